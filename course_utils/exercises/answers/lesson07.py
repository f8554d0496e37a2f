"""Reference answers of lesson 07 (token-weighted accumulation). The notebook never imports this module."""

from __future__ import annotations

import math
import random

import torch.nn.functional as F

from ...checks import Diagnosis
from ...data import graded, is_graded

TRACE_CAUSES = (
    "per_micro_batch_mean",     # each micro-batch's mean ÷ K with unequal token counts (this lesson)
    "per_rank_mean",            # each rank's own mean, DDP averages the ranks (section 6.1)
    "missing_division_by_k",    # lesson 01's look-alike: means summed over K micro-batches, no ÷ K
    "empty_micro_batch",        # lesson 05's look-alike: a micro-batch with no supervised token, 0/0
    "token_weighted",           # healthy: summed loss ÷ the step's (global) token count
)


def accumulation_trace_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """The trace of ``seed`` and its true ``Diagnosis`` (exercise 7.1's generator: it knows the truth, so it
    lives here). ``graded`` picks the stream: the checker's traces and the ones ``accumulation_trace`` shows
    are drawn apart, so matching a shown trace over seeds finds none of the graded ones. Evidence: the
    ``micro_step`` or ``rank`` whose tokens weigh the most (``per_micro_batch_mean``, ``per_rank_mean``), the
    ``micro_step`` that gave NaN (``empty_micro_batch``), the factor by which the step is too large
    (``missing_division_by_k``) or ``None`` (``token_weighted``).

    Healthy controls share the look-alikes' surface: some run on several ranks (like ``per_rank_mean``) and
    some have equal token counts (like ``missing_division_by_k``)."""
    rng = random.Random(f"{'graded' if graded else 'shown'}-{seed}")
    cause = TRACE_CAUSES[seed % len(TRACE_CAUSES)]
    # A healthy trace's look cycles with the seed, not a coin: the checker's three consecutive traces of a
    # cause (``checks.fresh_seeds``) are one rank with equal counts, several ranks, several ranks with equal
    # counts — every draw shows each look-alike (a coin left the multi-rank one out of 1 run in 10).
    look = (seed // len(TRACE_CAUSES)) % 3
    many_ranks = cause == "per_rank_mean" or (cause == "token_weighted" and look != 0)
    world = rng.randint(2, 4) if many_ranks else 1
    k = 1 if cause == "per_rank_mean" else rng.randint(2, 5)
    slots = [(r, m) for r in range(world) for m in range(k)]
    if cause == "missing_division_by_k" or (cause == "token_weighted" and look != 1):
        counts = [rng.randint(8, 60)] * len(slots)  # equal counts: the ONLY fault can be the missing ÷ K
    else:
        counts = rng.sample(range(5, 90), len(slots))  # distinct, so one micro-batch is clearly the smallest
    if cause == "empty_micro_batch":
        counts[rng.randrange(len(counts))] = 0
    total = sum(counts)
    rows = []
    for (rank, micro), n in zip(slots, counts):
        summed = round(n * rng.uniform(1.5, 4.0), 4)
        if cause == "token_weighted":
            backward = summed / total * world  # × world undoes DDP's average
        elif cause == "missing_division_by_k":
            backward = summed / n
        elif cause == "empty_micro_batch":
            backward = summed / n / k if n else float("nan")
        else:  # per_micro_batch_mean, per_rank_mean
            backward = summed / n / k
        rows.append({"rank": rank, "micro_step": micro, "n_tokens": n, "summed_loss": summed,
                     "backward_loss": backward})
    trace = {"world_size": world, "accum_steps": k, "rows": rows}
    smallest = min(rows, key=lambda r: r["n_tokens"])
    evidence = {"per_micro_batch_mean": smallest["micro_step"], "per_rank_mean": smallest["rank"],
                "missing_division_by_k": k, "token_weighted": None,
                "empty_micro_batch": smallest["micro_step"]}[cause]
    return trace, Diagnosis(cause, evidence)


# The self-test's plain phrases, in a fixed order (what a learner of lesson 07 can name).
SELF_TEST_CAUSES = {
    "per_micro_batch_mean": "each micro-batch's mean loss divided by K, with unequal token counts",
    "per_rank_mean": "each process uses its own mean loss, and DDP averages them",
    "missing_division_by_k": "the loss is never divided by the accumulation steps",
    "empty_micro_batch": "a micro-batch with no supervised token (0/0)",
    "token_weighted": "nothing: the step weighs every token equally",
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: the printed trace of one optimizer step, its true cause as a plain phrase,
    and the phrases to choose from (fixed order). Deterministic per seed; no training."""
    trace, truth = accumulation_trace_case(seed, graded=False)
    lines = [f"A print in the training loop, one optimizer step: world_size={trace['world_size']}, "
             f"accum_steps={trace['accum_steps']} (DDP averages the processes' gradients)",
             f"{'rank':>4} {'micro_step':>10} {'n_tokens':>8} {'summed_loss':>11} {'backward_loss':>13}"]
    rows = trace["rows"]
    shown = rows if len(rows) <= 20 else rows[:20]
    lines += [f"{r['rank']:>4} {r['micro_step']:>10} {r['n_tokens']:>8} {r['summed_loss']:>11.4f} "
              f"{r['backward_loss']:>13.6g}" for r in shown]
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown)} more rows")
    return "\n".join(lines), SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())


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
    return nll.sum(dim=1), is_graded(labels).sum(dim=1)


def accumulate_sequence_weighted(model, micro_batches, _scale=None):
    """Exercise 7.2: ``.grad`` = gradient of the mean over the step's sequences of each one's mean token loss.

    Sequences without a supervised token have no mean and are left out (and not counted).
    """
    n_sequences = sum(int((graded(b["labels"]).sum(dim=1) > 0).sum()) for b in micro_batches)
    for batch in micro_batches:
        summed, n = _row_losses(model, batch)
        keep = n > 0
        per_sequence = (summed[keep] / n[keep]).sum()
        scale = _scale / int(keep.sum()) if _scale is not None else 1 / n_sequences
        (per_sequence * scale).backward()
