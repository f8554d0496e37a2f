"""Lesson 05 (truncation and the NaN micro-batch): fully masked examples, 0/0 losses, the starving packer.

When a prompt fills ``max_length``, right truncation removes the whole answer and every label is
``-100``. Such an example costs compute and teaches nothing; a micro-batch made only of them has a
mean loss of 0/0. What happens next depends on *how* the mean is written:

- ``builtin_mean_loss``: ``F.cross_entropy(reduction="mean")`` returns NaN, but its backward
  writes exactly 0 into ignored positions, so the gradients are 0 and the weights survive;
- ``handwritten_mean_loss``: ``(nll * mask).sum() / mask.sum()`` returns NaN *and* NaN gradients
  (d(s/0)/ds = inf, times the mask's 0 = NaN), and one AdamW step makes every weight NaN;
- ``clamped_mean_loss``: the fix, ``sum / count.clamp(min=1)``: 0 with zero gradients.

``bestfit_batches`` re-implements, in a few readable lines, the best-fit packer of nanochat's SFT
loop (``scripts/chat_sft.py``, ``sft_data_generator_bos_bestfit``): with conversations longer than a
row it starves until every row is padding (karpathy/nanochat issue 590, PR 811); ``crop=True`` is
the fix. ``train_with_loss`` is the loop that compares the fixes. Checkers for the two exercises
are at the bottom.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import random
import tempfile
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .checks import Case, run_check
from .data import IGNORE_INDEX, collate_right

# ------------------------------------------------------------------------------------------------
# Counting what truncation did
# ------------------------------------------------------------------------------------------------


def has_targets(labels: Sequence[int]) -> bool:
    """True when at least one label is not -100: the example carries loss (TRL's own test)."""
    return any(int(label) != IGNORE_INDEX for label in labels)


def truncation_report(examples: Sequence[dict], max_length: int) -> dict:
    """Counts for a list of ``tokenize_chat`` outputs truncated at ``max_length``.

    ``fully_masked``: examples with no target left; ``token_share_fully_masked``: their share of
    all tokens the model would process (they are exactly ``max_length`` long, the costliest rows).
    """
    _check_examples(examples)
    masked = [e for e in examples if not has_targets(e["labels"])]
    total = sum(len(e["input_ids"]) for e in examples)
    return {
        "examples": len(examples),
        "fully_masked": len(masked),
        "at_max_length": sum(len(e["input_ids"]) == max_length for e in examples),
        "token_share_fully_masked": sum(len(e["input_ids"]) for e in masked) / max(total, 1),
    }


def filter_fully_masked(examples: Sequence[dict]) -> list[dict]:
    """The examples that still carry loss, in order (the dataset-level fix; TRL does the same)."""
    _check_examples(examples)
    return [e for e in examples if has_targets(e["labels"])]


def batch_signal(batches: Sequence[dict]) -> list[dict]:
    """Per micro-batch: rows, rows with at least one target, and valid (shifted) target tokens."""
    out = []
    for b in batches:
        shifted = b["labels"][:, 1:] != IGNORE_INDEX  # the loss predicts labels[1:]
        out.append({"rows": int(b["labels"].shape[0]), "rows_with_targets": int(shifted.any(1).sum()),
                    "valid_tokens": int(shifted.sum())})
    return out


def fully_masked_batch_rate(masked_flags: Sequence[bool], batch_size: int, *, shuffles: int = 200,
                            seed: int = 0) -> dict:
    """Measured on the dataset: how often a shuffled epoch cut into ``batch_size`` micro-batches
    yields a micro-batch whose rows are *all* fully masked.

    Returns ``per_batch`` (fraction of micro-batches) and ``per_epoch`` (fraction of epochs with at
    least one such micro-batch): small GPUs run small micro-batches, and hit it every epoch.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer — it is the number of "
                         "rows per micro-batch — pass e.g. batch_size=2.")
    flags = [bool(f) for f in masked_flags]
    if not flags:
        raise ValueError("masked_flags is empty — the rate is measured on a dataset — pass one flag "
                         "per example, e.g. [not has_targets(e['labels']) for e in examples].")
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
# Three ways to write the mean cross-entropy
# ------------------------------------------------------------------------------------------------


def _shifted(logits: torch.Tensor, labels: torch.Tensor):
    """Logits at t predict the label at t+1: drop the last logit and the first label."""
    return logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten()


def builtin_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy(reduction="mean")``: NaN when no target, yet zero gradients."""
    flat_logits, flat_labels = _shifted(logits, labels)
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX)


def _nll_and_mask(logits: torch.Tensor, labels: torch.Tensor):
    flat_logits, flat_labels = _shifted(logits, labels)
    mask = flat_labels != IGNORE_INDEX
    # clamp(min=0) only makes -100 a legal index for gather; the mask zeroes those terms anyway
    logp = flat_logits.log_softmax(-1).gather(-1, flat_labels.clamp(min=0)[:, None])[:, 0]
    return -logp, mask


def handwritten_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The masked mean as many loops write it: ``(nll * mask).sum() / mask.sum()``.

    With no target: 0/0 = NaN, and the backward multiplies 1/0 = inf by the mask's zeros: NaN grads.
    """
    nll, mask = _nll_and_mask(logits, labels)
    return (nll * mask).sum() / mask.sum()


def clamped_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The fix: divide by ``count.clamp(min=1)``. Same value as the mean where targets exist; an
    all-masked micro-batch gives 0 with zero gradients (it contributes nothing, as it should)."""
    nll, mask = _nll_and_mask(logits, labels)
    return (nll * mask).sum() / mask.sum().clamp(min=1)


LOSSES: dict[str, Callable] = {"builtin": builtin_mean_loss, "handwritten": handwritten_mean_loss,
                               "clamped": clamped_mean_loss}


def _loss_fn(loss) -> Callable:
    if callable(loss):
        return loss
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not one of {sorted(LOSSES)} or a function — the lesson "
                         "compares these three masked means — pass e.g. loss='clamped'.")
    return LOSSES[loss]


def all_finite(model) -> bool:
    """True when every parameter of ``model`` is finite (no NaN, no inf)."""
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def one_step(model, batch: dict, loss="builtin", lr: float = 1e-3) -> dict:
    """One forward/backward/AdamW step on a *copy* of ``model``; what the step did to it.

    Returns ``loss``, ``grad_norm``, ``grads_finite``, ``nan_grad_tensors`` (of ``n_tensors``),
    ``weights_finite`` after the step, and ``model`` (the stepped copy).
    """
    model = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
    value = _loss_fn(loss)(logits, batch["labels"])
    value.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    record = {"loss": value.item(), "grad_norm": float(torch.nn.utils.get_total_norm(grads)),
              "grads_finite": all(bool(torch.isfinite(g).all()) for g in grads),
              "nan_grad_tensors": sum(bool(torch.isnan(g).any()) for g in grads), "n_tensors": len(grads)}
    opt.step()
    record.update(weights_finite=all_finite(model), model=model.eval())
    return record


def running_mean(values: Sequence[float]) -> list[float]:
    """The running average a logger shows: one NaN in the sum and every later value is NaN."""
    out, total = [], 0.0
    for i, v in enumerate(values, 1):
        total += v
        out.append(total / i)
    return out


# ------------------------------------------------------------------------------------------------
# The loop that compares the fixes
# ------------------------------------------------------------------------------------------------


def train_with_loss(model, micro_batches: Sequence[dict], *, steps: int, accum_steps: int = 1,
                    loss="builtin", skip_empty: bool = False, lr: float = 3e-3) -> list[dict]:
    """Train ``model`` in place with one of the masked means; one record per optimizer step.

    ``skip_empty=True`` is the guard: a micro-batch without targets is not run at all. Records:
    ``step``, ``loss`` (mean of the micro-batch losses, as a logger shows it; NaN if any was NaN),
    ``n_tokens``, ``skipped`` micro-batches, ``weights_finite``.
    """
    if not micro_batches:
        raise ValueError("micro_batches is empty — the loop cycles through them — build them with "
                         "data.make_batches() or data.collate_right().")
    loss_fn = _loss_fn(loss)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    records, cursor = [], 0
    for step in range(1, steps + 1):
        losses, skipped, n_tokens = [], 0, 0
        for _ in range(accum_steps):
            batch = micro_batches[cursor % len(micro_batches)]
            cursor += 1
            n = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            n_tokens += n
            if skip_empty and n == 0:
                skipped += 1  # the guard: no targets, so no forward, no backward, no NaN
                continue
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            value = loss_fn(logits, batch["labels"])
            (value / accum_steps).backward()  # each .backward() adds to .grad
            losses.append(value.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
        records.append({"step": step, "loss": sum(losses) / len(losses) if losses else float("nan"),
                        "n_tokens": n_tokens, "skipped": skipped, "weights_finite": all_finite(model)})
    model.eval()
    return records


@torch.no_grad()
def eval_loss(model, batches: Sequence[dict]) -> float:
    """Token-weighted cross-entropy over ``batches`` (NaN if the model's weights are NaN)."""
    total, count = 0.0, 0
    for b in batches:
        flat_logits, flat_labels = _shifted(model(input_ids=b["input_ids"],
                                                  attention_mask=b["attention_mask"]).logits, b["labels"])
        total += float(F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum"))
        count += int((flat_labels != IGNORE_INDEX).sum())
    return total / count if count else float("nan")


# ------------------------------------------------------------------------------------------------
# nanochat-style best-fit packing, and how it starves
# ------------------------------------------------------------------------------------------------


def bestfit_batches(examples: Sequence[dict], *, row_capacity: int, rows: int, n_batches: int,
                    pad_id: int, buffer_size: int = 8, crop: bool = False,
                    drop_untrainable: bool = False) -> list[dict]:
    """Pack conversations into ``rows`` x ``row_capacity`` batches, best fit first, padding (never
    cropping) a row when nothing in the buffer fits, as nanochat's ``sft_data_generator_bos_bestfit``
    does. ``crop=True`` crops each conversation to ``row_capacity`` when it enters the buffer, so
    everything in it fits an empty row; ``drop_untrainable=True`` also skips a conversation left with
    no target (a crop can keep only the prompt, which would pack into a fully masked row).

    Each batch also has ``consumed``: conversations taken from the dataset so far (it freezes when
    the buffer is clogged). Rows are plain concatenations: fine for a loss count, not for training
    without reset position ids (lesson 04).
    """
    if not examples or row_capacity < 2 or rows < 1 or buffer_size < 1:
        raise ValueError("bestfit_batches needs examples, row_capacity >= 2, rows >= 1, buffer_size >= 1 "
                         "— they define the rows to fill — pass e.g. row_capacity=128, rows=2.")
    cut = row_capacity if crop else None
    if drop_untrainable and not any(has_targets(e["labels"][:cut]) for e in examples):
        raise ValueError("drop_untrainable=True but no example keeps a target — the buffer could never "
                         "refill — raise row_capacity or check the labels.")
    buffer, cursor, batches = [], 0, []
    for _ in range(n_batches):
        ids_rows, label_rows = [], []
        for _ in range(rows):
            while len(buffer) < buffer_size:  # refill: nanochat appends every conversation, even huge ones
                e = examples[cursor % len(examples)]
                cursor += 1
                if drop_untrainable and not has_targets(e["labels"][:cut]):
                    continue
                buffer.append((list(e["input_ids"][:cut]), list(e["labels"][:cut])))
            ids, labels = [], []
            while True:
                room = row_capacity - len(ids)
                fitting = [i for i, (c, _) in enumerate(buffer) if len(c) <= room]
                if not fitting:  # nothing fits: pad the rest; oversized ones stay in the buffer forever
                    break
                c, lab = buffer.pop(max(fitting, key=lambda i: len(buffer[i][0])))  # best fit = largest
                ids += c
                labels += lab
            pad = row_capacity - len(ids)
            ids_rows.append(ids + [pad_id] * pad)
            label_rows.append(labels + [IGNORE_INDEX] * pad)
        input_ids = torch.tensor(ids_rows)
        batches.append({"input_ids": input_ids, "labels": torch.tensor(label_rows),
                        "attention_mask": torch.ones_like(input_ids), "consumed": cursor - len(buffer)})
    return batches


# ------------------------------------------------------------------------------------------------
# What the libraries do: TRL's drop, the Trainer's NaN log filter
# ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet():
    """Silence the Trainer's printed log dicts and library banners; the lesson reads the records."""
    import datasets
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        transformers.logging.set_verbosity(level)
        datasets.enable_progress_bars()


def trl_kept_examples(model, tokenizer, dataset, max_length: int) -> list[dict]:
    """The training rows TRL's ``SFTTrainer`` keeps with ``assistant_only_loss=True`` and
    ``max_length``: after truncation it drops "fully masked examples" (``sft_trainer.py``).

    The trainer gets a copy: TRL 1.16 replaces ``model.forward`` with a fused-loss forward
    (``add_fused_lm_head``), and a later ``copy.deepcopy`` of that model still trains the original.
    """
    from .train import make_sft_trainer

    with _quiet():
        trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, dataset, max_length=max_length,
                                   assistant_only_loss=True)
    return [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in trainer.train_dataset]


def trainer_logged_losses(model, tokenizer, examples: Sequence[dict], *, nan_inf_filter: bool,
                          steps: int, batch_size: int = 1, lr: float = 1e-3) -> dict:
    """Train a copy of ``model`` with the plain transformers ``Trainer`` on hand-made rows (TRL would
    drop the fully masked ones) and return what it logged: ``logged`` (loss per step),
    ``train_loss``, ``grad_norms`` and ``weights_finite``."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    model = copy.deepcopy(model)
    rows = Dataset.from_list([{k: list(e[k]) for k in ("input_ids", "labels", "attention_mask")}
                              for e in examples])
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="sft-lab-"), max_steps=steps,
                             per_device_train_batch_size=batch_size, learning_rate=lr,
                             lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to="none", use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
                             seed=0, remove_unused_columns=False, logging_nan_inf_filter=nan_inf_filter)
    with _quiet():
        trainer = Trainer(model=model, args=args, train_dataset=rows,
                          data_collator=lambda f: collate_right(f, tokenizer.pad_token_id))
        result = trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    return {"logged": [h["loss"] for h in history], "grad_norms": [h["grad_norm"] for h in history],
            "train_loss": result.training_loss, "weights_finite": all_finite(model)}


# ------------------------------------------------------------------------------------------------
# Exercise 1: filter fully masked examples
# ------------------------------------------------------------------------------------------------


def _check_examples(examples) -> None:
    if not isinstance(examples, Sequence) or not all(isinstance(e, dict) and "labels" in e for e in examples):
        raise ValueError("examples must be a list of dicts with a 'labels' list — the check reads the "
                         "labels — pass tokenize_chat() outputs.")


def _ex(labels: list[int], tag: str) -> dict:
    return {"input_ids": [7] * len(labels), "labels": labels, "tag": tag}


def _filter_cases() -> list[Case]:
    m = IGNORE_INDEX
    keep_a = _ex([m, m, m, 41, 2, 9], "answer at the end")
    gone = _ex([m] * 6, "prompt filled max_length")
    keep_b = _ex([m, m, 17, m, m, m], "one target, then padding")  # last label -100, still trained
    long_ok = _ex([m] * 5 + [5, 6, 7], "long but with targets")
    first_only = _ex([12, m, m, m], "target in the first position")
    return [
        Case(([keep_a, gone, keep_b],), [keep_a, keep_b], label="mixed"),
        Case(([gone, _ex([m, m], "short, no answer")],), [], label="nothing left"),
        Case(([long_ok, keep_a, first_only],), [long_ok, keep_a, first_only], label="all carry loss"),
        Case(([],), [], label="empty list"),
    ]


def _tags(items) -> list:
    return [e.get("tag") if isinstance(e, dict) else e for e in items] if isinstance(items, list) else items


def _diagnose_filter(got, case: Case):
    examples = case.args[0]
    if not isinstance(got, list):
        return "return a list of the kept example dicts (not a generator, count or dataset)."
    masked = [e for e in examples if not has_targets(e["labels"])]
    if masked and _tags(got) == _tags(masked):
        return "inverted: you kept the fully masked examples; keep those with a label != -100."
    if _tags(got) == _tags([e for e in examples if e["labels"] and e["labels"][-1] != IGNORE_INDEX]):
        return ("you looked at the last label only; padding or a later prompt turn can end an example that "
                "still has targets. Test every label: any(label != -100 ...).")
    longest = max((len(e["labels"]) for e in examples), default=0)
    if _tags(got) == _tags([e for e in examples if len(e["labels"]) < longest]):
        return "you dropped examples by length; a long example can keep its answer. Test the labels."
    return None


def check_filter_fully_masked(fn):
    """Checker: ``fn(examples) -> list`` keeps, in order, the examples with at least one label != -100."""
    return run_check("filter_fully_masked", fn, _filter_cases(), diagnose=_diagnose_filter,
                     compare=lambda got, exp: None if isinstance(got, list) and _tags(got) == _tags(exp)
                     else f"expected the examples {_tags(exp)}, got {_tags(got)!r:.200}",
                     hint="keep an example when any of its labels is not -100; keep the order.")


# ------------------------------------------------------------------------------------------------
# Exercise 2: a masked mean that never returns NaN
# ------------------------------------------------------------------------------------------------


def _loss_cases(seed: int = 5) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    cases = []
    for shape, p_target, label in (((2, 5), 0.5, "some targets"), ((3, 4), 1.0, "every position a target"),
                                   ((2, 6), 0.0, "no target at all (the NaN micro-batch)"),
                                   ((1, 3), 0.0, "one row, no target")):
        logits = torch.randn(*shape, 11, generator=g)
        labels = torch.randint(0, 11, shape, generator=g)
        labels[torch.rand(shape, generator=g) >= p_target] = IGNORE_INDEX
        if p_target == 0.5:
            labels[0, 0] = 3  # at least one target
        ref_logits = logits.clone().requires_grad_(True)
        ref = clamped_mean_reference(ref_logits, labels)
        ref.backward()
        logits.requires_grad_(True)
        expected = {"value": float(ref.detach()), "grad": ref_logits.grad, "logits": logits}
        cases.append(Case((logits, labels), expected, label=label))
    return cases


def clamped_mean_reference(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The exercise's reference: mean cross-entropy over labels != -100 of *aligned* (already
    shifted) ``logits (..., V)`` and ``labels (...)``; 0 with zero gradient when there is no target."""
    flat_logits, flat_labels = logits.flatten(0, -2).float(), labels.flatten()
    summed = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return summed / (flat_labels != IGNORE_INDEX).sum().clamp(min=1)


def _compare_loss(got, exp) -> str | None:
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        return f"expected a scalar torch.Tensor, got {type(got).__name__}"
    value = float(got.detach())
    if not math.isfinite(value):
        return f"your loss is {value}, not a number"
    if not math.isclose(value, exp["value"], rel_tol=1e-4, abs_tol=1e-6):
        return f"expected {exp['value']:.6g}, got {value:.6g}"
    if not got.requires_grad:
        return "your loss has no gradient: backward() would raise, and training would stop"
    exp["logits"].grad = None
    got.backward()
    grad = exp["logits"].grad
    if grad is None or not torch.isfinite(grad).all():
        return "the value is right but the gradient is NaN"
    if not torch.allclose(grad, exp["grad"], rtol=1e-4, atol=1e-6):
        return f"gradient differs from the reference by {float((grad - exp['grad']).abs().max()):.3g}"
    return None


def _diagnose_loss(got, case: Case):
    logits, labels = case.args
    n = int((labels != IGNORE_INDEX).sum())
    if not isinstance(got, torch.Tensor):
        return None
    if n == 0 and not got.requires_grad:
        return ("a fresh torch.tensor(0.0) has no grad_fn, so loss.backward() raises. Build the zero from "
                "the logits (a clamped division does it for you).")
    nan_grad = logits.grad is not None and not torch.isfinite(logits.grad).all()
    if n == 0 and torch.isfinite(got).all() and nan_grad:
        return ("nan_to_num / torch.where AFTER the division fixes the value, not the gradient: the backward "
                "still multiplies 1/0 = inf by 0. Clamp the count before dividing: count.clamp(min=1).")
    if n == 0 and not torch.isfinite(got).all():
        return "0 targets: you divided by a count of zero. Divide by count.clamp(min=1)."
    summed = F.cross_entropy(logits.detach().flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX,
                             reduction="sum")
    value = float(got.detach())
    if n and math.isclose(value, float(summed), rel_tol=1e-4):
        return "you returned the sum; divide by the number of valid targets."
    if n and math.isclose(value, float(summed) / labels.numel(), rel_tol=1e-4):
        return "you divided by every position, -100 ones included; count only labels != -100."
    return None


def check_safe_masked_loss(fn):
    """Checker: ``fn(logits, labels)`` = mean CE over labels != -100, 0 (with a zero, finite gradient)
    when there is no target; matches ``F.cross_entropy`` wherever targets exist."""
    return run_check("safe_masked_loss", fn, _loss_cases(), compare=_compare_loss, diagnose=_diagnose_loss,
                     hint="sum the per-token losses of the valid targets, divide by their count clamped to "
                          ">= 1: F.cross_entropy(..., reduction='sum') / n.clamp(min=1).")
