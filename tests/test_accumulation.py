"""Lesson 01's helpers and checkers: the references pass, stubs and known-wrong answers fail with the hint."""

import copy

import pytest
import torch

from course_utils import accumulation as acc
from course_utils import make_batches, make_messages
from course_utils.train import token_losses


@pytest.fixture(scope="module")
def setup(course):
    model, tok = course
    batches = make_batches(tok, make_messages("mixed", n=12, seed=3), batch_size=3)
    return copy.deepcopy(model), batches


def _stub(*args, **kwargs):
    raise NotImplementedError


# ---- exercise 1: the accumulation step ------------------------------------------------------------

def test_accumulation_step_accepts_the_reference():
    assert acc.check_accumulation_step(acc.accumulation_step_reference)


def test_accumulation_step_stub_is_not_implemented(capsys):
    assert not acc.check_accumulation_step(_stub)
    assert "not implemented yet" in capsys.readouterr().out


def _unscaled(model, micro_batches, max_grad_norm):
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n).backward()  # the bug: no / K
    return float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))


def test_accumulation_step_rejects_the_missing_division_with_its_hint():
    result = acc.check_accumulation_step(_unscaled)
    assert not result
    assert "the division by K is missing" in result.message


def test_accumulation_step_rejects_the_post_clip_norm():
    def post_clip(model, micro_batches, max_grad_norm):
        acc.accumulation_step_reference(model, micro_batches, max_grad_norm)
        return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))

    result = acc.check_accumulation_step(post_clip)
    assert not result
    assert "AFTER clipping" in result.message


# ---- exercise 2: the clip rate --------------------------------------------------------------------

def test_clip_rate_accepts_the_reference_and_rejects_a_stub():
    assert acc.check_clip_rate(acc.clip_rate_reference)
    assert not acc.check_clip_rate(_stub)


def test_clip_rate_rejects_a_count_and_the_inverted_rate():
    count = acc.check_clip_rate(lambda norms, t: sum(g > t for g in norms))
    assert not count and "you returned a count" in count.message
    inverted = acc.check_clip_rate(lambda norms, t: sum(g <= t for g in norms) / len(norms))
    assert not inverted and "NOT clipped" in inverted.message


# ---- the lesson's measurements --------------------------------------------------------------------

def test_undivided_adamw_equals_divided_with_eps_over_k(setup):
    """The identity the lesson asserts: scaling every gradient by K only rescales epsilon."""
    model, batches = setup
    start = copy.deepcopy(model.state_dict())
    kw = dict(steps=2, accum_steps=2, lr=1e-3)
    _, undivided = acc.run_from(model, start, batches, divide_by_accum=False, eps=1e-8, **kw)
    _, divided = acc.run_from(model, start, batches, eps=1e-8 / 2, **kw)
    assert torch.allclose(undivided, divided, rtol=0, atol=1e-7)


def test_clip_grid_reuses_known_runs_and_shares_k1(setup):
    model, batches = setup
    start = copy.deepcopy(model.state_dict())
    sentinel = [{"step": 1, "grad_norm": 1.0, "clipped": False, "loss": 1.0}]
    grid = acc.clip_grid(model, start, batches, ks=[1], thresholds=[None], steps=1, lr=1e-3,
                         known={(2, None, True): sentinel})
    assert grid[(2, None, True)] is sentinel
    assert grid[(1, None, True)] is grid[(1, None, False)]


def test_explorer_builds_without_a_frontend(setup):
    records = [{"step": 1, "grad_norm": 2.0, "clipped": True, "loss": 1.0}]
    grid = {(k, t, d): records for k in (1, 2) for t in (1.0, None) for d in (True, False)}
    widget = acc.clip_explorer(grid)
    assert len(widget.children) >= 2


def test_threshold_between_lies_between_the_medians():
    assert 2 < acc.threshold_between([1, 2, 3], [7, 8, 9]) < 8


# ---- bad input raises ValueError with what / why / fix --------------------------------------------

def test_threshold_between_rejects_unseparated_norms():
    with pytest.raises(ValueError, match="no threshold between them"):
        acc.threshold_between([5.0, 6.0], [1.0, 2.0])


def test_relative_difference_rejects_bad_shapes_and_zero_reference():
    with pytest.raises(ValueError, match="same model"):
        acc.relative_difference(torch.zeros(3), torch.zeros(4), torch.ones(3))
    with pytest.raises(ValueError, match="norm 0"):
        acc.relative_difference(torch.zeros(3), torch.ones(3), torch.zeros(3))


def test_sft_first_grad_norm_rejects_an_unknown_loss(course):
    with pytest.raises(ValueError, match="not one of"):
        acc.sft_first_grad_norm(None, course[1], None, accum_steps=2, batch_size=2, loss="mean")


def test_plot_clip_setting_rejects_a_missing_grid_point():
    with pytest.raises(ValueError, match="not in the grid"):
        acc.plot_clip_setting({}, 4, 1.0)
