"""Lesson 05's exercise graders (``course_utils.exercises.lesson05``): the tables of its checkers (the
reference answer, a second correct answer, each known wrong answer with its misconception:
``tests/test_checkers.py`` runs them), the broken-log generator covers every cause, the hints are graded,
and the graders refuse bad non-learner arguments (issue 36: no pass with zero cases)."""

import math

import pytest
from conftest import Row, graded, stub, tried_twice

from course_utils.checks import Diagnosis
from course_utils.data import IGNORE_INDEX
from course_utils.exercises import lesson05 as L
from course_utils.exercises.answers import lesson05

M = IGNORE_INDEX


# =================================================================================================
# Answers: a second correct one per checker, and the wrong ones (each docstring names its misconception)
# =================================================================================================

def diagnose_by_lookahead(log):
    """A second correct answer: read `consumed` and `grad_norm` instead of the targets after the NaN."""
    bad = next(i for i, r in enumerate(log) if r["loss"] != r["loss"])
    step = log[bad]["step"]
    if math.isfinite(log[bad]["grad_norm"]) and log[bad]["grad_norm"] == 0.0:
        frozen = len({r["consumed"] for r in log[bad:]}) == 1
        return Diagnosis("clogged_packer" if frozen else "truncated_examples", step)
    if log[bad]["targets"] == 0:
        return Diagnosis("loss_at_ignored_positions", step)
    return Diagnosis("learning_rate", step)


def first_nan(log):
    return next(r["step"] for r in log if not math.isfinite(r["loss"]))


def always_clog(log):
    """Memorised: every NaN log is a clogged packer."""
    return Diagnosis("clogged_packer", first_nan(log))


def no_consumed(log):
    """Treats every empty step as truncation: ignores that `consumed` froze."""
    d = lesson05.diagnose_log(log)
    return Diagnosis("truncated_examples" if d.cause == "clogged_packer" else d.cause, d.evidence)


def nan_means_lr(log):
    """Every NaN is a divergence (lesson 06's reflex), even a 0/0 in the loss."""
    d = lesson05.diagnose_log(log)
    return Diagnosis("learning_rate" if d.cause == "loss_at_ignored_positions" else d.cause, d.evidence)


def wrong_evidence(log):
    """Right cause, evidence one step late."""
    d = lesson05.diagnose_log(log)
    return Diagnosis(d.cause, d.evidence + 1)


def drop_oversized(examples, row_capacity):
    """A second correct answer: drop what does not fit instead of cropping it."""
    return [e for e in examples if len(e["input_ids"]) <= row_capacity
            and any(label != M for label in e["labels"][1:])]


def crop_only(examples, row_capacity):
    """Crops to the row but keeps the crops that lost every target."""
    return [{"input_ids": e["input_ids"][:row_capacity], "labels": e["labels"][:row_capacity]}
            for e in examples]


def filter_only(examples, row_capacity):
    """Drops the rows without targets but keeps the oversized ones that clog the buffer."""
    return [e for e in examples if any(label != M for label in e["labels"])]


def too_strict(examples, row_capacity):
    """Keeps only short conversations: throws away training data that fits."""
    return [e for e in examples
            if len(e["input_ids"]) < row_capacity // 2 and any(x != M for x in e["labels"][1:])]


def check_before_crop(examples, row_capacity):
    """Checks for targets before cropping: a crop can still lose every target."""
    return [{"input_ids": e["input_ids"][:row_capacity], "labels": e["labels"][:row_capacity]}
            for e in examples if any(label != M for label in e["labels"])]


# =================================================================================================
# Lesson 06 (nan_detective): diagnosis_run, guard


def crop_as_tensors(examples, row_capacity):
    """A second correct answer in another container: crop, keep what has a target, as 1-D tensors."""
    import torch

    out = []
    for e in examples:
        ids, labels = torch.tensor(e["input_ids"][:row_capacity]), torch.tensor(e["labels"][:row_capacity])
        if bool((labels[1:] != M).any()):
            out.append({"input_ids": ids, "labels": labels})
    return out


def unshifted_targets(examples, row_capacity):
    """Counts a label at column 0 as a target: a crop whose only answer token is its first token stays."""
    out = []
    for e in examples:
        ids, labels = e["input_ids"][:row_capacity], e["labels"][:row_capacity]
        if any(label != M for label in labels):
            out.append({"input_ids": ids, "labels": labels})
    return out


def labels_as_strings(examples, row_capacity):
    """Returns decoded-looking text instead of token lists."""
    return [{"input_ids": str(e["input_ids"]), "labels": str(e["labels"])} for e in examples]


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

CHECKERS = [
    Row("diagnose_log", graded(L.check_diagnose_log), lesson05.diagnose_log),
    Row("prepare_for_packer", graded(L.check_prepare_for_packer), lesson05.prepare_for_packer),
]

ALSO_CORRECT = [
    ("diagnose_log", diagnose_by_lookahead),
    ("prepare_for_packer", drop_oversized),
    ("prepare_for_packer", crop_as_tensors),
]

WRONG = [
    ("diagnose_log", always_clog, "is not what broke this run"),
    ("diagnose_log", no_consumed, "targets never return"),
    ("diagnose_log", nan_means_lr, "0/0 in the loss"),
    ("diagnose_log", wrong_evidence, "does not show it"),
    ("prepare_for_packer", crop_only, "cropping alone is not the fix"),
    ("prepare_for_packer", filter_only, "still there"),
    ("prepare_for_packer", too_strict, "training data"),
    ("prepare_for_packer", check_before_crop, "cropping alone is not the fix"),
    ("prepare_for_packer", unshifted_targets, "column 0 is never a target"),
    ("prepare_for_packer", labels_as_strings, "lists of ints"),
]


# =================================================================================================
# Hints
# =================================================================================================

def test_packer_hints_are_graded():
    result = tried_twice(L.check_prepare_for_packer)
    first, second, third = (result.hint() for _ in range(3))
    assert "has_targets(labels)" not in first and "has_targets(labels)" in third


# =================================================================================================
# The broken-log generator: every cause, a log without its cause
# =================================================================================================

def test_broken_log_covers_every_cause():
    causes = {L._broken_log(seed)[1].cause for seed in range(8)}
    assert causes == set(L.CAUSES)


def test_the_public_log_is_the_log_only():
    log = L.broken_log(5)
    assert isinstance(log, list) and all(isinstance(r, dict) for r in log)
    assert not any(isinstance(v, Diagnosis) or v in L.CAUSES for r in log for v in r.values())
    assert [r["step"] for r in log] == [r["step"] for r in L._broken_log(5)[0]]


# =================================================================================================
# Bad non-learner arguments (issue 36): refused with what/why/fix, never a pass with zero cases
# =================================================================================================

REFERENCE = lesson05.diagnose_log


@pytest.mark.parametrize("bad_call, phrase", [
    (lambda: L.check_diagnose_log(REFERENCE, seeds=[]), "with none it would pass"),
    (lambda: L.check_diagnose_log(REFERENCE, seeds=range(0)), "non-empty"),
    (lambda: L.check_diagnose_log(REFERENCE, seeds=8), "non-empty list"),
    (lambda: L.check_diagnose_log(REFERENCE, seeds=[None]), "deterministic"),
    (lambda: L.broken_log(None), "deterministic"),
    (lambda: L.check_diagnose_log(42), "must be a function"),
    (lambda: L.check_prepare_for_packer(None), "expected your function"),
    (lambda: L.broken_log(-3), ">= 0"),
])
def test_bad_grader_arguments_are_refused(bad_call, phrase):
    with pytest.raises((ValueError, TypeError), match=phrase) as error:
        bad_call()
    assert " — " in str(error.value), "what — why — fix"


def test_explicit_seeds_grade_those_logs(capsys):
    assert L.check_diagnose_log(REFERENCE, seeds=range(100, 104))
    assert "all 4 cases pass" in capsys.readouterr().out


def test_a_checker_never_raises_on_a_wrong_answer(capsys):
    """Answers of the wrong kind are reported, not raised."""
    assert not L.check_diagnose_log(lambda log: "clogged_packer")
    assert not L.check_prepare_for_packer(lambda examples, row_capacity: None)
    assert not L.check_prepare_for_packer(lambda examples, row_capacity: [{"input_ids": 3, "labels": None}])
    assert not L.check_prepare_for_packer(lambda examples, row_capacity: [[1, 2, 3]])
