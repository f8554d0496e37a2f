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
import random
import tempfile
from collections.abc import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from . import validate
from .losses import count_supervised, model_logits, params_finite, summed_ignore_index
from .model import course_seed
from .quiet import quiet_libraries

NORMALISATIONS = ("mean", "token")
PROGRESS_DELAY_S = 2.0  # a bar appears only when a run takes longer than this: fast cells stay clean


def set_seed(seed: int | None = None) -> int:
    """Seed python, numpy and torch, so that a lesson's numbers repeat on every run; returns the seed.

    ``None``: the course seed (``$COURSE_SEED``, default 0), so ``make robustness`` can vary it.
    """
    seed = course_seed() if seed is None else validate.integer("seed", seed, minimum=0, why="it seeds RNGs")

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


def token_losses(model, batch: dict) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the batch's supervised tokens, and their count.

    The shift is explicit: the logit at position t predicts the label at t+1.
    """
    validate.batch("batch", batch)
    summed = summed_ignore_index(model_logits(model, batch), batch["labels"])
    return summed, count_supervised(batch["labels"])


def micro_batch_loss(summed: torch.Tensor, n_tokens: int, *, normalise: str, accum_steps: int,
                     divide_by_accum: bool, step_tokens: int) -> torch.Tensor:
    """The loss whose ``.backward()`` adds this micro-batch's share to the step's gradient.

    ``"mean"``: the micro-batch's own mean (what most hand-written loops do), divided by the number
    of accumulation steps unless ``divide_by_accum=False`` (lesson 01's bug).
    ``"token"``: the sum divided by the valid tokens of *all* micro-batches of the step, so every
    token weighs the same, as in one big batch (lesson 07).
    """
    validate.tensor("summed", summed)
    validate.choice("normalise", normalise, NORMALISATIONS, why="the loop knows these two normalisations")
    validate.positive_int("accum_steps", accum_steps, why="it is the number of micro-batches per step")
    validate.flag("divide_by_accum", divide_by_accum, why="it switches lesson 01's division by the steps")
    # 0 is allowed: a micro-batch (or a step) without a graded token is the failure lessons 05 and 07 show
    validate.integer("n_tokens", n_tokens, minimum=0, why="it counts the micro-batch's graded tokens")
    validate.integer("step_tokens", step_tokens, minimum=0, why="it counts the graded tokens of the whole "
                     "step, all its micro-batches")
    value = float(summed.detach().sum()) if summed.numel() else 0.0
    if value < 0:
        raise ValueError(f"summed={value:g} is negative — it is a sum of cross-entropies, each -log p >= 0 — "
                         "pass the summed loss of the micro-batch's graded tokens "
                         "(losses.summed_ignore_index, or token_losses(model, batch)[0]).")
    if n_tokens == 0 and value != 0 and math.isfinite(value):
        raise ValueError(f"summed={value:g} with n_tokens=0 — a sum over no graded token is 0, so the sum "
                         "and the count come from different micro-batches — pass both from the same one: "
                         "summed, n_tokens = token_losses(model, batch).")
    if n_tokens > step_tokens:
        raise ValueError(f"n_tokens={n_tokens} is more than step_tokens={step_tokens} — the micro-batch's "
                         "tokens are some of the step's — pass step_tokens = the sum over the step's "
                         "micro-batches (losses.count_supervised).")
    if normalise == "token":
        return summed / step_tokens
    # 0/0 = NaN when the micro-batch has no targets, yet the gradient stays 0: ignore_index's
    # backward writes exact zeros (lesson 05 contrasts this with masking by multiplication)
    loss = summed / n_tokens
    return loss / accum_steps if divide_by_accum else loss


def _check_train_args(model, micro_batches, accum_steps, steps, normalise, optimizer, lr,
                      max_grad_norm) -> None:
    validate.model("model", model)
    validate.positive_int("accum_steps", accum_steps, why="it counts micro-batches per optimizer step")
    validate.positive_int("steps", steps, why="it counts optimizer steps")
    validate.choice("normalise", normalise, NORMALISATIONS,
                    why="the loop knows these two loss normalisations")
    validate.choice("optimizer", optimizer, ("adamw", "sgd"), why="the lessons compare these two")
    validate.number("lr", lr, positive=True, why="a learning rate of 0 or less trains nothing or backwards",
                    example=1e-3)
    validate.number("max_grad_norm", max_grad_norm, positive=True, allow_none=True,
                    why="clipping to 0 would erase every update; None turns clipping off", example=1.0)
    validate.batches("micro_batches", micro_batches)


def train(model, micro_batches: Sequence[dict], *, steps: int, accum_steps: int = 1, lr: float = 1e-3,
          optimizer: str = "adamw", max_grad_norm: float | None = None, normalise: str = "mean",
          divide_by_accum: bool = True, weight_decay: float = 0.0, eps: float = 1e-8,
          on_step: Callable[[int, torch.nn.Module], None] | None = None,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
          skip_empty: bool = False, progress: bool = True) -> list[dict]:
    """Train for ``steps`` optimizer steps of ``accum_steps`` micro-batches each.

    Micro-batches are taken in order, cycling. Returns one record per step: ``loss`` (the mean of
    the micro-batch losses, as a logger would show it), ``grad_norm`` (before clipping),
    ``clipped``, ``n_tokens`` (supervised tokens in the step) and ``nonfinite`` (micro-batches
    whose loss was inf or NaN), ``skipped`` (micro-batches not run) and ``weights_finite``.
    ``on_step(step, model)`` runs after each update, e.g. to snapshot parameters; if it returns True,
    training ends there (a criterion met: ``eos.train_until_stops``).

    ``loss_fn(logits, labels)``: a per-micro-batch mean written your way (lesson 05 passes the
    masked means of ``losses``) instead of ``normalise``; it is divided by ``accum_steps`` like the
    default. ``skip_empty=True`` is the guard against empty micro-batches: one without a supervised
    token is not run at all. ``progress`` shows a bar once a run has taken a couple of seconds.
    """

    _check_train_args(model, micro_batches, accum_steps, steps, normalise, optimizer, lr, max_grad_norm)
    validate.number("weight_decay", weight_decay, minimum=0, why="it shrinks every weight by lr x it each "
                    "step: a negative one grows them")
    validate.number("eps", eps, positive=True, why="it keeps Adam's division by the gradient's scale finite",
                    example=1e-8)
    if on_step is not None:
        validate.function("on_step", on_step)
    if loss_fn is not None:
        validate.function("loss_fn", loss_fn)
    validate.flag("skip_empty", skip_empty,
                  why="it switches the guard that skips micro-batches without targets")
    validate.flag("progress", progress, why="it switches the progress bar")
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps)
    else:
        opt = torch.optim.SGD(params, lr=lr)
    model.train()
    records, cursor = [], 0
    bar = tqdm(total=steps, desc="train", unit="step", leave=False, delay=PROGRESS_DELAY_S,
               disable=not progress)
    for step in range(steps):
        group = [micro_batches[(cursor + k) % len(micro_batches)] for k in range(accum_steps)]
        cursor += accum_steps
        step_tokens = sum(count_supervised(b["labels"]) for b in group)
        losses, nonfinite, skipped = [], 0, 0
        for batch in group:
            if skip_empty and count_supervised(batch["labels"]) == 0:
                skipped += 1  # the guard: no targets, so no forward, no backward, no NaN
                continue
            if loss_fn is not None:
                value_t = loss_fn(model_logits(model, batch), batch["labels"])
                loss = value_t / accum_steps if divide_by_accum else value_t
                value = value_t.item()
            else:
                summed, n_tokens = token_losses(model, batch)
                loss = micro_batch_loss(summed, n_tokens, normalise=normalise, accum_steps=accum_steps,
                                        divide_by_accum=divide_by_accum, step_tokens=step_tokens)
                value = summed.item() / n_tokens if n_tokens else float("nan")
            loss.backward()  # each .backward() adds to .grad: the step's gradient is a sum
            nonfinite += not math.isfinite(loss.item())
            losses.append(value)
        if max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)  # returns the pre-clip norm
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        grad_norm = float(grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        records.append({"step": step + 1, "loss": sum(losses) / len(losses) if losses else float("nan"),
                        "grad_norm": grad_norm,
                        "clipped": max_grad_norm is not None and grad_norm > max_grad_norm,
                        "n_tokens": step_tokens, "nonfinite": nonfinite, "skipped": skipped,
                        "weights_finite": params_finite(model)})
        bar.update()
        if on_step is not None and on_step(step + 1, model):
            break  # the caller's criterion is met
    _close_bar(bar)
    model.eval()
    return records


def _close_bar(bar) -> None:
    """Close a progress bar as done. A run that meets its criterion early (``on_step``, a stop callback) is
    finished, not failed: without this the notebook bar closes at e.g. 90/300 and tqdm paints it red."""
    if bar.total and bar.n < bar.total:
        done, started = bar.n, getattr(bar, "start_t", None)
        bar.reset(total=done)  # the notebook bar's maximum too (setting .total alone leaves it at the cap)
        if started is not None:
            bar.start_t = started  # reset() restarts the clock: the closed bar would show ~10^5 step/s
        bar.update(done)
    bar.refresh()  # update() may skip the redraw (mininterval): the closed bar shows done/done
    bar.close()


def clip_rate(records: list[dict]) -> float:
    """Fraction of optimizer steps on which gradient clipping fired."""
    if not isinstance(records, (list, tuple)) or not records:
        raise ValueError("clip_rate got no records — it is a fraction of steps — pass train()'s output.")
    for i, r in enumerate(records):
        if not isinstance(r, dict) or not isinstance(r.get("clipped"), (bool, np.bool_)):
            got = (f"a {type(r).__name__}" if not isinstance(r, dict) else
                   f"no 'clipped' (keys: {sorted(r, key=str)})" if "clipped" not in r else
                   f"clipped={r['clipped']!r}")
            raise ValueError(f"records[{i}] has {got} — clip_rate counts the steps whose record says "
                             "clipped=True — pass train()'s records (one dict per optimizer step).")
    return sum(bool(r["clipped"]) for r in records) / len(records)


def _progress_callback():
    """A Trainer callback that shows a bar once a run takes a couple of seconds, and prints nothing
    else (the Trainer's own ``ProgressCallback`` also prints every log dict)."""
    from transformers import TrainerCallback  # see make_sft_trainer: the Trainer's import is slow

    class QuietProgress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=state.max_steps, desc="SFTTrainer", unit="step", leave=False,
                            delay=PROGRESS_DELAY_S)

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update()

        def on_train_end(self, args, state, control, **kwargs):
            _close_bar(self.bar)  # a stop callback may end the run before max_steps: finished, not failed

    return QuietProgress()


def make_sft_trainer(model, tokenizer, train_dataset, *, trainer_cls=None, progress: bool = True, **config):
    """A TRL ``SFTTrainer`` with CPU-friendly defaults; any ``SFTConfig`` field can be overridden.

    Defaults: 20 steps, batch 8, lr 3e-3 (a tiny model wants a large one), log every step, no
    activation (gradient) checkpointing (it only slows a 0.5 M model), no checkpoints,
    ``report_to="none"``, seeded (``course_seed()``), outputs in a temporary directory, and quiet:
    no printed log dicts (read ``trainer.state.log_history`` or ``logged()``), no dataset-map bars
    while it is built (restored afterwards), a progress bar only once training takes a couple of
    seconds (``progress=False``: none). And fp32: ``SFTConfig`` defaults to ``bf16=True``, which on
    a CPU means bf16 autocast — extra noise that would blur comparisons with the hand-written loop.
    ``trainer_cls`` swaps in a subclass (e.g. one with a custom ``compute_loss``, lesson 01).

    TRL 1.16 replaces ``model.forward`` with a fused-loss forward (``add_fused_lm_head``): a
    ``copy.deepcopy`` of ``model`` taken afterwards still runs, and trains, the original's modules.
    Pass ``copy.deepcopy(model)`` here if you use the model again after building the trainer.
    """
    # imported here, not at the top: transformers' Trainer and TRL take seconds to import (TRL pulls in
    # peft and bitsandbytes), and the hand-written loop of lessons 01 and 05-07 needs neither
    from transformers import PrinterCallback, ProgressCallback
    from trl import SFTConfig, SFTTrainer


    defaults = dict(
        output_dir=tempfile.mkdtemp(prefix="sft-lab-"), report_to="none", max_steps=20,
        per_device_train_batch_size=8, learning_rate=3e-3, lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", activation_checkpointing=False, seed=course_seed(),
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, disable_tqdm=True, bf16=False,
    )
    validate.model("model", model)
    validate.tokenizer("tokenizer", tokenizer)
    validate.flag("progress", progress, why="it switches the progress bar")
    if not hasattr(train_dataset, "column_names"):
        raise TypeError(f"train_dataset must be a datasets.Dataset, got {type(train_dataset).__name__} — "
                        "SFTTrainer maps and tokenizes it — build one with make_chat_dataset() or "
                        "datasets.Dataset.from_dict(...).")
    validate.sft_config("config", config)  # make_sft_trainer passes its keyword arguments to SFTConfig
    merged = {**defaults, **config}
    if merged["max_steps"] != -1:
        validate.positive_int("max_steps", merged["max_steps"], why="it counts optimizer steps",
                              fix="pass an integer >= 1, e.g. max_steps=20, or -1 to train num_train_epochs "
                              "epochs instead")
    args = SFTConfig(**merged)
    trainer_cls = trainer_cls or SFTTrainer
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, SFTTrainer)):
        raise ValueError(f"trainer_cls={trainer_cls!r} is not a subclass of trl.SFTTrainer — the defaults "
                         "are SFTConfig fields — subclass SFTTrainer (e.g. to override compute_loss).")
    with quiet_libraries(logs=False):  # no dataset-map bars while TRL prepares the data; restored after
        trainer = trainer_cls(model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer)
    if args.disable_tqdm:
        trainer.remove_callback(PrinterCallback)  # the log stays in trainer.state.log_history
        trainer.remove_callback(ProgressCallback)
        if progress:
            trainer.add_callback(_progress_callback())
    return trainer


def logged(trainer, key: str = "loss") -> list[float]:
    """The values of ``key`` a Trainer logged, in step order (e.g. ``"loss"``, ``"grad_norm"``)."""
    validate.trainer("trainer", trainer)
    history = [h for h in trainer.state.log_history if "train_runtime" not in h]
    if not history:
        raise ValueError("the trainer has logged nothing — train() was not called yet, or logging_steps is "
                         "larger than the run — call trainer.train() first.")
    validate.key("key", key, {k for h in history for k in h}, where="the trainer's log")
    return [h[key] for h in history if key in h]
