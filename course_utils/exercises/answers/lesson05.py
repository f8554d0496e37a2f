"""Reference answers of lesson 05's exercises, and the generator of exercise 1's training logs, which knows
their cause (``course_utils.exercises.lesson05`` holds the checkers; no notebook imports this module).

Two correct answers are accepted by each checker; these are one of each.
"""

from __future__ import annotations

import math
import random

from ...checks import Diagnosis
from ...data import n_graded

# What a broken (or healthy) log of lesson 05 can come from — only what the core path taught: right
# truncation leaving steps without a graded token (NaN with ignore_index, 0.0 under a clamped count like
# TRL's), a per-token loss computed at every position and masked (NaN weights for good), and healthy runs
# whose logs share the surface (a running average, a step with few graded tokens, a loss spike).
LOG_CAUSES = ("empty_micro_batch", "nan_weights", "healthy")


def training_log_case(seed: int, graded: bool = True) -> tuple[list[dict], Diagnosis]:
    """A training log (one record per optimizer step: ``step``, ``loss`` of the step, ``avg_loss`` the
    running mean a logger prints, ``grad_norm`` before clipping, ``num_tokens`` graded in the step) and its
    true ``Diagnosis``: ``evidence`` is the first step without a graded token (None when healthy).

    ``graded`` picks the stream: the checker's logs and the ones ``training_log`` shows are drawn apart."""
    rng = random.Random(f"{'graded' if graded else 'shown'}-05-{seed}")
    cause = LOG_CAUSES[seed % len(LOG_CAUSES)]
    # Which look of its cause the log takes cycles with the seed, not with a coin: four consecutive logs of
    # one cause (what ``checks.fresh_seeds`` hands the checker) show each look, so no draw lets an answer
    # that misses one of them pass (a coin left every clamped log out of 13 % of the checker's runs).
    look = seed // len(LOG_CAUSES)
    steps = rng.randint(12, 18)
    first = rng.randint(2, steps - 5)
    clamped = cause == "empty_micro_batch" and look % 2 == 1  # TRL's clamp: a silent 0.0, not NaN
    empties = {first}
    if cause == "empty_micro_batch" and look % 4 >= 2:
        empties |= set(rng.sample(range(first + 2, steps + 1), rng.randint(1, 2)))
    few = rng.randrange(1, steps + 1)  # healthy look-alike: a step with only a handful of graded tokens
    spike = rng.randrange(2, steps + 1) if look % 2 == 0 else None  # and a noisy step
    loss, log, total, poisoned = rng.uniform(2.5, 4.0), [], 0.0, False
    for step in range(1, steps + 1):
        tokens, norm = rng.randint(40, 160), rng.uniform(0.8, 3.0)
        loss = max(0.3, loss * rng.uniform(0.9, 0.995))
        value = loss
        if cause == "healthy" and step == few:
            tokens, value, norm = rng.randint(1, 3), loss * rng.uniform(1.3, 2.0), norm * rng.uniform(1.5, 3)
        if cause == "healthy" and step == spike:
            value, norm = loss * rng.uniform(1.5, 2.5), norm * rng.uniform(3, 6)
        if cause != "healthy" and step in empties:
            tokens = 0
            value = 0.0 if clamped else float("nan")
            norm = float("nan") if cause == "nan_weights" else 0.0
            poisoned = cause == "nan_weights"
        elif poisoned:  # the weights are NaN: every later forward is NaN, whatever the data
            value, norm = float("nan"), float("nan")
        total += value
        log.append({"step": step, "loss": value, "avg_loss": total / step, "grad_norm": norm,
                    "num_tokens": tokens})
    return log, Diagnosis(cause, None if cause == "healthy" else first)


def diagnose_log(log: list[dict]) -> Diagnosis:
    """Exercise 1: a step without a graded token is the event; whether the run recovers after it (the
    gradient norm at that step and after) tells whether the weights survived."""
    empty = [i for i, r in enumerate(log) if r["num_tokens"] == 0]
    if not empty:
        return Diagnosis("healthy", None)
    i = empty[0]
    if math.isfinite(log[i]["grad_norm"]) and all(math.isfinite(r["loss"]) for r in log[i + 1:]
                                                  if r["num_tokens"] > 0):
        return Diagnosis("empty_micro_batch", log[i]["step"])  # zero gradient, healthy steps after it
    return Diagnosis("nan_weights", log[i]["step"])


def prepare_examples(examples: list[dict], max_length: int) -> list[dict]:
    """Exercise 2: crop each example to ``max_length`` (right truncation), then keep only those that still
    carry a target after the one-token shift."""
    out = []
    for e in examples:
        ids, labels = list(e["input_ids"][:max_length]), list(e["labels"][:max_length])
        if n_graded(labels) > 0:  # a target after the one-token shift
            out.append({"input_ids": ids, "labels": labels})
    return out


# The self-test's plain phrases, in a fixed order (what a learner of lesson 05 can name).
SELF_TEST_CAUSES = {
    "empty_micro_batch": "a step with no graded token (truncation cut every answer): 0/0",
    "nan_weights": "a loss computed at every position, masked: one empty step made the weights NaN",
    "healthy": "nothing: the run is healthy",
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: a training log as a logger prints it, its true cause as a plain phrase, and
    the phrases to choose from (fixed order). Deterministic per seed; no training."""
    log, truth = training_log_case(seed, graded=False)
    lines = ["A training log (one line per optimizer step; num_tokens = graded tokens in the step):"]
    lines += [f"step {r['step']:3d} | loss {r['loss']:8.4f} | avg {r['avg_loss']:8.4f} | "
              f"grad_norm {r['grad_norm']:8.4g} | num_tokens {r['num_tokens']:4d}" for r in log[:20]]
    return "\n".join(lines), SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())
