"""Reference answers of lesson 05's exercises (the checkers in ``course_utils.exercises.lesson05``).

Two correct answers are accepted by each checker; these are one of each.
"""

from __future__ import annotations

import math

from ...checks import Diagnosis
from ...data import n_graded


def diagnose_log(log: list[dict]) -> Diagnosis:
    """Read a broken training log: what happens after the first non-finite step tells the cause."""
    bad = next(i for i, r in enumerate(log) if not math.isfinite(r["loss"]))
    after = log[bad + 1:]
    if log[bad]["targets"] > 0:  # every step had data: the optimisation diverged (lesson 06)
        cause = "learning_rate"
    elif all(r["targets"] == 0 for r in after) and all(r["consumed"] == log[bad]["consumed"] for r in after):
        cause = "clogged_packer"  # empty for good, and the data stopped advancing
    elif all(not math.isfinite(r["loss"]) for r in after):
        cause = "loss_at_ignored_positions"  # the data came back, the loss did not: NaN weights
    else:
        cause = "truncated_examples"  # empty now and then, healthy in between
    return Diagnosis(cause, log[bad]["step"])


def prepare_for_packer(examples: list[dict], row_capacity: int) -> list[dict]:
    """Crop each conversation to the row, then keep only those that still carry a target."""
    out = []
    for e in examples:
        ids, labels = list(e["input_ids"][:row_capacity]), list(e["labels"][:row_capacity])
        if n_graded(labels) > 0:  # a target after the one-token shift
            out.append({"input_ids": ids, "labels": labels})
    return out
