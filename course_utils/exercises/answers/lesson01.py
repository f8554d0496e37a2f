"""Reference answers of lesson 01's exercises (``course_utils.exercises.lesson01``'s checkers import this;
notebooks never do)."""

from __future__ import annotations

import statistics

import torch

from ...checks import Diagnosis
from ...losses import count_supervised
from ...training import token_losses


def diagnose_run(artefact: dict) -> Diagnosis:
    """Exercise 1: the threshold-free split test first, then the loss curve and the clip threshold."""
    k = artefact["config"]["accum_steps"]
    ratio = artefact["split_test"][k] / artefact["split_test"][1]
    if abs(ratio / k - 1) < 0.1:  # the same examples, K× the norm: each micro-batch mean was summed
        return Diagnosis("missing_division", ratio)
    if abs(ratio - 1) > 0.1:  # changed by the split, but not K×: micro-batches weighted unevenly
        tokens = artefact["tokens_per_micro_batch"]
        return Diagnosis("unequal_token_counts", tokens.index(min(tokens)))
    log = artefact["log"]
    lowest = min(log, key=lambda r: r["loss"])
    if log[-1]["loss"] > 1.5 * lowest["loss"]:  # it learned, then climbed for good
        return Diagnosis("lr_too_high", lowest["step"])
    norms = [r["grad_norm"] for r in log]
    return Diagnosis("clip_far_below_norm", statistics.median(norms) / artefact["config"]["max_grad_norm"])


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
