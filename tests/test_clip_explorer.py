"""Lesson 01's explorer (issue 17.3): "no clipping" is a value the slider holds, and the last move wins."""

import pytest

from course_utils import accumulation as acc


@pytest.fixture
def grid():
    def records(norm):
        return [{"step": s, "grad_norm": norm * s, "clipped": norm * s > 2, "loss": 1.0} for s in (1, 2, 3)]

    return {(k, t, d): records(k * (1 if d else 2)) for k in (1, 2) for t in (1.0, 17.3, None)
            for d in (True, False)}


def test_no_clipping_is_the_option_off_and_redraws(grid):
    box = acc.clip_explorer(grid)
    k_slider, t_slider, image = box.children
    assert t_slider.options == ("1", "17.3", "off")
    t_slider.value = "off"  # raised a TraitError (None is not an index) before
    assert acc.clip_title(2, None) == "pre-clip gradient norm, K = 2, max_grad_norm = off"
    assert "<img src=\"data:image/png;base64," in image.value
    assert f'alt="{acc.clip_title(2, None)}"' in image.value


def test_quick_moves_end_on_the_last_setting(grid):
    k_slider, t_slider, image = acc.clip_explorer(grid).children
    pictures = set()
    for k, label in ((1, "off"), (2, "1"), (1, "17.3")):
        k_slider.value, t_slider.value = k, label
        pictures.add(image.value)
    assert f'alt="{acc.clip_title(1, 17.3)}"' in image.value
    assert len(pictures) == 3, "each setting draws its own picture"


def test_descriptions_have_room(grid):
    for slider in acc.clip_explorer(grid).children[:2]:
        assert slider.style.description_width == "initial"


def test_plot_clip_setting_accepts_off_and_rejects_unknown_points(grid):
    ax = acc.plot_clip_setting(grid, 2, "off")
    assert ax.get_title().endswith("max_grad_norm = off")
    with pytest.raises(ValueError, match="not in the grid"):
        acc.plot_clip_setting(grid, 3, "off")
