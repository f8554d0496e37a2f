"""Lesson 05's exercise graders (``course_utils.exercises.lesson05``): the tables of its checkers (the
reference answer, a second correct answer, each known wrong answer with its misconception:
``tests/test_checkers.py`` runs them), the log generator covers every cause, the hints are graded,
and the graders refuse bad non-learner arguments (issue 36: no pass with zero cases)."""

import math

import pytest
from conftest import Row, graded, tried_twice

from course_utils.checks import Diagnosis
from course_utils.data import IGNORE_INDEX
from course_utils.exercises import lesson05 as L
from course_utils.exercises.answers import lesson05

M = IGNORE_INDEX


# =================================================================================================
# Answers: a second correct one per checker, and the wrong ones (each docstring names its misconception)
# =================================================================================================

def diagnose_by_recovery(log):
    """A second correct answer: reads whether any later step with tokens has a finite gradient norm."""
    empty = [r for r in log if r["num_tokens"] == 0]
    if not empty:
        return Diagnosis("healthy", None)
    later = [r for r in log if r["step"] > empty[0]["step"] and r["num_tokens"] > 0]
    dead = all(not math.isfinite(r["grad_norm"]) for r in later)
    return Diagnosis("nan_weights" if dead else "empty_micro_batch", empty[0]["step"])


def running_average_says_dead(log):
    """Reads the running average: NaN for good means NaN weights (section 1's logger look-alike)."""
    d = lesson05.diagnose_log(log)
    if d.cause == "empty_micro_batch" and math.isnan(log[-1]["avg_loss"]):
        return Diagnosis("nan_weights", d.evidence)
    return d


def zero_loss_is_fine(log):
    """Takes a 0.0 loss for a perfect step: a clamped empty step looks healthy."""
    d = lesson05.diagnose_log(log)
    if d.cause == "empty_micro_batch" and all(math.isfinite(r["loss"]) for r in log):
        return Diagnosis("healthy", None)
    return d


def spike_is_a_fault(log):
    """Calls a step with few tokens, or a spike, an empty micro-batch."""
    d = lesson05.diagnose_log(log)
    if d.cause == "healthy":
        worst = min(log, key=lambda r: r["num_tokens"])
        return Diagnosis("empty_micro_batch", worst["step"])
    return d


def wrong_evidence(log):
    """Right cause, evidence one step late."""
    d = lesson05.diagnose_log(log)
    return Diagnosis(d.cause, None if d.evidence is None else d.evidence + 1)


def drop_oversized(examples, max_length):
    """A second correct answer: drop what does not fit instead of cropping it."""
    return [e for e in examples if len(e["input_ids"]) <= max_length
            and any(label != M for label in e["labels"][1:])]


def crop_only(examples, max_length):
    """Crops to max_length but keeps the crops that lost every target."""
    return [{"input_ids": e["input_ids"][:max_length], "labels": e["labels"][:max_length]}
            for e in examples]


def filter_only(examples, max_length):
    """Drops the rows without targets but keeps the ones longer than max_length."""
    return [e for e in examples if any(label != M for label in e["labels"])]


def too_strict(examples, max_length):
    """Keeps only short conversations: throws away training data that fits."""
    return [e for e in examples
            if len(e["input_ids"]) < max_length // 2 and any(x != M for x in e["labels"][1:])]


def check_before_crop(examples, max_length):
    """Checks for targets before cropping: a crop can still lose every target."""
    return [{"input_ids": e["input_ids"][:max_length], "labels": e["labels"][:max_length]}
            for e in examples if any(label != M for label in e["labels"])]


def crop_as_tensors(examples, max_length):
    """A second correct answer in another container: crop, keep what has a target, as 1-D tensors."""
    import torch

    out = []
    for e in examples:
        ids, labels = torch.tensor(e["input_ids"][:max_length]), torch.tensor(e["labels"][:max_length])
        if bool((labels[1:] != M).any()):
            out.append({"input_ids": ids, "labels": labels})
    return out


def unshifted_targets(examples, max_length):
    """Counts a label at column 0 as a target: a crop whose only answer token is its first token stays."""
    out = []
    for e in examples:
        ids, labels = e["input_ids"][:max_length], e["labels"][:max_length]
        if any(label != M for label in labels):
            out.append({"input_ids": ids, "labels": labels})
    return out


def labels_as_strings(examples, max_length):
    """Returns decoded-looking text instead of token lists."""
    return [{"input_ids": str(e["input_ids"]), "labels": str(e["labels"])} for e in examples]


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

CHECKERS = [
    Row("diagnose_log", graded(L.check_diagnose_log), lesson05.diagnose_log),
    Row("prepare_examples", graded(L.check_prepare_examples), lesson05.prepare_examples),
]

ALSO_CORRECT = [
    ("diagnose_log", diagnose_by_recovery),
    ("prepare_examples", drop_oversized),
    ("prepare_examples", crop_as_tensors),
]

WRONG = [
    ("diagnose_log", running_average_says_dead, "the weights survived"),
    ("diagnose_log", zero_loss_is_fine, "not a perfect step"),
    ("diagnose_log", spike_is_a_fault, "is noise, not 0/0"),
    ("diagnose_log", wrong_evidence, "does not show it"),
    ("prepare_examples", crop_only, "cropping alone is not the fix"),
    ("prepare_examples", filter_only, "still there"),
    ("prepare_examples", too_strict, "training data"),
    ("prepare_examples", check_before_crop, "cropping alone is not the fix"),
    ("prepare_examples", unshifted_targets, "column 0 is never a target"),
    ("prepare_examples", labels_as_strings, "lists of ints"),
]


# =================================================================================================
# Hints
# =================================================================================================

def test_prepare_examples_hints_are_graded():
    result = tried_twice(L.check_prepare_examples)
    first, second, third = (result.hint() for _ in range(3))
    assert "has_targets(labels)" not in first and "has_targets(labels)" in third


# =================================================================================================
# The log generator: every cause, the log without its cause, healthy look-alikes; the self-test's cases
# =================================================================================================

def test_logs_cover_every_cause_and_the_public_one_hands_out_the_log_only():
    assert {lesson05.training_log_case(seed)[1].cause for seed in range(6)} == set(L.CAUSES)
    log = L.training_log(5)
    assert set(log[0]) == {"step", "loss", "avg_loss", "grad_norm", "num_tokens"}, "no field names the cause"
    assert log == lesson05.training_log_case(5, graded=False)[0]
    assert log != lesson05.training_log_case(5, graded=True)[0], "the graded stream is drawn apart"
    assert not hasattr(L, "training_log_case"), "the truth lives with the answers"


def test_healthy_controls_and_look_alikes_share_the_surface():
    cases = [lesson05.training_log_case(s) for s in range(300)]
    healthy = [log for log, d in cases if d.cause == "healthy"]
    empty = [log for log, d in cases if d.cause == "empty_micro_batch"]
    assert all(min(r["num_tokens"] for r in log) <= 3 for log in healthy), "a step with a handful of tokens"
    assert any(all(math.isfinite(r["loss"]) for r in log) for log in empty), "a clamped empty step logs 0.0"
    assert any(math.isnan(log[-1]["avg_loss"]) for log in empty), "the running average stays NaN"


@pytest.mark.parametrize("draw", range(40))
def test_every_draw_of_the_checker_shows_each_look_of_a_cause(draw, monkeypatch):
    """The checker's twelve logs carry, on every draw, a clamped and a NaN empty step, a run with one and with
    several empty steps, and a healthy run with and without a spike: a wrong answer blind to one of the
    looks fails on every run, not on most (CI once drew no clamped log, and ``zero_loss_is_fine`` passed)."""
    from course_utils import checks

    monkeypatch.setenv(checks.CHECK_SEED_ENV, str(draw))
    cases = [lesson05.training_log_case(s) for s in checks.fresh_seeds(4 * len(L.CAUSES))]
    empty = [log for log, d in cases if d.cause == "empty_micro_batch"]
    healthy = [log for log, d in cases if d.cause == "healthy"]
    clamped = [all(math.isfinite(r["loss"]) for r in log) for log in empty]
    several = [sum(r["num_tokens"] == 0 for r in log) > 1 for log in empty]
    spiky = [max(r["grad_norm"] for r in log) > 6 for log in healthy]
    assert any(clamped) and not all(clamped)
    assert any(several) and not all(several)
    assert any(spiky) and not all(spiky)
    assert zero_loss_is_fine in [w for _, w, _ in WRONG]
    assert any(zero_loss_is_fine(log).cause == "healthy" for log in empty), "the misconception is met"


# =================================================================================================
# Shortcuts a learner has at each exercise: each fails the checker (issue 33)
# =================================================================================================

def _match_shown_logs(log):
    """Exercise 1: look the log up among training_log(seed) and read the cause off the seed."""
    for seed in range(3000):
        if L.training_log(seed) == log:
            return Diagnosis(L.CAUSES[seed % len(L.CAUSES)], None)
    return Diagnosis("healthy", None)


def _any_nan_is_the_empty_batch(log):
    """Exercise 1: the first non-finite loss (section 1's `nan_steps`) is the empty micro-batch."""
    bad = [r["step"] for r in log if not math.isfinite(r["loss"])]
    return Diagnosis("empty_micro_batch", bad[0]) if bad else Diagnosis("healthy", None)


def _nan_forever_is_dead(log):
    """Exercise 1: section 1's running-average test (NaN from the first NaN on) read as NaN weights."""
    bad = [r["step"] for r in log if not math.isfinite(r["loss"])]
    if not bad:
        return Diagnosis("healthy", None)
    dead = all(math.isnan(r["avg_loss"]) for r in log[bad[0] - 1:])
    return Diagnosis("nan_weights" if dead else "empty_micro_batch", bad[0])


def _has_targets_filter(examples, max_length):
    """Exercise 2: the lesson's own T.has_targets filter, without a cut at max_length."""
    from course_utils.truncation import has_targets

    return [e for e in examples if has_targets(e["labels"])]


def _cut_then_keep_all(examples, max_length):
    """Exercise 2: right truncation alone (what tokenize_chat(max_length=...) does): cut, keep everything."""
    return [{"input_ids": list(e["input_ids"][:max_length]), "labels": list(e["labels"][:max_length])}
            for e in examples]


def _drop_anything_with_a_masked_label(examples, max_length):
    """Exercise 2: a blanket fix — keep only short examples whose labels are mostly set."""
    return [e for e in examples if len(e["input_ids"]) <= max_length // 2]


SHORTCUTS = [
    ("diagnose_log", "match the shown logs over seeds", _match_shown_logs),
    ("diagnose_log", "any NaN loss is the empty micro-batch", _any_nan_is_the_empty_batch),
    ("diagnose_log", "NaN forever in the running average means NaN weights", _nan_forever_is_dead),
    ("prepare_examples", "the has_targets filter alone", _has_targets_filter),
    ("prepare_examples", "cut at max_length, keep everything", _cut_then_keep_all),
    ("prepare_examples", "keep only short examples", _drop_anything_with_a_masked_label),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, capsys):
    check = {"diagnose_log": L.check_diagnose_log, "prepare_examples": L.check_prepare_examples}[exercise]
    assert not check(function), f"{description} passes exercise {exercise}"


# =================================================================================================
# Bad non-learner arguments (issue 36): refused with what/why/fix, never a pass with zero cases
# =================================================================================================

REFERENCE = lesson05.diagnose_log


@pytest.mark.parametrize("bad_call, phrase", [
    (lambda: L.training_log(None), "deterministic"),
    (lambda: L.check_diagnose_log(42), "must be a function"),
    (lambda: L.check_prepare_examples(None), "expected your function"),
    (lambda: L.training_log(-3), ">= 0"),
])
def test_bad_grader_arguments_are_refused(bad_call, phrase):
    with pytest.raises((ValueError, TypeError), match=phrase) as error:
        bad_call()
    assert " — " in str(error.value), "what — why — fix"


def test_a_checker_never_raises_on_a_wrong_answer(capsys):
    """Answers of the wrong kind are reported, not raised."""
    assert not L.check_diagnose_log(lambda log: "healthy")
    assert not L.check_prepare_examples(lambda examples, max_length: None)
    assert not L.check_prepare_examples(lambda examples, max_length: [{"input_ids": 3, "labels": None}])
    assert not L.check_prepare_examples(lambda examples, max_length: [[1, 2, 3]])
