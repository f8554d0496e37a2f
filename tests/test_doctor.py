"""Tests for course_utils.doctor: each check fires on a set-up that has its failure and stays quiet on
one that does not; held-out broken set-ups (a model directory, a JSONL file and a config each) exit
non-zero naming the cause; bad input exits 2 with a message, never a traceback."""

import copy
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trl.chat_template_utils import qwen2_5_chat_template, qwen2_5_training_chat_template

from course_utils import doctor
from course_utils.data import make_messages
from course_utils.doctor import DoctorInputError, Finding, diagnose, empty_batch_probability
from course_utils.doctor.__main__ import main
from course_utils.doctor.inputs import read_rows

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"assistant_only_loss": True, "eos_token": "<|im_end|>", "learning_rate": 2e-5}
INSTRUCT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
OUT_LINE = "{{- '\\n' + message.content + '<|im_end|>\\n' }}"


def rows(n=48, **kw):
    return [{"messages": m} for m in make_messages(n=n, seed=3, **kw)]


def base_template():
    """Qwen2.5 base's template: Instruct's with another default system prompt (unknown to TRL)."""
    return qwen2_5_chat_template.replace(INSTRUCT, "You are a helpful assistant.")


def stop_outside_template():
    """TRL's Qwen2.5 training template, <|im_end|> moved after {% endgeneration %}: never graded."""
    assert qwen2_5_training_chat_template.count(OUT_LINE) == 1
    moved = "{%- endgeneration %}\n        {%- if not message.tool_calls %}{{- '<|im_end|>\\n' }}{%- endif %}"
    return (qwen2_5_training_chat_template.replace(OUT_LINE, "{{- '\\n' + message.content }}")
            .replace("{%- endgeneration %}", moved))


def with_template(course, template):
    model, tok = course
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return model, tok


def run(course, data, config=None, **kw):
    return diagnose(course, data, config, **kw)


# ---------------------------------------------------------------------------------------------
# Each check: a set-up that triggers it and one that does not
# ---------------------------------------------------------------------------------------------

def test_clean_course_setup_has_no_error_and_no_warning(course):
    report = run(course, rows(), GOOD)
    assert report.exit_code == 0
    assert report.checks("error") == set() and report.checks("warning") == set(), report


def test_course_defaults_have_no_error(course):
    """make_sft_trainer's own defaults (lr 3e-3, full-sequence loss): a learning-rate warning, no error."""
    report = run(course, rows(), {"learning_rate": 3e-3, "per_device_train_batch_size": 8})
    assert report.exit_code == 0 and "learning-rate" in report.checks("warning")


def test_unknown_config_keys_are_bad_input_naming_the_field(course):
    """A misspelt key used to be a warning while the doctor measured with the default max_length (1024):
    a report computed from a config it had to guess at. Now it is bad input, with the closest field."""
    with pytest.raises(DoctorInputError, match=r"'max_lenght' is not an SFTConfig field \(did you mean "
                                               r"'max_length'\?\) — .+ — .+"):
        run(course, rows(), {**GOOD, "max_lenght": 64})
    lora = run(course, rows(), {**GOOD, "use_peft": True, "lora_r": 8})  # TRL's ModelConfig fields: known
    assert lora.exit_code == 0


def test_fully_truncated_rows(course):
    data = rows(200, context_words=20, long_tail=True)
    bad = run(course, data, {**GOOD, "max_length": 96, "per_device_train_batch_size": 2})
    finding = next(f for f in bad if f.check == "fully-truncated")
    assert finding.severity == "error" and "Dropping fully masked" in finding.evidence
    # no fix TRL discourages: keep_end is deprecated in TRL 1.16 (and cuts the BOS and the system prompt)
    assert "keep_end" not in finding.fix and "max_length >= " in finding.fix
    assert "NaN (0/0" in finding.evidence  # a micro-batch's odds matter to a hand-written loop
    assert "fully-truncated" not in run(course, data, {**GOOD, "max_length": 100_000}).checks()


def test_fully_truncated_rows_with_packing_log_zero_only_for_a_whole_empty_step(course):
    """SFTTrainer divides by num_items_in_batch, the graded tokens of every micro-batch on every process of
    the optimizer step: an empty packed row adds nothing; only a whole step without graded tokens logs 0.0.
    The odds fall with each micro-batch and process the step adds."""
    data = rows(200, context_words=20, long_tail=True)
    packed = {**GOOD, "max_length": 96, "packing": True, "packing_strategy": "bfd",
              "per_device_train_batch_size": 1}

    def p_step(report):
        finding = next(f for f in report if f.check == "fully-truncated")
        assert "num_items_in_batch" in finding.evidence and "logs 0.0" in finding.evidence
        return float(re.search(r"no graded token at all \(p=([0-9.e+-]+)\)", finding.evidence).group(1))

    one = p_step(run(course, data, packed))
    accumulated = p_step(run(course, data, {**packed, "gradient_accumulation_steps": 4}))
    ranks = p_step(diagnose(course, data, {**packed, "gradient_accumulation_steps": 4}, num_processes=2))
    assert 0 < one and accumulated < one and ranks < accumulated


def test_max_length_below_most_prompts(course):
    assert "max-length-below-prompts" in run(course, rows(), {**GOOD, "max_length": 16}).checks("error")
    assert "max-length-below-prompts" not in run(course, rows(), {**GOOD, "max_length": 512}).checks()


def test_empty_batch_probability_is_hypergeometric():
    assert empty_batch_probability(10, 5, 2) == pytest.approx(5 / 10 * 4 / 9)
    assert empty_batch_probability(10, 0, 1) == 0 and empty_batch_probability(10, 10, 4) == 1
    for bad in ((10, 5, 0), (0, 0, 1), (10, 11, 2), (10, -1, 2), (10.0, 5, 2)):
        with pytest.raises(ValueError, match=".+ — .+ — .+"):  # batch_size 0 used to give p = 1
            empty_batch_probability(*bad)


def test_template_trl_cannot_patch(course):
    report = run(with_template(course, base_template()), rows(), GOOD)
    finding = next(f for f in report if f.check == "template-unpatchable")
    assert finding.severity == "error" and "qwen2_5" in finding.evidence
    assert "qwen2_5_training.jinja" in finding.fix
    assert "template-unpatchable" not in run(course, rows(), GOOD).checks()


def test_chat_template_path_fixes_the_base_template(course):
    import trl

    jinja = Path(trl.__file__).parent / "chat_templates" / "qwen2_5_training.jinja"
    report = run(with_template(course, base_template()), rows(), {**GOOD, "chat_template_path": str(jinja)})
    assert report.exit_code == 0, report


def test_stop_token_never_graded(course):
    report = run(with_template(course, stop_outside_template()), rows(), GOOD)
    finding = next(f for f in report if f.check == "stop-token-untrained")
    assert finding.severity == "error" and "<|im_end|>" in finding.what
    assert "stop-token-untrained" not in run(with_template(course, qwen2_5_training_chat_template), rows(),
                                             GOOD).checks()


def test_eos_mismatch(course):
    assert "eos-mismatch" in run(course, rows(), {"assistant_only_loss": True}).checks("warning")
    assert "eos-mismatch" not in run(course, rows(), GOOD).checks()


def test_pad_is_the_graded_stop_token(course):
    text_rows = [{"prompt": f"{a} plus {a} is", "completion": f" {2 * a}."} for a in range(20)]
    finding = next(f for f in run(course, text_rows, {"learning_rate": 2e-5}) if f.check == "pad-is-eos")
    assert "keeps 0 of them" in finding.evidence  # transformers' collator masks every graded eos
    model, tok = course
    own_pad = copy.deepcopy(tok)
    own_pad.pad_token = "<|im_start|>"  # any token that is not the stop token
    assert "pad-is-eos" not in run((model, own_pad), text_rows, {"learning_rate": 2e-5}).checks()


def test_assistant_only_loss_needs_conversational_rows(course):
    text_rows = [{"prompt": f"{a} plus {a} is", "completion": f" {2 * a}."} for a in range(20)]
    assert "assistant-only-loss" in run(course, text_rows, {**GOOD}).checks("error")
    chat_rows = [{"prompt": r["messages"][:1], "completion": r["messages"][1:]} for r in rows()]
    report = run(course, chat_rows, GOOD)  # conversational prompt/completion: TRL accepts it
    assert report.exit_code == 0 and "assistant-only-loss" not in report.checks()


def test_no_assistant_turns(course):
    data = [{"messages": [m for m in r["messages"] if m["role"] != "assistant"]} for r in rows()]
    assert "no-assistant-turns" in run(course, data, GOOD).checks("error")
    renamed = [{"messages": [{**m, "role": "gpt" if m["role"] == "assistant" else m["role"]}
                             for m in r["messages"]]} for r in rows()]
    assert "no-assistant-turns" in run(course, renamed, GOOD).checks("error")
    assert "no-assistant-turns" not in run(course, rows(), GOOD).checks()


def test_trl_preparation_failure_is_a_finding(course):
    report = run(with_template(course, None), rows(), {"learning_rate": 2e-5})
    assert "trl-preparation" in report.checks("error")


def test_wrapped_packing_without_boundaries(course):
    cfg = {**GOOD, "packing": True, "max_length": 256}
    wrapped = run(course, rows(), {**cfg, "packing_strategy": "wrapped"})
    assert "packing-no-boundaries" in wrapped.checks("warning")
    assert "packing-no-boundaries" not in run(course, rows(), {**cfg, "packing_strategy": "bfd"}).checks()


def test_right_padding_for_generation(course):
    model, tok = course
    left = copy.deepcopy(tok)
    left.padding_side = "left"
    assert "right-padding" in run(course, rows(), GOOD).checks("info")
    assert "right-padding" not in run((model, left), rows(), GOOD).checks()


def test_learning_rate_far_outside_range(course):
    assert "learning-rate" in run(course, rows(), {**GOOD, "learning_rate": 0.05}).checks("warning")
    assert "learning-rate" not in run(course, rows(), GOOD).checks()
    lora = {**GOOD, "learning_rate": 2e-4, "use_peft": True}
    assert "learning-rate" not in run(course, rows(), lora).checks()


def test_fp16_with_hot_learning_rate_or_activations_near_the_range(course):
    hot_lr = run(course, rows(), {**GOOD, "fp16": True, "learning_rate": 0.05})
    assert "fp16-overflow-risk" in hot_lr.checks("error")
    calm = run(course, rows(), {**GOOD, "fp16": True})
    assert "fp16-overflow-risk" not in calm.checks() and "fp16-range" in calm.checks("info")
    model, tok = course
    hot = copy.deepcopy(model)
    with torch.no_grad():
        hot.model.embed_tokens.weight.mul_(1e4)  # activations now far beyond fp16's comfort
    report = run((hot, tok), rows(), {**GOOD, "fp16": True})
    finding = next(f for f in report if f.check == "fp16-overflow-risk")
    assert "activations already reach" in finding.evidence


def test_fp16_is_judged_by_measured_activations_not_by_the_learning_rate(course):
    """The T4 QLoRA recipe (fp16, 2e-4, a LoraConfig) is healthy: its measured activations do not grow; the
    same rate on all weights neither. 0.05 on all weights grows them toward fp16's max within a few steps,
    and the finding quotes the measurement."""
    recipe = {**GOOD, "fp16": True, "learning_rate": 2e-4}
    lora = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}
    for peft in (lora, None):
        report = run(course, rows(), recipe, peft_config=peft)
        assert report.exit_code == 0 and "fp16-range" in report.checks("info"), report
        assert "measured" in next(f for f in report if f.check == "fp16-range").evidence
    hot_run = run(course, rows(), {**recipe, "learning_rate": 0.05})
    hot = next(f for f in hot_run if f.check == "fp16-overflow-risk")
    assert hot.severity == "error" and "measured" in hot.evidence and "all weights" in hot.evidence


def test_fp16_unmeasured_is_said_never_an_error(course, tmp_path):
    model, tok = course
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    for kw in ({"forward": False}, {"max_load_gb": 0.0001}):
        report = diagnose(str(tmp_path), rows(), {**GOOD, "fp16": True, "learning_rate": 0.05}, **kw)
        finding = next(f for f in report if f.check == "fp16-range")
        assert finding.severity == "info" and "not measured" in finding.what, report
        assert "fp16-overflow-risk" not in report.checks()
    assert "load limit" in next(f for f in diagnose(str(tmp_path), rows(), {**GOOD, "fp16": True},
                                                    max_load_gb=0.0001) if f.check == "fp16-range").evidence


def test_a_peft_config_is_read_as_loraconfig_fields(course, tmp_path):
    path = tmp_path / "lora.json"
    path.write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    assert doctor.read_peft_config(path).r == 8 and doctor.read_peft_config(None) is None
    with pytest.raises(DoctorInputError, match=r"'lora_rank' is not a LoraConfig field \(did you mean"):
        doctor.read_peft_config({"lora_rank": 8})
    for bad in ([8], "missing.json", {"r": "eight"}):
        with pytest.raises(DoctorInputError, match=".+ — .+ — .+"):
            doctor.read_peft_config(bad)
    # a LoRA learning rate is judged against LoRA's usual range
    assert "learning-rate" not in run(course, rows(), {**GOOD, "learning_rate": 5e-4},
                                      peft_config={"r": 8}).checks()
    assert "learning-rate" in run(course, rows(), {**GOOD, "learning_rate": 5e-2},
                                  peft_config={"r": 8}).checks("warning")


def test_float16_weights_under_fp16_fail_the_first_step(course):
    """Measured (tests/test_doctor.py's own probe below): the GradScaler refuses fp16 gradients."""
    from torch.amp import GradScaler

    layer = torch.nn.Linear(4, 4).half()
    optimizer = torch.optim.AdamW(layer.parameters())
    scaler = GradScaler("cpu")
    scaler.scale(layer(torch.randn(2, 4).half()).float().sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(optimizer)
    model, tok = course
    half = copy.deepcopy(model).half()
    broken = run((half, tok), rows(), {**GOOD, "fp16": True}, forward=False)
    finding = next(f for f in broken if f.check == "load-dtype")
    assert finding.severity == "error" and "Attempting to unscale FP16 gradients" in finding.evidence
    assert "load-dtype" not in run((half, tok), rows(), {**GOOD, "fp16": True}, forward=False,
                                   peft_config={"r": 8}).checks(), "peft trains float32 adapters"
    assert "load-dtype" not in run(course, rows(), {**GOOD, "fp16": True}, forward=False).checks()
    assert "load-dtype" in run((half, tok), rows(), GOOD, forward=False).checks("warning"), "pure float16"


def test_bf16_weights_in_full_fine_tuning_are_reported_whatever_the_flags(course):
    """Issue 45: from_pretrained (transformers 5) keeps a bf16 checkpoint in bf16; bf16=True autocasts the
    compute and adds no float32 master weights — the doctor says so from the weights' dtype alone."""
    model, tok = course
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    for config in (GOOD, {**GOOD, "bf16": True}):
        finding = next(f for f in run((bf16, tok), rows(), config, forward=False) if f.check == "load-dtype")
        assert finding.severity == "warning" and "master weights" in finding.what
    assert "load-dtype" not in run((bf16, tok), rows(), {**GOOD, "bf16": True}, forward=False,
                                   peft_config={"r": 8}).checks(), "peft trains float32 adapters"
    assert "load-dtype" not in run(course, rows(), {**GOOD, "bf16": True}, forward=False).checks()


def test_a_float16_checkpoint_is_loaded_as_model_init_kwargs_say(course, tmp_path):
    model, tok = course
    copy.deepcopy(model).half().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    fp16 = {**GOOD, "fp16": True}
    assert "load-dtype" in diagnose(str(tmp_path), rows(), {**fp16, "model_init_kwargs": {"dtype": "auto"}},
                                    forward=False).checks("error")
    # a path without model_init_kwargs: SFTTrainer loads float32 (its documented default) — no error
    plain = diagnose(str(tmp_path), rows(), fp16, forward=False)
    assert "load-dtype" in plain.checks("info") and plain.exit_code == 0


def test_report_renders_as_text_html_and_json(course):
    report = run(with_template(course, base_template()), rows(), GOOD)
    assert "ERROR" in str(report) and "<table>" in report._repr_html_()
    parsed = json.loads(report.to_json())
    assert parsed["exit_code"] == 1 and parsed["counts"]["error"] >= 1
    with pytest.raises(ValueError, match="severity"):
        Finding("fatal", "x", "x", "x", "x")


# ---------------------------------------------------------------------------------------------
# Held-out broken set-ups on disk, through the command's entry point
# ---------------------------------------------------------------------------------------------

def _setup(tmp_path, course, *, template=None, data=None, config=None, lines=None):
    model, tok = course
    directory = tmp_path / "model"
    tok = copy.deepcopy(tok)
    if template is not None:
        tok.chat_template = template
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    data_path = tmp_path / "data.jsonl"
    text = lines if lines is not None else "".join(json.dumps(r) + "\n" for r in (data or rows()))
    data_path.write_text(text)
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config if config is not None else GOOD))
    return ["--model", str(directory), "--data", str(data_path), "--config", str(config_path), "--json"]


HELD_OUT = {
    "fully truncated rows": (dict(data=rows(100, context_words=20, long_tail=True),
                                  config={**GOOD, "max_length": 80}), "fully-truncated"),
    "base template + assistant_only_loss": (dict(template=base_template()), "template-unpatchable"),
    "end-of-turn never graded": (dict(template=stop_outside_template()), "stop-token-untrained"),
    "fp16 + hot learning rate": (dict(config={**GOOD, "fp16": True, "learning_rate": 5e-2}),
                                 "fp16-overflow-risk"),
    "no assistant turns": (dict(data=[{"messages": r["messages"][:1]} for r in rows()]),
                           "no-assistant-turns"),
}


@pytest.mark.parametrize("name", list(HELD_OUT))
def test_held_out_broken_setups_exit_1_naming_the_cause(name, tmp_path, course, capsys):
    kwargs, cause = HELD_OUT[name]
    assert main(_setup(tmp_path, course, **kwargs)) == 1
    out = json.loads(capsys.readouterr().out)
    assert cause in {f["check"] for f in out["findings"] if f["severity"] == "error"}


def test_clean_setup_on_disk_exits_0(tmp_path, course, capsys):
    assert main(_setup(tmp_path, course)) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["error"] == 0


def test_max_length_flag_overrides_the_config(tmp_path, course, capsys):
    argv = _setup(tmp_path, course, config={**GOOD, "max_length": 1024})
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--max-length", "16"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert "max-length-below-prompts" in {f["check"] for f in out["findings"]}


def test_malformed_jsonl_row_exits_2_with_its_line_number(tmp_path, course, capsys):
    good = json.dumps(rows(2)[0])
    assert main(_setup(tmp_path, course, lines=f"{good}\n{good}\n{{\"messages\": [}}\n")) == 2
    assert "line 3" in capsys.readouterr().err


BAD_CONFIGS = {  # config -> what the message names (SFTConfig accepts every one of them without a word)
    "max_length -5": ({"max_length": -5}, "config max_length=-5 must be an integer >= 1"),
    "max_length 0": ({"max_length": 0}, "config max_length=0 must be an integer >= 1"),
    "max_length as text": ({"max_length": "64"}, "config max_length='64' must be an integer"),
    "max_length as a float": ({"max_length": 64.0}, "config max_length=64.0 must be an integer"),
    "batch size 0": ({"per_device_train_batch_size": 0}, "per_device_train_batch_size=0 must be an integer"),
    "gradient_accumulation_steps 0": ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0"),
    "negative learning rate": ({"learning_rate": -1e-5}, "learning_rate=-1e-05 must be a finite number > 0"),
    "NaN max_grad_norm": ({"max_grad_norm": float("nan")}, "config max_grad_norm=nan must be a finite"),
    "negative max_grad_norm": ({"max_grad_norm": -1.0}, "config max_grad_norm=-1.0 must be a finite number"),
    "negative epochs": ({"num_train_epochs": -1}, "config num_train_epochs=-1 must be a finite number >= 0"),
    "negative weight decay": ({"weight_decay": -0.1}, "config weight_decay=-0.1 must be a finite number"),
    "learning rate as text": ({"learning_rate": "2e-5"}, "learning_rate='2e-5' has type str"),
    "flag as text": ({"packing": "yes"}, "packing='yes' has type str"),
    "flag as a number": ({"fp16": 1}, "fp16=1 has type int"),
    "unknown packing strategy": ({"packing_strategy": "wrapd"}, "(did you mean 'wrapped'?)"),
    "unknown truncation mode": ({"truncation_mode": "keep_middle"}, "not one of ['keep_end', 'keep_start']"),
    "misspelt key": ({"learning_rte": 2e-5}, "(did you mean 'learning_rate'?)"),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_config_values_sftconfig_accepts_but_training_cannot_are_bad_input(name, course):
    config, named = BAD_CONFIGS[name]
    with pytest.raises(DoctorInputError, match=".+ — .+ — .+") as caught:
        run(course, rows(8), {**GOOD, **config})
    assert named in str(caught.value)


@pytest.mark.parametrize("max_length", [-5, 0, True, 1.5, "64"])
def test_diagnose_refuses_a_max_length_that_is_not_one(max_length, course):
    """Issue 36: max_length=-5 gave a report ("below most prompts (median 0 tokens)", exit 1)."""
    with pytest.raises(DoctorInputError, match="max_length=.* must be an integer >= 1 — .+ — "):
        run(course, rows(8), GOOD, max_length=max_length)


GUESSES = {  # name -> (model, data) from (course, tmp_path): what the doctor would have to guess at
    "no model": lambda course, tmp: (None, rows(8)),  # it would check the course's default model
    "a number for a model": lambda course, tmp: (5, rows(8)),
    "a swapped pair": lambda course, tmp: (course[::-1], rows(8)),
    "no data": lambda course, tmp: (course, None),
    "one row, not a list": lambda course, tmp: (course, rows(1)[0]),
    "empty rows": lambda course, tmp: (course, []),
    "mixed forms": lambda course, tmp: (course, rows(2) + [{"prompt": "a", "completion": "b"}]),
    "a directory for data": lambda course, tmp: (course, tmp),
    "a missing file": lambda course, tmp: (course, tmp / "nope.jsonl"),
}


@pytest.mark.parametrize("name", list(GUESSES))
def test_diagnose_refuses_arguments_it_would_have_to_guess_at(name, course, tmp_path):
    model, data = GUESSES[name](course, tmp_path)
    with pytest.raises(DoctorInputError, match=".+ — .+ — .+"):
        run(model, data, GOOD)


def test_diagnose_refuses_a_flag_that_is_not_one_and_a_directory_for_a_config(course, tmp_path):
    with pytest.raises(DoctorInputError, match="forward='no' must be True or False"):
        run(course, rows(8), GOOD, forward="no")
    with pytest.raises(DoctorInputError, match="is a directory"):
        run(course, rows(8), tmp_path)


def test_report_checks_refuses_an_unknown_severity(course):
    report = run(course, rows(8), GOOD)
    with pytest.raises(ValueError, match="did you mean 'error'"):
        report.checks("errors")  # a typo used to give an empty set: "no errors"


@pytest.mark.parametrize("case", ["missing data", "missing model", "config not an object",
                                  "row not TRL form", "max-length -5", "max-length 0", "misspelt config key",
                                  "negative learning rate", "data is a directory", "mixed row forms",
                                  "config is a directory"])
def test_bad_input_exits_2_with_what_why_fix(case, tmp_path, course, capsys):
    argv = _setup(tmp_path, course)
    if case == "missing data":
        argv[3] = str(tmp_path / "nope.jsonl")
    elif case == "missing model":
        argv[1] = "no-such-org/no-such-model"
    elif case == "config not an object":
        Path(argv[5]).write_text("[1, 2]")
    elif case == "row not TRL form":
        Path(argv[3]).write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    elif case.startswith("max-length"):
        argv += ["--max-length", case.split()[-1]]
    elif case == "misspelt config key":
        Path(argv[5]).write_text(json.dumps({**GOOD, "max_lenght": 64}))
    elif case == "negative learning rate":
        Path(argv[5]).write_text(json.dumps({**GOOD, "learning_rate": -2e-5}))
    elif case == "data is a directory":
        argv[3] = str(tmp_path)
    elif case == "mixed row forms":
        with Path(argv[3]).open("a") as handle:
            handle.write(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    else:
        argv[5] = str(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    message = err.strip().splitlines()[-1]  # above it: save_pretrained's progress bar from _setup
    assert message.startswith("doctor: bad input:") and message.count(" — ") >= 2 and "Traceback" not in err


# ---- issue 42, part 3: what the doctor measured as given, or reported as its own bug -------------------
@pytest.mark.parametrize("fields, named", [
    ({"r": 4, "lora_alpha": float("nan")}, "peft config lora_alpha=nan"),
    ({"r": 4, "bias": "some"}, "peft config bias='some' is not one of ['none', 'all', 'lora_only']"),
    ({"r": 0}, "peft config r=0 must be an integer >= 1"),
    ({"r": 4, "lora_dropout": -0.1}, "peft config lora_dropout=-0.1"),
])
def test_a_lora_config_peft_would_refuse_later_is_bad_input(fields, named):
    """LoraConfig(bias='some') is built without a word; peft's NotImplementedError came later (exit 3)."""
    with pytest.raises(DoctorInputError, match=".+ — .+ — .+") as caught:
        doctor.read_peft_config(fields)
    assert named in str(caught.value)


@pytest.mark.parametrize("bad_row, named", [
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"text": 3}, "'text' is 3, not a string"),
])
def test_a_row_a_check_would_crash_on_is_bad_input_naming_the_row(bad_row, named, course):
    """An empty conversation (IndexError) and a number for the text (AttributeError) were 'could not
    check ... report as a doctor bug' findings (exit 3): they are the data's mistakes."""
    good = rows(4) if "messages" in bad_row else [{"text": f"row {i}"} for i in range(4)]
    with pytest.raises(DoctorInputError, match=".+ — .+ — .+") as caught:
        run(course, [*good[:2], bad_row, *good[2:]], GOOD, forward=False)
    assert "row 2" in str(caught.value) and named in str(caught.value)


@pytest.mark.parametrize("findings", ["abc", [1, 2]])
def test_a_report_holds_findings_only(findings):
    with pytest.raises(TypeError, match="a Report holds Findings, got .+ — .+ — "):
        doctor.Report(findings)


def test_all_and_sample_together_are_refused(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(4)))
    assert main(["--data", str(data), "--all", "--sample", "3"]) == 2
    err = capsys.readouterr().err
    assert "--all and --sample 3" in err and err.count(" — ") >= 2
    assert main(["--data", str(data), "--all"]) == 0 and main(["--data", str(data), "--sample", "3"]) == 0


def test_read_config_rejects_non_objects():
    with pytest.raises(DoctorInputError, match="not a JSON object"):
        doctor.read_config([1])


@pytest.mark.slow
def test_command_line_runs_in_a_process_under_15_s_on_1000_rows(tmp_path, course):
    """The real command on 1,000 rows: exit 1 on the broken set-up, stderr without a traceback, <= 15 s."""
    argv = _setup(tmp_path, course, data=rows(1000, context_words=20, long_tail=True),
                  config={**GOOD, "max_length": 96})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "course_utils.doctor", *argv[:-1]], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert done.returncode == 1 and "fully-truncated" in done.stdout
    assert "Traceback" not in done.stderr
    # CPU seconds, not wall: the test machine is shared, and one busy neighbour must not fail it
    assert cpu < 15, f"the doctor took {cpu:.1f} CPU s ({wall:.1f} s wall) on 1,000 rows"
    print(f"doctor on 1,000 rows: {cpu:.1f} CPU s, {wall:.1f} s wall")


# ---------------------------------------------------------------------------------------------
# Pre-tokenised rows (your own tokenization, or a custom collator's output), sampling at scale
# ---------------------------------------------------------------------------------------------

def tokenized_rows(course, n=24):
    """Chats rendered and tokenized by hand, the answer graded: what a custom pipeline hands TRL."""
    _, tok = course
    out = []
    for messages in make_messages(n=n, seed=5):
        prompt = tok.apply_chat_template(messages[:-1], add_generation_prompt=True, return_dict=True)
        full = tok.apply_chat_template(messages, return_dict=True)["input_ids"]
        out.append((len(prompt["input_ids"]), full))
    return out


def test_pre_tokenised_rows_are_audited_as_trl_trains_them(course):
    pairs = tokenized_rows(course)
    config = {"learning_rate": 2e-5, "eos_token": "<|im_end|>", "max_length": 64}
    labelled = [{"input_ids": f, "labels": [-100] * p + f[p:]} for p, f in pairs]
    masked = [{"input_ids": f, "completion_mask": [0] * p + [1] * (len(f) - p)} for p, f in pairs]
    for healthy in (labelled, masked):
        report = run(course, healthy, config)
        assert report.exit_code == 0 and not report.checks("warning"), report
    shifted = [{"input_ids": f, "labels": ([-100] * p + f[p:])[1:] + [-100]} for p, f in pairs]
    finding = next(f for f in run(course, shifted, config) if f.check == "labels-misaligned")
    assert finding.severity == "error" and "already shifted" in finding.what
    empty = [{"input_ids": r["input_ids"], "labels": [-100] * len(r["input_ids"])} if i < 3 else r
             for i, r in enumerate(labelled)]
    finding = next(f for f in run(course, empty, config) if f.check == "no-assistant-turns")
    assert "no graded token" in finding.what and "[0, 1, 2]" in finding.evidence
    no_stop = [{"input_ids": r["input_ids"][:-2], "labels": r["labels"][:-2]} for r in labelled]
    assert "stop-token-untrained" in run(course, no_stop, config).checks("error")


def test_pre_tokenised_rows_with_bad_columns_are_bad_input(course):
    (p, f), = tokenized_rows(course, 1)
    for bad in ({"input_ids": []}, {"input_ids": [1, "2"]}, {"input_ids": f, "labels": f[:-1]},
                {"input_ids": f, "completion_mask": [2] * len(f)}):
        with pytest.raises(DoctorInputError, match=".+ — .+ — .+"):
            run(course, [bad], GOOD)


def test_a_sample_quotes_each_rate_with_its_interval_and_all_checks_every_row(course, tmp_path):
    data = rows(200, context_words=20, long_tail=True)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    config = {**GOOD, "max_length": 96}
    sampled = diagnose(course, str(path), config, sample=60, seed=1)
    note = next(f for f in sampled if f.check == "sample")
    assert "60 of 200 rows" in note.what
    cut = next(f for f in sampled if f.check == "fully-truncated")
    assert "of 60 rows" in cut.what and "95 % interval" in cut.what
    ids = [int(i) for i in re.search(r"row ids \[([0-9, ]+)\]", cut.evidence).group(1).split(",")]
    exact = diagnose(course, data, config, sample=None)
    assert "sample" not in exact.checks()
    exact_cut = next(f for f in exact if f.check == "fully-truncated")
    share = int(exact_cut.what.split(" of ")[0]) / 200
    low, high = (float(x) / 100 for x in re.search(r"([0-9.]+)%\.\.([0-9.]+)%", cut.what).groups())
    assert low <= share <= high, "the interval holds the rate of all the rows"
    _, tok = course

    def prompt_tokens(i):  # a row loses every graded token when its prompt fills max_length
        return len(tok.apply_chat_template(data[i]["messages"][:-1], add_generation_prompt=True,
                                           return_dict=True)["input_ids"])

    assert all(prompt_tokens(i) >= 96 for i in ids), "the ids are the data's rows, not the sample's"
    again = diagnose(course, str(path), config, sample=60, seed=1)
    assert [f.what for f in again] == [f.what for f in sampled], "the sample is seeded"


def test_many_rows_are_prepared_in_forked_shards_that_join_to_trl_s_own_rows(course, monkeypatch):
    """--all on a large file: TRL's preparation runs on one shard per core (trl_view.Preparation) — one
    process when the cores were busy. The joined shards must be the rows one process gives (values, order,
    features), a filter's dropped rows included, a row TRL refuses must raise TRL's own error in the
    caller, and the rows TRL's truncation drops, found by each shard, must make the report one process
    makes."""
    from course_utils import internals
    from course_utils.doctor import lengths, trl_view

    _, tok = course
    cores = trl_view._cores
    monkeypatch.setattr(trl_view, "PARALLEL_ROWS", 8)
    monkeypatch.setattr(trl_view, "_cores", lambda: 3)  # uneven shards, whatever this machine has
    data = rows(40, context_words=20, long_tail=True)
    dataset, _ = trl_view.trl_dataset([{**r, "_doctor_row": i} for i, r in enumerate(data)],
                                      [{**r, "_doctor_row": i} for i, r in enumerate(data)])
    args, _ = trl_view.sft_args({**GOOD, "max_length": 96})
    template = internals.sft_chat_template(tok)
    for overrides in ({"max_length": None}, {}):  # untruncated, and truncated with TRL's drop filter
        shards = trl_view.Preparation(tok, dataset, args, template, None, packing=False, **overrides)
        assert len(shards._shards) == 3
        joined = shards.result()
        one = internals.prepare_sft_dataset(dataset, tok, trl_view._replace(
            args, shuffle_dataset=False, packing=False, **overrides), chat_template=template)
        assert joined.features == one.features and joined.column_names == one.column_names
        assert joined.to_list() == one.to_list()
    assert len(joined) < len(dataset), "the filter dropped fully truncated rows"
    counted = trl_view.Preparation(tok, dataset, args, template, None, then=len, packing=False)
    assert len(counted.result()) == sum(counted.after) and len(counted.after) == 3  # each shard's kept rows
    failing = trl_view.Preparation(tok, dataset, args, template, None, then=lambda rows_: 1 / 0)
    assert failing.result() is not None and failing.after is None, "the caller computes it (and sees why)"
    broken = dataset.map(lambda r, i: {"messages": r["messages"][:1] if i == 30 else r["messages"]},
                         with_indices=True)  # row 30: no assistant turn — TRL refuses the data
    with pytest.raises(RuntimeError, match="no assistant tokens"):
        trl_view.Preparation(tok, broken, args, template, None, max_length=None, packing=False).result()
    for idle, shards in ((0.1, 1), (1.0, None), (None, None)):  # busy cores: one process; idle, unknown: all
        monkeypatch.setattr(trl_view, "_idle_cores", lambda idle=idle: idle)
        assert cores() == (shards or min(len(os.sched_getaffinity(0)), 8))
    calls = []  # the truncation check's own search for dropped rows, in this process
    real = lengths.dropped_rows
    monkeypatch.setattr(lengths, "dropped_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    sharded = diagnose(course, data, {**GOOD, "max_length": 96}, sample=None)
    assert not calls and "fully-truncated" in sharded.checks(), "each shard found its dropped rows"
    monkeypatch.setattr(trl_view, "_cores", lambda: 1)
    assert sharded == diagnose(course, data, {**GOOD, "max_length": 96}, sample=None) and calls == [1]


def test_prepared_rows_are_read_from_arrow_as_a_python_pass_reads_them():
    """trl_view's numpy readers of TRL's prepared rows (graded ends, rows holding a token, a doubled first
    token, the longest row) against the Python pass they replace — rows without a graded label, one-token
    rows and a filter's row selection included."""
    from datasets import Dataset

    from course_utils.data import graded_positions
    from course_utils.doctor import trl_view

    cases = ((7, [1, 1, 2], [-100, -100, -100]), (3, [1], [5]), (9, [1, 1], [-100, 4]),
             (4, [2, 1, 1], [6, -100, 6]), (8, [1, 1, 1, 5], [-100, 1, 5, -100]))
    prepared = Dataset.from_list([{"_doctor_row": r, "input_ids": ids, "labels": labels}
                                  for r, ids, labels in cases])
    for rows_ in (prepared, prepared.filter(lambda r: r["_doctor_row"] != 9)):
        labels = list(rows_["labels"])
        ends = {r: (p[0], p[-1]) if p else None
                for r, p in zip(rows_["_doctor_row"], map(graded_positions, labels))}
        assert trl_view.graded_bounds(rows_) == ends and list(trl_view.graded_bounds(rows_)) == list(ends)
        for token in (1, 5, 6, -100):
            assert trl_view.rows_holding(rows_, "labels", token) == sum(token in lab for lab in labels)
        assert trl_view.rows_starting_twice(rows_, 1) == [
            r for r, ids in zip(rows_["_doctor_row"], rows_["input_ids"]) if ids[:2] == [1, 1]]
        assert trl_view.longest_row(rows_) == max(map(len, labels))
    assert trl_view.graded_bounds(prepared) == {7: None, 3: (0, 0), 9: (1, 1), 4: (0, 2), 8: (1, 2)}


def test_sampling_reads_a_uniform_sample_of_the_file_and_every_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "completion": "c"}) + "\n" for i in range(1000)))
    counts = [0] * 10
    for seed in range(200):
        rows_, total = read_rows(path, 50, seed)
        assert total == 1000 and len(rows_) == 50
        for r in rows_:
            counts[r["_doctor_row"] // 100] += 1
    assert min(counts) > 0.8 * 1000 and max(counts) < 1.2 * 1000, counts  # 10,000 draws, 1,000 per decile
    with path.open("a") as handle:
        handle.write("{not json\n")
    with pytest.raises(DoctorInputError, match="line 1001"):
        read_rows(path, 50, 0)  # a malformed line outside the sample is still bad input


# ---------------------------------------------------------------------------------------------
# --trainer: a practitioner's own SFTTrainer subclass under lesson 01's split test
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow  # six short SFTTrainer runs (~15 s): in make test-slow
def test_a_trainer_whose_loss_ignores_num_items_in_batch_is_found_by_the_split_test(course, tmp_path,
                                                                                   monkeypatch):
    from course_utils.accumulation import custom_loss_trainer

    accumulating = {**GOOD, "gradient_accumulation_steps": 4}
    micro_mean = custom_loss_trainer("micro_mean")
    broken = next(f for f in run(course, rows(), accumulating, trainer=micro_mean)
                  if f.check == "trainer-accumulation")
    assert broken.severity == "error" and "split test" in broken.evidence
    assert "num_items_in_batch" in broken.fix
    without = next(f for f in run(course, rows(), GOOD, trainer=micro_mean)
                   if f.check == "trainer-accumulation")
    assert without.severity == "warning", "no accumulation, one process: not yet wrong"
    (tmp_path / "my_trainers.py").write_text(
        "from trl import SFTTrainer\n\n\nclass Delegating(SFTTrainer):\n"
        "    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):\n"
        "        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    healthy = run(course, rows(), accumulating, trainer="my_trainers:Delegating")
    assert "trainer-accumulation" in healthy.checks("info") and healthy.exit_code == 0, healthy
    for bad in ("my_trainers", "no_such_module:X", "my_trainers:Nope", "json:JSONDecoder"):
        with pytest.raises(DoctorInputError, match=".+ — .+ — .+"):
            run(course, rows(), GOOD, trainer=bad)


_BY_COUNT = '''import torch.nn.functional as F
from trl import SFTTrainer


class ByCount(SFTTrainer):
    """Lesson 01's 'divide by num_items_in_batch yourself', without x num_processes."""
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"]
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask")).logits
        logits = logits[:, :-1].float()
        summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                 ignore_index=-100, reduction="sum")
        count = num_items_in_batch if num_items_in_batch is not None else (labels[:, 1:] != -100).sum()
        return summed / count


class ByCountTimesW(ByCount):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, False, num_items_in_batch)
        return loss * self.accelerator.num_processes if num_items_in_batch is not None else loss
'''


@pytest.mark.slow  # four short SFTTrainer runs and two losses (~20 s): in make test-slow
def test_a_trainer_dividing_by_the_gathered_count_without_times_w_is_found_on_several_processes(
        course, tmp_path, monkeypatch):
    """Issue 45: the count is every rank's and DDP averages, so a loss ÷ num_items_in_batch needs × W. The
    split test cannot see it (one process); the ranks test does, and leaves the user's process alone."""
    (tmp_path / "by_count.py").write_text(_BY_COUNT)
    monkeypatch.syspath_prepend(str(tmp_path))
    one = next(f for f in run(course, rows(), GOOD, trainer="by_count:ByCount")
               if f.check == "trainer-accumulation")
    assert one.severity == "info", "on one process dividing by the count is right"
    two = next(f for f in run(course, rows(), GOOD, trainer="by_count:ByCount", num_processes=2)
               if f.check == "trainer-accumulation")
    assert two.severity == "error" and "0.5×" in two.what and "num_processes" in two.fix, two
    fixed = run(course, rows(), GOOD, trainer="by_count:ByCountTimesW", num_processes=2)
    assert "trainer-accumulation" in fixed.checks("info"), fixed
    from accelerate.state import PartialState
    assert PartialState().num_processes == 1, "the user's process still has one rank"


def test_rows_with_tool_calls_never_get_a_content_only_training_template(course):
    """Issue 45: TRL's llama3_training.jinja renders content only (TRL ships no Llama 3.1 training template):
    suggested for tool-call data it would drop every call from the loss. The doctor suggests prompt/completion
    rows instead; the same template on rows without calls still gets the training template."""
    from trl import chat_template_utils as ctu

    model, tok = course
    tok = copy.deepcopy(tok)
    tok.chat_template = ctu.llama3_chat_template + "\n"  # one byte off: TRL cannot patch it
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    tools = [{"messages": [{"role": "user", "content": "add 1 and 2"},
                           {"role": "assistant", "content": "", "tool_calls": [call]},
                           {"role": "tool", "content": "3"},
                           {"role": "assistant", "content": "It is 3."}]}] * 4
    config = {"assistant_only_loss": True, "learning_rate": 2e-5}
    unpatchable = "template-unpatchable"
    finding = next(f for f in run((model, tok), tools, config, forward=False) if f.check == unpatchable)
    assert "llama3_training.jinja" not in finding.fix and "prompt/completion" in finding.fix
    plain = next(f for f in run((model, tok), rows(), config, forward=False) if f.check == unpatchable)
    assert "llama3_training.jinja" in plain.fix


@pytest.mark.parametrize("template, assistant_only_works", [("llama3_1", False), ("qwen2_5", True)])
def test_graded_tool_replies_get_a_fix_that_keeps_the_calls(course, template, assistant_only_works):
    """Issue 45: under full loss, 'set assistant_only_loss=True' is the fix only where TRL can train the
    template that way and keep the tool calls (Qwen2.5's training template renders them); on Llama 3.1, which
    TRL cannot patch, it leads into the template-unpatchable error: prompt/completion rows instead."""
    from trl import chat_template_utils as ctu

    model, tok = course
    tok = copy.deepcopy(tok)
    tok.chat_template = getattr(ctu, f"{template}_chat_template")
    tok.bos_token = tok.bos_token or tok.eos_token
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    tools = [{"messages": [{"role": "user", "content": f"add {i} and 2"},
                           {"role": "assistant", "content": "", "tool_calls": [call]},
                           {"role": "tool", "content": str(i + 2)},
                           {"role": "assistant", "content": f"It is {i + 2}."}]} for i in range(4)]
    graded = next(f for f in run((model, tok), tools, {"learning_rate": 2e-5}, forward=False)
                  if f.check == "tool-output-graded")
    assert graded.fix.startswith("set assistant_only_loss=True") == assistant_only_works, graded.fix
    assert "prompt/completion row" in graded.fix
    if assistant_only_works:  # the fix applied: the replies carry no loss, no template error
        fixed = run((model, tok), tools, {"learning_rate": 2e-5, "assistant_only_loss": True}, forward=False)
        bad = fixed.checks("error") | fixed.checks("warning")
        assert not {"tool-output-graded", "template-unpatchable"} & bad, fixed
