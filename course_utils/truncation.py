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
(``NormalisedMomentum``) and what TRL and the ``Trainer`` do. "A target" is the course's one rule,
``data.graded``: a label after the one-token shift that is not -100. The two exercises are graded in
``course_utils.exercises.lesson05``.
"""

from __future__ import annotations

import copy
import math
import random
import tempfile
from collections.abc import Sequence

import torch

from . import internals, validate
from .data import IGNORE_INDEX, collate_right, graded, is_graded, n_graded
from .losses import mean_ignore_index, model_logits, params_finite
from .model import course_seed
from .quiet import quiet_libraries
from .training import logged, make_sft_trainer
from .viz import figure, what_if

# ------------------------------------------------------------------------------------------------
# Counting what truncation did, and choosing lengths from the data
# ------------------------------------------------------------------------------------------------


def has_targets(labels: Sequence[int]) -> bool:
    """True when the example carries loss: at least one label after the one-token shift is not -100
    (``data.graded``; TRL drops the examples where this is False as "fully masked")."""
    if getattr(labels, "ndim", 1) != 1:
        raise ValueError(f"labels has {labels.ndim} dimensions — has_targets reads one example's labels — "
                         "pass example['labels'] (for a batch: n_graded(batch['labels']) or batch_signal).")
    return n_graded(validate.token_ids("labels", labels, labels=True)) > 0


def _check_example(e, name: str) -> dict:
    """One tokenized example, checked and copied as lists of ints (``input_ids`` and ``labels`` of one
    length)."""
    if not isinstance(e, dict) or "input_ids" not in e or "labels" not in e:
        got = f"a list of {len(e)}" if isinstance(e, (list, tuple)) else type(e).__name__
        raise ValueError(f"{name} must be a dict with 'input_ids' and 'labels', got {got} — the helper reads "
                         "both — pass one tokenize_chat() output (e.g. examples[0]).")
    ids = validate.token_ids(f"{name}['input_ids']", e["input_ids"])
    labels = validate.token_ids(f"{name}['labels']", e["labels"], labels=True)
    if len(ids) != len(labels):
        raise ValueError(f"{name} has {len(ids)} input_ids but {len(labels)} labels — each label belongs to "
                         "one token, so the counts would mix up positions — cut ids and labels with the same "
                         "slice (or tokenize again).")
    return {"input_ids": ids, "labels": labels}


def _check_examples(examples, name: str = "examples") -> list[dict]:
    """Tokenized examples checked and copied as lists of ints (``_check_example`` for each)."""
    if isinstance(examples, dict):
        raise TypeError(f"{name} is one dict, not a list of examples — the helper goes example by example — "
                        f"pass a list of tokenize_chat() outputs ([example] for one).")
    if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
        raise TypeError(f"{name} must be a list of tokenize_chat() outputs, got "
                        f"{type(examples).__name__} — the helper reads their input_ids and labels — pass "
                        "e.g. [tokenize_chat(tok, m) for m in conversations].")
    if not examples:
        raise ValueError(f"{name} is empty — there is nothing to count or train on — pass at least one "
                         "tokenize_chat() output.")
    return [_check_example(e, f"{name}[{i}]") for i, e in enumerate(examples)]


def answer_start(example: dict) -> int:
    """Position of the first label that is not -100: how many tokens of prompt come before the answer.
    Right truncation at ``max_length <= answer_start`` leaves the example with no target at all."""
    example = _check_example(example, "example")
    # a position in the row, not a shifted target: this is where the answer begins (it is never column 0)
    for i, label in enumerate(example["labels"]):
        if is_graded(label):
            return i
    raise ValueError("answer_start: this example has no target at all — there is no answer to locate — "
                     "pass the untruncated tokenize_chat() output.")


def percentile(values: Sequence[float], q: float) -> int:
    """The ``q``-th percentile (0-100, nearest rank) of ``values``, as an int: lengths come from the data.
    ``q=0.85`` is refused: it is a percentage, pass ``q=85``."""
    validate.non_empty("values", values, what="lengths", fix="pass e.g. [len(e['input_ids']) for e in ...].")
    q = validate.percentage("q", q, why="it is a percentile, 0 to 100")
    for v in values:
        validate.number("values item", v, why="each is a length")
    ordered = sorted(values)
    return int(ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))])


def truncation_report(examples: Sequence[dict], max_length: int) -> dict:
    """Counts for a list of ``tokenize_chat`` outputs truncated at ``max_length``.

    ``fully_masked``: examples with no target left; ``token_share_fully_masked``: their share of
    all tokens the model would process (they are exactly ``max_length`` long, the costliest rows).
    """
    examples = _check_examples(examples)
    validate.positive_int("max_length", max_length, why="it is the truncation length")
    longest = max(len(e["input_ids"]) for e in examples)
    if longest > max_length:
        raise ValueError(f"an example has {longest} tokens, more than max_length={max_length} — the report "
                         "counts examples already truncated at max_length — pass tokenize_chat(..., "
                         "max_length=max_length) outputs (or truncated(e, max_length)).")
    masked = [e for e in examples if n_graded(e["labels"]) == 0]
    total = sum(len(e["input_ids"]) for e in examples)
    return {
        "examples": len(examples),
        "fully_masked": len(masked),
        "at_max_length": sum(len(e["input_ids"]) == max_length for e in examples),
        "token_share_fully_masked": sum(len(e["input_ids"]) for e in masked) / max(total, 1),
    }


MODES = ("keep_start", "keep_end")


_CUT_WHY = "it is the truncation length"
_MODE_WHY = "TRL knows these two truncation modes"


def truncated(example: dict, max_length: int, mode: str = "keep_start") -> dict:
    """``example`` cut to ``max_length`` tokens: ``"keep_start"`` keeps the first ones (TRL's default,
    the answer goes first), ``"keep_end"`` the last ones (TRL's ``truncation_mode="keep_end"``)."""
    validate.positive_int("max_length", max_length, why=_CUT_WHY)
    validate.choice("mode", mode, MODES, why=_MODE_WHY)
    return _truncated(_check_example(example, "example"), max_length, mode)


def _truncated(example: dict, max_length: int, mode: str) -> dict:
    cut = slice(None, max_length) if mode == "keep_start" else slice(-max_length, None)
    return {"input_ids": list(example["input_ids"])[cut], "labels": list(example["labels"])[cut]}


def kept_by_policy(full_examples: Sequence[dict], max_length: int, mode: str = "keep_start") -> dict:
    """What a truncation policy keeps of untruncated examples, after TRL's drop of fully masked ones:
    ``examples`` kept and ``graded_tokens`` (targets, ``data.graded``) kept, and the totals before it."""
    full_examples = _check_examples(full_examples, "full_examples")
    validate.positive_int("max_length", max_length, why=_CUT_WHY)
    validate.choice("mode", mode, MODES, why=_MODE_WHY)
    return _kept_by_policy(full_examples, max_length, mode)


def _kept_by_policy(full_examples: list[dict], max_length: int, mode: str) -> dict:
    cut = [_truncated(e, max_length, mode) for e in full_examples]
    kept = [e for e in cut if n_graded(e["labels"]) > 0]
    return {"examples": len(kept), "of_examples": len(full_examples),
            "graded_tokens": sum(n_graded(e["labels"]) for e in kept),
            "of_graded_tokens": sum(n_graded(e["labels"]) for e in full_examples),
            "longest_row": max((len(e["input_ids"]) for e in kept), default=0)}


def batch_signal(batches: Sequence[dict]) -> list[dict]:
    """Per micro-batch: rows, rows with at least one target, and valid (shifted) target tokens."""
    validate.batches("batches", batches, need=("labels",))
    out = []
    for b in batches:
        targets = graded(b["labels"])
        out.append({"rows": int(b["labels"].shape[0]), "rows_with_targets": int(targets.any(1).sum()),
                    "valid_tokens": int(targets.sum())})
    return out


def _flag(value) -> bool:
    """One masked flag: True/False (or 0/1, a numpy or 0-d torch bool); anything else is refused."""
    if getattr(value, "ndim", 0) == 0 and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"masked_flags holds {value!r} ({type(value).__name__}), not True/False — one flag per "
                    "example says whether it is fully masked — pass e.g. [not has_targets(e['labels']) for e "
                    "in examples].")


def fully_masked_batch_rate(masked_flags: Sequence[bool], batch_size: int, *, shuffles: int = 200,
                            seed: int = 0) -> dict:
    """Measured on the dataset: how often a shuffled epoch cut into ``batch_size`` micro-batches
    yields a micro-batch whose rows are *all* fully masked (the right-truncation mechanism).

    Returns ``per_batch`` (fraction of micro-batches) and ``per_epoch`` (fraction of epochs with at
    least one such micro-batch): small GPUs run small micro-batches, and hit it every epoch.
    """
    validate.positive_int("batch_size", batch_size, why="it is the number of rows per micro-batch")
    validate.positive_int("shuffles", shuffles, why="it is the number of shuffled epochs measured")
    validate.seed("seed", seed)
    flags = [_flag(f) for f in validate.non_empty(
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
    """Supervised tokens (``data.graded``: ``labels[1:] != -100``) in each micro-batch of ``batch_size``
    consecutive examples, in order; the last micro-batch may be short. A 0 is a micro-batch whose
    ``ignore_index`` mean is 0/0: its loss is logged as NaN."""
    examples = _check_examples(examples)
    validate.positive_int("batch_size", batch_size, why="it is the number of rows per micro-batch")
    return _targets_per_micro_batch(examples, batch_size)


def _targets_per_micro_batch(examples: list[dict], batch_size: int) -> list[int]:
    return [sum(n_graded(e["labels"]) for e in examples[i: i + batch_size])
            for i in range(0, len(examples), batch_size)]


def truncation_frame(full_examples: Sequence[dict], max_length: int, mode: str, batch_size: int,
                     *, note: str = ""):
    """One explorer frame: ``full_examples`` cut at ``max_length`` from ``mode``'s side, then taken in order
    ``batch_size`` rows at a time, as a plain loop (no TRL drop) would. Returns ``(text, figure)``: rows
    left without a target, supervised tokens kept, micro-batches whose loss is NaN, and the targets per
    micro-batch with the empty ones marked."""
    full_examples = _check_examples(full_examples, "full_examples")
    validate.positive_int("max_length", max_length, why=_CUT_WHY)
    validate.choice("mode", mode, MODES, why=_MODE_WHY)
    validate.positive_int("batch_size", batch_size, why="it is the number of rows per micro-batch")
    if not isinstance(note, str):
        raise TypeError(f"note={note!r} must be a string — it is printed after max_length — pass e.g. "
                        "note=' (p85 of answer starts)'.")
    return _truncation_frame(full_examples, max_length, mode, batch_size, note)


def _truncation_frame(full_examples: list[dict], max_length: int, mode: str, batch_size: int, note: str):
    cut = [_truncated(e, max_length, mode) for e in full_examples]
    policy = _kept_by_policy(full_examples, max_length, mode)
    per_batch = _targets_per_micro_batch(cut, batch_size)
    empty = [i for i, n in enumerate(per_batch, 1) if n == 0]
    masked = len(cut) - policy["examples"]
    p = masked / len(cut)
    prompt_cut = sum(len(e["input_ids"]) - len(c["input_ids"]) for e, c in zip(full_examples, cut))
    share = policy["graded_tokens"] / max(policy["of_graded_tokens"], 1)
    shown = ", ".join(f"#{i}" for i in empty[:8]) + (" …" if len(empty) > 8 else "")
    side = "end (answers first)" if mode == "keep_start" else "start (the prompt's opening first)"
    text = "\n".join([
        f"max_length {max_length}{note}, {mode}, device batch size {batch_size}:",
        f"  rows left with no target: {masked} / {len(cut)} (p = {p:.3f})"
        + ("; TRL drops them, a plain loop spends a row on nothing" if masked else ""),
        f"  supervised tokens kept: {policy['graded_tokens']} / {policy['of_graded_tokens']} ({share:.0%}); "
        f"tokens cut from the {side}: {prompt_cut}",
        f"  micro-batches with no target (loss NaN): {len(empty)} of {len(per_batch)}"
        + (f" — {shown}" if empty else ""),
        f"  (rows in random order: expect p^b × {len(per_batch)} = {p ** batch_size * len(per_batch):.2f})",
    ])
    untruncated = _targets_per_micro_batch(full_examples, batch_size)
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
    full_examples = _check_examples(full_examples, "full_examples")
    percentiles = validate.non_empty("percentiles", percentiles, what="percentiles",
                                     fix="pass e.g. (50, 85, 95).")
    for q in percentiles:
        validate.percentage("percentiles item", q, why="each is a percentile, 0 to 100")
    validate.non_empty("batch_sizes", batch_sizes, what="batch sizes", fix="pass e.g. (1, 4).")
    sizes = sorted({validate.positive_int("batch_sizes", b, why="each is rows per micro-batch")
                    for b in batch_sizes})
    if start is not None:
        if not isinstance(start, dict):
            raise TypeError(f"start={start!r} must be a dict of starting values — one per control — pass "
                            "e.g. {'max_length': MAX_LENGTH, 'mode': 'keep_start', 'batch_size': 1}.")
        for name in start:
            validate.key("start key", name, ("max_length", "mode", "batch_size"),
                         where="the explorer's controls")
    starts = [answer_start(e) for e in full_examples]
    names = {}  # max_length -> where it comes from; a length two percentiles share keeps the first name
    for q in percentiles:
        names.setdefault(percentile(starts, q), f" (p{q:g} of answer starts)")
    names.setdefault(max(len(e["input_ids"]) for e in full_examples), " (the longest example)")
    lengths = sorted(names)
    return what_if(lambda max_length, mode, batch_size: _truncation_frame(
                       full_examples, max_length, mode, batch_size, names.get(max_length, "")),
                   {"max_length": lengths, "mode": list(MODES), "batch_size": sizes},
                   start=start, descriptions={"mode": "truncated side (keep)",
                                              "batch_size": "device batch size"})


# ------------------------------------------------------------------------------------------------
# One step, and what a logger shows
# ------------------------------------------------------------------------------------------------


def _check_model_batch(model, batch: dict) -> None:
    """A course model and a collated batch of ids it can embed."""
    validate.model("model", model)
    validate.batch("batch", batch)
    validate.ids_fit_model(model, batch["input_ids"])


def one_step(model, batch: dict, loss_fn, lr: float = 1e-3) -> dict:
    """One forward/backward/AdamW step of ``loss_fn(logits, labels)`` on a *copy* of ``model``.

    Returns ``loss``, ``grad_norm``, ``grads_finite``, ``nan_grad_tensors`` (of ``n_tensors``),
    ``weights_finite`` after the step, and ``model`` (the stepped copy).
    """
    _check_model_batch(model, batch)
    validate.function("loss_fn", loss_fn)
    validate.number("lr", lr, positive=True, why="it is the AdamW learning rate", example=1e-3)
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


def _losses(name: str, values) -> list[float]:
    """Logged losses: a non-empty list of real numbers (NaN and inf allowed: they are the point here)."""
    validate.non_empty(name, values, what="losses", fix="pass e.g. [r['loss'] for r in run].")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise TypeError(f"{name} holds {v!r} ({type(v).__name__}), not a number — the helper averages "
                            "losses — pass one float per step (NaN allowed).")
    return [float(v) for v in values]


def running_mean(values: Sequence[float]) -> list[float]:
    """The running average a logger shows: one NaN in the sum and every later value is NaN."""
    values = _losses("values", values)
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
    validate.fraction("beta", beta, why="it is the EMA decay, a share of the old average")
    if beta == 1:
        raise ValueError("beta=1 — the average would never move and nanochat's debiasing divides by "
                         "1 - beta**(step + 1) = 0 — pass beta < 1, e.g. 0.9 (nanochat's value).")
    losses = _losses("last_micro_batch_losses", last_micro_batch_losses)
    smooth, out = 0.0, []
    for step, loss in enumerate(losses, 1):
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
    return _render(_check_example(example, "example"), render_cap)


def _render(example: dict, render_cap: int) -> tuple[list[int], list[int]]:
    return list(example["input_ids"][:render_cap]), list(example["labels"][:render_cap])


MAX_BUFFER = 100_000  # nanochat's buffer holds 100 conversations; a million would take minutes to fill


def bestfit_rows(examples: Sequence[dict], *, row_capacity: int, n_rows: int, pad_id: int,
                 render_cap: int, buffer_size: int = 100, crop: bool = False,
                 drop_untrainable: bool = False) -> list[dict]:
    """Rows of ``row_capacity`` tokens packed as nanochat's ``sft_data_generator_bos_bestfit`` packs
    them: keep ``buffer_size`` rendered conversations in a buffer (refilled to full before each pick),
    put the largest one that fits the room left in the row, and when none fits pad the rest of the row
    — never crop. A conversation longer than a row therefore never leaves the buffer. The
    conversations are read in order and again from the start when they run out (epochs).

    Returns one dict per row: ``ids``, ``labels`` (-100 on padding), ``targets`` (supervised tokens
    after the shift, ``data.n_graded``) and ``consumed`` (conversations taken out of the buffer so far;
    it drives nanochat's progress, LR schedule and ``last_step``, and freezes when the buffer clogs).
    ``crop=True`` cuts each conversation to the row as it enters the buffer (nanochat PR 811's idea):
    the buffer cannot clog, but a crop can keep only the prompt, a row without a target;
    ``drop_untrainable=True`` also skips conversations left with no target (what the crop still needs).
    """
    examples = _check_examples(examples)
    empty = next((i for i, e in enumerate(examples) if not e["input_ids"]), None)
    if empty is not None:
        raise ValueError(f"examples[{empty}] has no tokens — it always fits the room left in a row and fills "
                         "none of it, so the packer would pick it forever — drop empty conversations first "
                         "(e.g. [e for e in examples if e['input_ids']]).")
    validate.integer("row_capacity", row_capacity, minimum=2, why="a row needs an input and a target")
    validate.positive_int("n_rows", n_rows, why="it is how many rows to pack")
    validate.positive_int("buffer_size", buffer_size, why="it is how many conversations the buffer holds")
    if buffer_size > MAX_BUFFER:
        raise ValueError(f"buffer_size={buffer_size} is above {MAX_BUFFER} — the buffer is refilled to full "
                         "before every pick, so a huge one takes minutes to fill and scan — pass nanochat's "
                         "buffer_size=100 (or a few hundred).")
    # only ids at hand: an id no vocabulary holds is refused (one of another vocabulary cannot be told apart)
    validate.vocab_id("pad_id", pad_id, why="it is the token id that fills the end of a row")
    validate.positive_int("render_cap", render_cap, why="it is the render length limit")
    validate.flag("crop", crop, why="it switches one step of the packer")
    validate.flag("drop_untrainable", drop_untrainable, why="it switches one step of the packer")
    cut = min(row_capacity, render_cap) if crop else render_cap
    pool = [(ids[:cut], labels[:cut]) for ids, labels in (_render(e, render_cap) for e in examples)]
    if drop_untrainable:
        pool = [(ids, labels) for ids, labels in pool if n_graded(labels) > 0]
        if not pool:
            raise ValueError("drop_untrainable=True but no conversation keeps a target after the cut — the "
                             "buffer could never refill — raise row_capacity or check the labels.")
    buffer, cursor, consumed, rows = [], 0, 0, []
    for _ in range(n_rows):
        ids, labels = [], []
        for _ in range(row_capacity):  # each pick adds at least one token: a row takes at most this many
            while len(buffer) < buffer_size:  # refill, as nanochat does, even with ones no row can hold
                buffer.append(pool[cursor % len(pool)])
                cursor += 1
            room = row_capacity - len(ids)
            fitting = [i for i, (c, _) in enumerate(buffer) if len(c) <= room]
            if not fitting:  # nothing fits: pad the rest of the row instead of cropping
                break
            best = max(fitting, key=lambda i: len(buffer[i][0]))  # first of the largest, as nanochat's `>`
            c, lab = buffer.pop(best)
            ids, labels, consumed = ids + c, labels + lab, consumed + 1
            if len(ids) == row_capacity:
                break
        pad = row_capacity - len(ids)
        labels = labels + [IGNORE_INDEX] * pad
        rows.append({"ids": ids + [pad_id] * pad, "labels": labels, "targets": n_graded(labels),
                     "consumed": consumed})
    return rows


def _check_rows(rows, *, keys: tuple[str, ...] = ("ids", "labels", "targets")) -> Sequence[dict]:
    if isinstance(rows, dict):
        raise TypeError("rows is one dict — the helper takes the list bestfit_rows() returns — pass the "
                        "list (or [row] for one).")
    validate.non_empty("rows", rows, what="packed rows", fix="pass rows from bestfit_rows().")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or any(k not in r for k in keys):
            raise ValueError(f"rows[{i}] is not a row of bestfit_rows() (a dict with {list(keys)}) — the "
                             "helper reads those keys — pass bestfit_rows(...)'s result.")
    return rows


def stack_rows(rows: Sequence[dict]) -> dict:
    """Rows of ``bestfit_rows`` as one micro-batch (``input_ids``, ``labels``, ``attention_mask``).
    Rows are plain concatenations, as nanochat's are (no per-document attention)."""
    _check_rows(rows)
    widths = {len(r["ids"]) for r in rows} | {len(r["labels"]) for r in rows}
    if len(widths) != 1:
        raise ValueError(f"rows have different lengths {sorted(widths)} — a micro-batch is one rectangle of "
                         "tokens — stack rows packed with the same row_capacity.")
    ids = torch.tensor([r["ids"] for r in rows])
    return {"input_ids": ids, "labels": torch.tensor([r["labels"] for r in rows]),
            "attention_mask": torch.ones_like(ids)}


def first_empty_row(rows: Sequence[dict]) -> int:
    """1-based index of the first row without a target; raises if every row carries one."""
    _check_rows(rows, keys=("targets",))
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
    _check_rows(rows, keys=("targets",))
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
        validate.number("lr", lr, positive=True, why="it sets the size of every update", example=1e-3)
        validate.fraction("momentum", momentum, why="it is the share of the old direction kept each step")
        if isinstance(params, (torch.Tensor, str, bytes)) or not hasattr(params, "__iter__"):
            raise TypeError(f"params is {type(params).__name__}, not an iterable of parameters — an "
                            "optimiser updates each of them — pass model.parameters() (or [tensor]).")
        params = list(params)
        if not params:
            raise ValueError("params is empty — the optimiser would have nothing to update — pass "
                             "model.parameters() of a model with trainable weights.")
        for i, param in enumerate(params):
            if not isinstance(param, (torch.Tensor, dict)):  # a dict is a parameter group
                raise TypeError(f"params[{i}] is {param!r:.40} ({type(param).__name__}), not a tensor — an "
                                "optimiser updates tensors in place — pass model.parameters() (or a list "
                                "of tensors).")
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
    validate.model("model", model)
    validate.choice("optimizer", optimizer, ("sgd", "adamw", "normalised"), why="the lesson compares these")
    validate.batches("warm_batches", warm_batches)
    validate.batch("empty_batch", empty_batch)
    for i, b in enumerate(warm_batches):
        validate.ids_fit_model(model, b["input_ids"], name=f"warm_batches[{i}]['input_ids']")
    validate.ids_fit_model(model, empty_batch["input_ids"], name="empty_batch['input_ids']")
    validate.number("lr", lr, positive=True, why="it is the optimiser's learning rate", example=1e-3)
    validate.integer("warm_steps", warm_steps, minimum=0, why="it counts steps on batches with targets")
    validate.positive_int("zero_steps", zero_steps, why="it counts the zero-gradient steps measured")
    if n_graded(empty_batch["labels"]) != 0:
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


def _check_model_examples(model, tokenizer, examples) -> list[dict]:
    """A model/tokenizer pair that fits, and tokenized examples whose ids the model can embed."""
    validate.model_and_tokenizer(model, tokenizer)
    examples = _check_examples(examples)
    validate.ids_fit_model(model, torch.tensor([t for e in examples for t in e["input_ids"]]),
                           name="examples' input_ids")
    return examples


# what a True/False switch of this module does (validate.flag says it when the value is not a bool)
_FLAG_WHY = "it switches one Trainer setting"


def trl_kept_examples(model, tokenizer, dataset, max_length: int,
                      truncation_mode: str = "keep_start", *, packing: bool = False) -> list[dict]:
    """The examples TRL's ``SFTTrainer`` trains with ``assistant_only_loss=True``, ``max_length``
    and ``truncation_mode``: without packing, after truncation it drops "fully masked examples"
    (``sft_trainer.py``). With ``packing=True`` (``bfd``, padding-free) TRL 1.16 runs no such drop: the
    packed rows are split back into their examples (``seq_lengths``), and fully masked ones are among them.

    The trainer gets a copy: TRL 1.16 replaces ``model.forward`` with a fused-loss forward.
    """
    validate.model_and_tokenizer(model, tokenizer)
    if not hasattr(dataset, "column_names") or len(dataset) == 0:
        raise ValueError(f"dataset must be a non-empty datasets.Dataset of conversations, got "
                         f"{type(dataset).__name__}{' (empty)' if hasattr(dataset, '__len__') else ''} — "
                         "SFTTrainer tokenizes, truncates and filters it — pass e.g. make_chat_dataset(...).")
    validate.positive_int("max_length", max_length, why="it is the truncation length")
    validate.choice("truncation_mode", truncation_mode, MODES, why="TRL knows these two truncation modes")
    validate.flag("packing", packing, why=_FLAG_WHY)
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, dataset, max_length=max_length,
                               assistant_only_loss=True, truncation_mode=truncation_mode, packing=packing,
                               progress=False)
    examples = []
    for row in trainer.train_dataset:
        start = 0
        for length in row.get("seq_lengths") or [len(row["input_ids"])]:  # a packed row: its examples
            examples.append({"input_ids": row["input_ids"][start:start + length],
                             "labels": row["labels"][start:start + length]})
            start += length
    return examples


def rows_without_targets(examples: Sequence[dict]) -> list[int]:
    """Indices of the examples whose labels are all ``-100``: the rows that make a silent 0.0 (a step of
    them only) or a NaN (a hand-written mean). Run it on what the trainer trains
    (``list(trainer.train_dataset)``, before ``train()``): with ``packing=True`` TRL keeps them."""
    examples = _check_examples(examples)
    return [i for i, e in enumerate(examples) if not has_targets(e["labels"])]


def cut_before_end_of_turn(examples: Sequence[dict], end_of_turn_id: int) -> list[int]:
    """Indices of the examples that still carry graded tokens but whose last graded answer holds no graded
    end-of-turn token: truncation cut the answer's end (or the template never graded it). Such a row trains
    the answer and never the stop after it — a cause of a model that does not stop (lesson 02) that the
    "drop fully masked rows" filter does not see, since the row keeps targets."""
    examples = _check_examples(examples)
    validate.vocab_id("end_of_turn_id", end_of_turn_id, fix="pass end_of_turn_id(tokenizer)")
    cut, graded_rows = [], 0
    for i, e in enumerate(examples):
        labels = list(e["labels"])
        graded_at = [j for j, label in enumerate(labels) if is_graded(label)]
        if not graded_at:
            continue  # fully masked: rows_without_targets' case
        graded_rows += 1
        start = graded_at[-1]
        while start > 0 and is_graded(labels[start - 1]):  # back to the start of the last graded run
            start -= 1
        if end_of_turn_id not in labels[start:graded_at[-1] + 1]:
            cut.append(i)
    if graded_rows and not any(end_of_turn_id in e["input_ids"] for e in examples):
        # a graded answer follows a prompt whose turns the template closed with this token
        raise ValueError(f"end_of_turn_id={end_of_turn_id} occurs in none of the examples' input_ids — a "
                         "chat row's prompt turns end with the template's end-of-turn token, so this is not "
                         "it (every row would read as cut) — pass end_of_turn_id(tokenizer) of the tokenizer "
                         "that made the rows.")
    return cut


def _rows_dataset(examples: list[dict]):
    # Deferred: `datasets` takes ~0.6 s to import on top of torch (measured with python -X importtime),
    # and only the two Trainer runs below need it.
    from datasets import Dataset

    return Dataset.from_list([{"input_ids": list(e["input_ids"]), "labels": list(e["labels"])}
                              for e in examples])


def trl_logged_on_pretokenised(model, tokenizer, examples: Sequence[dict], *, nan_inf_filter: bool = True,
                               lr: float = 1e-3, accum_steps: int = 1, logging_steps: int = 1) -> dict:
    """Train a copy of ``model`` with TRL's ``SFTTrainer`` on a *pre-tokenised* dataset (``input_ids`` and
    ``labels`` columns, ``max_length=None``): TRL skips its own truncation and its drop of fully masked
    rows, so they reach ``compute_loss``, which divides the summed loss by ``num_items_in_batch`` — the
    graded tokens of the whole optimizer step (every micro-batch; every rank), ``clamp(min=1)`` — for a model
    class that accepts loss kwargs (the course models; not Gemma 4 / Qwen2.5-VL / Qwen3-VL, lesson 07).

    One row per micro-batch, in order (no shuffle), ``accum_steps`` micro-batches per optimizer step.
    ``logging_steps``: the Trainer logs the mean loss of each window of that many steps (SFTConfig's
    default is 10; 1 logs every step). Returns ``logged`` (loss per logged window), ``grad_norms`` (the last
    step of each window), ``targets`` (supervised tokens per step, summed over its micro-batches) and
    ``weights_finite``."""
    examples = _check_model_examples(model, tokenizer, examples)
    validate.flag("nan_inf_filter", nan_inf_filter, why=_FLAG_WHY)
    validate.number("lr", lr, positive=True, why="it is the learning rate", example=1e-3)
    validate.positive_int("accum_steps", accum_steps, why="it is micro-batches per optimizer step")
    validate.positive_int("logging_steps", logging_steps, why="it is optimizer steps per logged value")
    if len(examples) % accum_steps:
        raise ValueError(f"{len(examples)} rows do not fill steps of accum_steps={accum_steps} — the last "
                         "step would wrap around to the first rows — pass a multiple of accum_steps rows.")
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, _rows_dataset(examples), max_length=None,
                               per_device_train_batch_size=1, gradient_accumulation_steps=accum_steps,
                               max_steps=len(examples) // accum_steps, learning_rate=lr,
                               logging_nan_inf_filter=nan_inf_filter, logging_steps=logging_steps,
                               progress=False)
    # library-private: the Trainer's sampler hook; a SequentialSampler keeps one row per step, in order
    internals.feed_in_order(trainer)
    trainer.train()
    per_row = [n_graded(e["labels"]) for e in examples]
    return {"logged": logged(trainer), "grad_norms": logged(trainer, "grad_norm"),
            "targets": [sum(per_row[i:i + accum_steps]) for i in range(0, len(per_row), accum_steps)],
            "weights_finite": params_finite(trainer.model)}


def trainer_logged_losses(model, tokenizer, examples: Sequence[dict], *, nan_inf_filter: bool,
                          steps: int, batch_size: int = 1, lr: float = 1e-3) -> dict:
    """Train a copy of ``model`` with the plain transformers ``Trainer`` on hand-made rows (TRL would
    drop the fully masked ones) and return what it logged: ``logged`` (loss per step),
    ``train_loss``, ``grad_norms`` and ``weights_finite``."""
    # Deferred: transformers' Trainer takes ~4.4 s to import on top of torch (measured with python -X
    # importtime); the rest of the lesson's helpers do not need it.
    from transformers import Trainer, TrainingArguments

    examples = _check_model_examples(model, tokenizer, examples)
    validate.flag("nan_inf_filter", nan_inf_filter, why=_FLAG_WHY)
    validate.positive_int("steps", steps, why="it counts optimizer steps")
    validate.positive_int("batch_size", batch_size, why="it is rows per step")
    validate.number("lr", lr, positive=True, why="it is the learning rate", example=1e-3)
    pad = validate.integer("tokenizer.pad_token_id", tokenizer.pad_token_id, minimum=0,
                           why="the collate pads rows with it (set tok.pad_token if it is None)")
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
                          data_collator=lambda f: collate_right(f, pad))
        result = trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    return {"logged": [h["loss"] for h in history], "grad_norms": [h["grad_norm"] for h in history],
            "train_loss": result.training_loss, "weights_finite": params_finite(model)}
