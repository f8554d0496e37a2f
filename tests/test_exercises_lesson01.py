"""Lesson 01's exercises (course_utils.exercises.lesson01): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: tests/test_checkers.py runs them);
the hints; the broken-run generator covers every cause; bad non-learner arguments are refused."""

import pytest
import torch
from conftest import Row, graded, stub, tried_twice

from course_utils.checks import Diagnosis
from course_utils.exercises import lesson01 as ex
from course_utils.exercises.answers import lesson01
from course_utils.losses import count_supervised
from course_utils.training import token_losses

# ---- the answers: exercise 2 (accumulation_step), then exercise 1 (diagnose_run) --------------------

def _params(model):
    return [p for p in model.parameters() if p.requires_grad]


def zero_at_the_end(model, optimizer, micro_batches, max_grad_norm):
    """Correct too: zeroing after the step leaves .grad empty for the next call."""
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
    norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    model.zero_grad()
    return norm.item()


def missing_division(model, optimizer, micro_batches, max_grad_norm):
    """Sums the K micro-batch means: the gradient is K times the big batch's."""
    optimizer.zero_grad()
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n).backward()  # the bug: K micro-batch means are summed
    norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(norm)


def divided_twice(model, optimizer, micro_batches, max_grad_norm):
    """Token-weighted AND divided by K: the gradient is K times too small."""
    optimizer.zero_grad()
    total = sum(count_supervised(b["labels"]) for b in micro_batches)
    for batch in micro_batches:
        summed, _ = token_losses(model, batch)
        (summed / total / len(micro_batches)).backward()  # token-weighted AND / K
    norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(norm)


def never_zeroes(model, optimizer, micro_batches, max_grad_norm):
    """Never zeroes .grad: step 2 adds onto step 1's gradient (stale gradients)."""
    k = len(micro_batches)
    for batch in micro_batches:  # no zero_grad anywhere: step 2 adds onto step 1's gradient
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
    norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(norm)


def clips_per_micro_batch(model, optimizer, micro_batches, max_grad_norm):
    """Clips inside the loop: each partial sum is clipped, not the step's gradient."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
        norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)  # inside the loop
    optimizer.step()
    return float(norm)


def returns_post_clip_norm(model, optimizer, micro_batches, max_grad_norm):
    """Returns the norm after clipping: the log never shows how large the gradient was."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
    torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(torch.nn.utils.get_total_norm([p.grad for p in _params(model)]))


def clips_after_the_step(model, optimizer, micro_batches, max_grad_norm):
    """Clips after optimizer.step(): the update used the unclipped gradient."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
    optimizer.step()  # the update used the unclipped gradient
    return float(torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm))


def by_median_and_k(artefact):
    """A second correct reading: reports K itself as the evidence of a missing division."""
    answer = lesson01.diagnose_run(artefact)
    if answer.cause == "missing_division":
        return Diagnosis(answer.cause, artefact["config"]["accum_steps"])
    return answer


def memorised_missing_division(artefact):
    """Memorised: every run is a missing division, whatever its log shows."""
    return Diagnosis("missing_division", 4.0)


def by_clip_rate(artefact):
    """The threshold-dependent reading: a clip that fires on every step must be a missing / K."""
    log, c = artefact["log"], artefact["config"]["max_grad_norm"]
    rate = sum(r["grad_norm"] > c for r in log) / len(log)
    if rate > 0.9:
        return Diagnosis("missing_division", artefact["config"]["accum_steps"])
    return lesson01.diagnose_run(artefact)


def ratio_is_not_one(artefact):
    """Any change under the split is taken for a missing / K (misses lesson 07's look-alike)."""
    k = artefact["config"]["accum_steps"]
    ratio = artefact["split_test"][k] / artefact["split_test"][1]
    if abs(ratio - 1) > 0.1:
        return Diagnosis("missing_division", ratio)
    return lesson01.diagnose_run(artefact)


def cause_without_evidence(artefact):
    """Right cause, no evidence: the checker wants what shows it."""
    return Diagnosis(lesson01.diagnose_run(artefact).cause, None)


# ---- the tables (tests/test_checkers.py runs them) ----------------------------------------------------

CHECKERS = [
    Row("accumulation_step", graded(ex.check_accumulation_step), lesson01.accumulation_step),
    Row("diagnose_run", graded(ex.check_diagnose_run), lesson01.diagnose_run),
]
ALSO_CORRECT = [
    ("accumulation_step", lesson01.accumulation_step_token_weighted),
    ("accumulation_step", zero_at_the_end),
    ("diagnose_run", by_median_and_k),
]
WRONG = [
    ("accumulation_step", missing_division, "missing division"),
    ("accumulation_step", divided_twice, "divided twice"),
    ("accumulation_step", never_zeroes, "stale gradients"),
    ("accumulation_step", clips_per_micro_batch, "clipping per micro-batch"),
    ("accumulation_step", returns_post_clip_norm, "AFTER clipping"),
    ("accumulation_step", clips_after_the_step, "clip once"),
    ("diagnose_run", memorised_missing_division, "is not what broke this run"),
    ("diagnose_run", by_clip_rate, "the split test"),
    ("diagnose_run", ratio_is_not_one, "lesson 07"),
    ("diagnose_run", cause_without_evidence, "does not show it"),
]


# ---- hints, and answers that raise ----------------------------------------------------------------

def test_accumulation_step_first_hint_holds_no_code_and_the_last_level_does(capsys):
    result = tried_twice(ex.check_accumulation_step)
    levels = [result.hint() for _ in range(3)]
    assert "zero_grad" not in levels[0] and "summed /" not in levels[0]
    assert "zero_grad" in levels[2]


def test_a_wrong_answer_that_raises_or_returns_nonsense_is_reported_not_raised(capsys):
    result = ex.check_accumulation_step(lambda model, opt, micro, c: micro[99])
    assert not result and "your function raised IndexError" in result.message
    result = ex.check_accumulation_step(lambda model, opt, micro, c: "a string")
    assert not result and "as a float" in result.message
    result = ex.check_diagnose_run(lambda artefact: artefact["cause"])
    assert not result and "your function raised KeyError" in result.message


# ---- the generator ----------------------------------------------------------------------------------

def test_broken_run_covers_every_cause_is_deterministic_and_hands_out_the_artefact_only():
    causes = {ex._broken_run_case(seed)[1].cause for seed in range(8)}
    assert causes == set(ex.CAUSES)
    assert ex.broken_run(5) == ex.broken_run(5) == ex._broken_run_case(5)[0]
    assert ex.broken_run(5) != ex.broken_run(9)
    assert set(ex.broken_run(5)) == {"config", "log", "split_test", "tokens_per_micro_batch"}


# ---- bad input: what / why / fix (issue 36) ---------------------------------------------------------

@pytest.mark.parametrize("seeds", [[], (), range(0)], ids=["list", "tuple", "range"])
def test_diagnose_run_with_no_seeds_raises_instead_of_passing(seeds):
    """Zero cases used to be "✅ all 0 cases pass" for any function, the stub included."""
    with pytest.raises(ValueError, match="seeds must be a non-empty list of ints.* — "):
        ex.check_diagnose_run(stub, seeds=seeds)


@pytest.mark.parametrize("seeds, words", [(5, "non-empty list of ints"), ("12", "non-empty list of ints"),
                                          ([3, None], r"seeds\[1\]=None"), ([-2], r"seeds\[0\]=-2")])
def test_diagnose_run_refuses_bad_seeds(seeds, words):
    with pytest.raises(ValueError, match=words):
        ex.check_diagnose_run(lesson01.diagnose_run, seeds=seeds)


def test_diagnose_run_grades_the_seeds_it_is_given(capsys):
    assert ex.check_diagnose_run(lesson01.diagnose_run, seeds=range(4))
    assert "all 4 cases pass" in capsys.readouterr().out


@pytest.mark.parametrize("seed, words", [(None, "seed=None"), (-1, "seed=-1"), (2.0, "seed=2.0")])
def test_broken_run_refuses_a_seed_that_is_not_one(seed, words):
    with pytest.raises(ValueError, match=words):
        ex.broken_run(seed)
