"""Every exercise checker is tested where its lesson's other checker tests are.

Each ``course_utils/exercises/lessonNN.py`` has ``tests/test_exercises_lessonNN.py``, whose tables give
every checker its reference answer (accepted), the stub a learner's cell holds (reported as not
implemented), a second correct answer (a checker grades behaviour, not text) and the known wrong answers
(each rejected, naming its misconception). This file finds the checkers by inspection, so a new
lesson's or a new checker cannot be left out of those tables.
"""

import importlib
import inspect
import pkgutil
from pathlib import Path

import course_utils.exercises

TESTS = Path(__file__).resolve().parent


def grader_modules():
    for info in pkgutil.iter_modules(course_utils.exercises.__path__, "course_utils.exercises."):
        if not info.ispkg:  # answers/ is a package of reference answers, not graders
            yield importlib.import_module(info.name)


def test_every_lesson_with_checkers_has_its_checker_tests():
    for module in grader_modules():
        lesson = module.__name__.rsplit(".", 1)[1]
        checkers = [n for n, f in vars(module).items() if n.startswith("check_") and inspect.isfunction(f)
                    and f.__module__ == module.__name__]
        assert checkers, f"{module.__name__} grades no exercise: a grader module holds check_* functions"
        tests = TESTS / f"test_exercises_{lesson}.py"
        assert tests.exists(), f"{module.__name__}'s checkers need {tests.name} (see another lesson's)"
        text = tests.read_text(encoding="utf-8")
        missing = [n for n in checkers if n not in text]
        assert not missing, f"{tests.name} does not test {missing}"


def test_checkers_live_only_in_the_exercises():
    """The give-away probe and these tests find checkers by the check_ prefix: nothing else carries it."""
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        if info.name.startswith("course_utils.exercises") or "course_model" in info.name:
            continue
        module = importlib.import_module(info.name)
        stray = [n for n, f in vars(module).items() if n.startswith("check_") and inspect.isfunction(f)
                 and f.__module__ == module.__name__ and module.__name__ != "course_utils.checks"]
        assert not stray, f"{module.__name__} defines {stray}: check_ is for exercise checkers"
