"""The final self-test (issue 33): unseen cases from every lesson, mixed, graded with a score; the notebook
never holds the truth; the right answers pass, a blanket answer and a wrong one do not."""

import importlib
import time

import pytest
from conftest import Row

from course_utils.exercises import self_test as st


def test_every_lesson_contributes_and_no_question_names_its_answer():
    assert set(st.available_lessons()) >= set(st.LESSONS) - {"09"}, "each lesson draws self-test cases"
    quiz = st.draw_quiz()
    assert len({q.lesson for q in quiz}) == len(st.available_lessons())
    for q in quiz:
        truth = st._truth(q)
        assert truth in q.choices and len(set(q.choices)) == len(q.choices) >= 2
        assert truth.lower() not in q.text.lower(), f"Q{q.number} (lesson {q.lesson}) names its own answer"
        assert "truth" not in vars(q) and truth not in repr(q).replace(repr(q.choices), ""), "no truth stored"


def test_right_answers_pass_blanket_answers_fail(capsys):
    quiz = st.draw_quiz()
    assert st.check_self_test(lambda q: st._truth(q), quiz, quiet=True)
    by_letter = st.check_self_test(lambda q: "abcdefgh"[q.choices.index(st._truth(q))], quiz, quiet=True)
    assert by_letter, "a letter answers too"
    for blanket in ("a", "b"):
        assert not st.check_self_test(lambda q, b=blanket: b, quiz, quiet=True), f"always {blanket!r}"
    result = st.check_self_test(lambda q: q.choices[-1] if st._truth(q) != q.choices[-1] else q.choices[0],
                                quiz, quiet=True)
    assert not result and "revisit lesson" in result.message and "0 of" in result.message


@pytest.mark.parametrize("lesson", st.LESSONS)
def test_each_lessons_cases_draw_every_cause_quickly_and_never_name_it(lesson):
    """Each lesson's ``self_test_case(seed)`` (in its answers module): deterministic, a fraction of a second,
    at most 25 lines, every cause within 24 seeds, and the text names neither the cause's phrase nor a
    cause's code name."""
    answers = importlib.import_module(f"course_utils.exercises.answers.lesson{lesson}")
    exercise = importlib.import_module(f"course_utils.exercises.lesson{lesson}")
    names = [n for n in getattr(answers, "CAUSES", getattr(exercise, "CAUSES", ())) if "_" in n]
    phrases = tuple(answers.SELF_TEST_CAUSES.values())
    answers.self_test_case(0)  # a tokenizer or template loads once
    causes = set()
    for seed in range(24):
        start = time.perf_counter()
        text, cause, choices = answers.self_test_case(seed)
        assert time.perf_counter() - start < 0.5, f"seed {seed} is slow"
        assert cause in choices and choices == phrases
        assert cause.lower() not in text.lower() and len(text.splitlines()) <= 25
        assert not any(name in text for name in names), "no cause's code name in what the learner reads"
        assert (text, cause) == answers.self_test_case(seed)[:2], "deterministic per seed"
        causes.add(cause)
    assert causes == set(phrases)


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="draw_quiz"):
        st.check_self_test(lambda q: "a", [])
    with pytest.raises(TypeError, match="must be a function"):
        st.check_self_test("a", st.draw_quiz())


# ---- the checker tables (tests/test_checkers.py runs them) ------------------------------------------------

_QUIZ = []


def _quiz():
    if not _QUIZ:
        _QUIZ.append(st.draw_quiz())
    return _QUIZ[0]


def answer_key(question):
    """The reference: each question's cause, drawn again from its lesson."""
    return st._truth(question)


def by_letter(question):
    """A second correct answer: the letter of the right choice, as a learner types it."""
    return "abcdefgh"[question.choices.index(st._truth(question))]


def always_the_first_choice(question):
    """A blanket answer: the first choice every time — some are right, most are not."""
    return "a"


CHECKERS = [Row("self_test", lambda fn, fixture: st.check_self_test(fn, _quiz()), answer_key)]
ALSO_CORRECT = [("self_test", by_letter)]
WRONG = [("self_test", always_the_first_choice, "revisit lesson")]
