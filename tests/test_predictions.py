"""Predictions that count (issue 33): recorded before the measurement, compared, tallied; late ones are not
counted; bad input is refused with a message."""

import pytest

from course_utils.predictions import predict, reveal, tally


def test_a_prediction_made_first_is_compared_and_counted(capsys):
    predict("ratio", 8.0)
    assert reveal("ratio", 7.9, right=lambda guess: abs(guess - 7.9) < 0.5) is True
    predict("direction", "closer")
    assert reveal("direction", "further") is False
    out = capsys.readouterr().out
    assert "you predicted 8" in out and "measured 7.9" in out and "✅" in out and "❌" in out
    assert tally() == {"right": 1, "wrong": 1, "not made": 0}


def test_no_prediction_or_a_late_one_is_not_counted(capsys):
    predict("x", None)  # the exercise copy's placeholder records nothing
    assert reveal("x", 3) is None
    predict("x", 3)  # written after the answer was on screen
    assert "not counted" in capsys.readouterr().out
    assert tally() == {"right": 0, "wrong": 0, "not made": 1}


def test_bad_input_says_what_to_pass():
    with pytest.raises(ValueError, match="non-empty string"):
        predict("", 1)
    with pytest.raises(TypeError, match="must be a function"):
        reveal("ratio", 1.0, right=True)


def test_after_a_run_all_the_learner_is_told_how_to_predict_first(capsys):
    """Issue 43: a prediction written after Run All is not counted, and the message says what to do."""
    from course_utils.predictions import forget, predict, reveal, tally

    reveal("ratio", 4.0)  # Run All: the measurement ran before any prediction
    assert "forget('ratio')" in capsys.readouterr().out
    predict("ratio", 4.0)
    out = capsys.readouterr().out
    assert "not counted" in out and "forget('ratio')" in out and "Restart" in out
    forget("ratio")
    predict("ratio", 4.0)
    reveal("ratio", 4.0)
    assert tally()["right"] == 1
