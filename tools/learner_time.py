"""How long a learner needs for each lesson: the core path and the optional sections, from their content.

    python -m tools.learner_time                 # the table, per exercise copy in notebooks/
    python -m tools.learner_time --check         # exit 1 if a core path is over CORE_BUDGET_MIN
    python -m tools.learner_time --write         # refresh the table in INSTRUCTORS.md (between its markers)

An estimate from stated rates, not a stopwatch (INSTRUCTORS.md says so beside the table):

- prose at ``PROSE_WPM`` words a minute (markdown cells; a careful technical read, below the ~240 of
  light reading);
- code at ``CODE_LINES_PER_MIN`` lines a minute (non-blank lines of the code cells a learner reads and
  runs: reading, running and looking at the output);
- each exercise at the minutes its heading states, ``(≈10 min)``; its stub is not read as code;
- collapsed proof cells (metadata ``jupyter.source_hidden``) are not read;
- a heading that starts with ``Optional:`` opens an optional section, up to the next heading of the same
  or a higher level: counted apart, out of the core path.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tools import ROOT

PROSE_WPM = 200
CODE_LINES_PER_MIN = 6
CORE_BUDGET_MIN = 45
MARK_BEGIN = "<!-- learner-time table: python -m tools.learner_time --write -->"
MARK_END = "<!-- end of learner-time table -->"

_HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.MULTILINE)
_EXERCISE_MINUTES = re.compile(r"\((?:≈|~|about )\s*(\d+)\s*min\)")


@dataclass
class Time:
    """Minutes by kind, for the core path or the optional sections of one lesson."""

    prose: float = 0.0
    code: float = 0.0
    exercises: float = 0.0

    @property
    def total(self) -> float:
        return self.prose + self.code + self.exercises


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _is_proof(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _prose_words(markdown: str) -> int:
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)  # a code block in prose is read as prose
    return len(re.findall(r"[\w'’.-]+", text))


def estimate(path: Path) -> tuple[Time, Time]:
    """``(core, optional)`` minutes of one notebook, by the rates above."""
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
            bucket.exercises += sum(int(m) for m in _EXERCISE_MINUTES.findall(
                "\n".join(t for h, t in _HEADING.findall(src))))
        elif cell["cell_type"] == "code" and not _is_proof(cell):
            bucket = optional if optional_level is not None else core
            lines = [line for line in src.splitlines() if line.strip()
                     and "raise NotImplementedError" not in line]
            bucket.code += len(lines) / CODE_LINES_PER_MIN
    return core, optional


def table(paths: list[Path]) -> str:
    """The markdown table of every lesson's estimate."""
    rows = ["| Lesson | Core path (min) | prose | code | exercises | Optional sections (min) |",
            "|---|---:|---:|---:|---:|---:|"]
    for path in paths:
        core, opt = estimate(path)
        rows.append(f"| `{path.stem}` | **{core.total:.0f}** | {core.prose:.0f} | {core.code:.0f} | "
                    f"{core.exercises:.0f} | {opt.total:.0f} |")
    return "\n".join(rows)


def _write(text: str, file: Path) -> None:
    doc = file.read_text(encoding="utf-8")
    if MARK_BEGIN not in doc or MARK_END not in doc:
        raise SystemExit(f"{file}: no learner-time markers — add the lines {MARK_BEGIN!r} and {MARK_END!r} "
                         "where the table belongs.")
    head, rest = doc.split(MARK_BEGIN, 1)
    _, tail = rest.split(MARK_END, 1)
    file.write_text(f"{head}{MARK_BEGIN}\n{text}\n{MARK_END}{tail}", encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Estimate each lesson's learner time from its content.")
    parser.add_argument("paths", nargs="*", help="exercise notebooks (default: notebooks/*.ipynb)")
    parser.add_argument("--check", action="store_true",
                        help=f"fail if a core path is over {CORE_BUDGET_MIN} min")
    parser.add_argument("--write", action="store_true", help="refresh the table in INSTRUCTORS.md")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    text = table(paths)
    print(text)
    if args.write:
        _write(text, ROOT / "INSTRUCTORS.md")
    over = [p.stem for p in paths if estimate(p)[0].total > CORE_BUDGET_MIN]
    if args.check and over:
        print(f"over the {CORE_BUDGET_MIN}-minute core path: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
