"""Each solution notebook's run time as a multiple of the import floor, measured in one run.

    python -m tools.floor_benchmark                       # every solution notebook, 3 floor runs
    python -m tools.floor_benchmark solutions/02_*.ipynb  # some
    python -m tools.floor_benchmark --write INSTRUCTORS.md   # also refresh the table between its markers

The *floor* is what no lesson can go below: a fresh kernel that imports torch, transformers, TRL and datasets
and loads the course model (``FLOOR_CELLS``). A lesson's *ratio* is its whole run (kernel start to last cell,
as ``tools.notebook_runner.execute`` times it) divided by the floor's median, both measured in this process on
this machine a few seconds apart, so a slower or busier machine moves both. The course's goal is a ratio of at
most ``GOAL`` for every lesson (issue 46); the script exits 1 when one is over, so a maintainer sees it, but
it is a benchmark, not a test: `make test` does not run it (a busy machine would make it flaky).

Threads: each kernel gets ``OMP_NUM_THREADS`` = the cores this process may use (``--threads`` to change it),
what a learner's kernel uses when nothing is set — torch takes every core, and the lessons no longer pin one
thread (on a quiet 2-core machine two threads train the course model ~1.5x faster: measured in lesson 09's
runs). ``make test`` sets 1 instead: it runs two notebooks at once, and two threads each on two cores made an
SFTTrainer run 10-30x slower. The floor is import-bound, so its figure barely moves with the threads.

Run it on a quiet machine: the load average at the start is printed with the table, and a load above the
core count makes every figure meaningless.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import nbformat

from tools import ROOT, notebook_runner
from tools.run_solutions import machine

GOAL = 4.0
# The floor stays what it was when issue 46 set the goal, so that ratios compare across days. Its kernel gets
# the course's settings from its environment (notebook_runner) and does not call use_course_defaults(): in a
# lesson kernel the first load_course_model also imports TRL's trainer and freezes the heap
# (course_utils.freeze_lesson_imports), ~1 s a lesson pays for its training runs. It imports datasets (with
# pandas, ~0.4 s), which load_course_model did then and every lesson does (TRL's trainer imports it).
FLOOR_CELLS = (
    "import torch, transformers, trl, datasets  # what every lesson imports\n"
    "from course_utils import load_course_model\n"
    "model, tokenizer = load_course_model()",
)
TABLE_BEGIN = "<!-- floor:begin (python -m tools.floor_benchmark --write FILE) -->"
TABLE_END = "<!-- floor:end -->"


def floor_seconds(runs: int = 3) -> list[float]:
    """``runs`` timings of the floor notebook, each in a fresh kernel (the first pays any cold cache)."""
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ValueError(f"runs={runs!r}: the floor is timed at least once — "
                         "pass a positive int (3 is usual)")
    times = []
    for _ in range(runs):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in FLOOR_CELLS])
        times.append(notebook_runner.execute(nb, where=ROOT / "solutions")[1])
    return times


def lesson_seconds(path: Path) -> float:
    """One whole run of a solution notebook, outputs discarded (the file is not changed)."""
    return notebook_runner.execute(path)[1]


def table(floor: list[float], lessons: dict[str, float], where: str) -> str:
    """The Markdown table: each lesson's seconds and its ratio to the floor's median."""
    base = statistics.median(floor)
    rows = [f"| `{name}` | {sec:.1f} | {sec / base:.1f} | {'yes' if sec / base <= GOAL else '**no**'} |"
            for name, sec in lessons.items()]
    return "\n".join([
        f"Measured on: {where}.",
        "Import floor (a kernel importing torch, transformers, TRL and datasets and loading the course "
        f"model): median {base:.1f} s of {len(floor)} runs ({', '.join(f'{t:.1f}' for t in floor)}).", "",
        f"| notebook | run time (s) | × floor | ≤ {GOAL:g}× |", "|---|---|---|---|", *rows])


def write_table(path: Path, text: str) -> None:
    """Replace the part of ``path`` between the floor markers with ``text``."""
    body = path.read_text()
    if TABLE_BEGIN not in body or TABLE_END not in body:
        raise SystemExit(f"{path}: no floor markers — add the lines {TABLE_BEGIN!r} and {TABLE_END!r} "
                         "where the table belongs, then run again.")
    head, rest = body.split(TABLE_BEGIN, 1)
    path.write_text(f"{head}{TABLE_BEGIN}\n{text}\n{TABLE_END}{rest.split(TABLE_END, 1)[1]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Solution notebooks' run times as multiples of the import floor.")
    parser.add_argument("paths", nargs="*", help="solution notebooks (default: all)")
    parser.add_argument("--floor-runs", type=int, default=3,
                        help="how many times the floor is timed (median)")
    parser.add_argument("--write", metavar="FILE", type=Path,
                        help="refresh the table in FILE between its markers")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="OMP_NUM_THREADS of every kernel (default: the cores this process may use, "
                             "what a learner's kernel gets)")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths] or sorted((ROOT / "solutions").glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)} — "
                     "give paths like solutions/02_eos_never_stops.ipynb")
    if args.floor_runs < 1:
        parser.error(f"--floor-runs {args.floor_runs}: time the floor at least once (3 is usual)")
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: a kernel needs at least one thread (default: every core)")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # every kernel inherits it; the table's header names it
    where = machine()
    floor = floor_seconds(args.floor_runs)
    print(f"floor: {', '.join(f'{t:.1f}' for t in floor)} s", flush=True)
    lessons = {}
    for path in paths:
        lessons[path.name] = sec = lesson_seconds(path)
        print(f"{path.name}: {sec:.1f} s = {sec / statistics.median(floor):.1f}x", flush=True)
    text = table(floor, lessons, where)
    print(text)
    if args.write:
        write_table(args.write, text)
    return 0 if all(sec / statistics.median(floor) <= GOAL for sec in lessons.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
