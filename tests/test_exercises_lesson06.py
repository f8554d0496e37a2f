"""Lesson 06's exercises (course_utils.exercises.lesson06): the generated broken runs, the tables of both
checkers (the reference, a second correct answer, each known wrong answer with its misconception:
tests/test_checkers.py runs them), and the checkers' own bad input."""

import inspect
import math
import re

import pytest
import torch
from conftest import Row, graded

from course_utils import nan_detective as nd
from course_utils.checks import Diagnosis
from course_utils.exercises import lesson06 as ex
from course_utils.exercises.answers import lesson06

WHAT_WHY_FIX = r".+ — .+ — .+"


# =================================================================================================
# The generator: the artefact is public, the truth private
# =================================================================================================

def test_generator_covers_every_cause_and_is_seeded():
    causes = {ex._broken_run(s)[1].cause for s in range(8)}
    assert causes == set(nd.CAUSES)
    assert repr(ex._broken_run(5)) == repr(ex._broken_run(5))  # NaN != NaN: compare the text
    assert ex.broken_run(5)["log"] != ex.broken_run(9)["log"]
    for seed in range(200):  # the reference diagnoses every generated case
        run, truth = ex._broken_run(seed)
        assert lesson06.diagnose_run(run) == truth, seed


def test_broken_run_returns_the_run_only():
    run = ex.broken_run(3)
    assert set(run) == {"config", "log", "activation_max"}
    assert repr(run) == repr(ex._broken_run(3)[0])
    assert "Diagnosis" not in repr(run) and not any(cause in repr(run) for cause in nd.CAUSES)


@pytest.mark.parametrize("seed", [None, -1, "0", 1.5, True])
def test_broken_run_refuses_a_seed_that_is_not_one(seed):
    with pytest.raises(ValueError, match=WHAT_WHY_FIX):
        ex.broken_run(seed)


def test_show_run_prints_and_rejects_wrong_input(capsys):
    ex.show_run(ex.broken_run(3))
    assert "grad_norm" in capsys.readouterr().out
    with pytest.raises(TypeError, match="broken_run"):
        ex.show_run([1, 2])
    with pytest.raises(TypeError, match="broken_run"):
        ex.show_run(ex._broken_run(3))  # the (run, truth) pair is not a run


# =================================================================================================
# Exercise 1 (diagnosis): wrong answers, each a misconception
# =================================================================================================

def diagnose_variant(run):
    """A second correct answer: find the first bad step first, then classify it."""
    log = run["log"]
    odd = next(i for i, r in enumerate(log) if r["n_tokens"] == 0 or not math.isfinite(r["grad_norm"])
               or any(not math.isfinite(v[i]) for v in run["activation_max"].values()))
    row = log[odd]
    if row["n_tokens"] == 0:
        return Diagnosis("all_masked_labels" if math.isnan(row["grad_norm"]) else "silent_zero_loss", odd + 1)
    infs = [m for m, v in run["activation_max"].items() if math.isinf(v[odd])]
    return Diagnosis("fp16_overflow", infs[0]) if infs else Diagnosis("learning_rate_too_high", odd + 1)


def zero_loss_means_empty(run):
    """'loss 0.0 = no tokens': every zero or non-finite step is all-masked labels."""
    step = next(r["step"] for r in run["log"] if r["loss"] == 0.0 or not math.isfinite(r["grad_norm"]))
    return Diagnosis("all_masked_labels", step)


def dtype_means_fp16(run):
    """'the config says float16, so it is float16': blames overflow on the dtype alone."""
    if run["config"]["dtype"] == "float16":
        return Diagnosis("fp16_overflow", next(iter(run["activation_max"])))
    return lesson06.diagnose_run(run)


def every_nan_is_the_lr(run):
    """'NaN? lower the learning rate', even when the bad step has no token."""
    step = next(r["step"] for r in run["log"] if r["loss"] == 0.0 or not math.isfinite(r["grad_norm"]))
    return Diagnosis("learning_rate_too_high", step)


def index_not_step(run):
    """Right cause, evidence off by one: the log's index instead of its step."""
    d = lesson06.diagnose_run(run)
    return Diagnosis(d.cause, d.evidence - 1 if isinstance(d.evidence, int) else d.evidence)


def largest_module_not_first(run):
    """The module with the largest value instead of the first one that became inf."""
    d = lesson06.diagnose_run(run)
    if d.cause == "fp16_overflow":
        return Diagnosis(d.cause, list(run["activation_max"])[-1])
    return d


# =================================================================================================
# Exercise 2 (guard): wrong answers, each a misconception
# =================================================================================================

def guard_zeroes(model, control):
    """A second correct answer: zero every gradient in place (AdamW then applies a finite update)."""
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if not bad:
        return None
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    control.should_training_stop = True
    return bad[0].rsplit(".", 1)[0]  # the module's name is accepted too


def isnan_only(model, control):
    """Looks for NaN only: an inf gradient passes the guard."""
    for name, p in model.named_parameters():
        if p.grad is not None and p.grad.isnan().any():
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None


def stops_but_keeps_gradients(model, control):
    """Stops training but keeps the bad gradients: the optimizer still applies them."""
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            control.should_training_stop = True
            return name
    return None


def drops_but_goes_on(model, control):
    """Drops the bad gradients but never stops training."""
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            model.zero_grad(set_to_none=True)
            return name
    return None


def checks_weights(model, control):
    """Checks the weights, still finite before the step: the bad values are in .grad."""
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None


def names_the_last(model, control):
    """Names the last bad parameter instead of the first."""
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad:
        model.zero_grad(set_to_none=True)
        control.should_training_stop = True
        return bad[-1]
    return None


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

def _check_diagnosis_run_twice(fn):
    """The diagnosis on seeds 0-39 first (fixed, whatever COURSE_SEED: the wrong answers above were pinned on
    them), then on the checker's default seeds (what the notebook grades)."""
    result = ex.check_diagnosis_run(fn, seeds=list(range(40)))
    return ex.check_diagnosis_run(fn) if result else result


CHECKERS = [
    Row("diagnosis_run", graded(_check_diagnosis_run_twice), lesson06.diagnose_run),
    Row("guard", graded(ex.check_guard), lesson06.guard),
]
ALSO_CORRECT = [("diagnosis_run", diagnose_variant), ("guard", guard_zeroes)]
WRONG = [
    ("diagnosis_run", zero_loss_means_empty, "logged loss of 0.0 is what the Trainer shows"),
    ("diagnosis_run", dtype_means_fp16, "float16 storage alone is not evidence"),
    ("diagnosis_run", every_nan_is_the_lr, "n_tokens"),
    ("diagnosis_run", index_not_step, "does not show it"),
    ("diagnosis_run", largest_module_not_first, "does not show it"),
    ("guard", isnan_only, "`isnan` misses it"),
    ("guard", stops_but_keeps_gradients, "stopping is not enough"),
    ("guard", drops_but_goes_on, "should_training_stop = True"),
    ("guard", checks_weights, "look at each parameter's .grad"),
    ("guard", names_the_last, "name the first one"),
]


# =================================================================================================
# The lesson's own module
# =================================================================================================

def test_the_lesson_module_holds_no_grader_and_no_truth():
    """The learner's module keeps its tools; checkers, hints and the generator that knows the cause moved."""
    assert not [name for name in vars(nd) if name.startswith("check_")]
    assert not hasattr(nd, "broken_run") and not hasattr(nd, "DIAGNOSIS_HINTS")
    assert not re.search(r"^\s*(from|import) \S*exercises", inspect.getsource(nd), re.M), "no import cycle"


# =================================================================================================
# The checkers' own arguments: never zero cases
# =================================================================================================

@pytest.mark.parametrize("seeds", [[], (), range(0), "0", 3, [None], [-1], ["1"]])
def test_diagnosis_checker_refuses_seeds_that_grade_nothing_or_are_not_seeds(seeds):
    with pytest.raises(ValueError, match=WHAT_WHY_FIX):
        ex.check_diagnosis_run(lesson06.diagnose_run, seeds=seeds)


def test_checkers_refuse_a_non_function_but_never_raise_on_a_wrong_answer(capsys):
    for checker in (ex.check_diagnosis_run, ex.check_guard):
        with pytest.raises(TypeError, match="must be a function.* without calling it"):
            checker("diagnose")
    assert not ex.check_diagnosis_run(lambda run: 1 / 0, seeds=[0])  # a crash is reported, not raised
    assert not ex.check_guard(lambda model, control: model.missing)
