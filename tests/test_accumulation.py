"""Lesson 01's helpers, and its checkers' graded hints (the checkers' answers: test_checkers.py)."""

import copy

import pytest
import torch
from conftest import stub

from course_utils import accumulation as acc
from course_utils import make_messages


@pytest.fixture(scope="module")
def split(course):
    model, tok = course
    chats = make_messages("mixed", n=16, seed=3)
    by_k = {k: acc.split_micro_batches(tok, chats, group_size=8, k=k) for k in (1, 2, 4)}
    return copy.deepcopy(model), by_k


# ---- exercise 2 (fix): one optimizer step ---------------------------------------------------------

def test_accumulation_step_first_hint_holds_no_code_and_the_last_level_does(capsys):
    result = acc.check_accumulation_step(stub)
    levels = [result.hint() for _ in range(3)]
    assert "zero_grad" not in levels[0] and "summed /" not in levels[0]
    assert "zero_grad" in levels[2]


# ---- exercise 1 (diagnosis): broken runs ----------------------------------------------------------

def test_broken_run_covers_every_cause_and_is_deterministic():
    causes = {acc.broken_run_case(seed)[1].cause for seed in range(8)}
    assert causes == set(acc.CAUSES)
    assert acc.broken_run(5) == acc.broken_run(5)
    assert acc.broken_run(5) != acc.broken_run(9)


# ---- the lesson's measurements --------------------------------------------------------------------

def test_split_norms_grow_exactly_k_times_without_the_division(split):
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    bug = acc.split_norms(model, start, by_k, divide_by_accum=False)
    div = acc.split_norms(model, start, by_k)
    token = acc.split_norms(model, start, by_k, normalise="token")
    for k in by_k:
        assert bug[k] / div[k] == pytest.approx(k, rel=1e-4)
        assert token[k] == pytest.approx(token[1], rel=1e-4)


def test_undivided_adamw_equals_divided_with_eps_over_k(split):
    """The identity the lesson asserts: scaling every gradient by K only rescales epsilon."""
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    kw = dict(steps=2, accum_steps=2, lr=1e-3)
    _, undivided = acc.run_from(model, start, by_k[2], divide_by_accum=False, eps=1e-8, **kw)
    _, divided = acc.run_from(model, start, by_k[2], eps=1e-8 / 2, **kw)
    assert torch.allclose(undivided, divided, rtol=0, atol=1e-7)


def test_clip_grid_reuses_known_runs_and_shares_k1(split):
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    sentinel = [{"step": 1, "grad_norm": 1.0, "clipped": False, "loss": 1.0}]
    grid = acc.clip_grid(model, start, {1: by_k[1]}, thresholds=[None], steps=1, lr=1e-3,
                         known={(2, None, True): sentinel})
    assert grid[(2, None, True)] is sentinel
    assert grid[(1, None, True)] is grid[(1, None, False)]


def test_explorer_builds_without_a_frontend():
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


def test_split_micro_batches_rejects_a_k_that_does_not_divide_the_group(tokenizer):
    with pytest.raises(ValueError, match="not divisible"):
        acc.split_micro_batches(tokenizer, make_messages("add", n=8), group_size=8, k=3)
    with pytest.raises(ValueError, match="fewer than group_size"):
        acc.split_micro_batches(tokenizer, make_messages("add", n=4), group_size=8, k=2)
    with pytest.raises(ValueError, match="k=0"):
        acc.split_micro_batches(tokenizer, make_messages("add", n=8), group_size=8, k=0)


def test_split_norms_and_clip_grid_reject_a_list_instead_of_a_dict(split):
    model, by_k = split
    with pytest.raises(ValueError, match="dict"):
        acc.split_norms(model, model.state_dict(), by_k[1])
    with pytest.raises(ValueError, match="dict"):
        acc.clip_grid(model, model.state_dict(), by_k[1], thresholds=[None], steps=1, lr=1e-3)


def test_relative_difference_rejects_bad_shapes_and_zero_reference():
    with pytest.raises(ValueError, match="same model"):
        acc.relative_difference(torch.zeros(3), torch.zeros(4), torch.ones(3))
    with pytest.raises(ValueError, match="norm 0"):
        acc.relative_difference(torch.zeros(3), torch.ones(3), torch.zeros(3))


def test_custom_loss_trainer_and_sft_run_log_reject_bad_arguments(course):
    with pytest.raises(ValueError, match="not one of"):
        acc.custom_loss_trainer("mean")
    with pytest.raises(ValueError, match="accum_steps=0"):
        acc.sft_run_log(course[0], course[1], None, accum_steps=0, batch_size=2)


def test_broken_run_rejects_a_negative_seed():
    with pytest.raises(ValueError, match="seed=-1"):
        acc.broken_run(-1)


def test_plot_clip_setting_rejects_a_missing_grid_point():
    with pytest.raises(ValueError, match="not in the grid"):
        acc.plot_clip_setting({}, 4, 1.0)
