"""Lesson 01's exercises (course_utils.exercises.lesson01): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: tests/test_checkers.py runs them);
the hints; the broken-run generator covers every cause; bad non-learner arguments are refused."""

import pytest
import torch
from conftest import Row, graded, strings_held, tried_twice

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


def by_median_and_k(run):
    """A second correct reading: reports K itself as the evidence of a missing division."""
    answer = lesson01.diagnose_run(run)
    if answer.cause == "missing_division":
        return Diagnosis(answer.cause, run.args["gradient_accumulation_steps"])
    return answer


def memorised_missing_division(run):
    """Memorised: every run is a missing division, whatever its log shows."""
    return Diagnosis("missing_division", 4.0)


def by_clip_rate(run):
    """The threshold-dependent reading: a clip that fires on every step must be a missing / K."""
    c = run.args["max_grad_norm"]
    if sum(r["grad_norm"] > c for r in run.log) / len(run.log) > 0.9:
        return Diagnosis("missing_division", run.args["gradient_accumulation_steps"])
    return lesson01.diagnose_run(run)


def log_only(run):
    """Reads the log and never runs the split test: a missing / K under a high threshold looks healthy."""
    lowest = min(run.log, key=lambda r: r["loss"])
    if run.log[-1]["loss"] > 1.5 * lowest["loss"]:
        return Diagnosis("lr_too_high", lowest["step"])
    median = sorted(r["grad_norm"] for r in run.log)[len(run.log) // 2]
    if median > run.args["max_grad_norm"]:
        return Diagnosis("clip_far_below_norm", median / run.args["max_grad_norm"])
    return Diagnosis("healthy", None)


def grad_norm_spikes_mean_missing_division(run):
    """A grad_norm far over the threshold late in the run taken for the bug (a high lr spikes it too)."""
    if max(r["grad_norm"] for r in run.log[10:]) > 3 * run.args["max_grad_norm"]:
        return Diagnosis("missing_division", run.args["gradient_accumulation_steps"])
    return lesson01.diagnose_run(run)


def always_healthy(run):
    """The blanket answer: nothing is wrong."""
    return Diagnosis("healthy", None)


def cause_without_evidence(run):
    """Right cause, no evidence: the checker wants what shows it."""
    return Diagnosis(lesson01.diagnose_run(run).cause, 0)


def _match_shown_runs(run):
    """Matches the run against the notebook's mystery_run(seed) over many seeds: they never repeat."""
    for seed in range(60):
        if ex.mystery_run(seed).log == run.log:
            return lesson01.diagnose_run(ex.mystery_run(seed))
    return Diagnosis("healthy", None)


def _lessons_own_train(model, optimizer, micro_batches, max_grad_norm):
    """The lesson's train() loop for one step: its own fresh optimizer, not the one it is handed."""
    from course_utils.training import train

    lr = optimizer.param_groups[0]["lr"]
    records = train(model, micro_batches, steps=1, accum_steps=len(micro_batches), lr=lr, optimizer="sgd",
                    max_grad_norm=max_grad_norm, progress=False)
    model.train()
    return records[0]["grad_norm"]


def _mean_then_clip_each(model, optimizer, micro_batches, max_grad_norm):
    """The divided mean, but clipped after every .backward() (a blanket 'clip early')."""
    optimizer.zero_grad()
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / len(micro_batches)).backward()
        norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(norm)


SHORTCUTS = [
    ("diagnose_run", "read the log only, never the split test", log_only),
    ("diagnose_run", "clip fires every step -> missing / K", by_clip_rate),
    ("diagnose_run", "late grad_norm spikes -> missing / K", grad_norm_spikes_mean_missing_division),
    ("diagnose_run", "always healthy", always_healthy),
    ("diagnose_run", "match the shown runs over seeds", _match_shown_runs),
    ("accumulation_step", "the lesson's train() for one step", _lessons_own_train),
    ("accumulation_step", "clip after every backward", _mean_then_clip_each),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, capsys):
    check = {"diagnose_run": ex.check_diagnose_run, "accumulation_step": ex.check_accumulation_step}[exercise]
    assert not check(function), f"{description} passes exercise {exercise}"


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
    ("diagnose_run", log_only, "the split test"),  # "grows" or "tells them apart": whichever case is shown
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
    result = ex.check_diagnose_run(lambda run: run.cause)
    assert not result and "your function raised AttributeError" in result.message


# ---- the generator ----------------------------------------------------------------------------------

def test_mystery_run_covers_every_cause_is_deterministic_and_hands_out_the_run_only():
    causes = {lesson01.mystery_run_case(seed)[1].cause for seed in range(8)}
    assert causes == set(ex.CAUSES) and "unequal_token_counts" not in ex.CAUSES, "lesson 07 comes later"
    assert ex.mystery_run(5).log == ex.mystery_run(5).log == lesson01.mystery_run_case(5, graded=False)[0].log
    assert ex.mystery_run(5).log != ex.mystery_run(9).log
    shown = [ex.mystery_run(seed).log for seed in range(60)]
    assert not [s for s in range(1000, 1012) if lesson01.mystery_run_case(s)[0].log in shown]
    assert not hasattr(ex, "_broken_run_case") and not hasattr(ex, "mystery_run_case"), "truth: answers"
    with pytest.raises(ValueError, match="k=0"):
        ex.mystery_run(1).grad_norm(0)


def test_the_mystery_run_holds_nothing_that_names_its_cause():
    """Issue 43: the artefact is what a practitioner sees — its log, its args and a split test to run — never
    a field or a closure variable holding the cause (its step_norm once closed over ``cause``)."""
    for seed in range(2 * len(ex.CAUSES)):
        run, truth = lesson01.mystery_run_case(seed)
        assert not strings_held(run) & set(ex.CAUSES), f"seed {seed}: the run names {truth.cause!r}"


# ---- bad input: what / why / fix (issue 36) ---------------------------------------------------------

# (The diagnosis checker takes no seeds: it draws fresh cases per run; tests/test_checkers.py tries
# the shortcuts.)


@pytest.mark.parametrize("seed, words", [(None, "seed=None"), (-1, "seed=-1"), (2.0, "seed=2.0")])
def test_mystery_run_refuses_a_seed_that_is_not_one(seed, words):
    with pytest.raises(ValueError, match=words):
        ex.mystery_run(seed)
