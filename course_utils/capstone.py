"""Lesson 08 (capstone): a broken fine-tuning set-up with failures planted from several lessons.

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

``fixes_explorer`` switches each fix on or off and shows what the doctor then reports (``fixes_frame``).
``check_fix_setup`` is the exercise's checker: it draws set-ups the notebook has not shown, applies
the learner's ``fix_setup(config, rows, tokenizer)``, runs the doctor on the result and names the
misconception behind what is still wrong.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .checks import Case, run_check

FAILURES = {  # name -> (lesson, the doctor's check that must find it)
    "base_template": ("04", "template-unpatchable"),
    "long_prompts": ("05", "fully-truncated"),
    "renamed_roles": ("04", "no-assistant-turns"),
    "fp16_hot_lr": ("06", "fp16-overflow-risk"),
    "wrapped_packing": ("03", "packing-no-boundaries"),
}
ALWAYS = {"eos_mismatch": ("02", "eos-mismatch")}
N_PLANTED = 3
N_ROWS = 240
BROKEN_SHARE = 0.15  # of the rows, for the data failures
BASE_CONFIG = {"assistant_only_loss": True, "max_length": 64, "per_device_train_batch_size": 8,
               "learning_rate": 3e-3, "max_steps": 60, "lr_scheduler_type": "constant"}
INSTRUCT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
BASE_SYSTEM = "You are a helpful assistant."
ALLOWED_WARNINGS = {"learning-rate"}  # a 0.6 M-parameter model wants a rate a real one would not take


@dataclass
class Setup:
    """A set-up on disk: ``model_dir``, ``data_path`` (JSONL), ``config_path`` (JSON), and in memory."""

    seed: int
    planted: list[str]
    model_dir: Path
    data_path: Path
    config_path: Path
    config: dict = field(repr=False)
    rows: list[dict] = field(repr=False)

    @property
    def expected_checks(self) -> set[str]:
        """The doctor's check names that must fire on this set-up."""
        return {FAILURES[name][1] for name in self.planted} | {c for _, c in ALWAYS.values()}

    def cli(self) -> str:
        return (f"python -m course_utils.doctor --model {self.model_dir} --data {self.data_path} "
                f"--config {self.config_path}")


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r} must be an int — it draws which failures are planted — pass e.g. "
                         "seed=int(os.environ.get('COURSE_SEED', 0)).")


def broken_rows(seed: int, planted) -> list[dict]:
    """``N_ROWS`` chats in TRL's ``messages`` form, with the planted data failures in some rows."""
    from .data import filler_text, make_messages

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


def broken_config(planted) -> dict:
    config = dict(BASE_CONFIG)
    if "fp16_hot_lr" in planted:
        config.update(fp16=True, learning_rate=0.05)
    if "wrapped_packing" in planted:
        config.update(packing=True, packing_strategy="wrapped")
    return config


def broken_setup(seed: int = 0, directory=None, planted=None) -> Setup:
    """Draw ``N_PLANTED`` failures with ``seed`` (or plant the ``planted`` names) and write the set-up
    under ``directory`` (a temporary directory by default)."""
    from .model import load_course_model

    _check_seed(seed)
    if planted is None:
        planted = random.Random(seed).sample(sorted(FAILURES), N_PLANTED)
    unknown = set(planted) - set(FAILURES)
    if unknown:
        raise ValueError(f"unknown failure(s) {sorted(unknown)} — the capstone plants {sorted(FAILURES)} — "
                         "pick from those.")
    planted = sorted(planted)
    root = Path(directory or tempfile.mkdtemp(prefix="capstone-"))
    model, tokenizer = load_course_model()
    if "base_template" in planted:
        tokenizer.chat_template = tokenizer.chat_template.replace(INSTRUCT_SYSTEM, BASE_SYSTEM)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows, config = broken_rows(seed, planted), broken_config(planted)
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (root / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return Setup(seed, planted, root / "model", root / "data.jsonl", root / "config.json", config, rows)


def trl_training_template_path() -> str:
    """TRL's Qwen2.5 training template (``{% generation %}`` markers, Instruct text) as a file path."""
    import trl

    return str(Path(trl.__file__).parent / "chat_templates" / "qwen2_5_training.jinja")


# ---------------------------------------------------------------------------------------------
# What if: only some of the fixes (the doctor re-run on each choice, nothing trained)
# ---------------------------------------------------------------------------------------------

def _failure_check(name: str) -> tuple[str, str]:
    """``(lesson, the doctor's check)`` of a planted failure or of an always-present one."""
    return {**FAILURES, **ALWAYS}[name]


def fixes_frame(setup: Setup, report, apply_fixes, model, tokenizer, fixed) -> str:
    """The doctor's verdict when only the failures named in ``fixed`` are fixed.

    ``apply_fixes(config, rows, findings)`` (the notebook's own) fixes what ``findings`` names; it is
    handed the findings of ``report`` that belong to ``fixed``, then the doctor runs on the result with
    the loaded ``model``/``tokenizer`` (a fraction of a second: nothing is trained). Returns the verdict
    as text: errors and warnings, which planted failures are still found, and what a fix revealed.
    """
    from .doctor import Report, diagnose

    fixed, names = set(fixed), setup.planted + sorted(ALWAYS)
    if not fixed <= set(names):
        raise ValueError(f"fixed names {sorted(fixed - set(names))}, which are not failures of this set-up "
                         f"{names} — only what is there can be fixed — pick from those.")
    wanted = {_failure_check(name)[1] for name in fixed}
    config, rows = apply_fixes(setup.config, setup.rows, Report(f for f in report if f.check in wanted))
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


def fixes_explorer(setup: Setup, report, apply_fixes, model, tokenizer):
    """A "what if" over which fixes are applied (``viz.what_if``): one switch per failure planted in
    ``setup`` plus the always-present eos mismatch, "as planted" or "fixed"; each frame is
    ``fixes_frame`` — the doctor re-run on the partly fixed set-up. ``report``: the doctor's report on
    the broken set-up; ``apply_fixes``: the function that fixes what a report names."""
    from . import validate
    from .doctor import Report
    from .viz import what_if

    if not isinstance(setup, Setup):
        raise TypeError(f"setup is a {type(setup).__name__} — the explorer fixes the failures planted in a "
                        "set-up — pass broken_setup(seed)'s result.")
    if not isinstance(report, Report):
        raise TypeError(f"report is a {type(report).__name__} — the fixes are read from the doctor's "
                        "findings — pass diagnose(...) of the broken set-up.")
    if not callable(apply_fixes):
        raise TypeError("apply_fixes must be a function (config, rows, report) -> (config, rows) — the "
                        "explorer applies it to the findings you switch on — pass the notebook's "
                        "apply_fixes.")
    validate.model_and_tokenizer(model, tokenizer)
    names = setup.planted + sorted(ALWAYS)
    switch = {"as planted": False, "fixed": True}
    return what_if(lambda **on: fixes_frame(setup, report, apply_fixes, model, tokenizer,
                                            {n for n, v in on.items() if v}),
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
    "config-keys": "a config key is misspelt: SFTConfig would refuse it.",
}


# Two hidden set-ups that, together, plant every failure (and long prompts in both: they interact with the
# template fix, whose system prompt is longer than the base template's).
CHECK_CASES = ((1001, ("base_template", "long_prompts", "renamed_roles")),
               (1002, ("fp16_hot_lr", "long_prompts", "wrapped_packing")))


@functools.lru_cache(maxsize=4)
def _hidden_setup(seed: int, planted: tuple) -> Setup:
    """The checker's set-ups, written once per process (the checker deep-copies what it hands out)."""
    return broken_setup(seed, planted=list(planted))


def _fix_cases(cases) -> list[Case]:
    out = []
    for seed, planted in cases:
        setup = _hidden_setup(seed, tuple(planted))
        out.append(Case((setup.config, setup.rows), setup, label=f"seed {seed}: {', '.join(setup.planted)}"))
    return out


def _evaluate(got, setup: Setup) -> tuple[str | None, str | None]:
    """(difference, misconception) for the learner's ``(config, rows)`` on ``setup``."""
    from .doctor import DoctorInputError, diagnose

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
    if config.get("learning_rate", 0) > 1e-2:
        return (f"learning_rate={config['learning_rate']}", "0.05 is the hot rate of lesson 06: fp32 only "
                "postpones the divergence. Use the base config's 3e-3.")
    if len(rows) < 0.8 * N_ROWS:
        return (f"only {len(rows)} of {N_ROWS} rows left", "only the broken rows may go (or be repaired): "
                "renaming roles keeps rows, and a larger max_length keeps long prompts.")
    try:
        report = diagnose(str(setup.model_dir), rows, config)
    except DoctorInputError as exc:
        return f"the doctor rejects the fixed set-up: {exc}", "keep the rows in TRL's messages form."
    bad = [f for f in report if f.severity == "error" or (f.severity == "warning"
                                                          and f.check not in ALLOWED_WARNINGS)]
    if bad:
        first = bad[0]
        difference = f"the doctor still reports {first.severity} {first.check}: {first.what}"
        return difference, HINTS.get(first.check)
    return None, None


def check_fix_setup(fn, cases=CHECK_CASES):
    """Checker: ``fn(config, rows, tokenizer) -> (config, rows)`` must leave the doctor with no error and
    no warning beyond the learning rate, on set-ups the notebook has not shown."""
    from transformers import AutoTokenizer

    cases = _fix_cases(cases)
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

    def diagnose(got, case):
        return evaluate(got, case.expected)[1]

    return run_check("fix_setup", fn, cases, compare=compare, diagnose=diagnose,
                     hint="run diagnose() on your fixed set-up and read each finding's fix column.")
