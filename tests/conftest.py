"""Shared fixtures: the course model is loaded once per test session (it is read-only here)."""

import functools
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

import course_utils

# The tests run as a lesson does: offline, no telemetry (the kernels nbval starts inherit these).
course_utils.use_course_defaults()


@pytest.fixture(scope="session")
def course():
    """``(model, tokenizer)`` of the embedded course model. Do not train it: load your own copy."""
    from course_utils import load_course_model

    return load_course_model()


@pytest.fixture(scope="session")
def tokenizer(course):
    return course[1]


# tests/test_browser.py runs this exercise copy as a learner does (Run All in JupyterLab, in Chromium) and
# probes its kernel for a reachable answer: where it can run, test_exercise_notebooks_odd.py leaves this
# one out instead of running the same lesson a second time (~25 s of one core in `make test`).
BROWSER_EXERCISE = "01_accumulation_clipping.ipynb"
CHROMIUM = Path(os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium"))


def browser_missing() -> str | None:
    """Why tests/test_browser.py cannot run here (its skip reason), or None when it can."""
    if not CHROMIUM.exists():
        return (f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium), as "
                ".ci/run does, or point COURSE_CHROMIUM at one")
    if importlib.util.find_spec("playwright") is None:
        return ("playwright is not installed: `make test` installs it (the pinned [test] extra); or "
                "pip install -e '.[test]'")
    return None


def stub(*args, **kwargs):
    """What a learner's exercise cell holds before they write anything (shared by the checker tests)."""
    raise NotImplementedError("Exercise: write your solution here")


def wrong(*args, **kwargs):
    """A learner's wrong attempt (it raises): a failed check, unlike the untouched ``stub``."""
    raise ValueError("a wrong attempt")


def tried_twice(check, *args):
    """The checker's result on the second failed attempt: the answer hint opens only after two."""
    check(wrong, *args)
    return check(wrong, *args)


def strings_held(value, depth=0) -> set:
    """Every str reachable from ``value``: attributes, closures, partial arguments, containers."""
    if depth > 6:
        return set()
    if isinstance(value, str):
        return {value}
    inner = []
    if isinstance(value, dict):
        inner = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        inner = list(value)
    elif isinstance(value, functools.partial):
        inner = [value.func, *value.args, *value.keywords.values()]
    elif callable(value) and getattr(value, "__closure__", None):
        inner = [c.cell_contents for c in value.__closure__]
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        inner = list(vars(value).values())
    return set().union(*(strings_held(v, depth + 1) for v in inner)) if inner else set()


@pytest.fixture(autouse=True)
def _fresh_learner_state():
    """Each test starts as a fresh kernel would: no failed checks counted, no predictions recorded."""
    from course_utils import checks, predictions

    checks._FAILURES.clear()
    predictions.forget()
    yield


class Row(NamedTuple):
    """One exercise checker in its lesson's ``CHECKERS`` table (tests/test_exercises_lessonNN.py); the generic
    checker tests of tests/test_checkers.py run over every lesson's rows."""

    name: str  # the checker's name without check_: Row("guard", ...) grades with check_guard
    run: Callable  # run(fn, fixture): the checker's result on the learner's fn (fixture: getfixturevalue)
    reference: Callable  # the reference answer (course_utils/exercises/answers/lessonNN.py)


def graded(check) -> Callable:
    """``run`` for a checker called ``check(fn)``."""
    return lambda fn, fixture: check(fn)


def graded_on_tokenizer(check) -> Callable:
    """``run`` for a checker called ``check(fn, tokenizer)``: the course tokenizer, loaded when asked."""
    return lambda fn, fixture: check(fn, fixture("tokenizer"))


# The longest files first, so that two workers finish together (make test runs pytest-xdist with
# --dist loadfile --no-loadscope-reorder: each file goes whole to the next free worker, in this order).
# In xdist's default order (most tests first) the solution notebooks, one test per cell, ran first and
# the exercise-notebook files and the browser test (each over a minute, few tests) last, leaving one
# core idle for their length; the unit-test files of tens of seconds go before the notebooks too, so that
# the last files to be handed out take seconds.
HEAVY_UNIT_FILES = ("test_doctor.py", "test_doctor_families.py", "test_bad_input.py", "test_shipping.py",
                    "test_checkers.py", "test_exercises_lesson10.py", "test_doctor_architecture.py",
                    "test_exercises_lesson12.py", "test_exercises_lesson13.py", "test_exercises_self_test.py",
                    "test_grader_process.py")


def _weight(item) -> int:
    path = item.path.name
    if path.startswith("test_exercise_notebooks"):
        return 0       # every exercise notebook, Run All with its stubs
    if path == "test_browser.py":
        return 1       # JupyterLab, Chromium and two notebooks
    if path in HEAVY_UNIT_FILES:
        return 2       # tens of seconds each
    if path.endswith(".ipynb"):
        return 3       # one solution notebook
    return 4           # unit tests: seconds


# The slow lane (make test-slow, which CI runs too): the adversarial matrices and the real-family and
# real-artefact sets, each minutes of CPU in all. make test keeps, for every checker, its wrong answers with
# their misconceptions and a second correct answer, and every solution notebook — whose checker cells run the
# reference answers under nbval's output check — so the fast lane still fails when a checker or a lesson does.
SLOW_LANE = {
    "test_no_shortcut_passes": "every shortcut class (issue 43) on every checker",
    "test_no_adversary_passes_a_lessons_checker": "issue 43's adversaries on six lessons' forked graders",
    "test_each_shortcut_fails_the_checker": "each lesson's own shortcuts",
    "test_each_shortcut_fails_its_checker": "each lesson's own shortcuts",
    "test_every_run_draws_fresh_cases_that_mix_causes": "seven checker runs per diagnosis exercise",
    "test_the_hints_answer_is_not_on_the_result": "two failed runs per checker",
    "test_no_truth_is_reachable_from_the_learners_frames": "a frame walk inside every checker",
    "test_no_artefact_names_its_cause": "every diagnosis artefact walked",
    "test_reference_is_accepted": "the solution notebooks' checker cells run the references in make test",
    "test_healthy_setups_exit_0_without_an_error": "the real families' set-ups",
    "test_planted_failures_are_found_by_their_own_check": "the real families' set-ups",
    "test_fp16_is_judged_by_measured_activations_not_by_the_learning_rate": "forward passes over a grid",
    "test_every_artefact_gets_its_verdict": "every saved artefact the ship check judges",
    # fresh interpreters and kernels (8-15 s each on 2 busy cores): make test keeps one of each kind
    "test_importing_the_package_or_the_take_home_tools_changes_nothing": "three fresh interpreters",
    "test_a_lesson_opts_in_to_the_course_defaults_and_the_model_loads_offline": "a fresh offline interpreter",
    "test_max_grad_norm_is_read_from_training_args_without_unpickling": "a real SFTTrainer run saved to disk",
    # the ship check's artefact matrix (one fixture, ~20 saves): lessons 10 and 13 run the check in make test
    "test_a_correct_bf16_save_and_a_bf16_merge_pass_on_what_a_user_feels": "the ship artefact matrix",
    "test_the_lost_rows_are_far_past_the_tolerance": "the ship artefact matrix",
    "test_the_base_tokenizer_serves_another_prompt": "the ship artefact matrix",
    "test_untrained_added_rows_are_reported_not_crashed_on": "the ship artefact matrix",
    "test_run_one_collects_failing_cells_and_outcomes_from_a_real_kernel": "a real kernel",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if getattr(item, "originalname", item.name) in SLOW_LANE:
            item.add_marker(pytest.mark.slow)
    items.sort(key=_weight)  # stable: within a group, collection order
