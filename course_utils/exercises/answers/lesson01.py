"""Reference answers of lesson 01's exercises, and the generator of exercise 1's runs, which knows their
cause (``course_utils.exercises.lesson01``'s checkers and the self-test import this; notebooks never do)."""

from __future__ import annotations

import functools
import math
import random
import statistics

import torch

from ...accumulation import MysteryRun
from ...checks import Diagnosis
from ...losses import count_supervised
from ...training import token_losses

# What can be behind a run that "looks off" in lesson 01 (the learner picks one). Lesson 07's look-alike
# (micro-batches of unequal token counts) is not drawn here: it comes later.
CAUSES = ("missing_division", "clip_far_below_norm", "lr_too_high", "healthy")
LOG_STEPS = 30


def _loss_curve(rng: random.Random, n: int) -> list[float]:
    start, floor, tau = rng.uniform(2.5, 4.0), rng.uniform(0.3, 0.9), rng.uniform(4, 9)
    return [floor + (start - floor) * math.exp(-t / tau) * (1 + rng.gauss(0, 0.02)) for t in range(n)]


def _natural_norms(rng: random.Random, n: int, typical: float) -> list[float]:
    # the first steps train untrained token rows: large norms that decay, then noise around `typical`
    return [typical * (1 + 6 * math.exp(-t / 1.5)) * math.exp(rng.gauss(0, 0.2)) for t in range(n)]


def _split_norm(n1: float, factors: dict, power: int, j: int) -> float:
    """The first step's pre-clip norm with the same rows in ``j`` micro-batches: measured factors up to 16,
    then growing as ``j ** power`` (a summed mean of means grows with ``j``; a right loss does not)."""
    return round(n1 * factors.get(j, factors[16] * (j / 16) ** power), 4)


def mystery_run_case(seed: int, graded: bool = True) -> tuple[MysteryRun, Diagnosis]:
    """A run broken by one of ``CAUSES`` (or healthy), and its true ``Diagnosis``.

    Look-alikes share the log's surface: a too-high learning rate spikes ``grad_norm`` over the threshold
    late in the run, a far-too-low ``max_grad_norm`` clips every step as a missing ``/ K`` does, and half
    the missing divisions run under a threshold so high that nothing clips: the log looks healthy, only the
    split test tells. ``graded=False`` is the stream the notebook shows, ``True`` the checker's.
    Evidence: the split test's ratio (missing_division), the median ``grad_norm`` over ``max_grad_norm``
    (clip_far_below_norm), the step of the lowest loss (lr_too_high), ``None`` (healthy).
    """
    cause = CAUSES[seed % len(CAUSES)]
    rng = random.Random(f"lesson01-run-{seed}-{graded}")
    k = rng.choice((2, 4, 8))
    typical = math.exp(rng.uniform(math.log(0.5), math.log(40)))  # any model: norms vary by orders
    loss, norms = _loss_curve(rng, LOG_STEPS), _natural_norms(rng, LOG_STEPS, typical)
    threshold = typical * rng.uniform(1.5, 3.0)  # a sane clip: above the natural norm
    split_factor = {j: rng.uniform(0.93, 1.07) for j in range(2, 17)}  # a mean of means moves a little
    if cause == "missing_division":
        norms = [k * g for g in norms]  # .backward() summed K micro-batch means
        if rng.random() < 0.5:
            threshold *= k * rng.uniform(2, 4)  # so high nothing clips: the log alone looks healthy
        split_factor = {j: j * rng.uniform(0.99, 1.01) for j in split_factor}
    elif cause == "clip_far_below_norm":
        threshold = typical / rng.uniform(8, 30)
    elif cause == "lr_too_high":
        turn = rng.randint(6, 18)  # the loss falls, then the updates overshoot and it climbs for good
        for t in range(turn, LOG_STEPS):
            growth = 1.25 ** (t - turn + 1)
            loss[t] = loss[turn - 1] * (1 + 0.15 * (t - turn + 1)) * growth ** 0.5
            norms[t] = norms[t] * growth
    n1 = norms[0] / (k if cause == "missing_division" else 1) * rng.uniform(0.97, 1.03)
    # the run's split test as numbers only: nothing the artefact holds names its cause
    step_norm = functools.partial(_split_norm, n1, {1: 1.0, **split_factor},
                                  1 if cause == "missing_division" else 0)

    run = MysteryRun([{"step": t + 1, "loss": round(loss[t], 4), "grad_norm": round(norms[t], 4)}
                      for t in range(LOG_STEPS)],
                     {"gradient_accumulation_steps": k, "max_grad_norm": round(threshold, 4),
                      "learning_rate": 1e-3}, step_norm)
    median = statistics.median(r["grad_norm"] for r in run.log)
    evidence = {"missing_division": step_norm(k) / step_norm(1),
                "clip_far_below_norm": median / run.args["max_grad_norm"],
                "lr_too_high": min(run.log, key=lambda r: r["loss"])["step"], "healthy": None}[cause]
    return run, Diagnosis(cause, evidence)


def diagnose_run(run) -> Diagnosis:
    """Exercise 1: the threshold-free split test first, then the loss curve and the clip threshold."""
    k = run.args["gradient_accumulation_steps"]
    ratio = run.grad_norm(k) / run.grad_norm(1)
    if abs(ratio / k - 1) < 0.2:  # the same examples, K× the norm: each micro-batch mean was summed
        return Diagnosis("missing_division", ratio)
    lowest = min(run.log, key=lambda r: r["loss"])
    if run.log[-1]["loss"] > 1.5 * lowest["loss"]:  # it learned, then climbed for good
        return Diagnosis("lr_too_high", lowest["step"])
    median = statistics.median(r["grad_norm"] for r in run.log)
    if median > run.args["max_grad_norm"]:  # the clip fires on most steps, yet the scaling is right
        return Diagnosis("clip_far_below_norm", median / run.args["max_grad_norm"])
    return Diagnosis("healthy", None)


# The self-test (issue 33): the same runs, printed as a practitioner reads them; the causes in plain words.
SELF_TEST_CAUSES = {"missing_division": "the loss is not divided by the accumulation steps",
                    "clip_far_below_norm": "max_grad_norm far below the natural gradient norm",
                    "lr_too_high": "learning rate too high", "healthy": "nothing is wrong"}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """(the run's arguments, a log excerpt and its split test, as text; the true cause; the choices)."""
    run, truth = mystery_run_case(10_000 + seed, graded=True)
    k = run.args["gradient_accumulation_steps"]
    lines = [f"TrainingArguments: {run.args}", "step   loss     grad_norm"]
    lines += [f"{r['step']:>4}  {r['loss']:7.4f}  {r['grad_norm']:10.4f}" for r in run.log[::3]]
    lines.append(f"split test on step 1's examples: 1 micro-batch -> grad_norm {run.grad_norm(1):.4f}; "
                 f"{k} micro-batches -> grad_norm {run.grad_norm(k):.4f}")
    return "\n".join(lines), SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())


def accumulation_step(model, optimizer, micro_batches, max_grad_norm) -> float:
    """Exercise 2: one optimizer step; each micro-batch's mean loss divided by K."""
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)  # the previous step's gradient must not leak in
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()  # .backward() sums into .grad: / k makes the sum an average
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)  # once, on the whole step's gradient
    optimizer.step()
    return float(norm)


def accumulation_step_token_weighted(model, optimizer, micro_batches, max_grad_norm) -> float:
    """Exercise 2, the other correct answer: every supervised token of the step weighs the same."""
    total = sum(count_supervised(b["labels"]) for b in micro_batches)
    optimizer.zero_grad(set_to_none=True)
    for batch in micro_batches:
        summed, _ = token_losses(model, batch)
        (summed / total).backward()
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return float(norm)
