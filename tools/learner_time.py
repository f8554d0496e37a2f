"""How long a learner needs for each lesson: the core path and the optional sections, from their content.

    python -m tools.learner_time                 # the table, one row per solution notebook
    python -m tools.learner_time --check         # exit 1 if a core path is over CORE_BUDGET_MIN
    python -m tools.learner_time --write         # refresh the table in INSTRUCTORS.md (between its markers)

An estimate from stated rates, not a stopwatch (INSTRUCTORS.md says so beside the table). It reads the
*solution* notebooks, because they hold the outputs a learner reads and the reference answers a learner
writes; the exercise copy is the same notebook with those answers taken out.

- prose at ``PROSE_WPM`` words a minute (markdown cells; a careful technical read);
- code at ``CODE_LINES_PER_MIN`` lines a minute (non-blank lines of the code cells a learner reads and runs,
  outside the fenced answers: this course's code is dense — one line often holds a measurement);
- outputs at ``OUTPUT_LINES_PER_MIN`` lines a minute (text a cell prints: a log, a table, a rendering),
  at most ``OUTPUT_LINES_READ`` lines of one cell (a long listing is scanned, not read), and
  ``FIGURE_MIN`` for each figure or widget;
- each prediction (``predict(...)  # your prediction``) and each self-test answer (``# your answer``)
  at ``DECISION_MIN``: stop, think, commit to a number or a cause;
- each exercise from its reference answer, not from its heading's "(≈N min)": ``EXERCISE_BASE_MIN`` (read the
  task and the artefact, run the checker, read its verdict) plus ``WRITE_MIN_PER_LINE`` per code line of the
  fenced reference answer (thinking, writing and debugging one line of working code, the lesson's helpers
  in reach; comments not counted);
- collapsed proof cells (metadata ``jupyter.source_hidden``) are not read;
- a heading that starts with ``Optional:`` opens an optional section, up to the next heading of the same or a
  higher level: counted apart, out of the core path.

Waiting for a cell to run is not counted (seconds on a laptop CPU, see INSTRUCTORS.md's timings).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tools import ROOT
from tools.run_solutions import BAR_TEXT

PROSE_WPM = 200
CODE_LINES_PER_MIN = 5
OUTPUT_LINES_PER_MIN = 10
OUTPUT_LINES_READ = 30
FIGURE_MIN = 1.0
DECISION_MIN = 1.5
EXERCISE_BASE_MIN = 5.0
WRITE_MIN_PER_LINE = 1.0
CORE_BUDGET_MIN = 45  # the course's target for one lesson's core path; the table says which lessons exceed it
MARK_BEGIN = "<!-- learner-time table: python -m tools.learner_time --write -->"
MARK_END = "<!-- end of learner-time table -->"

_HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.MULTILINE)
_FENCED = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION",
                     re.MULTILINE | re.DOTALL)
_DECISION = re.compile(r"#\s*your (?:prediction|answer)")


@dataclass
class Time:
    """Minutes by kind, for the core path or the optional sections of one lesson."""

    prose: float = 0.0
    code: float = 0.0
    outputs: float = 0.0
    decisions: float = 0.0
    exercises: float = 0.0
    each_exercise: list[float] = field(default_factory=list)  # in the notebook's order

    @property
    def total(self) -> float:
        return self.prose + self.code + self.outputs + self.decisions + self.exercises

    @property
    def half_homework(self) -> float:
        """The total with every second exercise (the 2nd, the 4th, …) left as homework."""
        return self.total - sum(self.each_exercise[1::2])


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _is_proof(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _prose_words(markdown: str) -> int:
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)  # a code block in prose is read as prose
    return len(re.findall(r"[\w'’.-]+", text))


def _code_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def output_minutes(cell) -> float:
    """Minutes to read what a code cell printed: its text lines (``OUTPUT_LINES_READ`` at most), figures."""
    lines, figures = 0, 0
    for out in cell.get("outputs", []):
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        data = out.get("data", {})
        if "application/vnd.jupyter.widget-view+json" in data and (not text or BAR_TEXT.match(text)):
            continue  # a progress bar (run_solutions keeps no text for one): watched, not read
        if "image/png" in data or "application/vnd.jupyter.widget-view+json" in data or "text/html" in data:
            figures += 1
        elif out.get("output_type") == "stream" or "text/plain" in data:
            lines += len([line for line in text.splitlines() if line.strip()])
    return min(lines, OUTPUT_LINES_READ) / OUTPUT_LINES_PER_MIN + figures * FIGURE_MIN


def exercise_minutes(source: str) -> list[float]:
    """Minutes for each exercise fenced in a code cell: ``EXERCISE_BASE_MIN``, plus its lines to write."""
    return [EXERCISE_BASE_MIN + WRITE_MIN_PER_LINE * _code_lines(a) for a in _FENCED.findall(source)]


def estimate(path: Path) -> tuple[Time, Time]:
    """``(core, optional)`` minutes of one solution notebook, by the rates above."""
    core, optional = Time(), Time()
    optional_level = None  # the heading level that opened the optional section we are in, if any
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        src = _source(cell)
        if cell["cell_type"] == "markdown":
            for hashes, title in _HEADING.findall(src):
                level = len(hashes)
                if optional_level is not None and level <= optional_level:
                    optional_level = None
                if optional_level is None and title.strip().lower().startswith("optional:"):
                    optional_level = level
            bucket = optional if optional_level is not None else core
            bucket.prose += _prose_words(src) / PROSE_WPM
        elif cell["cell_type"] == "code" and not _is_proof(cell):
            bucket = optional if optional_level is not None else core
            read = _FENCED.sub("", src)  # the learner reads the cell around the answer they write
            bucket.code += _code_lines(read) / CODE_LINES_PER_MIN
            minutes = exercise_minutes(src)
            bucket.exercises += sum(minutes)
            bucket.each_exercise += minutes
            bucket.decisions += DECISION_MIN * len(_DECISION.findall(src))
            bucket.outputs += output_minutes(cell)
    return core, optional


def table(paths: list[Path]) -> str:
    """The markdown table of every lesson's estimate."""
    rows = ["| Lesson | Core path (min) | prose | code | outputs | predictions | exercises (each) | "
            "every 2nd exercise as homework | Optional sections (min) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for path in paths:
        core, opt = estimate(path)
        each = " + ".join(f"{m:.0f}" for m in core.each_exercise)
        rows.append(f"| `{path.stem}` | **{core.total:.0f}** | {core.prose:.0f} | {core.code:.0f} | "
                    f"{core.outputs:.0f} | {core.decisions:.0f} | {core.exercises:.0f}"
                    f"{f' ({each})' if len(core.each_exercise) > 1 else ''} | {core.half_homework:.0f} | "
                    f"{opt.total:.0f} |")
    cores = [estimate(p)[0] for p in paths]
    rows.append(f"| **all lessons** | **{sum(c.total for c in cores):.0f}** | | | | | | "
                f"**{sum(c.half_homework for c in cores):.0f}** | |")
    over = over_budget(paths)
    rows.append("")
    named = ": " + ", ".join(f"`{n}`" for n in over) if over else ""
    rows.append(f"By this method {len(over)} of {len(paths)} core paths are over the "
                f"{CORE_BUDGET_MIN}-minute target{named}.")
    return "\n".join(rows)


def default_paths() -> list[Path]:
    return sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def over_budget(paths: list[Path]) -> list[str]:
    """The lessons whose core path is over ``CORE_BUDGET_MIN`` by this method."""
    return [p.stem for p in paths if estimate(p)[0].total > CORE_BUDGET_MIN]


def _write(text: str, file: Path, paths: list[Path]) -> None:
    """The table between the markers, and the two totals the prose above it quotes ("N minutes for all",
    "(N in all"): a stale total failed CI once, so the write refreshes both."""
    doc = file.read_text(encoding="utf-8")
    if MARK_BEGIN not in doc or MARK_END not in doc:
        raise SystemExit(f"{file}: no learner-time markers — add the lines {MARK_BEGIN!r} and {MARK_END!r} "
                         "where the table belongs.")
    head, rest = doc.split(MARK_BEGIN, 1)
    _, tail = rest.split(MARK_END, 1)
    cores = [estimate(p)[0] for p in paths]
    head = re.sub(r"\d+ minutes for all", f"{sum(c.total for c in cores):.0f} minutes for all", head)
    head = re.sub(r"\((\d+) in all", f"({sum(c.half_homework for c in cores):.0f} in all", head)
    file.write_text(f"{head}{MARK_BEGIN}\n{text}\n{MARK_END}{tail}", encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Estimate each lesson's learner time from its content.")
    parser.add_argument("paths", nargs="*", help="solution notebooks (default: solutions/NN_*.ipynb)")
    parser.add_argument("--check", action="store_true",
                        help=f"fail if a core path is over {CORE_BUDGET_MIN} min")
    parser.add_argument("--write", action="store_true", help="refresh the table in INSTRUCTORS.md")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths] or default_paths()
    text = table(paths)
    print(text)
    if args.write:
        _write(text, ROOT / "INSTRUCTORS.md", paths)
    over = over_budget(paths)
    if over:
        print(f"over the {CORE_BUDGET_MIN}-minute core path: {', '.join(over)}", file=sys.stderr)
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
