"""Lesson 07's exercises (course_utils.exercises.lesson07): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: tests/test_checkers.py runs them);
the trace generator covers every cause; bad non-learner arguments are refused."""

import math

import pytest
import torch
from conftest import Row, graded

from course_utils.checks import Diagnosis
from course_utils.exercises import lesson07 as ex
from course_utils.exercises.answers import lesson07
from course_utils.losses import count_supervised
from course_utils.training import token_losses

# ---- the answers: exercise 7.1 (trace_diagnosis), then exercise 7.2 (sequence_weighted) ------------

def _diagnose_by_ratios(trace):
    """A second correct diagnosis: compares each row's weight with 1/N instead of with each other."""
    rows, world, k = trace["rows"], trace["world_size"], trace["accum_steps"]
    bad = [r for r in rows if not math.isfinite(r["backward_loss"])]
    if bad:
        return Diagnosis("empty_micro_batch", bad[0]["micro_step"])
    n_total = sum(r["n_tokens"] for r in rows)
    ratio = [r["backward_loss"] / r["summed_loss"] / world * n_total for r in rows]  # 1.0 when healthy
    if all(abs(x - 1) < 1e-6 for x in ratio):
        return Diagnosis("token_weighted", None)
    if all(abs(x - ratio[0]) < 1e-6 * ratio[0] for x in ratio):
        return Diagnosis("missing_division_by_k", k)
    worst = rows[ratio.index(max(ratio))]
    return Diagnosis("per_rank_mean", worst["rank"]) if world > 1 else Diagnosis("per_micro_batch_mean",
                                                                                  worst["micro_step"])


def _ignores_world_size(trace):
    """Misconception: forgets DDP's average, so a correct multi-rank step looks W times too large."""
    truth = lesson07.diagnose_accumulation_trace(trace)
    if truth.cause == "token_weighted" and trace["world_size"] > 1:
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _ranks_are_micro_batches(trace):
    """Misconception: a DDP step is just accumulation, so per-rank means are 'per_micro_batch_mean'."""
    truth = lesson07.diagnose_accumulation_trace(trace)
    if truth.cause == "per_rank_mean":
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _unequal_blamed_on_k(trace):
    """Misconception: any too-large step is the missing / K of lesson 01."""
    truth = lesson07.diagnose_accumulation_trace(trace)
    if truth.cause == "missing_division_by_k":
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _sequence_weighted_loop(model, micro_batches):
    """A second correct fix: a loop over rows, each row's mean / S."""
    import torch.nn.functional as F

    rows = [(b, r) for b in micro_batches for r in range(len(b["labels"]))
            if (b["labels"][r, 1:] != -100).any()]
    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        loss = 0.0
        for r in range(len(b["labels"])):
            labels = b["labels"][r, 1:]
            if (labels != -100).any():
                loss = loss + F.cross_entropy(logits[r, :-1].float(), labels, ignore_index=-100)
        (loss / len(rows)).backward()


def _token_weighted(model, micro_batches):
    """Per-token weighting (summed / the step's tokens) where per-sequence weighting was asked."""
    n = sum(count_supervised(b) for b in micro_batches)
    for b in micro_batches:
        summed, _ = token_losses(model, b)
        (summed / n).backward()


def _per_micro_batch_sequence_mean(model, micro_batches):
    """Averages sequences inside each micro-batch, then / K: small micro-batches weigh more."""
    import torch.nn.functional as F

    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        labels = b["labels"][:, 1:]
        nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
        n = (labels != -100).sum(1)
        keep = n > 0
        ((nll.sum(1)[keep] / n[keep]).mean() / len(micro_batches)).backward()


def _counts_empty_rows(model, micro_batches):
    """Counts the rows without a supervised token among the sequences: the right direction, too small."""
    import torch.nn.functional as F

    s = sum(len(b["labels"]) for b in micro_batches)
    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        labels = b["labels"][:, 1:]
        nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
        n = (labels != -100).sum(1)
        (torch.where(n > 0, nll.sum(1) / n.clamp(min=1), 0.0).sum() / s).backward()


def _no_backward(model, micro_batches):
    """Computes nothing and never calls .backward(): no parameter gets a .grad."""
    return None


# ---- the tables (tests/test_checkers.py runs them) ----------------------------------------------------

CHECKERS = [
    Row("trace_diagnosis", graded(ex.check_trace_diagnosis), lesson07.diagnose_accumulation_trace),
    Row("sequence_weighted", graded(ex.check_sequence_weighted), lesson07.accumulate_sequence_weighted),
]
ALSO_CORRECT = [("trace_diagnosis", _diagnose_by_ratios), ("sequence_weighted", _sequence_weighted_loop)]
WRONG = [
    ("trace_diagnosis", _ignores_world_size, "this step is the big batch"),
    ("trace_diagnosis", _ranks_are_micro_batches, "DDP averages the ranks' means"),
    ("trace_diagnosis", _unequal_blamed_on_k, "the step counts K times"),
    ("sequence_weighted", _token_weighted, "long answers dominate"),
    ("sequence_weighted", _per_micro_batch_sequence_mean, "a sequence in a small micro-batch counts more"),
    ("sequence_weighted", _counts_empty_rows, "right direction"),
    ("sequence_weighted", _no_backward, ".backward()"),
]


# ---- answers that raise or give a degenerate gradient --------------------------------------------

def _zero_gradient(model, micro_batches):
    """Back-propagates 0 × the loss: every .grad exists and is zero."""
    for b in micro_batches:
        summed, _ = token_losses(model, b)
        (0 * summed).backward()


def _nan_gradient(model, micro_batches):
    """Divides by a count of zero: the gradient is NaN."""
    for b in micro_batches:
        summed, _ = token_losses(model, b)
        (summed / 0).backward()


@pytest.mark.parametrize("answer, words", [
    (lambda model, mbs: mbs[99], "your function raised IndexError"),
    (_zero_gradient, "relative gradient error"),
    (_nan_gradient, "NaN/inf"),
], ids=["raises", "zero gradient", "nan gradient"])
def test_a_wrong_answer_that_raises_or_gives_a_degenerate_gradient_is_reported(answer, words, capsys):
    result = ex.check_sequence_weighted(answer)
    assert not result and words in result.message, result.message


# ---- the generator ----------------------------------------------------------------------------------

def test_traces_cover_every_cause_and_the_public_one_hands_out_the_trace_only():
    assert {lesson07.accumulation_trace_case(s)[1].cause for s in range(10)} == set(ex.TRACE_CAUSES)
    trace = ex.accumulation_trace(7)
    assert set(trace) == {"world_size", "accum_steps", "rows"}, "the public function names no cause"
    assert trace == lesson07.accumulation_trace_case(7, graded=False)[0]
    assert trace != lesson07.accumulation_trace_case(7, graded=True)[0], "the graded stream is drawn apart"
    assert not hasattr(ex, "_accumulation_trace_case"), "the truth lives with the answers"


def test_healthy_controls_share_the_look_alikes_surface():
    """Healthy traces on several ranks (like per_rank_mean) and with equal counts (like the missing ÷ K)."""
    cases = map(lesson07.accumulation_trace_case, range(4, 400, 5))
    healthy = [t for t, d in cases if d.cause == "token_weighted"]
    assert any(t["world_size"] > 1 for t in healthy)
    assert any(len({r["n_tokens"] for r in t["rows"]}) == 1 for t in healthy)


# ---- shortcuts a learner has at each exercise: each fails the checker (issue 33) ----------------------

def _match_shown_traces(trace):
    """Exercise 1: look the trace up among accumulation_trace(seed) and read the cause off the seed."""
    for seed in range(20_000):
        if ex.accumulation_trace(seed) == trace:
            return Diagnosis(ex.TRACE_CAUSES[seed % len(ex.TRACE_CAUSES)], None)
    return Diagnosis("token_weighted", None)


def _counts_only(trace):
    """Exercise 1: reads n_tokens and NaN only, never backward_loss: unequal -> a mean, equal -> no ÷ K."""
    rows = trace["rows"]
    nan = [r for r in rows if math.isnan(r["backward_loss"])]
    if nan:
        return Diagnosis("empty_micro_batch", nan[0]["micro_step"])
    smallest = min(rows, key=lambda r: r["n_tokens"])
    if len({r["n_tokens"] for r in rows}) == 1:
        return Diagnosis("missing_division_by_k", trace["accum_steps"])
    if trace["world_size"] > 1:
        return Diagnosis("per_rank_mean", smallest["rank"])
    return Diagnosis("per_micro_batch_mean", smallest["micro_step"])


def _several_ranks_is_the_bug(trace):
    """Exercise 1: any world_size > 1 is the per-rank mean (section 6.1 as a rule), else the reference."""
    if trace["world_size"] > 1:
        return Diagnosis("per_rank_mean", min(trace["rows"], key=lambda r: r["n_tokens"])["rank"])
    return lesson07.diagnose_accumulation_trace(trace)


def _always_healthy(trace):
    """Exercise 1: a constant answer."""
    return Diagnosis("token_weighted", None)


def _course_token_weighting(model, micro_batches):
    """Exercise 2: the lesson's own fix (training.micro_batch_loss, normalise='token') where per-sequence
    averaging was asked."""
    from course_utils.training import micro_batch_loss

    n = sum(count_supervised(b) for b in micro_batches)
    for b in micro_batches:
        summed, count = token_losses(model, b)
        micro_batch_loss(summed, count, normalise="token", accum_steps=len(micro_batches),
                         divide_by_accum=True, step_tokens=n).backward()


def _hint_per_row_mean_per_micro_batch(model, micro_batches):
    """Exercise 2: the hint's F.cross_entropy(reduction='none'), row means averaged per micro-batch, ÷ K."""
    _per_micro_batch_sequence_mean(model, micro_batches)


SHORTCUTS = [
    ("trace_diagnosis", "match the shown traces over seeds", _match_shown_traces),
    ("trace_diagnosis", "read the token counts, never the weights", _counts_only),
    ("trace_diagnosis", "several ranks means the per-rank mean", _several_ranks_is_the_bug),
    ("trace_diagnosis", "always healthy", _always_healthy),
    ("sequence_weighted", "the lesson's token-weighted fix", _course_token_weighting),
    ("sequence_weighted", "per-row means averaged per micro-batch", _hint_per_row_mean_per_micro_batch),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, capsys):
    checks = {"trace_diagnosis": ex.check_trace_diagnosis, "sequence_weighted": ex.check_sequence_weighted}
    check = checks[exercise]
    assert not check(function), f"{description} passes exercise {exercise}"


# ---- the self-test's cases (issue 33) -------------------------------------------------------------------

# ---- bad input: what / why / fix (issue 36) ---------------------------------------------------------

# (The diagnosis checker takes no seeds: it draws fresh cases per run; tests/test_checkers.py tries
# the shortcuts.)


@pytest.mark.parametrize("seed, words", [(None, "seed=None"), (-1, "seed=-1"), (True, "seed=True")])
def test_accumulation_trace_refuses_a_seed_that_is_not_one(seed, words):
    with pytest.raises(ValueError, match=words):
        ex.accumulation_trace(seed)
