"""The run autopsy (``--run OUTPUT_DIR``, issue 49): each rule of ``run_rules`` fires on a planted log and not
on its healthy twin; the autopsy finds the state where the Trainer and ``trl sft`` leave it; bad input exits
2; and a real run watched by ``SFTWatch`` gets the same verdicts from its ``trainer_state.json``
afterwards."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import run_rules
from course_utils.doctor.__main__ import main
from course_utils.doctor.autopsy import autopsy, find_state

ROOT = Path(__file__).resolve().parents[1]


def log(losses, norms=None, lrs=None, evals=()):
    norms = norms or [0.5] * len(losses)
    lrs = lrs or [2e-5] * len(losses)
    entries = [{"step": s + 1, "loss": loss, "grad_norm": n, "learning_rate": lr}
               for s, (loss, n, lr) in enumerate(zip(losses, norms, lrs))]
    return entries + [{"step": s, "eval_loss": v} for s, v in evals]


FALLING = [3.0 * 0.9 ** i for i in range(20)]
HEALTHY = log(FALLING, evals=[(5, 2.5), (10, 2.0), (15, 1.8), (20, 1.7)])
PLANTED = {  # rule id -> a log that has it
    "run-nonfinite": log(FALLING[:10] + [math.nan] * 10),
    "run-zero-loss": log(FALLING[:15] + [0.0] + FALLING[16:]),
    "run-clipping": log(FALLING, norms=[1.0 + i for i in range(20)]),
    "run-grad-spike": log(FALLING, norms=[0.5] * 12 + [40.0] + [0.5] * 7),
    "run-loss-diverging": log([2.0 * 1.05 ** i for i in range(20)]),
    "run-loss-flat": log([2.3] * 20),
    "run-lr-zero": log(FALLING, lrs=[0.0] * 20),
    "run-eval-rising": log(FALLING, evals=[(5, 2.0), (10, 1.5), (15, 1.7), (20, 1.9)]),
}


@pytest.mark.parametrize("rule", PLANTED)
def test_each_rule_fires_on_its_planted_log_only(rule):
    fired = {v.id for v in run_rules.judge(PLANTED[rule], max_grad_norm=1.0)}
    assert rule in fired, (rule, fired)
    assert not run_rules.judge(HEALTHY, max_grad_norm=1.0)


def test_a_linear_schedules_last_step_at_lr_0_is_not_a_run_that_did_not_train():
    lrs = [2e-5 * (1 - i / 19) for i in range(20)]
    assert lrs[-1] == 0 and not run_rules.judge(log(FALLING, lrs=lrs))


def test_the_clip_rule_is_the_watchs():
    """One copy: SFTWatch decides a clip with run_rules.was_clipped (post-clip norm = max_grad_norm)."""
    import inspect

    from course_utils import watch

    assert "run_rules.was_clipped" in inspect.getsource(watch.SFTWatch.on_pre_optimizer_step)
    assert "CLIP_TOLERANCE =" not in inspect.getsource(watch)
    assert run_rules.was_clipped(1.0 * (1 - 1e-6), 1.0) and not run_rules.was_clipped(0.9, 1.0)


def write_run(directory: Path, entries, step_dirs=(5, 10), top=False):
    for step in step_dirs:
        (directory / f"checkpoint-{step}").mkdir(parents=True)
        state = {"global_step": step, "max_steps": 20,
                 "log_history": [e for e in entries if e["step"] <= step]}
        (directory / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(state))
    if top:
        (directory / "trainer_state.json").write_text(json.dumps({"global_step": 20, "log_history": entries}))


def test_the_last_checkpoint_is_read_as_trl_sft_leaves_it(tmp_path):
    write_run(tmp_path, PLANTED["run-zero-loss"], step_dirs=(8, 16))
    path, found = find_state(tmp_path)
    assert path == tmp_path / "checkpoint-16" / "trainer_state.json"
    assert found == ["checkpoint-8", "checkpoint-16"]
    report = autopsy(tmp_path)
    assert "run-zero-loss" in report.checks("error") and report.exit_code == 1
    assert "default" in next(f for f in report if f.check == "run-checkpoints").evidence  # max_grad_norm 1.0


def test_the_command_on_a_run_directory(tmp_path, capsys):
    write_run(tmp_path / "bad", PLANTED["run-clipping"], top=True)
    assert main(["--run", str(tmp_path / "bad"), "--format", "json"]) == 0  # a warning, not an error
    assert "run-clipping" in {f["check"] for f in json.loads(capsys.readouterr().out)["findings"]}
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"max_grad_norm": 100.0}))
    assert main(["--run", str(tmp_path / "bad"), "--config", str(config), "--json"]) == 0
    assert "run-clipping" not in capsys.readouterr().out
    write_run(tmp_path / "ok", HEALTHY)
    assert main(["--run", str(tmp_path / "ok")]) == 0


@pytest.mark.parametrize("case", ["missing", "empty dir", "not json", "no history", "other file"])
def test_bad_run_input_exits_2_with_what_why_fix(case, tmp_path, capsys):
    target = tmp_path / "run"
    if case != "missing":
        target.mkdir()
    if case == "not json":
        (target / "trainer_state.json").write_text("{oops")
    if case == "no history":
        (target / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    if case == "other file":
        target = target / "notes.txt"
        target.write_text("x")
    assert main(["--run", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("doctor: bad input:") and err.count(" — ") >= 2 and "Traceback" not in err, err


def test_max_grad_norm_is_read_from_training_args_without_unpickling(tmp_path):
    """``pickled_number`` walks the pickle's opcodes: the value comes back, and nothing in the file runs."""
    code = ("import sys, torch\nfrom transformers import TrainingArguments\n"
            "torch.save(TrainingArguments(output_dir=sys.argv[1], max_grad_norm=0.3, report_to='none'), "
            "sys.argv[1] + '/training_args.bin')")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=ROOT, capture_output=True)
    from course_utils.doctor.autopsy import pickled_number

    assert pickled_number(tmp_path / "training_args.bin", "max_grad_norm") == 0.3
    assert pickled_number(tmp_path / "missing.bin", "max_grad_norm") is None


@pytest.mark.slow
def test_a_watched_run_and_its_autopsy_agree(tmp_path):
    """The same run, judged live by SFTWatch and afterwards from its checkpoint: the same verdicts."""
    from course_utils import load_course_model, make_chat_dataset, make_sft_trainer
    from course_utils.watch import SFTWatch

    model, tokenizer = load_course_model()
    for max_grad_norm in (0.05, 1e6):  # clipping on every step, then never
        out = tmp_path / f"run-{max_grad_norm:g}"
        trainer = make_sft_trainer(model, tokenizer, make_chat_dataset(n=48), max_steps=8,
                                   output_dir=str(out),
                                   save_strategy="steps", save_steps=8, max_grad_norm=max_grad_norm,
                                   progress=False)
        watch = SFTWatch()
        trainer.add_callback(watch)
        trainer.train()
        live = {v.id for v in watch.verdicts()}
        after = autopsy(out).checks() - {"run-checkpoints"}
        assert live == after, (max_grad_norm, live, after)
        assert ("run-clipping" in live) == (max_grad_norm < 1), live


# ---- issue 49, gap 2: fp16's GradScaler warm-up is routine, not a NaN run ---------------------------
def fp16_warmup_log(bad=(1, 2, 3, 41), n=60, value=math.nan):
    norms = [value if s + 1 in bad else 0.5 for s in range(n)]
    return log([3.0 * 0.98 ** i for i in range(n)], norms=norms)


@pytest.mark.parametrize("fp16", [True, None])
def test_isolated_nonfinite_norms_with_a_finite_loss_are_the_grad_scalers_skips(fp16):
    verdict = next(v for v in run_rules.judge(fp16_warmup_log(), fp16=fp16) if v.id == "run-nonfinite")
    assert verdict.severity == "info" and "GradScaler skipped 4 of 60" in verdict.what, verdict
    assert "[1, 2, 3, 41]" in verdict.evidence
    assert ("fp16=True" if fp16 else "cannot be known") in verdict.evidence, verdict.evidence


def test_nonfinite_norms_without_fp16_most_steps_skipped_or_to_the_end_are_not_routine():
    not_fp16 = next(v for v in run_rules.judge(fp16_warmup_log(), fp16=False) if v.id == "run-nonfinite")
    assert not_fp16.severity == "warning" and "did not train in fp16" in not_fp16.evidence
    mostly = next(v for v in run_rules.judge(fp16_warmup_log(bad=range(1, 40)), fp16=True)
                  if v.id == "run-nonfinite")
    assert mostly.severity == "warning" and "hardly trains" in mostly.evidence
    to_the_end = run_rules.judge(fp16_warmup_log(bad=(1, 2, 58, 59, 60), value=math.inf), fp16=True)
    assert [v.severity for v in to_the_end if v.id == "run-nonfinite"] == ["error"]
    nan_loss = log([3.0] * 5 + [math.nan] + [2.0] * 14)
    assert [v.severity for v in run_rules.judge(nan_loss, fp16=True) if v.id == "run-nonfinite"] == ["error"]


def test_the_autopsy_reads_fp16_from_the_config_and_says_so(tmp_path, capsys):
    write_run(tmp_path, fp16_warmup_log(), step_dirs=(60,))
    assert main(["--run", str(tmp_path), "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)["findings"]
    finding = next(f for f in findings if f["check"] == "run-nonfinite")
    assert finding["severity"] == "info" and "cannot be known" in finding["evidence"]
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"fp16": True}))
    assert main(["--run", str(tmp_path), "--config", str(config), "--json"]) == 0
    assert "fp16=True" in capsys.readouterr().out
    config.write_text(json.dumps({"bf16": True, "fp16": False}))
    assert main(["--run", str(tmp_path), "--config", str(config), "--json"]) == 0
    assert "did not train in fp16" in capsys.readouterr().out


def test_the_watch_and_the_autopsy_share_the_nonfinite_rule():
    """One copy: SFTWatch.verdicts and the autopsy both call run_rules.judge (no second non-finite rule)."""
    import inspect

    from course_utils import watch
    from course_utils.doctor import autopsy as autopsy_module

    assert "run_rules.judge(" in inspect.getsource(watch.SFTWatch.verdicts)
    assert "run_rules.judge(" in inspect.getsource(autopsy_module.autopsy)
    assert "Verdict(" not in inspect.getsource(watch) + inspect.getsource(autopsy_module)


# ---- issue 49, gap 6: a stale top-level trainer_state.json does not hide a later checkpoint -----------
def test_the_newest_state_is_read_and_named_when_the_top_level_one_is_stale(tmp_path):
    """The top-level state of an earlier run (global_step 10, healthy) beside checkpoint-20 of the run that
    went NaN: the checkpoint is read (its global_step is higher), and the report says which file and why."""
    write_run(tmp_path, PLANTED["run-nonfinite"], step_dirs=(20,))
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 10, "log_history": HEALTHY[:10]}))
    path, _ = find_state(tmp_path)
    assert path == tmp_path / "checkpoint-20" / "trainer_state.json"
    report = autopsy(tmp_path)
    assert "run-nonfinite" in report.checks("error")
    note = next(f for f in report if f.check == "run-checkpoints")
    assert "checkpoint-20" in note.what and "(global_step 10) is older" in note.evidence, note
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 20, "log_history": HEALTHY}))
    assert find_state(tmp_path)[0] == tmp_path / "trainer_state.json"  # a tie: save_state's, after training


@pytest.mark.parametrize("entries", [[], [{"step": 10, "eval_loss": 1.0}]], ids=["empty", "only eval"])
def test_a_log_without_a_training_step_is_could_not_check(entries, tmp_path, capsys):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 0, "log_history": entries}))
    assert main(["--run", str(tmp_path)]) == 3
    assert "run-log" in capsys.readouterr().out


def test_eval_loss_noise_under_one_percent_is_not_a_rise():
    noise = log(FALLING, evals=[(5, 1.3), (10, 1.3005), (15, 1.301), (20, 1.3012)])
    assert "run-eval-rising" not in {v.id for v in run_rules.judge(noise)}
    rise = log(FALLING, evals=[(5, 1.3), (10, 1.31), (15, 1.32), (20, 1.33)])
    verdict = next(v for v in run_rules.judge(rise) if v.id == "run-eval-rising")
    assert "(+2.3%" in verdict.evidence, verdict.evidence


# ---- issue 42, part 3: a log or a threshold the rules cannot judge is refused, never judged healthy -------
@pytest.mark.parametrize("call, phrase", [
    (lambda: run_rules.judge(HEALTHY, max_grad_norm=math.nan), "max_grad_norm=nan"),
    (lambda: run_rules.judge(HEALTHY, max_grad_norm=math.inf), "max_grad_norm=inf"),
    (lambda: run_rules.judge(HEALTHY, max_grad_norm=None), "max_grad_norm=None"),
    (lambda: run_rules.was_clipped(2.0, math.nan), "max_grad_norm=nan"),
    (lambda: run_rules.was_clipped(2.0, math.inf), "max_grad_norm=inf"),
    (lambda: run_rules.clipping_verdict([True, True, False], math.nan), "max_grad_norm=nan"),
    (lambda: run_rules.clipping_verdict([True, True, False], math.inf), "max_grad_norm=inf"),
    (lambda: run_rules.judge([{"x": 1}]), "no entry of log is a logged step"),
    (lambda: run_rules.judge([{"foo": 1}, {"bar": 2}]), "no entry of log is a logged step"),
    (lambda: run_rules.judge([{"step": 1, "loss": "x"}, {"step": 2, "loss": "y"}]), "is not a number"),
    (lambda: run_rules.judge(log([2.0, 1.0], norms=["big", 0.5])), "is not a number"),
    (lambda: run_rules.judge([{"step": 1, "loss": 2.0, "grad_norm": 1.0}] * 2, clipped=[True] * 5),
     "clipped has 5 flags"),
    (lambda: run_rules.judge(HEALTHY, fp16="yes"), "fp16='yes'"),
])
def test_what_the_rules_cannot_judge_is_refused_with_what_why_fix(call, phrase):
    with pytest.raises((TypeError, ValueError), match=re.escape(phrase)) as caught:
        call()
    assert str(caught.value).count(" — ") >= 2, "what — why — fix"


def test_what_real_logs_hold_is_still_judged():
    """A step without grad_norm or learning_rate (None), the end-of-training summary without a loss, a log
    of only evaluations, and the watch's clip flags of steps after the last logged one (logging_steps=10)."""
    summary = {"step": 20, "train_loss": 1.2, "train_runtime": 3.0}
    quiet = [{"step": s, "loss": 1.0, "grad_norm": None, "learning_rate": None} for s in (10, 20)]
    assert run_rules.judge(quiet + [summary]) == []
    assert run_rules.judge([{"step": 10, "eval_loss": 1.0}]) == []
    assert run_rules.judge(quiet, clipped=[False] * 25) == []
    assert run_rules.judge(log(FALLING), max_grad_norm=0) == []


def test_the_autopsy_of_a_log_with_text_losses_is_bad_input(tmp_path, capsys):
    write_run(tmp_path, [{"step": s, "loss": "x"} for s in (1, 2, 3)], step_dirs=(3,))
    assert main(["--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a number" in err and err.count(" — ") >= 2 and "Traceback" not in err, err
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"max_grad_norm": -1.0}))
    write_run(tmp_path / "ok", HEALTHY)
    assert main(["--run", str(tmp_path / "ok"), "--config", str(config)]) == 2
    assert "--config max_grad_norm=-1.0" in capsys.readouterr().err
