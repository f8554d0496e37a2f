"""Unit tests for lesson 05's module (course_utils/truncation.py): the checkers accept the reference,
reject stubs and known-wrong answers with the targeted hint; the 0/0 behaviours the lesson asserts."""

import math

import pytest
import torch
import torch.nn.functional as F

from course_utils import truncation as T
from course_utils.data import IGNORE_INDEX


def _not_implemented(*args):
    raise NotImplementedError


# ---- exercise 1: the dataset filter ------------------------------------------------------------

def test_filter_checker_accepts_reference():
    assert T.check_filter_fully_masked(T.filter_fully_masked)


def test_filter_checker_rejects_stub():
    result = T.check_filter_fully_masked(_not_implemented)
    assert not result and "not implemented" in result.message


def test_filter_checker_names_inverted_filter():
    result = T.check_filter_fully_masked(lambda ex: [e for e in ex if not T.has_targets(e["labels"])])
    assert not result and "inverted" in result.message


def test_filter_checker_names_last_label_only():
    result = T.check_filter_fully_masked(lambda ex: [e for e in ex if e["labels"][-1] != IGNORE_INDEX])
    assert not result and "last label only" in result.message


def test_filter_rejects_bad_input():
    with pytest.raises(ValueError, match="labels"):
        T.filter_fully_masked([[1, 2, 3]])


# ---- exercise 2: the safe masked loss ----------------------------------------------------------

def _flat(logits, labels):
    return logits.flatten(0, -2).float(), labels.flatten()


def test_loss_checker_accepts_reference():
    assert T.check_safe_masked_loss(T.clamped_mean_reference)


def test_loss_checker_rejects_stub():
    assert not T.check_safe_masked_loss(_not_implemented)


def test_loss_checker_names_zero_division():
    def plain_mean(logits, labels):
        return F.cross_entropy(*_flat(logits, labels), ignore_index=IGNORE_INDEX)

    result = T.check_safe_masked_loss(plain_mean)
    assert not result and "clamp(min=1)" in result.message


def test_loss_checker_names_nan_to_num_gradient():
    def patched(logits, labels):  # the hand-written masked mean, "fixed" after the division
        logits, labels = _flat(logits, labels)
        mask = labels != IGNORE_INDEX
        nll = -logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[:, None])[:, 0]
        return torch.nan_to_num((nll * mask).sum() / mask.sum())

    result = T.check_safe_masked_loss(patched)
    assert not result and "gradient" in result.message and "nan_to_num" in result.message


def test_loss_checker_names_gradless_zero():
    def fresh_zero(logits, labels):
        logits, labels = _flat(logits, labels)
        if not (labels != IGNORE_INDEX).any():
            return torch.tensor(0.0)
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)

    result = T.check_safe_masked_loss(fresh_zero)
    assert not result and "grad_fn" in result.message


def test_loss_checker_names_sum():
    def summed(logits, labels):
        logits, labels = _flat(logits, labels)
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")

    result = T.check_safe_masked_loss(summed)
    assert not result and "the sum" in result.message


# ---- the behaviours the lesson asserts ---------------------------------------------------------

def _empty_logits():
    logits = torch.randn(2, 5, 7, requires_grad=True)
    return logits, torch.full((2, 5), IGNORE_INDEX)


def test_builtin_mean_is_nan_with_zero_grad():
    logits, labels = _empty_logits()
    loss = T.builtin_mean_loss(logits, labels)
    loss.backward()
    assert math.isnan(loss.item()) and torch.equal(logits.grad, torch.zeros_like(logits))


def test_handwritten_mean_has_nan_grad_and_clamped_fixes_it():
    logits, labels = _empty_logits()
    T.handwritten_mean_loss(logits, labels).backward()
    assert torch.isnan(logits.grad[:, :-1]).all()  # the last logit predicts nothing
    logits.grad = None
    loss = T.clamped_mean_loss(logits, labels)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))


def test_clamped_matches_builtin_with_targets():
    logits = torch.randn(2, 6, 7)
    labels = torch.randint(0, 7, (2, 6))
    labels[0, :3] = IGNORE_INDEX
    assert torch.allclose(T.clamped_mean_loss(logits, labels), T.builtin_mean_loss(logits, labels))


def _ex(n_prompt, n_answer):
    return {"input_ids": list(range(1, n_prompt + n_answer + 1)),
            "labels": [IGNORE_INDEX] * n_prompt + list(range(1, n_answer + 1))}


def test_packer_starves_and_crop_fixes_it():
    examples = [_ex(3, 2), _ex(20, 2), _ex(4, 3), _ex(25, 1)]  # two conversations longer than the row
    starving = T.bestfit_batches(examples, row_capacity=10, rows=1, n_batches=12, pad_id=0, buffer_size=2)
    assert T.batch_signal(starving)[-1]["valid_tokens"] == 0
    assert starving[-1]["consumed"] == starving[-4]["consumed"]  # the data stopped advancing
    fixed = T.bestfit_batches(examples, row_capacity=10, rows=1, n_batches=12, pad_id=0, buffer_size=2,
                              crop=True, drop_untrainable=True)
    assert all(s["valid_tokens"] > 0 for s in T.batch_signal(fixed))


def test_fully_masked_rate_and_bad_batch_size():
    rate = T.fully_masked_batch_rate([True, False] * 10, 1, shuffles=5)
    assert rate["per_batch"] == 0.5 and rate["per_epoch"] == 1.0
    with pytest.raises(ValueError, match="batch_size"):
        T.fully_masked_batch_rate([True], 0)


def test_unknown_loss_name_raises():
    with pytest.raises(ValueError, match="clamped"):
        T._loss_fn("mean")
