"""Lesson 05 (truncation and the NaN micro-batch): fully masked examples, 0/0 losses, the clogged packer.

Two mechanisms give a micro-batch without a single target token:

- **right truncation** (TRL-style ``max_length``): a prompt that fills ``max_length`` leaves an example
  whose labels are all ``-100``; a micro-batch of ``b`` random rows is all-masked with probability
  about ``p**b`` — this one depends on the device batch size (``fully_masked_batch_rate``;
  ``truncation_explorer`` moves ``max_length``, the truncated side and the batch size);
- **a clogged best-fit packer** (nanochat's ``sft_data_generator_bos_bestfit``): conversations longer
  than a row never leave the buffer; once the buffer holds nothing else, every row is padding, for good
  — this one does not depend on the device batch size (``bestfit_rows``, ``clog_by_batch_size``).

The masked means themselves (NaN, NaN gradients, silent 0.0) live in ``course_utils.losses``; the
training loop is ``course_utils.training.train``. Here: what truncation and packing produce, how nanochat
logs it (``nanochat_logged``), a normalised-update optimiser that moves weights without a gradient
(``NormalisedMomentum``), what TRL and the ``Trainer`` do, and the checkers of the two exercises.
"""

from __future__ import annotations

import copy
import math
import random
import tempfile
from collections.abc import Sequence

import torch

from . import validate
from .checks import Case, Diagnosis, Hints, check_diagnosis, run_check
from .data import IGNORE_INDEX, collate_right
from .losses import count_supervised, mean_ignore_index, model_logits, params_finite

# ------------------------------------------------------------------------------------------------
# Counting what truncation did, and choosing lengths from the data
# ------------------------------------------------------------------------------------------------


def has_targets(labels: Sequence[int]) -> bool:
    """True when at least one label is not -100: the example carries loss (TRL's own test)."""
    return any(int(label) != IGNORE_INDEX for label in labels)


def _check_examples(examples, name: str = "examples") -> Sequence[dict]:
    if not isinstance(examples, Sequence) or not all(isinstance(e, dict) and "labels" in e
                                                     and "input_ids" in e for e in examples):
        raise ValueError(f"{name} must be a list of dicts with 'input_ids' and 'labels' — the helper reads "
                         "both — pass tokenize_chat() outputs.")
    return examples


def answer_start(example: dict) -> int:
    """Position of the first label that is not -100: how many tokens of prompt come before the answer.
    Right truncation at ``max_length <= answer_start`` leaves the example with no target at all."""
    for i, label in enumerate(example["labels"]):
        if int(label) != IGNORE_INDEX:
            return i
    raise ValueError("answer_start: this example has no target at all — there is no answer to locate — "
                     "pass the untruncated tokenize_chat() output.")


def percentile(values: Sequence[float], q: float) -> int:
    """The ``q``-th percentile (0-100, nearest rank) of ``values``, as an int: lengths come from the data."""
    validate.non_empty("values", values, what="lengths", fix="pass e.g. [len(e['input_ids']) for e in ...].")
    validate.number("q", q, minimum=0.0, why="it is a percentile")
    if q > 100:
        raise ValueError(f"q={q!r} must be at most 100 — it is a percentile — pass e.g. q=85.")
    ordered = sorted(values)
    return int(ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))])


def truncation_report(examples: Sequence[dict], max_length: int) -> dict:
    """Counts for a list of ``tokenize_chat`` outputs truncated at ``max_length``.

    ``fully_masked``: examples with no target left; ``token_share_fully_masked``: their share of
    all tokens the model would process (they are exactly ``max_length`` long, the costliest rows).
    """
    _check_examples(examples)
    validate.positive_int("max_length", max_length, why="it is the truncation length")
    masked = [e for e in examples if not has_targets(e["labels"])]
    total = sum(len(e["input_ids"]) for e in examples)
    return {
        "examples": len(examples),
        "fully_masked": len(masked),
        "at_max_length": sum(len(e["input_ids"]) == max_length for e in examples),
        "token_share_fully_masked": sum(len(e["input_ids"]) for e in masked) / max(total, 1),
    }


def truncated(example: dict, max_length: int, mode: str = "keep_start") -> dict:
    """``example`` cut to ``max_length`` tokens: ``"keep_start"`` keeps the first ones (TRL's default,
    the answer goes first), ``"keep_end"`` the last ones (TRL's ``truncation_mode="keep_end"``)."""
    validate.positive_int("max_length", max_length, why="it is the truncation length")
    validate.choice("mode", mode, ("keep_start", "keep_end"), why="TRL knows these two truncation modes")
    cut = slice(None, max_length) if mode == "keep_start" else slice(-max_length, None)
    return {"input_ids": list(example["input_ids"])[cut], "labels": list(example["labels"])[cut]}


def kept_by_policy(full_examples: Sequence[dict], max_length: int, mode: str = "keep_start") -> dict:
    """What a truncation policy keeps of untruncated examples, after TRL's drop of fully masked ones:
    ``examples`` kept and ``graded_tokens`` (labels != -100) kept, and the totals before it."""
    _check_examples(validate.non_empty("full_examples", full_examples, what="tokenized examples",
                                       fix="pass tokenize_chat() outputs without max_length."))
    cut = [truncated(e, max_length, mode) for e in full_examples]
    kept = [e for e in cut if has_targets(e["labels"])]
    graded = sum(sum(int(x) != IGNORE_INDEX for x in e["labels"]) for e in kept)
    total = sum(sum(int(x) != IGNORE_INDEX for x in e["labels"]) for e in full_examples)
    return {"examples": len(kept), "of_examples": len(full_examples), "graded_tokens": graded,
            "of_graded_tokens": total, "longest_row": max((len(e["input_ids"]) for e in kept), default=0)}


def batch_signal(batches: Sequence[dict]) -> list[dict]:
    """Per micro-batch: rows, rows with at least one target, and valid (shifted) target tokens."""
    validate.batches("batches", batches, need=("labels",))
    out = []
    for b in batches:
        shifted = b["labels"][:, 1:] != IGNORE_INDEX  # the loss predicts labels[1:]
        out.append({"rows": int(b["labels"].shape[0]), "rows_with_targets": int(shifted.any(1).sum()),
                    "valid_tokens": int(shifted.sum())})
    return out


def fully_masked_batch_rate(masked_flags: Sequence[bool], batch_size: int, *, shuffles: int = 200,
                            seed: int = 0) -> dict:
    """Measured on the dataset: how often a shuffled epoch cut into ``batch_size`` micro-batches
    yields a micro-batch whose rows are *all* fully masked (the right-truncation mechanism).

    Returns ``per_batch`` (fraction of micro-batches) and ``per_epoch`` (fraction of epochs with at
    least one such micro-batch): small GPUs run small micro-batches, and hit it every epoch.
    """
    validate.positive_int("batch_size", batch_size, why="it is the number of rows per micro-batch")
    validate.positive_int("shuffles", shuffles, why="it is the number of shuffled epochs measured")
    flags = [bool(f) for f in validate.non_empty(
        "masked_flags", masked_flags, what="flags",
        fix="pass one flag per example, e.g. [not has_targets(e['labels']) for e in examples].")]
    if batch_size > len(flags):
        raise ValueError(f"batch_size={batch_size} is larger than the {len(flags)} examples — an epoch "
                         "would hold no full micro-batch — pass a smaller batch_size.")
    rng = random.Random(seed)
    hits = batches = epochs_hit = 0
    for _ in range(shuffles):
        rng.shuffle(flags)
        full = [all(flags[i: i + batch_size]) for i in range(0, len(flags) - batch_size + 1, batch_size)]
        hits += sum(full)
        batches += len(full)
        epochs_hit += any(full)
    return {"per_batch": hits / batches, "per_epoch": epochs_hit / shuffles}


# ------------------------------------------------------------------------------------------------
# What if: max_length, the truncated side and the device batch size (arithmetic on labels, no training)
# ------------------------------------------------------------------------------------------------


def targets_per_micro_batch(examples: Sequence[dict], batch_size: int) -> list[int]:
    """Supervised tokens (``labels[1:] != -100``, the shifted targets) in each micro-batch of ``batch_size``
    consecutive examples, in order; the last micro-batch may be short. A 0 is a micro-batch whose
    ``ignore_index`` mean is 0/0: its loss is logged as NaN."""
    _check_examples(examples)
    return [sum(sum(int(x) != IGNORE_INDEX for x in e["labels"][1:]) for e in examples[i: i + batch_size])
            for i in range(0, len(examples), batch_size)]


def truncation_frame(full_examples: Sequence[dict], max_length: int, mode: str, batch_size: int,
                     *, note: str = ""):
    """One explorer frame: ``full_examples`` cut at ``max_length`` from ``mode``'s side, then taken in order
    ``batch_size`` rows at a time, as a plain loop (no TRL drop) would. Returns ``(text, figure)``: rows
    left without a target, supervised tokens kept, micro-batches whose loss is NaN, and the targets per
    micro-batch with the empty ones marked."""
    from .viz import figure

    _check_examples(validate.non_empty("full_examples", full_examples, what="tokenized examples",
                                       fix="pass tokenize_chat() outputs without max_length."))
    cut = [truncated(e, max_length, mode) for e in full_examples]
    policy = kept_by_policy(full_examples, max_length, mode)
    per_batch = targets_per_micro_batch(cut, batch_size)
    empty = [i for i, n in enumerate(per_batch, 1) if n == 0]
    masked = len(cut) - policy["examples"]
    p = masked / len(cut)
    prompt_cut = sum(len(e["input_ids"]) - len(c["input_ids"]) for e, c in zip(full_examples, cut))
    graded = policy["graded_tokens"] / max(policy["of_graded_tokens"], 1)
    shown = ", ".join(f"#{i}" for i in empty[:8]) + (" …" if len(empty) > 8 else "")
    side = "end (answers first)" if mode == "keep_start" else "start (the prompt's opening first)"
    text = "\n".join([
        f"max_length {max_length}{note}, {mode}, device batch size {batch_size}:",
        f"  rows left with no target: {masked} / {len(cut)} (p = {p:.3f})"
        + ("; TRL drops them, a plain loop spends a row on nothing" if masked else ""),
        f"  supervised tokens kept: {policy['graded_tokens']} / {policy['of_graded_tokens']} ({graded:.0%}); "
        f"tokens cut from the {side}: {prompt_cut}",
        f"  micro-batches with no target (loss NaN): {len(empty)} of {len(per_batch)}"
        + (f" — {shown}" if empty else ""),
        f"  (rows in random order: expect p^b × {len(per_batch)} = {p ** batch_size * len(per_batch):.2f})",
    ])
    untruncated = targets_per_micro_batch(full_examples, batch_size)
    mean_full = sum(untruncated) / len(untruncated)
    fig, ax = figure(7, 3)
    # one filled step line, not a bar per micro-batch: a frame stays light with hundreds of micro-batches
    ax.stairs(per_batch, [i + 0.5 for i in range(len(per_batch) + 1)], fill=True, color="tab:blue",
              label="targets kept")
    ax.plot(empty, [0] * len(empty), "x", color="tab:red", ms=7, mew=2, clip_on=False, zorder=3,
            label=f"no target: loss NaN ({len(empty)})")
    ax.axhline(mean_full, color="k", ls="--", lw=1, label=f"mean without truncation ({mean_full:.1f})")
    ax.set_ylim(0, 1.45 * max(max(per_batch), mean_full, 1))  # headroom for the legend
    rows = f"{batch_size} row{'s' if batch_size > 1 else ''}"
    ax.set(xlabel=f"micro-batch ({rows} each, in the data's order)", ylabel="supervised tokens",
           title=f"Targets per micro-batch: max_length {max_length}, {mode}, batch {batch_size}")
    ax.legend(fontsize=7, loc="upper right", ncols=3)
    return text, fig


def truncation_explorer(full_examples: Sequence[dict], *, percentiles: Sequence[float] = (50, 70, 85, 95),
                        batch_sizes: Sequence[int] = (1, 2, 4, 8, 16), start: dict | None = None):
    """A "what if" over ``max_length`` × the truncated side × the device batch size (``viz.what_if``).

    The ``max_length`` choices are ``percentiles`` of where the answers of ``full_examples`` start
    (``answer_start``) plus the longest example, so they come from this tokenizer's data; each frame is
    ``truncation_frame`` — list arithmetic on the labels, no model. ``start``: e.g.
    ``{"max_length": MAX_LENGTH, "mode": "keep_start", "batch_size": 1}``.
    """
    from .viz import what_if

    _check_examples(validate.non_empty("full_examples", full_examples, what="tokenized examples",
                                       fix="pass tokenize_chat() outputs without max_length."))
    validate.non_empty("percentiles", percentiles, what="percentiles", fix="pass e.g. (50, 85, 95).")
    for q in percentiles:
        validate.number("percentiles", q, minimum=0.0, why="each is a percentile between 0 and 100")
    validate.non_empty("batch_sizes", batch_sizes, what="batch sizes", fix="pass e.g. (1, 4).")
    sizes = sorted({validate.positive_int("batch_sizes", b, why="each is rows per micro-batch")
                    for b in batch_sizes})
    starts = [answer_start(e) for e in full_examples]
    names = {}  # max_length -> where it comes from; a length two percentiles share keeps the first name
    for q in percentiles:
        names.setdefault(percentile(starts, q), f" (p{q:g} of answer starts)")
    names.setdefault(max(len(e["input_ids"]) for e in full_examples), " (the longest example)")
    lengths = sorted(names)
    return what_if(lambda max_length, mode, batch_size: truncation_frame(
                       full_examples, max_length, mode, batch_size, note=names.get(max_length, "")),
                   {"max_length": lengths, "mode": ["keep_start", "keep_end"], "batch_size": sizes},
                   start=start, descriptions={"mode": "truncated side (keep)",
                                              "batch_size": "device batch size"})


# ------------------------------------------------------------------------------------------------
# One step, and what a logger shows
# ------------------------------------------------------------------------------------------------


def one_step(model, batch: dict, loss_fn, lr: float = 1e-3) -> dict:
    """One forward/backward/AdamW step of ``loss_fn(logits, labels)`` on a *copy* of ``model``.

    Returns ``loss``, ``grad_norm``, ``grads_finite``, ``nan_grad_tensors`` (of ``n_tensors``),
    ``weights_finite`` after the step, and ``model`` (the stepped copy).
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn={loss_fn!r} is not a function — the step calls loss_fn(logits, labels) — "
                         "pass e.g. course_utils.losses.mean_ignore_index.")
    validate.batch("batch", batch)
    validate.number("lr", lr, positive=True, why="it is the AdamW learning rate")
    model = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    value = loss_fn(model_logits(model, batch), batch["labels"])
    value.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    record = {"loss": value.item(), "grad_norm": float(torch.nn.utils.get_total_norm(grads)),
              "grads_finite": all(bool(torch.isfinite(g).all()) for g in grads),
              "nan_grad_tensors": sum(bool(torch.isnan(g).any()) for g in grads), "n_tensors": len(grads)}
    opt.step()
    record.update(weights_finite=params_finite(model), model=model.eval())
    return record


def running_mean(values: Sequence[float]) -> list[float]:
    """The running average a logger shows: one NaN in the sum and every later value is NaN."""
    out, total = [], 0.0
    for i, v in enumerate(values, 1):
        total += v
        out.append(total / i)
    return out


def nanochat_logged(last_micro_batch_losses: Sequence[float], beta: float = 0.9) -> list[float]:
    """What nanochat's ``chat_sft.py`` prints as ``loss:`` at each step, given the loss of the *last*
    micro-batch of each step (``train_loss = loss.detach()`` is overwritten every micro-step): an EMA,
    debiased with ``1 - beta**(step + 1)`` where ``step`` was already incremented — copied as written.
    One NaN enters the EMA and every later value is NaN."""
    validate.number("beta", beta, minimum=0.0, why="it is the EMA decay")
    smooth, out = 0.0, []
    for step, loss in enumerate(last_micro_batch_losses, 1):
        smooth = beta * smooth + (1 - beta) * float(loss)
        out.append(smooth / (1 - beta ** (step + 1)))
    return out


# ------------------------------------------------------------------------------------------------
# nanochat's best-fit packer, and how it clogs
# ------------------------------------------------------------------------------------------------


def render(example: dict, render_cap: int) -> tuple[list[int], list[int]]:
    """A conversation as nanochat's packer receives it: ids and labels cut at ``render_cap`` tokens
    (``render_conversation(..., max_tokens=2048)``), which can be longer than a row."""
    validate.positive_int("render_cap", render_cap, why="it is the render length limit")
    return list(example["input_ids"][:render_cap]), list(example["labels"][:render_cap])


def bestfit_rows(examples: Sequence[dict], *, row_capacity: int, n_rows: int, pad_id: int,
                 render_cap: int, buffer_size: int = 100, crop: bool = False,
                 drop_untrainable: bool = False) -> list[dict]:
    """Rows of ``row_capacity`` tokens packed as nanochat's ``sft_data_generator_bos_bestfit`` packs
    them: keep ``buffer_size`` rendered conversations in a buffer (refilled to full before each pick),
    put the largest one that fits the room left in the row, and when none fits pad the rest of the row
    — never crop. A conversation longer than a row therefore never leaves the buffer.

    Returns one dict per row: ``ids``, ``labels`` (-100 on padding), ``targets`` (supervised tokens
    after the shift) and ``consumed`` (conversations taken out of the buffer so far; it drives nanochat's
    progress, LR schedule and ``last_step``, and freezes when the buffer clogs).
    ``crop=True`` cuts each conversation to the row as it enters the buffer (nanochat PR 811's idea):
    the buffer cannot clog, but a crop can keep only the prompt, a row without a target;
    ``drop_untrainable=True`` also skips conversations left with no target (what the crop still needs).
    """
    _check_examples(examples)
    validate.non_empty("examples", examples, what="tokenized conversations")
    validate.integer("row_capacity", row_capacity, minimum=2, why="a row needs an input and a target")
    for name, value in (("n_rows", n_rows), ("buffer_size", buffer_size)):
        validate.positive_int(name, value, why="it is a count")
    validate.integer("pad_id", pad_id, minimum=0, why="it is a token id")
    cut = row_capacity if crop else render_cap
    if drop_untrainable and not any(has_targets(e["labels"][:cut]) for e in examples):
        raise ValueError("drop_untrainable=True but no conversation keeps a target after the cut — the "
                         "buffer "
                         "could never refill — raise row_capacity or check the labels.")
    buffer, cursor, consumed, rows = [], 0, 0, []

    def refill():
        nonlocal cursor
        while len(buffer) < buffer_size:  # nanochat appends every conversation, even ones no row can hold
            ids, labels = render(examples[cursor % len(examples)], render_cap)
            cursor += 1
            if drop_untrainable and not has_targets(labels[:cut]):
                continue
            buffer.append((ids[:cut], labels[:cut]))

    for _ in range(n_rows):
        ids, labels = [], []
        while len(ids) < row_capacity:
            refill()
            room = row_capacity - len(ids)
            fitting = [i for i, (c, _) in enumerate(buffer) if len(c) <= room]
            if not fitting:  # nothing fits: pad the rest of the row instead of cropping
                break
            best = max(fitting, key=lambda i: len(buffer[i][0]))  # first of the largest, as nanochat's `>`
            c, lab = buffer.pop(best)
            ids, labels, consumed = ids + c, labels + lab, consumed + 1
        pad = row_capacity - len(ids)
        labels = labels + [IGNORE_INDEX] * pad
        rows.append({"ids": ids + [pad_id] * pad, "labels": labels,
                     "targets": sum(x != IGNORE_INDEX for x in labels[1:]), "consumed": consumed})
    return rows


def stack_rows(rows: Sequence[dict]) -> dict:
    """Rows of ``bestfit_rows`` as one micro-batch (``input_ids``, ``labels``, ``attention_mask``).
    Rows are plain concatenations, as nanochat's are (no per-document attention)."""
    validate.non_empty("rows", rows, what="packed rows", fix="pass rows from bestfit_rows().")
    ids = torch.tensor([r["ids"] for r in rows])
    return {"input_ids": ids, "labels": torch.tensor([r["labels"] for r in rows]),
            "attention_mask": torch.ones_like(ids)}


def first_empty_row(rows: Sequence[dict]) -> int:
    """1-based index of the first row without a target; raises if every row carries one."""
    for i, r in enumerate(rows, 1):
        if r["targets"] == 0:
            return i
    raise ValueError(f"first_empty_row: all {len(rows)} rows carry a target — the packer never clogged here "
                     "— pack more rows, or check that some conversations are longer than a row.")


def clog_by_batch_size(rows: Sequence[dict], *, device_batch_size: int, rows_per_step: int) -> dict:
    """nanochat's loop over the same row stream at a given device batch size: a step runs
    ``rows_per_step // device_batch_size`` micro-batches and logs only the last one's loss, which is
    NaN (``F.cross_entropy`` mean over 0 targets) when that micro-batch has no target.

    Returns ``first_empty_row`` (a property of the stream, not of the batch size),
    ``first_empty_micro_batch``, ``first_nan_step`` (first step whose *logged* micro-batch is empty;
    raises if none) and ``hidden_empty_micro_batches`` (empty micro-batches before it that the log never
    showed)."""
    validate.positive_int("device_batch_size", device_batch_size, why="it is rows per micro-batch")
    validate.positive_int("rows_per_step", rows_per_step, why="it is rows per optimizer step")
    if rows_per_step % device_batch_size:
        raise ValueError(f"rows_per_step={rows_per_step} is not a multiple of device_batch_size="
                         f"{device_batch_size} — nanochat asserts the same — pick sizes that divide.")
    accum = rows_per_step // device_batch_size
    empty = [all(r["targets"] == 0 for r in rows[i: i + device_batch_size])
             for i in range(0, len(rows) - device_batch_size + 1, device_batch_size)]
    first_nan_step = next((m // accum + 1 for m, e in enumerate(empty) if e and m % accum == accum - 1), None)
    if first_nan_step is None:
        raise ValueError("clog_by_batch_size: no step logs an empty micro-batch in these rows — the stream "
                         "is "
                         "too short or never clogs — pack more rows (at least a few steps past the clog).")
    return {"first_empty_row": first_empty_row(rows),
            "first_empty_micro_batch": empty.index(True) + 1, "first_nan_step": first_nan_step,
            "hidden_empty_micro_batches": sum(e for m, e in enumerate(empty[:first_nan_step * accum])
                                              if m % accum != accum - 1)}


# ------------------------------------------------------------------------------------------------
# An optimiser whose update has a fixed size (the Muon family), on zero gradients
# ------------------------------------------------------------------------------------------------


class NormalisedMomentum(torch.optim.Optimizer):
    """A tiny stand-in for Muon's update rule: heavy-ball momentum whose update is rescaled to a fixed
    size, ``lr * sqrt(min(rows, cols))`` per matrix (nanochat's "Muon+ renormalization" snaps the
    update's Frobenius norm to ``sqrt(min(m, n))``). No orthogonalisation: only the rescaling matters
    here. With a zero gradient the momentum still points somewhere, so the weights keep moving by a
    constant step; only an exactly zero momentum gives a zero update."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.95):
        validate.number("lr", lr, positive=True, why="it sets the size of every update")
        validate.number("momentum", momentum, minimum=0.0, why="it is a decay factor")
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - group["momentum"])  # as nanochat's momentum_buffer.lerp_
                shape = p.shape if p.ndim >= 2 else (1, p.numel())
                target = min(shape[-2], shape[-1]) ** 0.5
                p.sub_(group["lr"] * target * buf / buf.norm().clamp_min(1e-12))


def drift_on_zero_grads(model, warm_batches: Sequence[dict], empty_batch: dict, *, optimizer: str,
                        lr: float, warm_steps: int, zero_steps: int) -> dict:
    """Train a copy of ``model`` on ``warm_batches`` for ``warm_steps``, then for ``zero_steps`` on
    ``empty_batch`` (no target: ``F.cross_entropy`` mean is NaN, its gradient exactly 0).

    ``optimizer``: ``"sgd"`` (no momentum), ``"adamw"`` or ``"normalised"`` (``NormalisedMomentum``).
    Returns ``moves``: the L2 distance the weights moved at each zero-gradient step, and
    ``grad_norms`` of those steps (all 0.0)."""
    validate.choice("optimizer", optimizer, ("sgd", "adamw", "normalised"), why="the lesson compares these")
    validate.batches("warm_batches", warm_batches)
    validate.batch("empty_batch", empty_batch)
    if count_supervised(empty_batch["labels"]) != 0:
        raise ValueError("empty_batch has supervised tokens — the point is a micro-batch without any — pass "
                         "a batch whose labels are all -100 (e.g. a stack of all-padding rows).")
    model = copy.deepcopy(model).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = {"sgd": lambda: torch.optim.SGD(params, lr=lr), "adamw": lambda: torch.optim.AdamW(params, lr=lr),
           "normalised": lambda: NormalisedMomentum(params, lr=lr)}[optimizer]()
    moves, grad_norms = [], []
    for i in range(warm_steps + zero_steps):
        batch = warm_batches[i % len(warm_batches)] if i < warm_steps else empty_batch
        before = [p.detach().clone() for p in params]
        mean_ignore_index(model_logits(model, batch), batch["labels"]).backward()
        norm = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
        opt.step()
        opt.zero_grad(set_to_none=False)  # keep zero tensors: an optimiser skips params whose grad is None
        if i >= warm_steps:
            grad_norms.append(norm)
            moves.append(float(sum((p.detach() - b).pow(2).sum() for p, b in zip(params, before)) ** 0.5))
    return {"moves": moves, "grad_norms": grad_norms, "weights_finite": params_finite(model)}


# ------------------------------------------------------------------------------------------------
# What the libraries do: TRL's drop and its clamp, the Trainer's NaN log filter
# ------------------------------------------------------------------------------------------------


def trl_kept_examples(model, tokenizer, dataset, max_length: int,
                      truncation_mode: str = "keep_start") -> list[dict]:
    """The training rows TRL's ``SFTTrainer`` keeps with ``assistant_only_loss=True``, ``max_length``
    and ``truncation_mode``: after truncation it drops "fully masked examples" (``sft_trainer.py``).

    The trainer gets a copy: TRL 1.16 replaces ``model.forward`` with a fused-loss forward.
    """
    from .training import make_sft_trainer

    validate.positive_int("max_length", max_length, why="it is the truncation length")
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, dataset, max_length=max_length,
                               assistant_only_loss=True, truncation_mode=truncation_mode, progress=False)
    return [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in trainer.train_dataset]


def _rows_dataset(examples: Sequence[dict]):
    from datasets import Dataset

    return Dataset.from_list([{"input_ids": list(e["input_ids"]), "labels": list(e["labels"])}
                              for e in _check_examples(examples)])


def trl_logged_on_pretokenised(model, tokenizer, examples: Sequence[dict], *, nan_inf_filter: bool = True,
                               lr: float = 1e-3) -> dict:
    """Train a copy of ``model`` with TRL's ``SFTTrainer`` on a *pre-tokenised* dataset (``input_ids`` and
    ``labels`` columns, ``max_length=None``): TRL skips its own truncation and its drop of fully masked
    rows, so they reach ``compute_loss``, which divides by ``num_tokens.clamp(min=1)``.

    One row per step, in order (no shuffle). Returns ``logged`` (loss per step), ``grad_norms``,
    ``targets`` (supervised tokens per step) and ``weights_finite``."""
    from .training import logged, make_sft_trainer

    validate.non_empty("examples", examples, what="tokenized examples")
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, _rows_dataset(examples), max_length=None,
                               per_device_train_batch_size=1, max_steps=len(examples), learning_rate=lr,
                               logging_nan_inf_filter=nan_inf_filter, progress=False)
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    trainer.train()
    return {"logged": logged(trainer), "grad_norms": logged(trainer, "grad_norm"),
            "targets": [count_supervised(torch.tensor([e["labels"]])) for e in examples],
            "weights_finite": params_finite(trainer.model)}


def trainer_logged_losses(model, tokenizer, examples: Sequence[dict], *, nan_inf_filter: bool,
                          steps: int, batch_size: int = 1, lr: float = 1e-3) -> dict:
    """Train a copy of ``model`` with the plain transformers ``Trainer`` on hand-made rows (TRL would
    drop the fully masked ones) and return what it logged: ``logged`` (loss per step),
    ``train_loss``, ``grad_norms`` and ``weights_finite``."""
    from transformers import Trainer, TrainingArguments

    from .model import course_seed
    from .quiet import quiet_libraries

    validate.positive_int("steps", steps, why="it counts optimizer steps")
    validate.positive_int("batch_size", batch_size, why="it is rows per step")
    model = copy.deepcopy(model)
    rows = _rows_dataset(examples)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="sft-lab-"), max_steps=steps,
                             per_device_train_batch_size=batch_size, learning_rate=lr,
                             lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to="none", use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
                             seed=course_seed(), remove_unused_columns=False,
                             logging_nan_inf_filter=nan_inf_filter)
    with quiet_libraries(capture_output=True):
        trainer = Trainer(model=model, args=args, train_dataset=rows,
                          data_collator=lambda f: collate_right(f, tokenizer.pad_token_id))
        result = trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    return {"logged": [h["loss"] for h in history], "grad_norms": [h["grad_norm"] for h in history],
            "train_loss": result.training_loss, "weights_finite": params_finite(model)}


# ------------------------------------------------------------------------------------------------
# Exercise 1 (diagnosis): which mechanism broke this training log?
# ------------------------------------------------------------------------------------------------

CAUSES = ("clogged_packer", "truncated_examples", "mask_multiplication", "learning_rate")
"""The causes of a broken log: the best-fit buffer clogged; right truncation left random micro-batches
without a target; a hand-written ``(nll * mask).sum() / mask.sum()`` turned one empty micro-batch into NaN
weights; and lesson 06's look-alike, a learning rate so high the run diverges with every batch full."""


def broken_log(seed: int) -> tuple[list[dict], Diagnosis]:
    """A training log you have not seen (one record per step: ``step``, ``loss``, ``grad_norm``,
    ``targets`` in the step, ``consumed`` conversations) and its truth: ``Diagnosis(cause, evidence)``
    with ``evidence`` the first step whose logged loss is not finite."""
    rng = random.Random(seed)
    cause = CAUSES[seed % len(CAUSES)]
    steps, first = rng.randint(14, 22), rng.randint(3, 9)
    log, consumed, loss = [], 0, rng.uniform(2.5, 4.0)
    empties = set()
    if cause == "truncated_examples":  # isolated empty steps, data keeps flowing
        empties = {first} | set(rng.sample(range(first + 2, steps + 1), 2))
    for step in range(1, steps + 1):
        targets, norm = rng.randint(40, 90), rng.uniform(0.8, 2.5)
        loss = max(0.3, loss * rng.uniform(0.9, 0.99))
        value = loss
        if cause == "clogged_packer" and step >= first:
            targets, norm, value = 0, 0.0, float("nan")
        elif cause == "truncated_examples" and step in empties:
            targets, norm, value = 0, 0.0, float("nan")
        elif cause == "mask_multiplication" and step == first:
            targets, norm, value = 0, float("nan"), float("nan")
        elif cause == "mask_multiplication" and step > first:
            norm, value = float("nan"), float("nan")  # NaN weights: data is fine, the model is gone
        elif cause == "learning_rate":
            if step >= first:
                norm, value = norm * 10 ** (step - first + 1), loss * 2 ** (step - first + 1)
            if step >= first + 3:
                norm, value = float("inf"), float("nan")
        consumed += 0 if targets == 0 and cause == "clogged_packer" else rng.randint(3, 6)
        log.append({"step": step, "loss": value, "grad_norm": norm, "targets": targets, "consumed": consumed})
    bad = next(r["step"] for r in log if not math.isfinite(r["loss"]))
    return log, Diagnosis(cause, bad)


def check_diagnose_log(fn) -> object:
    """Checker: ``fn(log) -> Diagnosis(cause, evidence)`` on fresh logs from ``broken_log``; ``cause`` is
    one of ``CAUSES``, ``evidence`` the first step whose logged loss is not finite."""
    from .model import course_seed

    base = 1000 + 8 * course_seed()
    return check_diagnosis(
        "diagnose_log", fn, broken_log, seeds=range(base, base + 8),
        misconceptions={
            ("truncated_examples", "clogged_packer"): "isolated empty steps come back; here the targets "
            "never "
            "return and `consumed` stops moving: the buffer is clogged.",
            ("clogged_packer", "truncated_examples"): "a clogged buffer never recovers; here later steps "
            "carry "
            "targets again and `consumed` keeps growing.",
            ("clogged_packer", "mask_multiplication"): "look at `targets` after the first NaN: the data is "
            "full again, yet the loss stays NaN — the weights are NaN, not the batches empty.",
            ("learning_rate", "mask_multiplication"): "the first NaN step had no target at all and the norm "
            "was NaN at once, with no climb before it: 0/0 in the loss, not a divergence.",
            ("mask_multiplication", "learning_rate"): "every step had targets; the norm grew by orders of "
            "magnitude before the NaN: a divergence (lesson 06).",
            ("truncated_examples", "mask_multiplication"): "after the empty step the targets are back but "
            "the "
            "loss never is: the weights were poisoned (NaN gradients), not just one batch empty.",
        },
        hint=Hints(question="After the first non-finite step, do the steps have targets again, does "
                            "`consumed` still move, and did the gradient norm climb before it?",
                   pointer="Compare section 4's clogged-packer table (targets 0 for good, consumed frozen), "
                           "section 2's multiplication-masked mean (NaN weights) and lesson 06's divergence "
                           "(norm climbs).",
                   answer="empty forever + frozen consumed -> clogged_packer; empty now and then -> "
                          "truncated_examples; one empty step, then NaN with targets -> mask_multiplication; "
                          "targets everywhere, norm climbing -> learning_rate. Evidence: first non-finite "
                          "step."))


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): prepare conversations so a best-fit packer can neither clog nor pack empty rows
# ------------------------------------------------------------------------------------------------


def _ex(n_prompt: int, n_answer: int, tag: str, rng: random.Random) -> dict:
    ids = [rng.randrange(3, 5000) for _ in range(n_prompt + n_answer)]  # distinct: outputs are traceable
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * n_prompt + ids[n_prompt:], "tag": tag}


def _packer_cases() -> list[Case]:
    rng = random.Random(7)
    cases = []
    for i, cap in enumerate((16, 24, 33)):
        pool = [_ex(rng.randint(2, cap // 2), rng.randint(1, cap // 3), "fits", rng) for _ in range(5)]
        pool += [_ex(cap + rng.randint(1, 9), rng.randint(1, 5), "prompt longer than a row", rng)]
        pool += [_ex(cap // 2, cap, "answer crosses the row end", rng)]
        pool += [_ex(cap - 1, 2, "prompt fills the row but one", rng)]
        pool += [_ex(rng.randint(1, 4), 0, "no answer at all", rng)]
        rng.shuffle(pool)
        cases.append(Case((pool, cap), (pool, cap), label=f"row of {cap} tokens, {len(pool)} conversations",
                          tag=str(i)))
    cases.append(Case(([], 8), ([], 8), label="no conversations", tag="empty"))
    return cases


def _compare_packer(got, case_args) -> str | None:
    examples, cap = case_args
    if not isinstance(got, list) or not all(isinstance(e, dict) and "input_ids" in e and "labels" in e
                                            for e in got):
        return f"expected a list of dicts with 'input_ids' and 'labels', got {type(got).__name__}"
    if any(len(e["input_ids"]) > cap or len(e["labels"]) != len(e["input_ids"]) for e in got):
        return f"a conversation longer than the row ({cap} tokens) is left: it would never leave the buffer"
    if not all(has_targets(e["labels"][1:]) for e in got):
        return "a conversation without a target is left: packed alone it makes a row with loss 0/0"
    j = 0  # each output must be a prefix of a distinct input, in order
    for e in got:
        ids = list(e["input_ids"])
        while j < len(examples) and list(examples[j]["input_ids"][:len(ids)]) != ids:
            j += 1
        if j == len(examples) or list(examples[j]["labels"][:len(e["labels"])]) != list(e["labels"]):
            return "an output is not a (cropped) copy of an input, in the input order"
        j += 1
    fits = [e for e in examples if len(e["input_ids"]) <= cap and has_targets(e["labels"][1:])]
    kept = [list(e["input_ids"]) for e in got]
    if any(list(e["input_ids"]) not in kept for e in fits):
        return "a conversation that fits a row and has a target was dropped or cut: it is training data"
    return None


def _diagnose_packer(got, case: Case) -> str | None:
    examples, cap = case.args
    if not isinstance(got, list):
        return None
    if any(len(e.get("input_ids", ())) > cap for e in got if isinstance(e, dict)):
        return ("the oversized conversations are still there: a best-fit buffer never pops them, so it "
                "clogs. "
                "Crop or drop what is longer than the row.")
    if any(isinstance(e, dict) and not has_targets(e.get("labels", [])[1:]) for e in got):
        return ("cropping alone is not the fix: a crop that ends before the answer keeps only the prompt, "
                "a row "
                "with no target. Check the labels after the crop.")
    if len(got) < len(examples) - 3:
        return "you dropped conversations that fit a row and still have a target: they are training data."
    return None


def check_prepare_for_packer(fn) -> object:
    """Checker: ``fn(examples, row_capacity) -> list`` leaves, in order, only conversations that fit a row
    (``len <= row_capacity``) and keep a target after the shift; a conversation that fits and has a
    target is kept unchanged. Cropping the oversized ones or dropping them are both correct."""
    cases = [Case(c.args, c.args, label=c.label, tag=c.tag) for c in _packer_cases()]
    return run_check("prepare_for_packer", fn, cases, compare=_compare_packer, diagnose=_diagnose_packer,
                     hint=Hints(question="Which conversations can a best-fit buffer never pop, and which "
                                         "rows "
                                         "would have a loss of 0/0 even after they fit?",
                                pointer="Section 6 packs with crop=True and shows batches without targets; "
                                        "has_targets() tells whether labels still carry loss.",
                                answer="for each example: cut ids and labels to row_capacity (or skip it if "
                                       "longer), then keep it only if has_targets(labels[1:])."))


# Every public function above checks its arguments by their conventional names (model, tokenizer,
# batch, steps, ...) before it runs: one what/why/fix message for the slips learners make most.
validate.check_module_arguments(globals())
