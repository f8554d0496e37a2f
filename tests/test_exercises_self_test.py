"""The final self-test (issue 33): unseen cases from every lesson, mixed, graded with a score; the notebook
never holds the truth; the right answers pass, a blanket answer and a wrong one do not."""

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
