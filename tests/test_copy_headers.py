"""Each copy of a lesson says which copy it is (issue 17.4): the generator writes, --check tests."""

from pathlib import Path

import nbformat
import pytest

from tools import make_exercises as mx

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_each_copy_names_itself(solution):
    exercise = nbformat.read(ROOT / "notebooks" / solution.name, as_version=4)
    assert mx.header_problems(nbformat.read(solution, as_version=4), "solution", solution.name) == []
    assert mx.header_problems(exercise, "exercise", solution.name) == []
    first = exercise.cells[0].source
    assert "**Exercise copy**" in first and "**Solution copy**" not in first


def test_with_header_is_idempotent_and_replaces_the_other_side():
    source = "# Lesson 09 — x\n\nSome text."
    once = mx.with_header(source, "solution", "09_x.ipynb")
    assert mx.with_header(once, "solution", "09_x.ipynb") == once
    swapped = mx.with_header(once, "exercise", "09_x.ipynb")
    assert swapped == f"# Lesson 09 — x\n\n{mx.header('exercise', '09_x.ipynb')}\n\nSome text."


def test_check_catches_a_copy_named_outside_the_header():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        mx.with_header("# Lesson 09\n\nOpen `notebooks/09_x.ipynb` for the exercise version.",
                       "exercise", "09_x.ipynb"))])
    problems = mx.header_problems(nb, "exercise", "09_x.ipynb")
    assert len(problems) == 1 and "outside its header" in problems[0]
    assert "no solution header" in mx.header_problems(nb, "solution", "09_x.ipynb")[0]


def test_header_rejects_an_unknown_side():
    with pytest.raises(ValueError, match="'solution' or 'exercise'"):
        mx.header("answer", "09_x.ipynb")
