"""Every exercise checker, run on its lesson's answers: the one copy of the generic checker tests.

Each ``course_utils/exercises/lessonNN.py`` has ``tests/test_exercises_lessonNN.py``, whose tables give every
checker its reference answer (``CHECKERS``, rows ``Row(name, run, reference)``: accepted), the stub a
learner's cell holds (reported as not implemented), a second correct answer (``ALSO_CORRECT``, rows
``(name, answer)``: a checker grades behaviour, not text) and the known wrong answers (``WRONG``, rows
``(name, wrong, phrase)``: each rejected, naming its misconception where the learner sees it). The lesson
files keep their lesson-specific tests (hints, generators, bad input); this file runs the tables of all of
them, and finds the checkers by inspection, so a new lesson's or a new checker cannot be left out.
"""

import gc
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

import pytest
from conftest import Row, strings_held, stub, wrong

import course_utils.exercises
from course_utils import checks
from course_utils.checks import Diagnosis

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


# ---- the shortcut classes of issue 43, tried on every checker -------------------------------------------
# A learner who wants the tick without the skill: a public keyword that fixes the cases plus a constant
# answer, the hint's answer read off the returned object, the truth read from the caller's frames or from
# gc, an object equal to everything, and a memo of earlier runs. Each must fail every checker.

class AlwaysEqual:
    """Equal to everything, unequal to nothing."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def always_equal(*args, **kwargs):
    """Returns an object whose __eq__ always says yes."""
    return AlwaysEqual()


def always_equal_diagnosis(*args, **kwargs):
    """A Diagnosis whose cause and evidence are equal to everything."""
    return Diagnosis(AlwaysEqual(), AlwaysEqual())


class AlwaysEqualStr(str):
    """A str equal to everything (a subclass: isinstance(x, str) holds)."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


def always_equal_str_diagnosis(*args, **kwargs):
    """A Diagnosis whose cause is a str subclass equal to every cause."""
    return Diagnosis(AlwaysEqualStr("healthy"), AlwaysEqual())


def _is_truth(value) -> bool:
    """A value a frame walk could read an answer from: a Diagnosis (a truth), a Case whose expected value is
    an object (not sealed bytes), or a list/tuple/dict holding one."""
    if isinstance(value, Diagnosis):
        return True
    if isinstance(value, checks.Case):
        return value.expected is not None and not isinstance(value.expected, bytes)
    if isinstance(value, (list, tuple)):
        return any(_is_truth(v) for v in value[:64])
    if isinstance(value, dict):
        return any(_is_truth(v) for v in list(value.values())[:64])
    return False


def _truth_in_frames() -> list[str]:
    """What the caller's frames hold that reads as a truth: 'function: local' for each."""
    found, frame = [], inspect.currentframe().f_back.f_back
    while frame is not None:
        if frame.f_code.co_filename.startswith(str(TESTS)):
            break  # the test's own frames: not the checker's
        found += [f"{frame.f_code.co_name}: {name}" for name, value in frame.f_locals.items()
                  if _is_truth(value)]
        frame = frame.f_back
    return found


def frame_peek(*args, **kwargs):
    """Walks the caller's frames for the truth: a Diagnosis, or a Case's expected value."""
    frame = inspect.currentframe().f_back
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, Diagnosis):
                return value
            if isinstance(value, checks.Case) and value.expected is not None:
                return value.expected
        frame = frame.f_back
    return None


def gc_peek(*args, **kwargs):
    """Finds, among every live object, a pair (artefact, truth) whose artefact equals the one it was given."""
    for obj in gc.get_objects():
        if type(obj) is tuple and len(obj) == 2 and isinstance(obj[1], Diagnosis) and args:
            try:
                if obj[0] == args[0]:
                    return obj[1]
            except Exception:  # noqa: BLE001 — an artefact that cannot be compared is not the one
                continue
    return None


class LazyDiagnosis(Diagnosis):
    """A Diagnosis whose fields are computed when the grader reads them: a frame walk from there."""

    def __getattribute__(self, name):
        if name in ("cause", "evidence"):
            frame = inspect.currentframe().f_back
            while frame is not None:
                for value in frame.f_locals.values():
                    if isinstance(value, Diagnosis) and not isinstance(value, LazyDiagnosis):
                        return getattr(value, name)
                frame = frame.f_back
        return object.__getattribute__(self, name)


def lazy_diagnosis(*args, **kwargs):
    """Returns a Diagnosis that reads the truth from the grader's frames when its fields are read."""
    return LazyDiagnosis("?", None)


SHORTCUTS = [always_equal, always_equal_diagnosis, always_equal_str_diagnosis, frame_peek, gc_peek,
             lazy_diagnosis]
DIAGNOSIS_ROWS = [param for param in REFERENCES
                  if "check_diagnosis(" in inspect.getsource(
                      getattr(GRADERS[param.id.split()[0]], f"check_{param.values[0].name}"))]


@pytest.mark.parametrize("shortcut", SHORTCUTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("row", REFERENCES)
def test_no_shortcut_passes(row, shortcut, request, capsys):
    result = row.run(shortcut, request.getfixturevalue)
    assert not result, f"{shortcut.__doc__} passes {row.name}"


@pytest.mark.parametrize("row", REFERENCES)
def test_no_truth_is_reachable_from_the_learners_frames(row, request, capsys):
    """While the learner's function runs, no frame it can walk to holds a truth or an expected value."""
    seen = []

    def spy(*args, **kwargs):
        seen.extend(_truth_in_frames())
        return row.reference(*args, **kwargs)

    row.run(spy, request.getfixturevalue)
    assert not seen, f"the learner's function can read the truth from its caller's frames: {seen}"


@pytest.mark.parametrize("row", REFERENCES)
def test_the_hints_answer_is_not_on_the_result(row, request, capsys):
    """After two failed checks the answer level opens by .hint() only: the result does not hold it."""
    row.run(wrong, request.getfixturevalue)
    result = row.run(wrong, request.getfixturevalue)
    hints = checks._HINTS.get(result.name)
    if hints is None:
        pytest.skip(f"{row.name} has plain-sentence hints only")
    answer = hints.answer
    reachable = [result.message, repr(result), repr(vars(result))]
    reachable += [repr(getattr(result, a, None)) for a in dir(result) if not a.startswith("__")]
    assert not any(answer in text for text in reachable), "the hint's answer is readable on the result"


@pytest.mark.parametrize("row", REFERENCES)
def test_checkers_take_no_keyword_that_fixes_the_cases(row):
    lesson = next(lesson for lesson, tables in LESSONS.items() if row in tables.CHECKERS)
    check = getattr(GRADERS[lesson], f"check_{row.name}")
    # the learner's function and what it is graded with; check_self_test's quiz must be a whole drawn quiz
    knobs = set(inspect.signature(check).parameters) - {"fn", "tokenizer", "answer_for", "quiz", "quiet"}
    assert not knobs, f"check_{row.name} takes {sorted(knobs)}: a keyword that fixes or narrows the cases"


def _fingerprint(value):
    """A value's content as nested tuples (tensors as lists, objects as their fields), to compare draws."""
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _fingerprint(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_fingerprint(v) for v in value)
    if hasattr(value, "tolist"):
        return ("tensor", _fingerprint(value.tolist()))
    if callable(value):
        return ("callable", getattr(value, "__qualname__", type(value).__name__))
    if hasattr(value, "__dict__"):
        return (type(value).__name__, _fingerprint(vars(value)))
    return repr(value)


def _spied(row, fixture):
    """The artefacts the checker draws in one run (the reference answers them) and the causes it found."""
    artefacts, causes = [], []

    def spy(artefact):
        artefacts.append(_fingerprint(artefact))
        answer = row.reference(artefact)
        causes.append(answer.cause)
        return answer

    assert row.run(spy, fixture)
    return artefacts, causes


@pytest.mark.parametrize("row", DIAGNOSIS_ROWS)
def test_no_artefact_names_its_cause(row, request, capsys):
    """A diagnosis artefact is what a practitioner sees: no attribute, closure variable or partial argument
    of it holds its cause's name (lesson 01's run once closed over it)."""
    named = []

    def spy(artefact):
        answer = row.reference(artefact)
        if answer.cause in strings_held(artefact):
            named.append(answer.cause)
        return answer

    row.run(spy, request.getfixturevalue)
    assert not named, f"artefacts that name their cause: {named}"


@pytest.mark.parametrize("row", DIAGNOSIS_ROWS)
def test_every_run_draws_fresh_cases_that_mix_causes(row, request, capsys, monkeypatch):
    """A memo of earlier runs is useless (each run holds cases never drawn before); an instructor's seed makes
    a run reproducible, and even then every run mixes causes, so a constant answer fails."""
    first, _ = _spied(row, request.getfixturevalue)
    second, causes = _spied(row, request.getfixturevalue)
    new = [a for a in second if a not in first]
    assert len(new) >= 5, f"only {len(new)} of {len(second)} cases are new in a second run: a memo replays"
    assert len(set(causes)) >= 2, "a run of one cause lets a constant answer pass"
    monkeypatch.setenv(checks.CHECK_SEED_ENV, "7")
    demo, demo_causes = _spied(row, request.getfixturevalue)
    assert demo == _spied(row, request.getfixturevalue)[0], "COURSE_CHECK_SEED makes a run reproducible"
    for cause in sorted(set(demo_causes)):
        def constant(artefact, cause=cause):
            """One cause for everything."""
            return Diagnosis(cause, None)
        assert not row.run(constant, request.getfixturevalue), f"constant {cause!r} passes with the demo seed"


def test_a_hint_shows_once_in_jupyter_and_the_result_holds_no_hint(capsys):
    """result.hint() prints its text; the returned string does not show a second time as Out[] (issue 43)."""
    hints = checks.Hints("which tokens?", "look at row 3", "labels[i] = ids[i]")
    result = checks.run_check("toy", wrong, [checks.Case((1,), 1)], hint=hints, quiet=True)
    text = result.hint()
    assert capsys.readouterr().out.count("which tokens?") == 1
    assert isinstance(text, str) and hasattr(type(text), "_ipython_display_"), "no Out[] echo"
    assert "labels[i]" not in repr(vars(result)) and not hasattr(result, "hints")


@pytest.mark.parametrize("value, expected", [(AlwaysEqualStr("x"), "x"), ((1, [2.0, None]), (1, [2.0, None])),
                                             ({"a": {3}}, {"a": frozenset({3})}), (True, True)])
def test_plain_turns_look_alikes_into_builtins(value, expected):
    got = checks.plain(value)
    assert got == expected and type(got) is type(expected)


def test_plain_refuses_an_object_it_cannot_compare_honestly():
    with pytest.raises(checks.NotPlain, match="not a plain value"):
        checks.plain(AlwaysEqual())


def _finished_helper(x):
    """Stands for a course helper that is an exercise's answer."""
    return x + 1


def test_a_helper_out_of_reach_fails_however_it_is_reached(capsys):
    """Issue 43: a helper that is the exercise's finished form fails the check whether the learner calls it
    directly, through another name or nested in their own code; the profile hook is gone afterwards."""
    alias = _finished_helper

    def direct(x):
        """Calls the helper."""
        return alias(x)

    def nested(x):
        """Calls it two levels down."""
        return (lambda y: direct(y))(x)

    def own(x):
        """Writes the step itself."""
        return x + 1

    cases = [checks.Case((1,), 2), checks.Case((5,), 6)]
    for answer in (direct, nested):
        result = checks.run_check("toy", answer, cases, out_of_reach=(_finished_helper,), quiet=True)
        assert not result and "finished form of this exercise" in result.message, result.message
        assert "_finished_helper" in result.message
    assert checks.run_check("toy", own, cases, out_of_reach=(_finished_helper,), quiet=True)
    assert sys.getprofile() is None, "the checker restores the profile it found"


def test_a_narrowed_draw_cannot_certify_a_constant_answer(capsys):
    """Issue 43: a learner who patches the seed source so every case has one cause gets no tick for the
    constant answer that then fits every case."""
    def one_cause(seed):
        return {"seed": seed}, Diagnosis("healthy", None)

    def constant(artefact):
        """The same cause for everything."""
        return Diagnosis("healthy", None)

    result = checks.check_diagnosis("toy", constant, one_cause, seeds=lambda: [1, 2, 3], quiet=True)
    assert not result and "same cause" in result.message

    def two_causes(seed):
        return {"seed": seed}, Diagnosis("healthy" if seed % 2 else "broken", None)

    def reads_it(artefact):
        """Reads the cause from the seed, as a correct diagnosis reads the artefact."""
        return Diagnosis("healthy" if artefact["seed"] % 2 else "broken", None)

    assert checks.check_diagnosis("toy", reads_it, two_causes, seeds=lambda: [1, 2, 3], quiet=True)
