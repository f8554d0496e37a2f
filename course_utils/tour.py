"""Lesson 00 (tour): the environment check and the first exercise's checker."""

from __future__ import annotations

import os
import platform
import random
import re
from importlib import metadata

from .checks import Case, run_check
from .data import IGNORE_INDEX

DISTRIBUTION = "sft-failure-lab"


def pinned_versions() -> dict[str, str]:
    """``{package: version}`` for every ``==`` pin of the installed course (from pyproject.toml)."""
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"the course package {DISTRIBUTION!r} is not installed in this Python "
            f"({platform.python_version()}) "
            "— the check compares installed versions with its pins — run `make lab` (or "
            "`pip install -e .`) and pick the .venv kernel."
        ) from exc
    pins = {}
    for req in requirements:
        if "extra ==" in req:  # optional extras (the browser test's playwright): no lesson needs them
            continue
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^;\s]+)", req)
        if match:
            pins[match.group(1)] = match.group(2)
    return pins


def check_environment(load_model: bool = True) -> list[tuple[str, bool, str]]:
    """Print one ``[OK]``/``[FAIL]`` line per check and return ``(name, ok, detail)`` rows.

    Checks: the Python version, each pinned package at its pinned version, the device torch will
    use, that the hub is off (nothing will download), and that the course model loads.
    """
    rows = [("python 3.11 or 3.12", platform.python_version_tuple()[:2] in (("3", "11"), ("3", "12")),
             platform.python_version())]
    for package, wanted in pinned_versions().items():
        try:
            found = metadata.version(package)
        except metadata.PackageNotFoundError:
            found = "missing"
        rows.append((f"{package}=={wanted}", found.split("+")[0] == wanted, found))
    import torch

    device = os.environ.get("COURSE_DEVICE") or "cpu"
    rows.append(("device", device == "cpu" or torch.cuda.is_available(),
                 f"{device} (CUDA available: {torch.cuda.is_available()})"))
    rows.append(("offline (HF_HUB_OFFLINE=1)", os.environ.get("HF_HUB_OFFLINE") == "1",
                 os.environ.get("HF_HUB_OFFLINE", "unset")))
    if load_model:
        from .model import load_course_model

        try:
            model, _ = load_course_model()
            rows.append(("course model loads", True,
                         f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters"))
        except Exception as exc:  # report, don't crash the tour
            rows.append(("course model loads", False, str(exc)[:200]))
    for name, ok, detail in rows:
        print(f"[{'OK' if ok else 'FAIL'}] {name:<32} {detail}")
    return rows


# ------------------------------------------------------------------------------------------------
# Exercise 00: count the tokens that carry loss
# ------------------------------------------------------------------------------------------------

def _count_cases(seed: int = 1234) -> list[Case]:
    import torch

    rng = random.Random(seed)
    cases = []
    for rows, width in ((1, 7), (3, 12), (4, 30)):
        labels = torch.tensor([[rng.randrange(500) if rng.random() < 0.4 else IGNORE_INDEX
                                for _ in range(width)] for _ in range(rows)])
        labels[0, :2] = IGNORE_INDEX  # a prompt always starts masked
        cases.append(Case((labels,), int((labels != IGNORE_INDEX).sum()), label=f"{rows}x{width} labels"))
    all_masked = torch.full((2, 5), IGNORE_INDEX)
    cases.append(Case((all_masked,), 0, label="every label is -100"))
    return cases


def _diagnose_count(got, case: Case):
    labels = case.args[0]
    if got == int((labels == IGNORE_INDEX).sum()):
        return "you counted the -100 labels: those are the tokens that carry NO loss."
    if got == labels.numel():
        return "you counted every position; only labels != -100 carry loss."
    if got == int((labels[:, 1:] != IGNORE_INDEX).sum()):
        return "close: you skipped the first column. Count every label that is not -100."
    return None


def check_count_trained_tokens(fn):
    """Checker for lesson 00's exercise: ``fn(labels) -> int`` counts labels that are not -100."""
    return run_check("count_trained_tokens", fn, _count_cases(), diagnose=_diagnose_count,
                     compare=lambda got, exp: None if got == exp and not isinstance(got, bool)
                     else f"expected {exp}, got {got!r}",
                     hint="a token carries loss exactly when its label is not -100; "
                          "`(labels != -100).sum()` counts them (return a Python int).")
