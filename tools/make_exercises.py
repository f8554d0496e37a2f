"""Write the exercise notebooks (``notebooks/``) from the solution notebooks (``solutions/``).

    python -m tools.make_exercises            # regenerate every exercise notebook
    python -m tools.make_exercises --check    # exit 1 if notebooks/ is stale (a test runs this)
    python -m tools.make_exercises solutions/01_accumulation.ipynb   # just one

Solutions are the single source. In a code cell, the lines between ``### BEGIN SOLUTION`` and
``### END SOLUTION`` (the nbgrader convention) become a stub that raises ``NotImplementedError``,
indented like the fenced code; all outputs and execution counts are cleared.

A prediction line — ``predict("name", guess)  # your prediction: ...`` — keeps its call and comment and
loses its guess (``None``): the solution carries a recorded prediction, the learner writes their own. A
self-test answer line — ``quiz.answer(n, "b")  # your answer ...`` — loses its letter the same way. A line
ending ``# solution copy only`` is left out of the exercise copy (lesson 11's fixed demo quiz).

Each copy says which copy it is: the generator writes a header line under the title of the first
cell — "Solution copy" in ``solutions/`` (written in place, outputs untouched), "Exercise copy" in
``notebooks/`` — and ``--check`` fails when a header is missing, stale, or the first cell names a
copy's file anywhere else (where it would speak from the wrong side once copied).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

from tools import ROOT

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


_PREDICTION = re.compile(  # predict("name", guess)  # your prediction ...   (one line)
    r"""^([ \t]*predict\((?:"[^"\n]*"|'[^'\n]*'),[ \t]*)(.+?)(\)[ \t]*# your prediction.*)$""", re.MULTILINE)


_ANSWER = re.compile(r"^([ \t]*quiz\.answer\(\d+,[ \t]*)(.+?)(\);?[ \t]*# your answer.*)$", re.MULTILINE)
_SOLUTION_ONLY = re.compile(r"^[^\n]*# solution copy only[^\n]*\n?", re.MULTILINE)


def blank_predictions(source: str) -> str:
    """Replace the guess of every ``predict(name, guess)  # your prediction`` line, and the letter of every
    ``quiz.answer(n, letter)  # your answer`` line, with ``None``; drop ``# solution copy only`` lines."""
    source = _PREDICTION.sub(lambda m: f"{m.group(1)}None{m.group(3)}", source)
    source = _ANSWER.sub(lambda m: f"{m.group(1)}None{m.group(3)}", source)
    return _SOLUTION_ONLY.sub("", source)


HEADER_PREFIXES = ("> **Solution copy**", "> **Exercise copy**")


def header(side: str, name: str) -> str:
    """The line that tells a reader which copy of lesson ``name`` they are in and where the other is."""
    if side == "solution":
        return (f"> **Solution copy** (`solutions/{name}`): complete, with every output. To write the "
                f"exercises yourself, open `notebooks/{name}` (`make lab` opens `notebooks/`).")
    if side == "exercise":
        return (f"> **Exercise copy** (`notebooks/{name}`): each exercise cell raises `NotImplementedError` "
                f"until you write it, and a checker follows it. The complete version with outputs is "
                f"`solutions/{name}`.")
    raise ValueError(f"side={side!r} is not a copy — a header is written for 'solution' or 'exercise' — "
                     "pass one of those.")


def with_header(source: str, side: str, name: str) -> str:
    """``source`` (a first cell) with its copy header: under the title, replacing an older header."""
    lines = [line for line in source.split("\n") if not line.startswith(HEADER_PREFIXES)]
    while len(lines) > 1 and lines[1] == "" and len(lines) > 2 and lines[2] == "":
        del lines[1]  # the blank line a removed header left behind
    rest = lines[1:]
    if rest and rest[0] == "":
        rest = rest[1:]
    return "\n".join([lines[0], "", header(side, name), "", *rest]).rstrip("\n")


def header_problems(nb, side: str, name: str) -> list[str]:
    """What is wrong with a notebook's copy header (empty when it is right)."""
    if not nb.cells or nb.cells[0].cell_type != "markdown":
        return ["the first cell must be the markdown title cell that carries the copy header"]
    lines = nb.cells[0].source.split("\n")
    problems = []
    if header(side, name) not in lines:
        problems.append(f"no {side} header (run: python -m tools.make_exercises)")
    others = [line for line in lines if line != header(side, name)
              and (f"notebooks/{name}" in line or f"solutions/{name}" in line)]
    problems += [f"the first cell names a copy outside its header (each copy would say it of itself): "
                 f"{line.strip()!r}" for line in others]
    return problems


def solution_with_header(solution_path: Path):
    """The solution notebook with its own header; nothing else changes."""
    nb = nbformat.read(solution_path, as_version=4)
    if nb.cells and nb.cells[0].cell_type == "markdown":
        nb.cells[0].source = with_header(nb.cells[0].source, "solution", solution_path.name)
    return nb


def exercise_notebook(solution_path: Path):
    """The exercise version of one solution notebook, as an ``nbformat`` node."""
    nb = nbformat.read(solution_path, as_version=4)
    if nb.cells and nb.cells[0].cell_type == "markdown":
        nb.cells[0].source = with_header(nb.cells[0].source, "exercise", solution_path.name)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = blank_predictions(strip_solutions(cell.source))
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
    solutions = [Path(p).resolve() for p in paths] or sorted((ROOT / "solutions").glob("*.ipynb"))
    for path in solutions:
        if path.suffix != ".ipynb" or not path.exists():
            raise SystemExit(f"{path}: not a solution notebook — pass paths under solutions/.")
    return [(s, ROOT / "notebooks" / s.name) for s in solutions]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Generate notebooks/ from solutions/.")
    parser.add_argument("paths", nargs="*", help="solution notebooks (default: all)")
    parser.add_argument("--check", action="store_true", help="only report stale exercise notebooks")
    args = parser.parse_args(argv)
    stale, wrong = [], []
    for solution, exercise in targets(args.paths):
        solution_nb = solution_with_header(solution)
        if nbformat.read(solution, as_version=4).cells[:1] != solution_nb.cells[:1]:
            if args.check:
                stale.append(solution)
            else:
                nbformat.write(solution_nb, solution)
                print(f"wrote the header of {solution.relative_to(ROOT)}")
        if args.check:
            wrong += [(solution, p) for p in header_problems(solution_nb, "solution", solution.name)]
            wrong += [(exercise, p) for p in header_problems(exercise_notebook(solution), "exercise",
                                                              solution.name)]
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
        for path, problem in wrong:
            print(f"header: {path.relative_to(ROOT)}: {problem}")
        expected = {ROOT / "notebooks" / p.name for p in (ROOT / "solutions").glob("*.ipynb")}
        orphans = [p for p in (ROOT / "notebooks").glob("*.ipynb") if p not in expected]
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run: python -m tools.make_exercises)")
        for path in orphans:
            print(f"orphan: {path.relative_to(ROOT)} has no solution notebook")
        return 1 if stale or wrong or (orphans and not args.paths) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
