"""Write the exercise notebooks (``notebooks/``) from the solution notebooks (``solutions/``).

    python -m course_utils.make_exercises            # regenerate every exercise notebook
    python -m course_utils.make_exercises --check    # exit 1 if notebooks/ is stale (a test runs this)
    python -m course_utils.make_exercises solutions/01_accumulation.ipynb   # just one

Solutions are the single source. In a code cell, the lines between ``### BEGIN SOLUTION`` and
``### END SOLUTION`` (the nbgrader convention) become a stub that raises ``NotImplementedError``,
indented like the fenced code; all outputs and execution counts are cleared.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("Exercise: write your solution here")'
_FENCE = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*$",
                    re.MULTILINE | re.DOTALL)


def strip_solutions(source: str) -> str:
    """Replace every fenced solution in ``source`` with an indented stub."""
    if source.count(BEGIN) != source.count(END):
        raise ValueError(f"unbalanced solution fences in cell starting {source[:60]!r} — every "
                         f"{BEGIN} needs its {END} — add the missing marker.")
    return _FENCE.sub(lambda m: f"{m.group(1)}{STUB}", source)


def exercise_notebook(solution_path: Path):
    """The exercise version of one solution notebook, as an ``nbformat`` node."""
    nb = nbformat.read(solution_path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source)
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)  # timestamps of the solution's run
        cell.pop("id", None)  # stable output: cell ids would churn on every regeneration
    nb.metadata.pop("widgets", None)
    nb.nbformat_minor = 4  # ids need minor >= 5; without them the file stays valid at 4.4
    return nb


def render(nb) -> str:
    return nbformat.writes(nb, version=4) + "\n"


def targets(paths: list[str]) -> list[tuple[Path, Path]]:
    solutions = [Path(p) for p in paths] or sorted((ROOT / "solutions").glob("*.ipynb"))
    for path in solutions:
        if path.suffix != ".ipynb" or not path.exists():
            raise SystemExit(f"{path}: not a solution notebook — pass paths under solutions/.")
    return [(s, ROOT / "notebooks" / s.name) for s in solutions]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Generate notebooks/ from solutions/.")
    parser.add_argument("paths", nargs="*", help="solution notebooks (default: all)")
    parser.add_argument("--check", action="store_true", help="only report stale exercise notebooks")
    args = parser.parse_args(argv)
    stale = []
    for solution, exercise in targets(args.paths):
        text = render(exercise_notebook(solution))
        current = exercise.read_text(encoding="utf-8") if exercise.exists() else None
        if text == current:
            continue
        stale.append(exercise)
        if not args.check:
            exercise.parent.mkdir(exist_ok=True)
            exercise.write_text(text, encoding="utf-8")
            print(f"wrote {exercise.relative_to(ROOT)}")
    if args.check:
        expected = {ROOT / "notebooks" / p.name for p in (ROOT / "solutions").glob("*.ipynb")}
        orphans = [p for p in (ROOT / "notebooks").glob("*.ipynb") if p not in expected]
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run: python -m course_utils.make_exercises)")
        for path in orphans:
            print(f"orphan: {path.relative_to(ROOT)} has no solution notebook")
        return 1 if stale or (orphans and not args.paths) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
