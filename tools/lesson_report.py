"""Run every solution notebook under nbval, one at a time, and print a per-lesson table (pass/fail, time,
first failure), with the versions that differ from the course's pins.

    python -m tools.lesson_report                      # all lessons, with this interpreter
    python -m tools.lesson_report solutions/01_*.ipynb # some
    make test-latest      # in a venv with the newest TRL/transformers: what drifted, per lesson
    tools/gpu_check.sh  # on a GPU machine (COURSE_DEVICE=cuda): what holds there

A report, not a gate: it exits 0 whatever the lessons do (``--strict``: 1 if one fails), so a
canary that finds drift never breaks ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tools import ROOT
from tools.notebook_runner import nbval


def drifted_versions(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """``name pinned -> installed`` for every pinned package whose installed version differs."""
    lines = []
    for requirement in tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]:
        name, _, pinned = requirement.partition("==")
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = "missing"
        if installed.split("+")[0] != pinned:
            lines.append(f"{name} {pinned} -> {installed}")
    return lines


def first_failure(output: str) -> str:
    """The most telling line of a failed nbval run: the assertion or exception message."""
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # nbval colours tracebacks
    for pattern in (r"^E?\s*(AssertionError.*)$", r"^E?\s*(\w+Error: .*)$", r"^E?\s*(\w+Exception.*)$",
                    r"^(FAILED .*)$"):
        found = re.findall(pattern, output, re.MULTILINE)
        if found:
            return found[-1].strip()[:150]
    return output.strip().splitlines()[-1][:150] if output.strip() else "no output"


def run_lesson(path: Path, timeout: int) -> tuple[str, float, str]:
    """``(PASS/FAIL/TIMEOUT, seconds, first failure or '')`` for one solution notebook under nbval."""
    code, output, seconds = nbval(path, timeout=timeout * 3, cell_timeout=timeout, extra=("-x",))
    if code == -1:
        return "TIMEOUT", seconds, f"over {timeout * 3} s"
    return ("PASS", seconds, "") if code == 0 else ("FAIL", seconds, first_failure(output))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Per-lesson pass/fail table of the solution notebooks.")
    parser.add_argument("paths", nargs="*", help="solution notebooks (default: all)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a lesson fails")
    args = parser.parse_args(argv)
    paths = [Path(p).resolve() for p in args.paths] or sorted((ROOT / "solutions").glob("*.ipynb"))
    device = os.environ.get("COURSE_DEVICE", "cpu")
    print(f"Python {sys.version.split()[0]}, COURSE_DEVICE={device}, "
          f"COURSE_MODEL={os.environ.get('COURSE_MODEL') or '(the embedded course model)'}")
    drift = drifted_versions()
    print("versions that differ from the pins: " + ("; ".join(drift) if drift else "none"))
    print("\n| lesson | result | time (s) | first failure |\n|---|---|---|---|")
    failed = 0
    for path in paths:
        result, seconds, why = run_lesson(path, args.timeout)
        failed += result != "PASS"
        print(f"| {path.stem} | {result} | {seconds:.0f} | {why} |", flush=True)
    print(f"\n{len(paths) - failed} of {len(paths)} lessons pass.")
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
