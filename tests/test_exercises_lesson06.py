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
    causes = {lesson06.broken_run_case(s)[1].cause for s in range(10)}
    assert causes == set(ex.RUN_CAUSES)
    assert repr(lesson06.broken_run_case(5)) == repr(lesson06.broken_run_case(5))  # NaN != NaN: compare text
    assert ex.broken_run(5)["log"] != ex.broken_run(9)["log"]
    for seed in range(200):  # the reference diagnoses every generated case
        run, truth = lesson06.broken_run_case(seed)
        assert lesson06.diagnose_run(run) == truth, seed


def test_the_exercise_draws_the_lessons_causes_and_healthy_runs():
    assert set(ex.RUN_CAUSES) == set(nd.CAUSES) | {"healthy"}


def test_broken_run_returns_the_run_only_and_the_truth_lives_with_the_answers():
    run = ex.broken_run(3)
    assert set(run) == {"config", "log", "activation_max"}
    assert repr(run) == repr(lesson06.broken_run_case(3, graded=False)[0])
    assert repr(run) != repr(lesson06.broken_run_case(3, graded=True)[0]), "the graded stream is drawn apart"
    assert "Diagnosis" not in repr(run) and not any(cause in repr(run) for cause in ex.RUN_CAUSES)
    assert not hasattr(ex, "_broken_run") and not hasattr(ex, "broken_run_case")


def test_healthy_controls_and_the_zero_gradient_look_alike_share_the_surface():
    cases = [lesson06.broken_run_case(s) for s in range(400)]
    healthy = [r for r, d in cases if d.cause == "healthy"]
    assert any(r["config"]["dtype"] == "float16" and max(max(v) for v in r["activation_max"].values()) > 1e4
               for r in healthy), "float16 storage with large, finite activations"
    assert any(r["config"]["learning_rate"] >= 0.01 for r in healthy), "a high rate that still trains"
    zero_grad = [r for r, d in cases if d.cause == "empty_batch_zero_grad"]
    assert any(any(math.isnan(row["loss"]) for row in r["log"]) for r in zero_grad), "NaN loss, zero gradient"


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
        ex.show_run(lesson06.broken_run_case(3))  # the (run, truth) pair is not a run


# =================================================================================================
# Exercise 1 (diagnosis): wrong answers, each a misconception
# =================================================================================================

def diagnose_variant(run):
    """A second correct answer: find the first bad step first, then classify it."""
    log = run["log"]
    odd = next((i for i, r in enumerate(log) if r["n_tokens"] == 0 or not math.isfinite(r["grad_norm"])
                or any(not math.isfinite(v[i]) for v in run["activation_max"].values())), None)
    if odd is None:
        return Diagnosis("healthy", None)
    row = log[odd]
    if row["n_tokens"] == 0:
        dead = math.isnan(row["grad_norm"])
        return Diagnosis("all_masked_labels" if dead else "empty_batch_zero_grad", odd + 1)
    infs = [m for m, v in run["activation_max"].items() if math.isinf(v[odd])]
    return Diagnosis("fp16_overflow", infs[0]) if infs else Diagnosis("learning_rate_too_high", odd + 1)


def zero_loss_means_empty(run):
    """'loss 0.0 = no tokens': every zero or non-finite step is all-masked labels."""
    step = next((r["step"] for r in run["log"] if r["loss"] == 0.0 or not math.isfinite(r["grad_norm"])),
                None)
    return Diagnosis("all_masked_labels", step) if step else lesson06.diagnose_run(run)


def dtype_means_fp16(run):
    """'the config says float16, so it is float16': blames overflow on the dtype alone."""
    d = lesson06.diagnose_run(run)
    if run["config"]["dtype"] == "float16" and d.cause != "fp16_overflow":
        return Diagnosis("fp16_overflow", next(iter(run["activation_max"])))
    return d


def every_nan_is_the_lr(run):
    """'NaN? lower the learning rate', even when the bad step has no token."""
    step = next((r["step"] for r in run["log"] if r["loss"] == 0.0 or not math.isfinite(r["grad_norm"])),
                None)
    return Diagnosis("learning_rate_too_high", step) if step else lesson06.diagnose_run(run)


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

def guard_zeroes(model, control, scaler=None):
    """A second correct answer: zero every gradient in place (AdamW then applies a finite update); under a
    scaler, leave everything (a truthiness test: a GradScaler is always truthy)."""
    if scaler:
        return None
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if not bad:
        return None
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    control.should_training_stop = True
    return bad[0].rsplit(".", 1)[0]  # the module's name is accepted too


def scaler_blind(model, control, scaler=None):
    """The guard without the scaler: it stops a healthy fp16 mixed-precision run at its first overflow."""
    return lesson06.guard(model, control, None)


def two_arguments(model, control):
    """The old signature: the checker passes the scaler as a third argument."""
    return lesson06.guard(model, control)


def isnan_only(model, control, scaler=None):
    """Looks for NaN only: an inf gradient passes the guard."""
    if scaler is not None:
        return None
    for name, p in model.named_parameters():
        if p.grad is not None and p.grad.isnan().any():
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None


def stops_but_keeps_gradients(model, control, scaler=None):
    """Stops training but keeps the bad gradients: the optimizer still applies them."""
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            control.should_training_stop = True
            return name
    return None


def drops_but_goes_on(model, control, scaler=None):
    """Drops the bad gradients but never stops training."""
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            model.zero_grad(set_to_none=True)
            return name
    return None


def checks_weights(model, control, scaler=None):
    """Checks the weights, still finite before the step: the bad values are in .grad."""
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None


def names_the_last(model, control, scaler=None):
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

def _check_diagnosis_run_twice(fn, fixture):
    """The diagnosis on seeds 0-39 first (fixed, whatever the draw: the wrong answers above were pinned on
    them; the checker has no keyword for it, so the test replaces its draw), then on a fresh draw (what the
    notebook grades)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ex, "fresh_seeds", lambda n: list(range(40)))
        result = ex.check_diagnosis_run(fn)
    return ex.check_diagnosis_run(fn) if result else result


CHECKERS = [
    Row("diagnosis_run", _check_diagnosis_run_twice, lesson06.diagnose_run),
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
    ("guard", scaler_blind, "a skipped step"),
    ("guard", two_arguments, "positional argument"),
]


# =================================================================================================
# Shortcuts a learner has at each exercise: each fails the checker (issue 33)
# =================================================================================================

def _match_shown_runs(run):
    """Exercise 1: look the run up among broken_run(seed) and read the cause off the seed."""
    for seed in range(2000):
        if repr(ex.broken_run(seed)) == repr(run):
            return Diagnosis(ex.RUN_CAUSES[seed % len(ex.RUN_CAUSES)], None)
    return Diagnosis("healthy", None)


def _nonfinite_steps_and_culprit(run):
    """Exercise 1: the lesson's tools as a rule — the first step whose loss or grad_norm is not finite
    (nd.nonfinite_steps) is the learning rate, unless some module is inf (the watch's culprit)."""
    bad = nd.nonfinite_steps([{"loss": r["loss"], "grad_norm": r["grad_norm"]} for r in run["log"]])
    if not bad:
        return Diagnosis("healthy", None)
    infs = [m for m, v in run["activation_max"].items() if math.isinf(v[bad[0] - 1])]
    return Diagnosis("fp16_overflow", infs[0]) if infs else Diagnosis("learning_rate_too_high", bad[0])


def _nan_loss_with_no_tokens_is_dead(run):
    """Exercise 1: every step without a token is section 2d's dead run (no zero-gradient look-alike)."""
    d = lesson06.diagnose_run(run)
    return Diagnosis("all_masked_labels", d.evidence) if d.cause == "empty_batch_zero_grad" else d


def _guard_with_clip_tripwire(model, control, scaler=None):
    """Exercise 2: section 3d's clip_grad_norm_(error_if_nonfinite=True) as the guard: it raises."""
    params = [p for p in model.parameters() if p.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    return None


def _guard_stops_always(model, control, scaler=None):
    """Exercise 2: a blanket fix — drop every gradient and stop, whatever they hold."""
    model.zero_grad(set_to_none=True)
    control.should_training_stop = True
    return next(name for name, p in model.named_parameters() if p.requires_grad)


SHORTCUTS = [
    ("diagnosis_run", "match the shown runs over seeds", _match_shown_runs),
    ("diagnosis_run", "nonfinite_steps plus the inf culprit", _nonfinite_steps_and_culprit),
    ("diagnosis_run", "no token means a dead run", _nan_loss_with_no_tokens_is_dead),
    ("guard", "clip_grad_norm_ with error_if_nonfinite", _guard_with_clip_tripwire),
    ("guard", "always drop and stop", _guard_stops_always),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, capsys):
    check = {"diagnosis_run": ex.check_diagnosis_run, "guard": ex.check_guard}[exercise]
    assert not check(function), f"{description} passes exercise {exercise}"


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

def test_checkers_refuse_a_non_function_but_never_raise_on_a_wrong_answer(capsys):
    for checker in (ex.check_diagnosis_run, ex.check_guard):
        with pytest.raises(TypeError, match="must be a function.* without calling it"):
            checker("diagnose")
    assert not ex.check_diagnosis_run(lambda run: 1 / 0)  # a crash is reported, not raised
    assert not ex.check_guard(lambda model, control, scaler: model.missing)
