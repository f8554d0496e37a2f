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
doctor to find. The truth lives with the reference answers (``answers/lesson08.py``, filled in by
``_broken_setup``, which also returns it, for the tests): the lesson's claims ask it through
``expected_trl_error`` and ``all_planted_found``, and ``fixes_explorer`` — shown after the doctor has
found them — switches each planted failure between "as planted" and "fixed" and shows what the doctor
then reports (``fixes_frame``). ``broken_rows`` gives the rows with the data failures you name.

``check_fix_setup`` is the exercise's checker: it draws set-ups the notebook has not shown, applies
the learner's ``fix_setup(config, rows, tokenizer)``, runs the doctor on the result and names the
misconception behind what is still wrong. Its reference answer: ``answers/lesson08.py``.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from .. import validate
from ..capstone import Setup, trl_training_template_path
from ..checks import Case, Hints, fresh_seeds, run_check
from ..data import filler_text, make_messages
from ..doctor import DoctorInputError, Report, diagnose
from ..model import give_base_convention, load_course_model
from ..viz import what_if
from .answers import lesson08 as answers

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
SHORT_CONTEXT_SHARE = 0.1  # of the rows: a one-word context line that fits (look-alikes of the long prompts)
BASE_CONFIG = {"assistant_only_loss": True, "max_length": 64, "per_device_train_batch_size": 8,
               "learning_rate": 3e-3, "max_steps": 60, "lr_scheduler_type": "constant"}
INSTRUCT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
BASE_SYSTEM = "You are a helpful assistant."
CONTROL_SYSTEM = "You are a concise assistant."  # the control set-up's own (healthy) training template
# a model of under a million parameters wants a learning rate a real one would not take
ALLOWED_WARNINGS = {"learning-rate"}
_TRL_REFUSES = {"base_template": ValueError, "renamed_roles": RuntimeError}  # TRL checks these two itself



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
    long_ids = set()
    if "long_prompts" in planted:
        long_ids = {i for i, r in enumerate(rows) if r["messages"][0]["content"].startswith("Context:")}
    if "renamed_roles" in planted:
        for i in rng.sample(range(N_ROWS), n_broken):
            for message in rows[i]["messages"]:
                if message["role"] == "assistant":
                    message["role"] = "gpt"  # ShareGPT's name for the assistant
    # Look-alikes of the long prompts that fit: a one-word context line. A row is dropped for its length,
    # measured, never for how it starts (their own random stream: the planted rows stay where they were).
    look = random.Random(f"short-context-{seed}")
    for i in look.sample(range(N_ROWS), int(SHORT_CONTEXT_SHARE * N_ROWS)):
        if i not in long_ids:
            user = rows[i]["messages"][0]
            user["content"] = f"Context: {filler_text(look, 1)}.\n{user['content']}"
    return rows


def _max_length(tokenizer, seed: int) -> int:
    """The set-up's ``max_length``: 18 tokens more than the longest ordinary row with TRL's training template
    (66 on tiny-qwen; at least 64), so every ordinary row fits whole — the short-context look-alikes too —
    and every long prompt does not (81 tokens and more) — a budget from the model's own token counts."""
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


# A colleague's own trainer class (exercise 1's set-up): its compute_loss takes each micro-batch's mean and
# ignores num_items_in_batch — lesson 01's and 07's failure, which only the doctor's split test can see.
TRAINER_MODULE, TRAINER_CLASS = "colleague_trainer", "ColleagueTrainer"
TRAINER_SOURCE = '''"""Our trainer: SFTTrainer with a loss we can read."""

import torch
from trl import SFTTrainer


class ColleagueTrainer(SFTTrainer):
    """The mean cross-entropy over the answer tokens of the batch."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"][:, 1:]
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"))
        logits = outputs.logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100)
        return (loss, outputs) if return_outputs else loss
'''


def _write_trainer(root: Path) -> str:
    """Write the colleague's trainer module into the set-up's folder and make it importable, as it is from
    their repository; returns the doctor's ``module:Class`` spec."""
    (root / f"{TRAINER_MODULE}.py").write_text(TRAINER_SOURCE, encoding="utf-8")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return f"{TRAINER_MODULE}:{TRAINER_CLASS}"


def _broken_setup(seed: int, directory=None, planted=None, trainer: bool = False,
                  control: bool = False) -> tuple[Setup, tuple[str, ...]]:
    """``(setup, planted)``: ``broken_setup`` and the names of the failures planted in it. ``trainer``: the
    colleague trains with their own trainer class (``setup.trainer``), under gradient accumulation;
    ``control``: a healthy set-up with settings a blanket fix would break (bfd packing, its own training
    template, the eos fix already made)."""
    if planted is None:
        planted = random.Random(seed).sample(sorted(FAILURES), N_PLANTED)
    planted = tuple(sorted(set(planted)))
    if directory is not None:  # the set-up's files would replace a folder's own
        validate.new_directory("directory", directory, what="the set-up's model, data and config")
    root = Path(directory or tempfile.mkdtemp(prefix="capstone-"))
    model, tokenizer = load_course_model()
    # eos_mismatch, planted in every set-up (ALWAYS): a COURSE_MODEL that ships the instruct convention has
    # no mismatch to find, so its copy is given the base one (lesson 02)
    give_base_convention(model, tokenizer)
    if "base_template" in planted:
        tokenizer.chat_template = tokenizer.chat_template.replace(INSTRUCT_SYSTEM, BASE_SYSTEM)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows, config = _broken_rows(seed, planted), _broken_config(planted, _max_length(tokenizer, seed))
    spec = None
    if trainer:
        spec = _write_trainer(root)
        config.update(per_device_train_batch_size=4, gradient_accumulation_steps=2)  # the same 8 rows a step
    if control:
        template = Path(trl_training_template_path()).read_text(encoding="utf-8")
        (root / "training_template.jinja").write_text(template.replace(INSTRUCT_SYSTEM, CONTROL_SYSTEM),
                                                       encoding="utf-8")
        config.update(packing=True, packing_strategy="bfd", eos_token="<|im_end|>",
                      chat_template_path=str(root / "training_template.jinja"))
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (root / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    setup = Setup(seed, root / "model", root / "data.jsonl", root / "config.json", config, rows, spec)
    answers.PLANTED[str(setup.config_path)] = planted  # the truth lives with the reference answers
    return setup, planted


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
    planted = answers.planted_in(setup)
    return next((_TRL_REFUSES[name] for name in ("base_template", "renamed_roles") if name in planted), None)


def all_planted_found(setup: Setup, report: Report) -> bool:
    """Whether the doctor's ``report`` on ``setup`` names every failure planted in it, each by its own
    check (and the eos mismatch every base config has). For the lesson's claim, no more."""
    return _expected_checks(answers.planted_in(setup)) <= _check_report(report).checks()


# ---------------------------------------------------------------------------------------------
# Exercise 1: findings first — another colleague's set-up, with their own trainer class
# ---------------------------------------------------------------------------------------------

ROW_CHECKS = ("no-assistant-turns",)  # the findings whose rows the learner names (all of them)
OPTIONAL_FINDINGS = {"learning-rate"}  # a toy model's rate: stating it or not is both fine


SHOWN_SEEDS = 1000  # another_setup below this seed is one a notebook shows: the colleague has a trainer class


def another_setup(seed: int = 0, directory=None) -> Setup:
    """Exercise 1's set-up: one of the config failures and one or both of the row failures, drawn by
    ``seed``. The set-ups a notebook shows (``seed < SHOWN_SEEDS``) and every second graded one have renamed
    roles and the colleague's own trainer class (``setup.trainer``, a ``"module:Class"`` the doctor can
    import); the others may have neither (``trainer`` None). The graded set-ups mix what the shown one has,
    so a dict written for it fails. Returns the set-up only: its findings are yours to state."""
    validate.seed("seed", seed)
    rng = random.Random(f"another-{seed}")
    # fresh_seeds are consecutive: of each graded pair one has the trainer class and renamed roles for sure
    full = seed < SHOWN_SEEDS or seed % 2 == 0
    planted = [rng.choice(("base_template", "fp16_hot_lr", "wrapped_packing"))]
    planted += ["long_prompts"] * (rng.random() < 0.5) + ["renamed_roles"] * (full or rng.random() < 0.5)
    if len(planted) == 1:
        planted.append("long_prompts")  # a failure in the rows, always
    return _broken_setup(seed + 500, directory, planted, trainer=full)[0]


def _compare_findings(got, setup: Setup) -> str | None:
    if not isinstance(got, dict) or not all(isinstance(k, str) for k in got):
        return (f"expected a dict {{check name: row ids or None}}, got {type(got).__name__} — e.g. "
                "{'eos-mismatch': None, 'no-assistant-turns': [3, 7, ...]}")
    checks, rows = answers.true_findings(setup, _expected_checks(answers.planted_in(setup)))
    stated = {k for k in got if type(k) is str} - OPTIONAL_FINDINGS  # plain str keys: no look-alike objects
    # Counts only, never names: a message that named the missing or the extra checks would let a dict of
    # every check name be cut down to the truth from the checker's own words.
    missing, extra = checks - stated, stated - checks
    if "trainer-accumulation" in missing:
        return ("the colleague trains with their own class (setup.trainer): the doctor runs lesson 01's "
                "split test on it only when you pass trainer=setup.trainer (--trainer on the command line)")
    if missing:
        return (f"{len(missing)} of the errors and warnings the doctor reports on this set-up are not in "
                "your dict: run it on the set-up's files and read every row")
    if extra:
        return (f"{len(extra)} of your findings do not fire on this set-up: state what the doctor measured "
                "here, not every check you know")
    for check in ROW_CHECKS:
        if check not in checks:
            continue
        ids = got[check]
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, set)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return f"{check}: expected the list of row ids it concerns, got {ids!r:.80}"
        if set(ids) != set(rows[check]):
            if set(ids) < set(rows[check]):
                return (f"{check}: {len(ids)} of its {len(rows[check])} rows — the doctor's evidence quotes "
                        "the first few ids; find them all in the rows (what do their messages share?)")
            wrong = len(set(ids) - set(rows[check]))
            return f"{check}: {wrong} of your row ids are not among the rows it concerns"
    return None


FINDINGS_HINTS = Hints(
    question="Did the doctor see everything the colleague runs — their data, their config, and their trainer "
             "class?",
    pointer="diagnose(model_dir, data_path, config_path, trainer=...) — section 3, and the set-up's trainer "
            "attribute; the row ids: the doctor quotes a few, the rows hold them all.",
    answer="report = diagnose(str(s.model_dir), s.data_path, s.config_path, trainer=s.trainer); findings = "
           "{f.check: None for f in report if f.severity in ('error', 'warning')}; where "
           "'no-assistant-turns' is among them, findings['no-assistant-turns'] = [i for i, r in "
           "enumerate(s.rows) if any(m['role'] == 'gpt' for m in r['messages'])].")


FINDINGS_CASES = 2  # set-ups per checker run


def check_findings(fn):
    """Checker for exercise 1: ``fn(setup) -> {check name: row ids or None}`` must name every error and
    warning the doctor reports, the colleague's trainer class included, and, for the checks about rows, all
    the rows they concern — on ``FINDINGS_CASES`` set-ups of ``another_setup``'s family drawn fresh on every
    run (``checks.fresh_seeds``: one with the colleague's trainer class, one without; their failures mixed),
    none of them the one the notebook shows. Graded against what was planted,
    not against the doctor; a wrong answer is told how many findings are missing or extra, never which."""
    validate.function("fn", fn)
    with tempfile.TemporaryDirectory(prefix="findings-") as root:  # the grader writes there, this side cleans
        return run_check("findings", lambda setup: fn(_importable(setup)), lambda: _findings_cases(root),
                         compare=_compare_findings, hint=FINDINGS_HINTS)


def _importable(setup: Setup) -> Setup:
    """``setup`` with its colleague's trainer module importable here, as ``_write_trainer`` made it in the
    grading process that wrote it (that process's ``sys.path`` is its own)."""
    folder = str(Path(setup.model_dir).parent)
    if setup.trainer and folder not in sys.path:
        sys.path.insert(0, folder)
    return setup


def _findings_cases(root: str) -> list[Case]:
    setups = (another_setup(seed, Path(root) / str(seed)) for seed in fresh_seeds(FINDINGS_CASES))
    return [Case((setup,), setup, label="another colleague's set-up") for setup in setups]


# ---------------------------------------------------------------------------------------------
# What if: only some of the fixes (the doctor re-run on each choice, nothing trained)
# ---------------------------------------------------------------------------------------------

def _failure_check(name: str) -> tuple[str, str]:
    """``(lesson, the doctor's check)`` of a planted failure or of an always-present one."""
    return {**FAILURES, **ALWAYS}[name]


def _check_frame_args(setup, report, apply_fixes, model, tokenizer) -> list[str]:
    """The failure names of ``setup`` (its planted ones, then the always-present ones)."""
    names = list(answers.planted_in(setup)) + sorted(ALWAYS)
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
                            "template differs from Instruct's in one sentence. SFTTrainer needs a template "
                            "with {% generation %} markers: the finding's fix column says which.",
    "fully-truncated": "rows whose prompt fills max_length lose every graded token (lesson 05) and TRL drops "
                       "them without a word. Measure each prompt with the template TRL trains with (the "
                       "training template's system prompt is longer than the base one) and drop what does "
                       "not fit.",
    "max-length-below-prompts": "max_length must exceed a typical prompt (lesson 05), not only the answer.",
    "no-assistant-turns": "look at the roles of the rows the doctor lists: to the chat template 'gpt' is not "
                          "'assistant'. Renaming keeps the rows; dropping them throws data away.",
    "fp16-overflow-risk": "fp16 tops out at 65504 (lesson 06), and a hot learning rate gets there sooner: "
                          "which precision does a CPU train in, and which rate did the other set-ups use?",
    "packing-no-boundaries": "wrapped packing lets examples attend to each other (lesson 03): which of "
                             "TRL's packing strategies keeps each example's boundaries?",
    "answers-packed-apart": "wrapped packing splits a long row across packed rows, its answer apart from its "
                            "prompt (lessons 03 and 05): the same packing fix as for the boundaries.",
    "eos-mismatch": "generate() stops only on generation_config.eos_token_id (lesson 02): which SFTConfig "
                    "field writes the template's end-of-turn token there?",
    "stop-token-untrained": "the end-of-turn token must sit inside {% generation %} (lesson 02).",
    "trl-preparation": "TRL cannot tokenize the rows: read the error the doctor quotes.",
}


FIX_HINTS = Hints(
    question="Which findings does the report name, and which settings and rows does each one concern? What "
             "does the set-up do right that a fix must leave alone?",
    pointer="Each finding's fix column (section 3), apply_fixes in section 5 — but max_length stays here: "
            "measure each row with the template TRL will train with, and keep every row that fits.",
    answer="for each finding in report.checks('error') | report.checks('warning'): template-unpatchable -> "
           "chat_template_path = trl_training_template_path(); eos-mismatch -> eos_token = '<|im_end|>'; "
           "fp16-overflow-risk -> fp16=False, learning_rate 3e-3; packing-no-boundaries or "
           "answers-packed-apart -> packing_strategy='bfd'; rename 'gpt' roles; drop the rows whose "
           "rendering with that template exceeds max_length.")


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


CONTROL_SEED = 1003  # the control set-up: healthy, with settings a blanket "fix everything" breaks


@functools.lru_cache(maxsize=4)
def _hidden_setup(seed: int, planted: tuple, control: bool = False) -> tuple[Setup, Report]:
    """The checker's set-ups and the doctor's report on each, written and measured once per process (the
    checker deep-copies what it hands out)."""
    setup = _broken_setup(seed, planted=list(planted), control=control)[0]
    return setup, diagnose(str(setup.model_dir), setup.rows, setup.config)


def _fix_cases(cases, control: bool) -> list[Case]:
    """One case per set-up, named by ``(seed, planted, control)``: the set-up is written and measured when the
    checker reaches it (an unfinished answer stops at the first, and costs one doctor run, not three)."""
    out = [Case((seed, tuple(planted), False), None, label=f"seed {seed}: {', '.join(sorted(set(planted)))}")
           for seed, planted in cases]
    if control:
        out.append(Case((CONTROL_SEED, (), True), None, tag="control",
                        label="a healthy set-up (bfd packing, its own training template)"))
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
    must_keep = N_ROWS - (int(BROKEN_SHARE * N_ROWS) if "long_prompts" in answers.planted_in(setup) else 0)
    if len(rows) < must_keep:
        return (f"{len(rows)} of {N_ROWS} rows left; {must_keep} fit max_length", "only the rows that do not "
                "fit may go: measure each row's length with the template TRL trains with — a row's first "
                "word says nothing about its length — and rename the 'gpt' roles, do not drop those rows.")
    if not answers.planted_in(setup):  # the control: its healthy settings must survive the fix
        for key in ("packing", "packing_strategy", "chat_template_path", "eos_token"):
            if config.get(key) != setup.config[key]:
                return (f"{key}={config.get(key)!r} (the set-up had {setup.config[key]!r})",
                        f"the doctor found nothing wrong with this set-up's {key}: a blanket fix throws a "
                        "healthy setting away (bfd packing keeps the boundaries; its training template is "
                        "its own). Fix only what the findings name.")
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


def check_fix_setup(fn):
    """Checker: ``fn(config, rows, tokenizer, report) -> (config, rows)`` — ``report`` is the doctor's on that
    set-up — must leave the doctor with no error and no warning beyond the learning rate, on set-ups the
    notebook has not shown (two hidden ones that, together, plant every failure, and a healthy set-up a
    blanket fix would break), and must keep every healthy setting and every row that fits."""
    return _check_fix_setup(fn)


def _check_fix_setup(fn, cases=CHECK_CASES, control: bool = True):
    """``check_fix_setup`` on other set-ups (the tests' entry: ``cases``, the ``(seed, planted failures)`` of
    each; ``control``: also the healthy one). Not the learner's: a keyword that narrows the cases would let
    a partial fix pass."""
    validate.function("fn", fn)  # not an answer yet (e.g. fix_setup(...) called): say so, do not grade it
    cases = _fix_cases(_check_cases(cases), control)

    def run_one(seed, planted, is_control):
        """The learner's answer on one set-up, with the set-up itself for the comparison."""
        setup, report = _hidden_setup(seed, planted, is_control)
        tokenizer = AutoTokenizer.from_pretrained(setup.model_dir)  # the set-up's own tokenizer and findings
        return fn(copy.deepcopy(setup.config), copy.deepcopy(setup.rows), tokenizer, report), setup

    results = {}  # the doctor runs once per answer: compare and diagnose share its verdict

    def evaluate(got):
        answer, setup = got
        key = (id(answer), setup.seed)
        if key not in results:
            results[key] = _evaluate(answer, setup)
        return results[key]

    def compare(got, _expected):
        return evaluate(got)[0]

    def diagnose_answer(got, _case):
        return evaluate(got)[1]

    # a ready list, graded in this process: the cases hide nothing (expected None; the doctor grades the fix)
    return run_check("fix_setup", run_one, cases, compare=compare, diagnose=diagnose_answer, hint=FIX_HINTS)
