"""The next-token loss, written the ways real code writes it, and what each does with no target.

Used by lessons 01, 05, 06 and 07 (and the training loop in ``train``). The same masked mean can be
written four ways, and they differ only on a micro-batch whose every label is ``-100`` — exactly
the micro-batch that truncation and packing produce (lesson 05):

- ``mean_ignore_index``: ``F.cross_entropy(..., ignore_index=-100)`` (mean reduction). No target:
  loss 0/0 = **NaN**, but its backward writes exact zeros at ignored positions: **gradients 0**.
- ``mean_times_mask_ignore_index``: the loop most people write, ``F.cross_entropy(...,
  reduction="none", ignore_index=-100)`` then ``(nll * mask).sum() / mask.sum()``. No target: loss
  NaN, and the NaN reaches the per-token loss's backward — which ignores it at ignored positions:
  **gradients 0** again.
- ``mean_times_mask_all_positions``: the per-token loss computed at *every* position (ignored labels
  replaced by a stand-in id, here ``labels.clamp(min=0)`` through ``log_softmax().gather()``), then
  the same ``(nll * mask).sum() / mask.sum()``. No target: loss NaN *and* NaN gradients
  (d(s/0)/ds = inf, times the mask's 0 = NaN, and this backward passes it on); one AdamW step makes
  every weight NaN.
- ``mean_clamped``: ``sum / count.clamp(min=1)`` (TRL 1.16's ``compute_loss``). No target: a
  **silent 0.0** with zero gradients.

What decides NaN gradients is the per-token loss, not the multiplication nor how the division is
written: whether its backward writes zeros at ignored positions (``ignore_index``: yes, whatever
arrives from above; a loss computed on stand-in labels: no). ``summed_ignore_index(...) / 0`` is NaN
with zero gradients too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from . import validate
from .data import IGNORE_INDEX, is_graded, n_graded


def count_supervised(labels: torch.Tensor) -> int:
    """Tokens that carry loss in a ``[batch, seq]`` label tensor (or a batch holding one): the targets
    of the shifted loss, ``data.n_graded`` — the logit at t predicts the label at t+1, so column 0
    is never a target, and -100 is skipped."""
    if isinstance(labels, dict):
        labels = labels.get("labels")
    validate.tensor("labels", labels, ndim=2, integer_dtype=True)
    return n_graded(labels)


def _labels_in_range(labels: torch.Tensor, vocab: int) -> None:
    """Every label is a token id the logits score, or -100. A -1 meant as "ignore" would otherwise be
    clamped to token 0 by the hand-written losses and graded as a real target: a finite, wrong loss."""
    bad = labels[is_graded(labels) & ((labels < 0) | (labels >= vocab))]
    if bad.numel():
        value = int(bad[0])
        why = (f"{value} is not the ignore label: the course (and torch, transformers, TRL) skip only "
               f"{IGNORE_INDEX}" if value < 0 else f"the logits score only {vocab} tokens")
        raise ValueError(f"labels hold {value}, which is neither a token id in [0, {vocab}) nor "
                         f"{IGNORE_INDEX} — {why} — mask with IGNORE_INDEX (-100), and build labels with the "
                         "model's own tokenizer.")


def shifted(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened ``(logits[:, :-1], labels[:, 1:])`` in float32: the pairs the loss compares."""
    validate.tensor("logits", logits, ndim=3, integer_dtype=False)
    validate.tensor("labels", labels, ndim=2, integer_dtype=True)
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits have shape {tuple(logits.shape)} but labels {tuple(labels.shape)} — "
                         "every position needs one label — "
                         "pass the labels of the batch the logits came from.")
    _labels_in_range(labels, logits.shape[-1])
    return logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten()


def summed_ignore_index(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the per-token losses over supervised tokens (``reduction="sum"``, ``ignore_index``)."""
    flat_logits, flat_labels = shifted(logits, labels)
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")


def mean_ignore_index(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy(reduction="mean", ignore_index=-100)``: NaN with no target, zero gradients."""
    flat_logits, flat_labels = shifted(logits, labels)
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX)


def _check_flat(flat_logits, flat_labels) -> None:
    """``[n, vocab]`` float logits and ``[n]`` labels, one label per row (``shifted`` returns such a pair)."""
    validate.tensor("flat_logits", flat_logits, ndim=2, integer_dtype=False)
    validate.tensor("flat_labels", flat_labels, ndim=1, integer_dtype=True)
    if flat_logits.shape[1] == 0 or flat_logits.shape[0] != flat_labels.shape[0]:
        raise ValueError(f"flat_logits has shape {tuple(flat_logits.shape)} and flat_labels "
                         f"{tuple(flat_labels.shape)} — each row of scores (one per token of the vocabulary) "
                         "is compared with one label — pass the pair shifted(logits, labels) returns.")
    _labels_in_range(flat_labels, flat_logits.shape[1])


def per_token_ignore_index(flat_logits: torch.Tensor, flat_labels: torch.Tensor) -> torch.Tensor:
    """Per-token losses ``F.cross_entropy(reduction="none", ignore_index=-100)``: 0 at ignored positions,
    and its backward writes 0 there whatever gradient arrives (that is what keeps NaN out)."""
    _check_flat(flat_logits, flat_labels)
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="none")


def per_token_all_positions(flat_logits: torch.Tensor, flat_labels: torch.Tensor) -> torch.Tensor:
    """Per-token losses at *every* position: ignored labels are replaced by a stand-in id
    (``clamp(min=0)`` only makes -100 a legal index for ``gather``) and left for a mask to remove.
    Its backward passes whatever arrives at an ignored position on to the logits."""
    _check_flat(flat_logits, flat_labels)
    return -flat_logits.log_softmax(-1).gather(-1, flat_labels.clamp(min=0)[:, None])[:, 0]


def _nll_and_mask(logits: torch.Tensor, labels: torch.Tensor, per_token=per_token_all_positions):
    flat_logits, flat_labels = shifted(logits, labels)
    return per_token(flat_logits, flat_labels), is_graded(flat_labels).float()


def mean_times_mask_ignore_index(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The masked mean most hand-written loops use: ``F.cross_entropy(..., reduction="none",
    ignore_index=-100)``, then ``(nll * mask).sum() / mask.sum()``.

    With no target: loss 0/0 = NaN, yet **zero** gradients — the NaN that the division sends back
    (1/0 = inf times the mask's 0) meets nll_loss's backward, which writes 0 at every ignored position.
    """
    nll, mask = _nll_and_mask(logits, labels, per_token_ignore_index)
    return (nll * mask).sum() / mask.sum()


def mean_times_mask_all_positions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same ``(nll * mask).sum() / mask.sum()`` over a per-token loss computed at *every*
    position: ignored labels become a stand-in id (``labels.clamp(min=0)``) for ``log_softmax().gather()``
    and only the mask removes them — as loops do that replace -100 before the loss.

    With no target: 0/0 = NaN, and the backward multiplies 1/0 = inf by the mask's zeros and carries the
    NaN into every logit (gather and log_softmax do not zero ignored positions): NaN gradients.
    """
    nll, mask = _nll_and_mask(logits, labels)
    return (nll * mask).sum() / mask.sum()


def mean_clamped(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The guard: ``sum / count.clamp(min=1)``. Equal to the mean where targets exist; with none, a
    finite 0 with zero gradients (the micro-batch contributes nothing — and the log shows 0.0)."""
    nll, mask = _nll_and_mask(logits, labels)
    return (nll * mask).sum() / mask.sum().clamp(min=1)


MASKED_MEANS = {"ignore_index": mean_ignore_index, "times mask, ignore_index": mean_times_mask_ignore_index,
                "times mask, all positions": mean_times_mask_all_positions, "clamped": mean_clamped}


def model_logits(model, batch: dict) -> torch.Tensor:
    """The model's logits on a collated batch (its attention mask and ``position_ids`` passed when it has
    them: a packed or left-padded batch's positions decide the logits on a model with learned absolute
    positions, lesson 03)."""
    validate.model("model", model)
    validate.batch("batch", batch, need=("input_ids",))
    validate.ids_fit_model(model, batch["input_ids"])
    extra = {"position_ids": batch["position_ids"]} if batch.get("position_ids") is not None else {}
    return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), **extra).logits


@torch.no_grad()
def eval_loss(model, batches: Sequence[dict]) -> float:
    """Token-weighted cross-entropy of ``model`` on held-out ``batches`` (nats per supervised token).

    NaN when the model's weights are NaN. Batches with no supervised token at all are an error, not
    a 0.0 or a NaN: an evaluation that measured nothing must not look like a number.
    """
    validate.model("model", model)
    validate.batches("batches", batches)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for b in batches:
        total += float(summed_ignore_index(model_logits(model, b), b["labels"]))
        count += count_supervised(b["labels"])
    model.train(was_training)
    if count == 0:
        raise ValueError("eval_loss: no batch has a supervised token (every label is -100) — there is "
                         "nothing to evaluate — check max_length and the label masking of the held-out set.")
    return total / count


def params_finite(model, *, trainable_only: bool = False) -> bool:
    """True when every parameter (or every trainable one) is finite: no NaN, no inf.

    ``trainable_only=True`` for LoRA runs, where the frozen (possibly quantised) base is not
    touched by the optimiser and only the adapters can turn NaN.
    """
    validate.model("model", model)
    validate.flag("trainable_only", trainable_only, why="it switches between every parameter and the "
                  "trainable ones")
    return all(bool(torch.isfinite(p).all()) for p in model.parameters()
               if p.requires_grad or not trainable_only)
