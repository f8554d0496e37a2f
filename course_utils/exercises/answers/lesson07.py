"""Reference answers of lesson 07 (token-weighted accumulation). The notebook never imports this module."""

from __future__ import annotations

import math

import torch.nn.functional as F

from ...checks import Diagnosis


def diagnose_accumulation_trace(trace: dict) -> Diagnosis:
    """Exercise 7.1: the per-token weight of every row tells which normalisation the step used."""
    world, rows = trace["world_size"], trace["rows"]
    for row in rows:
        if math.isnan(row["backward_loss"]):
            return Diagnosis("empty_micro_batch", row["micro_step"])
    weights = [r["backward_loss"] / r["summed_loss"] / world for r in rows]  # DDP averages the ranks
    total = sum(w * r["n_tokens"] for w, r in zip(weights, rows))
    if max(weights) - min(weights) < 1e-9 * max(weights):
        if abs(total - 1) < 1e-6:
            return Diagnosis("token_weighted", None)
        return Diagnosis("missing_division_by_k", round(total))
    heaviest = rows[weights.index(max(weights))]
    if world > 1:
        return Diagnosis("per_rank_mean", heaviest["rank"])
    return Diagnosis("per_micro_batch_mean", heaviest["micro_step"])


def _row_losses(model, batch):
    """Each row's summed next-token cross-entropy and its number of supervised tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
    labels = batch["labels"][:, 1:]
    nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return nll.sum(dim=1), (labels != -100).sum(dim=1)


def accumulate_sequence_weighted(model, micro_batches, _scale=None):
    """Exercise 7.2: ``.grad`` = gradient of the mean over the step's sequences of each one's mean token loss.

    Sequences without a supervised token have no mean and are left out (and not counted).
    """
    n_sequences = sum(int(((b["labels"][:, 1:] != -100).sum(dim=1) > 0).sum()) for b in micro_batches)
    for batch in micro_batches:
        summed, n = _row_losses(model, batch)
        keep = n > 0
        per_sequence = (summed[keep] / n[keep]).sum()
        scale = _scale / int(keep.sum()) if _scale is not None else 1 / n_sequences
        (per_sequence * scale).backward()
