"""`viz.what_if`, every lesson's "what if" control: sliders → one redrawn frame; text without a frontend."""

import pytest

from course_utils import viz


def _frame(batch_size, side):
    fig, ax = viz.figure()
    ax.plot([0, 1], [0, batch_size])
    ax.set_title(f"batch {batch_size}, {side}")
    return f"batch {batch_size}, padding {side}", fig


@pytest.fixture
def control():
    return viz.what_if(_frame, {"batch_size": [1, 2, 4], "side": {"left": "L", "right": "R"}},
                       start={"batch_size": 2, "side": "R"}, descriptions={"batch_size": "batch size"})


def test_starts_where_told_and_prints_that_frame_without_a_frontend(control):
    assert control.choice() == {"batch_size": 2, "side": "R"}
    plain = control._repr_mimebundle_()["text/plain"]
    assert "batch_size = 2, side = right" in plain and "batch 2, padding R" in plain
    assert control.children[0].description == "batch size"
    kinds = [type(c).__name__ for c in control.children[:2]]
    assert kinds == ["SelectionSlider", "Dropdown"], "numbers on a slider, named set-ups in a dropdown"


def test_a_move_redraws_text_and_picture_in_one_value(control):
    control.children[0].value = 4
    assert control.text == "batch 4, padding R"
    assert 'alt="batch 4, R"' in control.output.value and "<pre" in control.output.value
    control.children[1].value = "left"
    assert control.choice() == {"batch_size": 4, "side": "L"}
    assert 'alt="batch 4, L"' in control.output.value


def test_frames_are_cached_so_going_back_is_instant():
    calls = []

    def frame(n):
        calls.append(n)
        return f"n = {n}"

    control = viz.what_if(frame, {"n": [1, 2]})
    for n in (2, 1, 2, 1):
        control.children[0].value = n
    assert calls == [1, 2]


@pytest.mark.parametrize("kwargs, error, phrase", [
    ({"frame": "not callable", "controls": {"n": [1]}}, TypeError, "function of the knobs"),
    ({"frame": str, "controls": {}}, ValueError, "no controls"),
    ({"frame": str, "controls": {"n": []}}, ValueError, "no choices"),
    ({"frame": str, "controls": {"n": 3}}, TypeError, "needs a list of choices"),
    ({"frame": str, "controls": {"n": [1]}, "start": {"n": 5}}, ValueError, "not one of its choices"),
    ({"frame": str, "controls": {"n": [1]}, "start": {"m": 1}}, ValueError, "not controls"),
    ({"frame": lambda n: 42, "controls": {"n": [1]}}, TypeError, "text and matplotlib figures only"),
])
def test_bad_input_says_what_why_and_how_to_fix(kwargs, error, phrase):
    frame, controls = kwargs.pop("frame"), kwargs.pop("controls")
    with pytest.raises(error, match=phrase):
        viz.what_if(frame, controls, **kwargs)
