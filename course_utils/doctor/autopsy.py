"""The autopsy of a finished run: ``python -m course_utils.doctor --run OUTPUT_DIR`` (lessons 01, 05, 06, 08).

It reads the ``log_history`` the Trainer wrote to ``trainer_state.json`` — at the top of the output
directory after ``trainer.save_state()``, and in each ``checkpoint-N/``, which is where ``trl sft`` leaves it
(the last checkpoint's history holds every earlier entry) — and judges it with ``course_utils.run_rules``,
the rules ``SFTWatch`` applies while a run trains: a run that had no watch gets the same verdict afterwards.

``max_grad_norm`` (for the clip rule) is read from the run's ``training_args.bin`` without unpickling it
(``pickletools`` walks the opcodes: nothing in the file is executed, and no torch is needed); a
``--config`` with ``max_grad_norm`` overrides it; otherwise TrainingArguments' default, 1.0, and the
finding says so. No torch, no transformers: reading JSON is all it does.
"""

from __future__ import annotations

import json
import pickletools
import re
import zipfile
from pathlib import Path

from .. import run_rules, validate
from .inputs import DoctorInputError
from .report import Finding, Report

STATE = "trainer_state.json"
DEFAULT_MAX_GRAD_NORM = 1.0  # transformers.TrainingArguments' default


def autopsy(output_dir, config: dict | None = None) -> Report:
    """The verdicts of ``run_rules.judge`` on the run in ``output_dir`` (a Trainer's output directory, one of
    its ``checkpoint-N`` directories, or a ``trainer_state.json``), as the doctor's ``Report``. Raises
    ``DoctorInputError`` when there is no readable trainer state."""
    state_path, checkpoints = find_state(output_dir)
    state = _read_state(state_path)
    log = state["log_history"]
    max_grad_norm, source = _max_grad_norm(state_path.parent, config or {})
    fp16 = _fp16(state_path.parent, config or {})
    logged = sum("loss" in e for e in log)
    try:  # a log of only a summary or nothing logged: could-not-check below; a text loss: bad input
        verdicts = (run_rules.judge(log, max_grad_norm or 0, fp16=fp16)
                    if logged or any("eval_loss" in e for e in log) else [])
    except ValueError as exc:
        raise DoctorInputError(f"{state_path}'s log_history cannot be judged: {exc}") from None
    findings = [Finding(v.severity, v.id, v.what, v.evidence, v.fix, v.lesson) for v in verdicts]
    if not logged:  # nothing trained was logged: no rule has a step to judge
        findings.append(Finding(
            "could-not-check", "run-log", f"{state_path} logs no training step ({len(log)} entries, "
            f"{sum('eval_loss' in e for e in log)} evaluations): the run rules had nothing to judge",
            "the Trainer writes a log entry every logging_steps optimizer steps; a run saved before its "
            "first log, or one that logged only evaluations, leaves none", "log training steps "
            "(logging_steps=1 for per-step verdicts) and read a state saved after them", "08"))
    ended = state.get("global_step")
    top = Path(output_dir) / STATE if Path(output_dir).is_dir() else None
    stale = (f"; the top-level {STATE} (global_step {_global_step(top):g}) is older than this one: read "
             f"{state_path.parent.name}'s" if top and top.is_file() and top != state_path else "")
    planned = state.get("max_steps")
    findings.append(Finding(
        "info", "run-checkpoints", f"read {state_path} ({logged} logged training steps, "
        f"{sum('eval_loss' in e for e in log)} evaluations); the run ended at step {ended}"
        + (f" of {planned}" if planned else ""),
        f"checkpoints found: {checkpoints or 'none'}{stale}; max_grad_norm={max_grad_norm} ({source}); the "
        "rules are SFTWatch's (course_utils.run_rules)",
        "log every step (logging_steps=1) for per-step verdicts; a run stopped before max_steps stopped "
        "early "
        "(SFTWatch, a crash, or a time limit)", "08"))
    severities = ("error", "could-not-check", "warning", "info")
    return Report(sorted(findings, key=lambda f: severities.index(f.severity)))


def find_state(output_dir) -> tuple[Path, list[str]]:
    """``(the trainer_state.json to read, the checkpoint directories found)``: of the top-level state and
    the last checkpoint's (the highest N of checkpoint-N), the one with the highest global_step — a
    top-level state from an earlier run (or an earlier save_state) is older than a later checkpoint; on a
    tie, the top-level one (save_state after training)."""
    if not isinstance(output_dir, (str, Path)) or not str(output_dir).strip():
        raise DoctorInputError(f"--run must be a path, got {output_dir!r} — the autopsy reads the Trainer's "
                               "output directory — pass e.g. --run outputs/my-run.")
    path = Path(output_dir)
    if path.is_file():
        if path.name != STATE:
            raise DoctorInputError(f"{path} is not a {STATE} — the autopsy reads the Trainer's log history — "
                                   "pass the output directory or its trainer_state.json.")
        return path, []
    if not path.is_dir():
        raise DoctorInputError(f"run directory {str(path)!r} does not exist — the autopsy reads the "
                               f"Trainer's "
                               "output_dir — pass the directory you trained into.")
    numbered = sorted((int(m.group(1)), p) for p in path.iterdir()
                      if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / STATE).is_file())
    names = [p.name for _, p in numbered]
    last = [numbered[-1][1] / STATE] if numbered else []
    candidates = [c for c in (path / STATE, *last) if c.is_file()]
    if candidates:
        return max(candidates, key=lambda c: (_global_step(c), c.parent == path)), names
    raise DoctorInputError(f"no {STATE} in {path} nor in a checkpoint-N/ below it — the Trainer writes it at "
                           "each save (save_strategy='steps'/'epoch') and on trainer.save_state() — save "
                           "checkpoints, or call trainer.save_state() after training.")


def _global_step(path: Path) -> float:
    """The state's global_step (-1 when unreadable: the other candidate wins, or reading it says why)."""
    try:
        step = json.loads(path.read_text(encoding="utf-8")).get("global_step")
    except (OSError, ValueError, AttributeError):
        return -1
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) else -1


def _read_state(path: Path) -> dict:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DoctorInputError(f"{path} is not valid JSON ({exc}) — the autopsy reads its log_history — "
                               "pass a trainer_state.json the Trainer wrote.") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list) or not all(isinstance(e, dict) for e in history):
        raise DoctorInputError(f"{path} has no log_history list — it is not a Trainer's state — pass the "
                               "trainer_state.json of a transformers / TRL run.")
    return state


def _max_grad_norm(run_dir: Path, config: dict) -> tuple[float, str]:
    if config.get("max_grad_norm") is not None:
        try:
            return validate.number("--config max_grad_norm", config["max_grad_norm"], minimum=0, why="it is "
                                   "the clip threshold the run trained with (0: no clipping)",
                                   fix="write the run's value, e.g. \"max_grad_norm\": 1.0"), "from --config"
        except ValueError as exc:
            raise DoctorInputError(str(exc)) from None
    for candidate in (run_dir / "training_args.bin", run_dir.parent / "training_args.bin"):
        value = pickled_number(candidate, "max_grad_norm")
        if value is not None:
            return value, f"read from {candidate}"
    return DEFAULT_MAX_GRAD_NORM, "TrainingArguments' default: no training_args.bin, no --config"


def _fp16(run_dir: Path, config: dict) -> bool | None:
    """Whether the run trained with fp16 mixed precision: --config's fp16, else training_args.bin's; None
    when neither says (the GradScaler rule then says it cannot know)."""
    if isinstance(config.get("fp16"), bool):
        return config["fp16"]
    for candidate in (run_dir / "training_args.bin", run_dir.parent / "training_args.bin"):
        value = pickled_number(candidate, "fp16")
        if isinstance(value, bool):
            return value
    return None


def pickled_number(path: Path, field: str) -> float | bool | None:
    """The number (or True/False) stored for ``field`` in a ``torch.save``d TrainingArguments (a zip holding
    a pickle), read from the pickle's opcodes — nothing in the file is executed. None when absent or
    unreadable."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            ops = list(pickletools.genops(archive.read(name)))
    except (OSError, zipfile.BadZipFile, StopIteration, ValueError):
        return None
    for i, (op, arg, _) in enumerate(ops):
        if arg == field and "UNICODE" in op.name:
            for later, value, _ in ops[i + 1:i + 4]:
                if later.name in ("BINFLOAT", "BININT", "BININT1", "BININT2", "LONG1"):
                    return float(value)
                if later.name in ("NEWTRUE", "NEWFALSE"):
                    return later.name == "NEWTRUE"
                if "PUT" not in later.name and later.name != "MEMOIZE":
                    return None
    return None
