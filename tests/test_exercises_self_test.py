"""The final self-test (issue 33): unseen cases from every lesson, mixed, graded with a score; the notebook
never holds the truth; the right answers pass, a blanket answer and a wrong one do not."""

import pytest

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
