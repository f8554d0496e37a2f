"""Lesson 08's exercise (capstone): the broken set-ups the lesson hands you, and the checker of fix_setup.

``broken_setup(seed)`` writes what a colleague would hand you — a model directory (the course model,
maybe with a different chat template), a JSONL file of chats and an SFTConfig as JSON — with three of
the five failures below drawn by the seed, plus lesson 02's eos mismatch, which every base-model
config has until someone sets ``eos_token``:

============== ====== ======================================================= ==========================
failure        lesson what is planted                                         the doctor's finding
============== ====== ======================================================= ==========================
base_template  04     Qwen2.5 *base* template (other default system prompt)   template-unpatchable
long_prompts   05     some prompts get a long context paragraph, past         fully-truncated
                      max_length
renamed_roles  04     some rows say ``"gpt"`` where the template expects      no-assistant-turns
                      ``"assistant"``
fp16_hot_lr    06     ``fp16=True`` with ``learning_rate=0.05``               fp16-overflow-risk
wrapped_packing 03    ``packing=True, packing_strategy="wrapped"``            packing-no-boundaries
(always)       02     no ``eos_token``: generate() stops on <|endoftext|>     eos-mismatch
============== ====== ======================================================= ==========================

``broken_setup`` returns the set-up only (a ``capstone.Setup``): which failures it holds is for the
doctor to find. The truth stays here, private (``_broken_setup`` returns it with the set-up): the
lesson's claims ask it through ``expected_trl_error`` and ``all_planted_found``, and ``fixes_explorer``
— shown after the doctor has found them — switches each planted failure between "as planted" and
"fixed" and shows what the doctor then reports (``fixes_frame``). ``broken_rows`` gives the rows
with the data failures you name.

``check_fix_setup`` is the exercise's checker: it draws set-ups the notebook has not shown, applies
the learner's ``fix_setup(config, rows, tokenizer)``, runs the doctor on the result and names the
misconception behind what is still wrong. Its reference answer: ``answers/lesson08.py``.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from .. import validate
from ..capstone import Setup, trl_training_template_path
from ..checks import Case, run_check
from ..data import filler_text, make_messages
from ..doctor import DoctorInputError, Report, diagnose
from ..model import load_course_model
from ..viz import what_if

FAILURES = {  # name -> (lesson, the doctor's check that must find it)
    "base_template": ("04", "template-unpatchable"),
    "long_prompts": ("05", "fully-truncated"),
    "renamed_roles": ("04", "no-assistant-turns"),
    "fp16_hot_lr": ("06", "fp16-overflow-risk"),
    "wrapped_packing": ("03", "packing-no-boundaries"),
}
ALWAYS = {"eos_mismatch": ("02", "eos-mismatch")}
DATA_FAILURES = ("long_prompts", "renamed_roles")  # the failures that live in the rows
N_PLANTED = 3
N_ROWS = 240
BROKEN_SHARE = 0.15  # of the rows, for the data failures
BASE_CONFIG = {"assistant_only_loss": True, "max_length": 64, "per_device_train_batch_size": 8,
               "learning_rate": 3e-3, "max_steps": 60, "lr_scheduler_type": "constant"}
INSTRUCT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
BASE_SYSTEM = "You are a helpful assistant."
ALLOWED_WARNINGS = {"learning-rate"}  # a 0.6 M-parameter model wants a rate a real one would not take
_TRL_REFUSES = {"base_template": ValueError, "renamed_roles": RuntimeError}  # TRL checks these two itself

_PLANTED: dict[str, tuple[str, ...]] = {}  # str(config_path) -> what was planted there: the truth


# ---------------------------------------------------------------------------------------------
# The broken set-ups
# ---------------------------------------------------------------------------------------------

def broken_rows(seed: int, planted) -> list[dict]:
    """``N_ROWS`` chats in TRL's ``messages`` form, drawn by ``seed``, with the data failures named in
    ``planted`` (from ``DATA_FAILURES``: long prompts, renamed roles) in ``BROKEN_SHARE`` of the rows."""
    validate.seed("seed", seed)
    validate.choices("planted", planted, DATA_FAILURES,
                     why="broken_rows plants the failures that live in the rows; the others live in the "
                         "config or the template, and broken_setup plants those")
    return _broken_rows(seed, planted)


def _broken_rows(seed: int, planted) -> list[dict]:
    rng = random.Random(seed)
    rows = [{"messages": m} for m in make_messages("mixed", N_ROWS, seed=seed)]
    n_broken = int(BROKEN_SHARE * N_ROWS)
    if "long_prompts" in planted:
        for i in rng.sample(range(N_ROWS), n_broken):
            user = rows[i]["messages"][0]
            user["content"] = f"Context: {filler_text(rng, rng.randint(40, 80))}.\n{user['content']}"
    if "renamed_roles" in planted:
        for i in rng.sample(range(N_ROWS), n_broken):
            for message in rows[i]["messages"]:
                if message["role"] == "assistant":
                    message["role"] = "gpt"  # ShareGPT's name for the assistant
    return rows


def _max_length(tokenizer, seed: int) -> int:
    """The set-up's ``max_length``: 64 on the shipped models, where every ordinary row fits whole (at
    most 46 tokens with TRL's training template) and every long prompt does not (81 and more); on a
    tokenizer that spends more tokens per word, as many more as its ordinary rows need — a budget from the
    model's own token counts, so the ordinary rows always fit and the long ones never do."""
    template = Path(trl_training_template_path()).read_text(encoding="utf-8")
    longest = max(len(tokenizer.apply_chat_template(r["messages"], chat_template=template,
                                                    return_dict=True)["input_ids"])
                  for r in _broken_rows(seed, ()))
    return max(BASE_CONFIG["max_length"], longest + 18)


def _broken_config(planted, max_length: int = BASE_CONFIG["max_length"]) -> dict:
    config = dict(BASE_CONFIG, max_length=max_length)
    if "fp16_hot_lr" in planted:
        config.update(fp16=True, learning_rate=0.05)
    if "wrapped_packing" in planted:
        config.update(packing=True, packing_strategy="wrapped")
    return config


def broken_setup(seed: int = 0, directory=None, planted=None) -> Setup:
    """A colleague's set-up with ``N_PLANTED`` failures drawn by ``seed`` (or the ``planted`` names of
    ``FAILURES``), written under ``directory`` (default: a new temporary directory). Returns the
    set-up only: which failures it holds is for the doctor to find."""
    validate.seed("seed", seed)
    if directory is not None:
        if not isinstance(directory, (str, Path)):
            raise TypeError(f"directory must be a path, got {type(directory).__name__} — the set-up is "
                            "written there as files — pass a folder path, or leave it out for a new one.")
        if Path(directory).exists() and not Path(directory).is_dir():
            raise ValueError(f"directory={str(directory)!r} is a file — the set-up is a folder of a model "
                             "directory, a JSONL file and a JSON config — pass a folder path.")
    if planted is not None:
        validate.choices("planted", planted, sorted(FAILURES), why="the capstone plants only these failures")
    return _broken_setup(seed, directory, planted)[0]


def _broken_setup(seed: int, directory=None, planted=None) -> tuple[Setup, tuple[str, ...]]:
    """``(setup, planted)``: ``broken_setup`` and the names of the failures planted in it."""
    if planted is None:
        planted = random.Random(seed).sample(sorted(FAILURES), N_PLANTED)
    planted = tuple(sorted(set(planted)))
    root = Path(directory or tempfile.mkdtemp(prefix="capstone-"))
    model, tokenizer = load_course_model()
    if "base_template" in planted:
        tokenizer.chat_template = tokenizer.chat_template.replace(INSTRUCT_SYSTEM, BASE_SYSTEM)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows, config = _broken_rows(seed, planted), _broken_config(planted, _max_length(tokenizer, seed))
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (root / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    setup = Setup(seed, root / "model", root / "data.jsonl", root / "config.json", config, rows)
    _PLANTED[str(setup.config_path)] = planted
    return setup, planted


def _planted(setup) -> tuple[str, ...]:
    """The failures planted in ``setup`` (one ``broken_setup`` wrote in this process)."""
    if not isinstance(setup, Setup):
        raise TypeError(f"setup is a {type(setup).__name__}, not a Setup — only the lesson's set-ups have "
                        "planted failures to compare with — pass broken_setup(seed)'s result.")
    try:
        return _PLANTED[str(setup.config_path)]
    except KeyError:
        raise ValueError(f"{setup.config_path} was not written by broken_setup in this process — only the "
                         "lesson's set-ups have planted failures to compare with — call "
                         "setup = broken_setup(seed) (again, after a kernel restart).") from None


def _expected_checks(planted) -> set[str]:
    """The doctor's check names that must fire on a set-up with these failures planted."""
    checks = {FAILURES[name][1] for name in planted} | {c for _, c in ALWAYS.values()}
    if {"long_prompts", "wrapped_packing"} <= set(planted):
        # wrapped packing truncates nothing (TRL 1.16): the long rows are split across packed rows, not
        # emptied — the doctor warns that their answers are packed apart from their prompts
        checks = (checks - {"fully-truncated"}) | {"answers-packed-apart"}
    return checks


def _check_report(report) -> Report:
    if not isinstance(report, Report):
        raise TypeError(f"report is a {type(report).__name__} — the lesson compares the doctor's findings — "
                        "pass diagnose(...) of the broken set-up.")
    return report


def expected_trl_error(setup: Setup) -> type[Exception] | None:
    """The exception TRL raises when it builds this set-up's trainer — ``ValueError`` for a template it
    cannot patch, ``RuntimeError`` for rows without assistant tokens (the template comes first) — or
    ``None``: TRL checks only these two of the planted failures. For the lesson's claim, no more."""
    planted = _planted(setup)
    return next((_TRL_REFUSES[name] for name in ("base_template", "renamed_roles") if name in planted), None)


def all_planted_found(setup: Setup, report: Report) -> bool:
    """Whether the doctor's ``report`` on ``setup`` names every failure planted in it, each by its own
    check (and the eos mismatch every base config has). For the lesson's claim, no more."""
    return _expected_checks(_planted(setup)) <= _check_report(report).checks()


# ---------------------------------------------------------------------------------------------
# What if: only some of the fixes (the doctor re-run on each choice, nothing trained)
# ---------------------------------------------------------------------------------------------

def _failure_check(name: str) -> tuple[str, str]:
    """``(lesson, the doctor's check)`` of a planted failure or of an always-present one."""
    return {**FAILURES, **ALWAYS}[name]


def _check_frame_args(setup, report, apply_fixes, model, tokenizer) -> list[str]:
    """The failure names of ``setup`` (its planted ones, then the always-present ones)."""
    names = list(_planted(setup)) + sorted(ALWAYS)
    _check_report(report)
    if not callable(apply_fixes):
        raise TypeError("apply_fixes must be a function (config, rows, report) -> (config, rows) — the "
                        "explorer applies it to the findings you switch on — pass the notebook's "
                        "apply_fixes.")
    validate.model_and_tokenizer(model, tokenizer)
    return names


def fixes_frame(setup: Setup, report: Report, apply_fixes, model, tokenizer, fixed) -> str:
    """The doctor's verdict when only the failures named in ``fixed`` are fixed.

    ``apply_fixes(config, rows, findings)`` (the notebook's own) fixes what ``findings`` names; it is
    handed the findings of ``report`` that belong to ``fixed``, then the doctor runs on the result with
    the loaded ``model``/``tokenizer`` (a fraction of a second: nothing is trained). Returns the verdict
    as text: errors and warnings, which planted failures are still found, and what a fix revealed.
    """
    names = _check_frame_args(setup, report, apply_fixes, model, tokenizer)
    validate.choices("fixed", list(fixed) if isinstance(fixed, (set, frozenset)) else fixed, names,
                     why="only the failures of this set-up can be fixed")
    return _fixes_frame(setup, report, apply_fixes, model, tokenizer, set(fixed), names)


def _fixes_frame(setup, report, apply_fixes, model, tokenizer, fixed: set, names: list[str]) -> str:
    wanted = {_failure_check(name)[1] for name in fixed}
    fixed_setup = apply_fixes(setup.config, setup.rows, Report(f for f in report if f.check in wanted))
    if not (isinstance(fixed_setup, tuple) and len(fixed_setup) == 2):
        raise TypeError(f"apply_fixes returned {type(fixed_setup).__name__}, not (config, rows) — the doctor "
                        "re-runs on the fixed config and rows — end apply_fixes with return config, rows.")
    config, rows = fixed_setup
    after = diagnose((model, tokenizer), rows, config)
    infos = [f.check for f in after if f.severity == "info"]
    label = ", ".join
    lines = [f"fixed: {label(n for n in names if n in fixed) or 'nothing'} · as planted: "
             f"{label(n for n in names if n not in fixed) or 'nothing'}",
             f"doctor: {len(after.errors)} error(s), {len(after) - len(after.errors) - len(infos)} "
             f"warning(s) → exit status {after.exit_code}"]
    width = max((len(f.check) for f in after if f.severity != "info"), default=0)
    lines += [f"  {f.severity.upper():<8}{f.check:<{width + 2}}{f.what}"
              for f in after if f.severity != "info"]
    if infos:
        lines.append(f"  (info: {', '.join(sorted(set(infos)))})")
    still = [n for n in names if _failure_check(n)[1] in after.checks()]
    lines.append(f"planted failures the doctor still finds: {label(still) or 'none'}")
    revealed = sorted((after.checks("error") | after.checks("warning")) - report.checks())
    if revealed:
        lines.append(f"revealed by these fixes (hidden before): {label(revealed)}")
    return "\n".join(lines)


def fixes_explorer(setup: Setup, report: Report, apply_fixes, model, tokenizer):
    """A "what if" over which fixes are applied (``viz.what_if``): one switch per failure planted in
    ``setup`` plus the always-present eos mismatch, "as planted" or "fixed"; each frame is
    ``fixes_frame`` — the doctor re-run on the partly fixed set-up. ``report``: the doctor's report on
    the broken set-up; ``apply_fixes``: the function that fixes what a report names."""
    names = _check_frame_args(setup, report, apply_fixes, model, tokenizer)
    switch = {"as planted": False, "fixed": True}
    return what_if(lambda **on: _fixes_frame(setup, report, apply_fixes, model, tokenizer,
                                             {n for n, v in on.items() if v}, names),
                   {name: switch for name in names},
                   descriptions={n: f"{n} (lesson {_failure_check(n)[0]})" for n in names})


# ---------------------------------------------------------------------------------------------
# The exercise's checker
# ---------------------------------------------------------------------------------------------

HINTS = {
    "template-unpatchable": "TRL recognises a template by exact string (lesson 04): the base model's "
                            "template differs from Instruct's in one sentence. Give SFTTrainer a template "
                            "with {% generation %} markers: config['chat_template_path'] = TRL's "
                            "qwen2_5_training.jinja.",
    "fully-truncated": "rows whose prompt fills max_length lose every graded token (lesson 05) and TRL drops "
                       "them without a word. Measure each prompt with the template TRL trains with (the "
                       "training template's system prompt is longer than the base one) and drop what does "
                       "not fit.",
    "max-length-below-prompts": "max_length must exceed a typical prompt (lesson 05), not only the answer.",
    "no-assistant-turns": "look at the roles of the rows the doctor lists: to the chat template 'gpt' is not "
                          "'assistant'. Renaming keeps the rows; dropping them throws data away.",
    "fp16-overflow-risk": "fp16 tops out at 65504 (lesson 06): use fp32 on a CPU (or bf16 on a GPU) and a "
                          "learning rate this model trains with (the config's base rate, 3e-3).",
    "packing-no-boundaries": "wrapped packing lets examples attend to each other (lesson 03): "
                             "packing_strategy='bfd' keeps the boundaries, packing=False avoids the "
                             "question.",
    "eos-mismatch": "generate() stops only on generation_config.eos_token_id (lesson 02): set "
                    "config['eos_token'] = '<|im_end|>', the token the template ends a turn with.",
    "stop-token-untrained": "the end-of-turn token must sit inside {% generation %} (lesson 02).",
    "trl-preparation": "TRL cannot tokenize the rows: read the error the doctor quotes.",
}


# Two hidden set-ups that, together, plant every failure (and long prompts in both: they interact with the
# template fix, whose system prompt is longer than the base template's).
CHECK_CASES = ((1001, ("base_template", "long_prompts", "renamed_roles")),
               (1002, ("fp16_hot_lr", "long_prompts", "wrapped_packing")))


def _check_cases(cases) -> list[tuple[int, tuple[str, ...]]]:
    """A non-empty list of ``(seed, planted names)``: a checker that grades no set-up would pass anything."""
    if isinstance(cases, (str, bytes, dict)) or not isinstance(cases, (list, tuple)) or not cases:
        got = "an empty list" if isinstance(cases, (list, tuple)) else type(cases).__name__
        raise ValueError(f"cases must be a non-empty list of (seed, planted failures), got {got} — a checker "
                         "that grades no set-up would pass any answer — leave cases out for the checker's "
                         "own hidden set-ups.")
    checked = []
    for i, case in enumerate(cases):
        if not (isinstance(case, (list, tuple)) and len(case) == 2):
            raise ValueError(f"cases[{i}]={case!r} is not a (seed, planted failures) pair — each case is one "
                             "set-up to draw — pass e.g. (1001, ('base_template', 'long_prompts')).")
        seed, planted = case
        validate.seed(f"cases[{i}] seed", seed)
        validate.choices(f"cases[{i}] planted", planted, sorted(FAILURES),
                         why="the capstone plants only these failures")
        checked.append((seed, tuple(planted)))
    return checked


@functools.lru_cache(maxsize=4)
def _hidden_setup(seed: int, planted: tuple) -> Setup:
    """The checker's set-ups, written once per process (the checker deep-copies what it hands out)."""
    return _broken_setup(seed, planted=list(planted))[0]


def _fix_cases(cases) -> list[Case]:
    out = []
    for seed, planted in cases:
        setup = _hidden_setup(seed, tuple(planted))
        label = f"seed {seed}: {', '.join(_planted(setup))}"
        out.append(Case((setup.config, setup.rows), setup, label=label))
    return out


def _evaluate(got, setup: Setup) -> tuple[str | None, str | None]:
    """(difference, misconception) for the learner's ``(config, rows)`` on ``setup``."""
    shape_ok = isinstance(got, tuple) and len(got) == 2
    if not (shape_ok and isinstance(got[0], dict) and isinstance(got[1], list)):
        return f"expected (config dict, list of rows), got {type(got).__name__}", "return config, rows"
    config, rows = got
    if config.get("assistant_only_loss") is not True:
        return ("assistant_only_loss is off", "turning assistant_only_loss off hides the template error but "
                "trains the model on the prompts and the system text: keep it, and fix the template instead.")
    if config.get("max_length") != setup.config["max_length"]:
        return (f"max_length={config.get('max_length')} (the budget is {setup.config['max_length']})",
                "the exercise keeps the memory budget: max_length stays. Find the rows that do not fit "
                "(measure each prompt with the template TRL will train with) and drop those.")
    learning_rate = config.get("learning_rate", 0)
    if isinstance(learning_rate, (int, float)) and learning_rate > 1e-2:
        return (f"learning_rate={config['learning_rate']}", "0.05 is the hot rate of lesson 06: fp32 only "
                "postpones the divergence. Use the base config's 3e-3.")
    if len(rows) < 0.8 * N_ROWS:
        return (f"only {len(rows)} of {N_ROWS} rows left", "only the broken rows may go (or be repaired): "
                "renaming roles keeps rows, and a larger max_length keeps long prompts.")
    try:
        report = diagnose(str(setup.model_dir), rows, config)
    except DoctorInputError as exc:
        return (f"the doctor rejects the fixed set-up: {exc}", "keep the rows in TRL's messages form and the "
                "config to SFTConfig's fields, with values of their types: the doctor's message names what.")
    # a check that could not run has not cleared the set-up: it counts against the fix like an error
    bad = [f for f in report if f.severity in ("error", "could-not-check") or (
        f.severity == "warning" and f.check not in ALLOWED_WARNINGS)]
    if bad:
        first = bad[0]
        difference = f"the doctor still reports {first.severity} {first.check}: {first.what}"
        return difference, HINTS.get(first.check)
    return None, None


def check_fix_setup(fn, cases=CHECK_CASES):
    """Checker: ``fn(config, rows, tokenizer) -> (config, rows)`` must leave the doctor with no error and
    no warning beyond the learning rate, on set-ups the notebook has not shown. ``cases``: the
    ``(seed, planted failures)`` of the set-ups to grade on (default: two hidden ones that, together,
    plant every failure)."""
    validate.function("fn", fn)  # not an answer yet (e.g. fix_setup(...) called): say so, do not grade it
    cases = _fix_cases(_check_cases(cases))
    for case in cases:  # the learner's function also gets the set-up's own tokenizer
        case.args = (copy.deepcopy(case.args[0]), copy.deepcopy(case.args[1]),
                     AutoTokenizer.from_pretrained(case.expected.model_dir))

    results = {}  # the doctor runs once per answer: compare and diagnose share its verdict

    def evaluate(got, setup):
        key = (id(got), setup.seed)
        if key not in results:
            results[key] = _evaluate(got, setup)
        return results[key]

    def compare(got, setup):
        return evaluate(got, setup)[0]

    def diagnose_answer(got, case):
        return evaluate(got, case.expected)[1]

    return run_check("fix_setup", fn, cases, compare=compare, diagnose=diagnose_answer,
                     hint="run diagnose() on your fixed set-up and read each finding's fix column.")
