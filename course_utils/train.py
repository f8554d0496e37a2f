"""One short, instrumented training loop, and a CPU-friendly TRL ``SFTTrainer``.

``train`` is the loop the lessons break on purpose: explicit micro-batches, gradient accumulation,
a loss normalisation you choose, clipping that records the pre-clip norm and whether it fired, and
a non-finite check per micro-batch. It returns one record per optimizer step instead of printing,
so a lesson can plot and assert on what happened.

``make_sft_trainer`` builds the real thing (TRL's ``SFTTrainer``) with defaults that suit a tiny
model on a laptop CPU: no telemetry, no report_to, no gradient checkpointing, no checkpoints saved.
Used by lessons 00-07.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .data import IGNORE_INDEX

NORMALISATIONS = ("mean", "token")


def set_seed(seed: int = 0) -> None:
    """Seed python, numpy and torch, so that a lesson's numbers repeat on every run."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def token_losses(model, batch: dict) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the batch's supervised tokens, and their count.

    The shift is explicit: the logit at position t predicts the label at t+1.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
    labels = batch["labels"][:, 1:]
    summed = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels.flatten(),
                             ignore_index=IGNORE_INDEX, reduction="sum")
    return summed, int((labels != IGNORE_INDEX).sum())


def micro_batch_loss(summed: torch.Tensor, n_tokens: int, *, normalise: str, accum_steps: int,
                     divide_by_accum: bool, step_tokens: int) -> torch.Tensor:
    """The loss whose ``.backward()`` adds this micro-batch's share to the step's gradient.

    ``"mean"``: the micro-batch's own mean (what most hand-written loops do), divided by the number
    of accumulation steps unless ``divide_by_accum=False`` (lesson 01's bug).
    ``"token"``: the sum divided by the valid tokens of *all* micro-batches of the step, so every
    token weighs the same, as in one big batch (lesson 07).
    """
    if normalise == "token":
        return summed / step_tokens
    loss = summed / n_tokens  # 0/0 = NaN when the micro-batch has no targets (lesson 05)
    return loss / accum_steps if divide_by_accum else loss


def _check_train_args(micro_batches, accum_steps, steps, normalise, optimizer, max_grad_norm) -> None:
    if not isinstance(micro_batches, Sequence) or len(micro_batches) == 0:
        raise ValueError("micro_batches must be a non-empty list of batches (dicts with input_ids, "
                         "labels) — the loop cycles through them — build them with data.make_batches().")
    for name, value in (("accum_steps", accum_steps), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer — it counts micro-batches "
                             f"or optimizer steps — pass e.g. {name}=4.")
    if normalise not in NORMALISATIONS:
        raise ValueError(f"normalise={normalise!r} is not one of {NORMALISATIONS} — the loop knows "
                         "these two loss normalisations — see micro_batch_loss's docstring.")
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"optimizer={optimizer!r} is not 'adamw' or 'sgd' — the lessons compare "
                         "these two — pass one of them.")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm={max_grad_norm!r} must be positive or None (no clipping) — "
                         "clipping to 0 would erase every update — pass e.g. 1.0.")


def train(model, micro_batches: Sequence[dict], *, steps: int, accum_steps: int = 1, lr: float = 1e-3,
          optimizer: str = "adamw", max_grad_norm: float | None = None, normalise: str = "mean",
          divide_by_accum: bool = True, weight_decay: float = 0.0, eps: float = 1e-8,
          on_step: Callable[[int, torch.nn.Module], None] | None = None) -> list[dict]:
    """Train for ``steps`` optimizer steps of ``accum_steps`` micro-batches each.

    Micro-batches are taken in order, cycling. Returns one record per step: ``loss`` (the mean of
    the micro-batch losses, as a logger would show it), ``grad_norm`` (before clipping),
    ``clipped``, ``n_tokens`` (supervised tokens in the step) and ``nonfinite`` (micro-batches
    whose loss was inf or NaN). ``on_step(step, model)`` runs after each update, e.g. to snapshot
    parameters.
    """
    _check_train_args(micro_batches, accum_steps, steps, normalise, optimizer, max_grad_norm)
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps)
    else:
        opt = torch.optim.SGD(params, lr=lr)
    model.train()
    records, cursor = [], 0
    for step in range(steps):
        group = [micro_batches[(cursor + k) % len(micro_batches)] for k in range(accum_steps)]
        cursor += accum_steps
        step_tokens = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in group)
        losses, nonfinite = [], 0
        for batch in group:
            summed, n_tokens = token_losses(model, batch)
            loss = micro_batch_loss(summed, n_tokens, normalise=normalise, accum_steps=accum_steps,
                                    divide_by_accum=divide_by_accum, step_tokens=step_tokens)
            loss.backward()  # each .backward() adds to .grad: the step's gradient is a sum
            value = summed.item() / max(n_tokens, 1) if n_tokens else float("nan")
            nonfinite += not math.isfinite(loss.item())
            losses.append(value)
        if max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)  # returns the pre-clip norm
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        grad_norm = float(grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        records.append({"step": step + 1, "loss": sum(losses) / len(losses), "grad_norm": grad_norm,
                        "clipped": max_grad_norm is not None and grad_norm > max_grad_norm,
                        "n_tokens": step_tokens, "nonfinite": nonfinite})
        if on_step is not None:
            on_step(step + 1, model)
    model.eval()
    return records


def clip_rate(records: list[dict]) -> float:
    """Fraction of optimizer steps on which gradient clipping fired."""
    if not records:
        raise ValueError("clip_rate got no records — it is a fraction of steps — pass train()'s output.")
    return sum(r["clipped"] for r in records) / len(records)


def make_sft_trainer(model, tokenizer, train_dataset, *, trainer_cls=None, **config):
    """A TRL ``SFTTrainer`` with CPU-friendly defaults; any ``SFTConfig`` field can be overridden.

    Defaults: 20 steps, batch 8, lr 3e-3 (a tiny model wants a large one), log every step, no
    activation (gradient) checkpointing (it only slows a 0.5 M model), no checkpoints,
    ``report_to="none"``, seeded, outputs in a temporary directory, and quiet (``disable_tqdm=True``
    also drops the printed log dicts; read ``trainer.state.log_history`` or ``logged()``), and fp32:
    ``SFTConfig`` defaults to ``bf16=True``, which on a CPU means bf16 autocast — extra noise that
    would blur comparisons with the hand-written loop. ``trainer_cls`` swaps in a subclass (e.g. one
    with a custom ``compute_loss``, lesson 01).

    TRL 1.16 replaces ``model.forward`` with a fused-loss forward (``add_fused_lm_head``): a
    ``copy.deepcopy`` of ``model`` taken afterwards still runs, and trains, the original's modules.
    Pass ``copy.deepcopy(model)`` here if you use the model again after building the trainer.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from trl import SFTConfig, SFTTrainer

    defaults = dict(
        output_dir=tempfile.mkdtemp(prefix="sft-lab-"), report_to="none", max_steps=20,
        per_device_train_batch_size=8, learning_rate=3e-3, lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", activation_checkpointing=False, seed=0,
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, disable_tqdm=True, bf16=False,
    )
    unknown = set(config) - set(SFTConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown SFTConfig field(s) {sorted(unknown)} — make_sft_trainer passes keyword "
                         "arguments to trl.SFTConfig — check the spelling against SFTConfig's docs.")
    args = SFTConfig(**{**defaults, **config})
    if args.disable_tqdm:  # quiet means quiet: no dataset-map bars and no printed log dicts either
        import datasets
        from transformers import PrinterCallback

        datasets.disable_progress_bars()
    trainer_cls = trainer_cls or SFTTrainer
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, SFTTrainer)):
        raise ValueError(f"trainer_cls={trainer_cls!r} is not a subclass of trl.SFTTrainer — the defaults "
                         "are SFTConfig fields — subclass SFTTrainer (e.g. to override compute_loss).")
    trainer = trainer_cls(model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer)
    if args.disable_tqdm:
        trainer.remove_callback(PrinterCallback)  # the log stays in trainer.state.log_history
    return trainer


def logged(trainer, key: str = "loss") -> list[float]:
    """The values of ``key`` a Trainer logged, in step order (e.g. ``"loss"``, ``"grad_norm"``)."""
    return [h[key] for h in trainer.state.log_history if key in h and "train_runtime" not in h]
