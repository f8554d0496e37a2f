"""The learner-first conventions (issue 33), on every lesson: the learner sees the teaching, not the proof;
predictions count; every lesson closes with its takeaways and the tally; the learner time is estimated by an
honest method and INSTRUCTORS.md states it, with a one-day plan that fits it; the course aids exist and are
current."""

import json
import re
from pathlib import Path

import pytest

from tools import learner_time

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
PROOF_LINE = re.compile(r"^\s*(assert\b|.*\breport_outcome\()")


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _collapsed(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_no_proof_line_in_a_cell_the_learner_reads(path):
    visible = [(i, line) for i, c in enumerate(_cells(path))
               if c["cell_type"] == "code" and not _collapsed(c)
               for line in _source(c).splitlines() if PROOF_LINE.match(line)]
    assert not visible, f"move these into a collapsed '# proof' cell: {visible[:5]}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_proof_cells_say_so_and_are_collapsed(path):
    for cell in _cells(path):
        if cell["cell_type"] == "code" and _source(cell).startswith("# proof"):
            assert _collapsed(cell), f"a proof cell is collapsed: {_source(cell)[:80]!r}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_closes_with_takeaways_and_the_tally(path):
    cells = _cells(path)
    at = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "## Key takeaways" in _source(c)]
    assert at, "a '## Key takeaways' cell"
    bullets = [line for line in _source(cells[at[0]]).splitlines()
               if line.lstrip().startswith(("- ", "* ", "1"))]
    assert 3 <= len(bullets) <= 6, "3-5 takeaways"
    assert any(c["cell_type"] == "code" and "tally()" in _source(c) for c in cells[at[0]:]), "then tally()"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_predictions_are_blank_in_the_copy_and_each_is_revealed(path):
    sources = [_source(c) for c in _cells(path) if c["cell_type"] == "code"]
    predicted = re.findall(r"""predict\((["'])(.+?)\1,\s*(.+?)\)\s*# your prediction""", "\n".join(sources))
    assert predicted, "at least one prediction a learner records before a measurement"
    assert all(guess == "None" for _, _, guess in predicted), "the copy leaves the guess to the learner"
    for _, name, _ in predicted:
        where = [i for i, s in enumerate(sources) if re.search(rf"""predict\((["']){re.escape(name)}\1""", s)]
        shown = [i for i, s in enumerate(sources)
                 if re.search(rf"""reveal(?:_score)?\((?:\w+,\s*)?(["']){re.escape(name)}\1""", s)]
        assert shown and min(shown) > max(where), f"{name!r}: predicted in a cell before its reveal"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solutions_carry_recorded_predictions(path):
    text = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "code")
    guesses = re.findall(r"""predict\((["']).+?\1,\s*(.+?)\)\s*# your prediction""", text)
    assert guesses and all(g != "None" for _, g in guesses)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_header_says_cell_by_cell_and_exercises_state_their_minutes(path):
    cells = _cells(path)
    assert "cell by cell" in _source(cells[0]), "the header tells a learner to run cell by cell"
    headings = [line for c in cells if c["cell_type"] == "markdown" for line in _source(c).splitlines()
                if re.match(r"#{2,4} .*Exercise", line)]
    assert all(re.search(r"\(≈\s*\d+\s*min\)", h) for h in headings), headings


def _notebook(tmp_path, cells):
    path = tmp_path / "99_x.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_estimate_counts_code_outputs_predictions_and_the_answers_size(tmp_path):
    """Issue 43's honest method: dense code at 5 lines a minute, the outputs a learner reads, each prediction,
    and each exercise from its reference answer's size — not from the minutes typed in its heading."""
    code = {"cell_type": "code", "metadata": {}, "source": "\n".join(f"x{i} = {i}" for i in range(10)),
            "outputs": [{"output_type": "stream", "name": "stdout", "text": "a\n" * 20}]}
    guess = {"cell_type": "code", "metadata": {}, "outputs": [],
             "source": 'predict("ratio", 4)  # your prediction: the ratio'}
    answer = "\n".join(f"    y{i} = {i}" for i in range(12))
    exercise = {"cell_type": "code", "metadata": {}, "outputs": [],
                "source": f"def f():\n    ### BEGIN SOLUTION\n{answer}\n    ### END SOLUTION"}
    heading = {"cell_type": "markdown", "metadata": {}, "source": "### Exercise — quick (≈2 min)"}
    core, _ = learner_time.estimate(_notebook(tmp_path, [heading, code, guess, exercise]))
    assert core.code == pytest.approx((10 + 1 + 1) / learner_time.CODE_LINES_PER_MIN)
    assert core.outputs == pytest.approx(20 / learner_time.OUTPUT_LINES_PER_MIN)
    assert core.decisions == pytest.approx(learner_time.DECISION_MIN)
    written = learner_time.EXERCISE_BASE_MIN + 12 * learner_time.WRITE_MIN_PER_LINE
    assert core.exercises == pytest.approx(written)
    assert core.exercises > 2, "the heading's (≈2 min) is not an input"


def test_instructors_states_the_honest_figures():
    """The table is current, the prose quotes its totals, and it names every lesson over 45 minutes."""
    doc = (ROOT / "INSTRUCTORS.md").read_text(encoding="utf-8")
    paths = learner_time.default_paths()
    assert learner_time.table(paths) in doc, "run: python -m tools.learner_time --write"
    cores = [learner_time.estimate(p)[0] for p in paths]
    assert f"{sum(c.total for c in cores):.0f} minutes for all" in doc, "the prose quotes the table's total"
    assert f"({sum(c.half_homework for c in cores):.0f} in all" in doc, "the prose quotes the homework total"
    for name in learner_time.over_budget(paths):
        assert f"`{name}`" in doc


def test_the_one_day_plan_fits_the_estimate():
    """Each lesson's slot in the one-day plan is at least its estimate with every second exercise as homework
    (the plan says so), so the day is not a promise the estimate breaks."""
    doc = (ROOT / "INSTRUCTORS.md").read_text(encoding="utf-8")
    day = doc.split("### One day")[1].split("### Two days")[0]
    slots = re.findall(r"\| (\d+):(\d\d)–(\d+):(\d\d) \| Lesson (\d\d)", day)
    assert len(slots) >= 5, "the one-day plan's lesson rows"
    estimates = {p.stem[:2]: learner_time.estimate(p)[0] for p in learner_time.default_paths()}
    for h0, m0, h1, m1, lesson in slots:
        minutes = (int(h1) * 60 + int(m1)) - (int(h0) * 60 + int(m0))
        need = estimates[lesson].half_homework
        assert minutes >= round(need), f"lesson {lesson}: {minutes} min in the day, {need:.0f} needed"


def test_cheatsheet_and_readme_map_every_lesson():
    sheet = (ROOT / "CHEATSHEET.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for path in SOLUTIONS:
        if path.stem[:2] in ("00", "11"):
            continue  # the tour and the self-test have no symptom of their own
        assert f"solutions/{path.name}" in sheet, f"CHEATSHEET.md links {path.name}"
        symptom_map = readme.split("### Symptom → lesson")[1]
        assert f"solutions/{path.name}" in symptom_map, f"README's map: {path.name}"
