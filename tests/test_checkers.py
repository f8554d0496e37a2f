"""Every exercise checker, run on its lesson's answers: the one copy of the generic checker tests.

Each ``course_utils/exercises/lessonNN.py`` has ``tests/test_exercises_lessonNN.py``, whose tables give every
checker its reference answer (``CHECKERS``, rows ``Row(name, run, reference)``: accepted), the stub a
learner's cell holds (reported as not implemented), a second correct answer (``ALSO_CORRECT``, rows
``(name, answer)``: a checker grades behaviour, not text) and the known wrong answers (``WRONG``, rows
``(name, wrong, phrase)``: each rejected, naming its misconception where the learner sees it). The lesson
files keep their lesson-specific tests (hints, generators, bad input); this file runs the tables of all of
them, and finds the checkers by inspection, so a new lesson's or a new checker cannot be left out.
"""

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from conftest import Row, stub

import course_utils.exercises

TESTS = Path(__file__).resolve().parent
NOT_IMPLEMENTED = "⏳ not implemented yet: replace the `raise NotImplementedError`"  # checks.run_check


def grader_modules():
    for info in pkgutil.iter_modules(course_utils.exercises.__path__, "course_utils.exercises."):
        if not info.ispkg:  # answers/ is a package of reference answers, not graders
            yield importlib.import_module(info.name)


def checker_names(module) -> list[str]:
    return [n for n, f in vars(module).items() if n.startswith("check_") and inspect.isfunction(f)
            and f.__module__ == module.__name__]


GRADERS = {module.__name__.rsplit(".", 1)[1]: module for module in grader_modules()}  # "lesson02": its module
LESSONS = {lesson: importlib.import_module(f"test_exercises_{lesson}") for lesson in GRADERS
           if (TESTS / f"test_exercises_{lesson}.py").exists()}  # "lesson02": its tables' module


def run_of(tables, name):
    """The ``run`` of checker ``name`` in a lesson's CHECKERS."""
    runs = [row.run for row in tables.CHECKERS if row.name == name]
    assert len(runs) == 1, f"{tables.__name__}: {name!r} needs one Row in CHECKERS, it has {len(runs)}"
    return runs[0]


REFERENCES = [pytest.param(row, id=f"{lesson} {row.name}") for lesson, tables in LESSONS.items()
              for row in tables.CHECKERS]
ALSO_CORRECT = [pytest.param(tables, name, answer, id=f"{lesson} {name} {answer.__name__}")
                for lesson, tables in LESSONS.items() for name, answer in tables.ALSO_CORRECT]
WRONG = [pytest.param(tables, name, wrong, phrase, id=f"{lesson} {name} {wrong.__name__}")
         for lesson, tables in LESSONS.items() for name, wrong, phrase in tables.WRONG]


@pytest.mark.parametrize("row", REFERENCES)
def test_reference_is_accepted(row, request, capsys):
    result = row.run(row.reference, request.getfixturevalue)
    assert result, result.message


@pytest.mark.parametrize("row", REFERENCES)
def test_stub_is_reported_as_not_implemented(row, request, capsys):
    result = row.run(stub, request.getfixturevalue)
    assert not result
    assert result.message.startswith(NOT_IMPLEMENTED), result.message
    assert NOT_IMPLEMENTED in capsys.readouterr().out, "the learner must see it"


@pytest.mark.parametrize("tables, name, answer", ALSO_CORRECT)
def test_another_correct_answer_is_accepted(tables, name, answer, request, capsys):
    result = run_of(tables, name)(answer, request.getfixturevalue)
    assert result, result.message


@pytest.mark.parametrize("tables, name, wrong, phrase", WRONG)
def test_wrong_answer_is_rejected_with_its_misconception(tables, name, wrong, phrase, request, capsys):
    result = run_of(tables, name)(wrong, request.getfixturevalue)
    assert not result
    assert phrase in result.message, result.message
    assert phrase in capsys.readouterr().out, "the learner must see it"


def test_every_lesson_with_checkers_has_its_checker_tests():
    for lesson, module in GRADERS.items():
        assert checker_names(module), f"{module.__name__} grades no exercise: a grader module holds check_*"
        tests = TESTS / f"test_exercises_{lesson}.py"
        assert tests.exists(), f"{module.__name__}'s checkers need {tests.name} (see another lesson's)"


@pytest.mark.parametrize("lesson", sorted(LESSONS))
def test_every_checker_of_the_lesson_is_in_its_tables(lesson):
    """Each check_* of the lesson has one Row in CHECKERS, at least one second correct answer and one wrong
    answer; every answer is a named function whose docstring says what it pins (a wrong one: which
    misconception)."""
    tables = LESSONS[lesson]
    assert tables.CHECKERS and all(isinstance(row, Row) for row in tables.CHECKERS), \
        f"{tables.__name__}.CHECKERS: a list of conftest.Row(name, run, reference)"
    names = sorted(f"check_{row.name}" for row in tables.CHECKERS)
    assert names == sorted(checker_names(GRADERS[lesson])), "each checker of the lesson in CHECKERS, once"
    checkers = {row.name for row in tables.CHECKERS}
    assert {name for name, _ in tables.ALSO_CORRECT} == checkers, "each checker: a second correct answer"
    assert {name for name, _, _ in tables.WRONG} == checkers, "each checker: at least one known wrong answer"
    answers = [fn for _, fn in tables.ALSO_CORRECT] + [fn for _, fn, _ in tables.WRONG]
    unnamed = [fn for fn in answers
               if not inspect.isfunction(fn) or fn.__name__ == "<lambda>" or not (fn.__doc__ or "").strip()]
    assert not unnamed, f"{unnamed}: each answer is a named function whose docstring says what it pins"
    assert all(isinstance(phrase, str) and phrase for _, _, phrase in tables.WRONG), \
        "each wrong answer names the phrase of its misconception"


def test_checkers_live_only_in_the_exercises():
    """The give-away probe and these tests find checkers by the check_ prefix: nothing else carries it."""
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        if info.name.startswith("course_utils.exercises") or "course_model" in info.name:
            continue
        module = importlib.import_module(info.name)
        stray = [n for n, f in vars(module).items() if n.startswith("check_") and inspect.isfunction(f)
                 and f.__module__ == module.__name__ and module.__name__ != "course_utils.checks"]
        assert not stray, f"{module.__name__} defines {stray}: check_ is for exercise checkers"
