"""``SFTWatch``: a training-time watch for ``Trainer``/``SFTTrainer`` (lesson 08, and your own runs).

The doctor (``course_utils.doctor``) checks a set-up before training; the watch records, while it
trains, the three things this course showed go wrong silently:

- **clip rate**: the fraction of optimizer steps on which ``max_grad_norm`` clipped the gradient
  (lesson 01). The Trainer clips *before* callbacks run, so the watch measures the gradient norm in
  ``on_pre_optimizer_step``: after a clip it equals ``max_grad_norm`` (clip_grad_norm_ scales it by
  ``max_norm / (norm + 1e-6)``); the pre-clip norm comes from the log (``grad_norm``) when logged.
- **micro-batches with no graded token** (lessons 05, 07): a callback never sees the batch, so the
  watch puts a forward *pre*-hook (``with_kwargs=True``) on the model and counts the ``labels`` that
  are not ``-100`` in every training forward. TRL's ``compute_loss`` divides by
  ``num_tokens.clamp(min=1)``, so such a micro-batch logs a silent 0.0 instead of NaN. (A custom
  ``compute_loss`` that calls the model without ``labels`` is invisible to this count.)
- **the first non-finite value** (lesson 06): forward hooks on every module find the first module
  whose output holds inf/NaN; ``register_post_accumulate_grad_hook`` on every parameter finds the
  first gradient that does, in backward order (the module nearest the loss first). With
  ``stop_on_nonfinite=True`` the watch sets ``control.should_training_stop``, drops the non-finite
  gradients before the optimizer step (so the weights stay finite), and ``report()`` says where.

Usage (a Trainer takes callbacks with ``add_callback``, or ``callbacks=[watch]`` when you build a
``transformers.Trainer`` yourself; ``make_sft_trainer`` takes SFTConfig fields only)::

    from course_utils import load_course_model, make_chat_dataset, make_sft_trainer
    from course_utils.watch import SFTWatch

    model, tokenizer = load_course_model()
    trainer = make_sft_trainer(model, tokenizer, make_chat_dataset(n=48), max_steps=5)
    watch = SFTWatch()
    trainer.add_callback(watch)
    trainer.train()
    print(watch.report())

One watch per run: it refuses a second ``train()``, whose numbers would mix with the first one's.
"""

from __future__ import annotations

import math

import torch
from transformers import TrainerCallback

from . import validate
from .data import n_graded

CLIP_TOLERANCE = 1e-4  # relative: clip_grad_norm_ leaves the norm at max_norm * (1 - ~1e-6/norm)


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    for key in ("loss", "log_probs", "logits"):
        value = getattr(output, key, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


class SFTWatch(TrainerCallback):
    """Records clip rate, empty micro-batches and the first non-finite value; can stop the run.

    ``stop_on_nonfinite`` (default True) stops at the first inf/NaN in an activation, the loss or a
    gradient; ``stop_on_empty`` (default False) stops at the first micro-batch with no graded token;
    ``locate`` (default True) installs the per-module hooks that name where a non-finite value first
    appeared (they cost one ``isfinite`` per module output and per gradient).
    """

    SWITCHES = ("stop_on_nonfinite", "stop_on_empty", "locate")

    def __init__(self, *positional, stop_on_nonfinite: bool = True, stop_on_empty: bool = False,
                 locate: bool = True, **unknown):
        if positional:  # SFTWatch(True): which of the three switches would that be?
            raise TypeError(f"SFTWatch takes its switches by name, got {len(positional)} positional "
                            f"argument(s) {positional!r:.60} — a bare value could mean any of "
                            f"{list(self.SWITCHES)} — pass e.g. SFTWatch(stop_on_empty=True).")
        for name in unknown:
            validate.choice("SFTWatch argument", name, self.SWITCHES, why="the watch has these switches")
        for name, value in (("stop_on_nonfinite", stop_on_nonfinite), ("stop_on_empty", stop_on_empty),
                            ("locate", locate)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r} must be True or False — it switches one behaviour of the "
                                 f"watch — pass {name}=True or False.")
        self.stop_on_nonfinite, self.stop_on_empty, self.locate = stop_on_nonfinite, stop_on_empty, locate
        self.steps: list[dict] = []         # one record per optimizer step
        self.micro_batches: list[int] = []  # graded tokens per training micro-batch
        self.nonfinite: dict | None = None  # the first non-finite value: kind, where, step
        self.stopped_because: str | None = None
        self._handles: list = []
        self._step = 0
        self._max_grad_norm = None

    # --- hooks ------------------------------------------------------------------------------
    def _count_graded(self, module, args, kwargs):
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation or generation: not a training micro-batch
        labels = kwargs.get("labels")
        if labels is None:
            return
        self.micro_batches.append(n_graded(labels))  # the course's rule: shifted by one, not -100

    def _record_nonfinite(self, kind: str, where: str):
        if self.nonfinite is None:
            self.nonfinite = {"kind": kind, "where": where, "step": self._step + 1,
                              "micro_batch": len(self.micro_batches)}

    def _forward_hook(self, name: str):
        def hook(module, args, output):
            if self.nonfinite is not None or not module.training:
                return
            tensor = _first_tensor(output)
            if tensor is not None and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                loss = getattr(output, "loss", None) is tensor
                kind = "activation" if name else "loss" if loss else "model output"
                self._record_nonfinite(kind, name or "the model's output")
        return hook

    def _grad_hook(self, name: str):
        def hook(param):
            grad = param.grad
            if self.nonfinite is None and grad is not None and not bool(torch.isfinite(grad).all()):
                self._record_nonfinite("gradient", name)
        return hook

    # --- callback events --------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("SFTWatch got no model from the Trainer — it hooks the model to see "
                             "micro-batches — add it with trainer.add_callback(watch) on a transformers "
                             "Trainer.")
        if self.steps or self.micro_batches or self._handles:
            raise ValueError(f"this SFTWatch already watched a run ({len(self.steps)} optimizer step(s)) — a "
                             "second train() would mix its numbers with the first run's — give each run its "
                             "own watch: trainer.add_callback(SFTWatch()).")
        self._max_grad_norm = args.max_grad_norm
        self._handles.append(model.register_forward_pre_hook(self._count_graded, with_kwargs=True))
        if self.locate:
            for name, module in model.named_modules():
                self._handles.append(module.register_forward_hook(self._forward_hook(name)))
            for name, param in model.named_parameters():
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(self._grad_hook(name)))

    def on_step_begin(self, args, state, control, **kwargs):
        self._first_micro_batch = len(self.micro_batches)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        graded = self.micro_batches[getattr(self, "_first_micro_batch", 0):]
        clipped = (self._max_grad_norm is not None and self._max_grad_norm > 0 and math.isfinite(norm)
                   and norm >= self._max_grad_norm * (1 - CLIP_TOLERANCE))
        self.steps.append({"step": state.global_step + 1, "post_clip_norm": norm, "clipped": clipped,
                           "graded_tokens": sum(graded), "empty_micro_batches": sum(g == 0 for g in graded),
                           "pre_clip_norm": None, "loss": None})
        if not math.isfinite(norm):
            self._record_nonfinite("gradient", "total norm")
            if self.stop_on_nonfinite:
                # the Trainer calls optimizer.step() right after this event: without gradients AdamW
                # leaves every weight as it is, so the run stops with finite weights, not NaN ones
                for param in model.parameters():
                    param.grad = None
        self._step = state.global_step + 1
        self._maybe_stop(control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if self.steps and "train_runtime" not in logs:
            self.steps[-1]["pre_clip_norm"] = logs.get("grad_norm")
            self.steps[-1]["loss"] = logs.get("loss")
        loss = logs.get("loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            self._record_nonfinite("logged loss", f"log at step {state.global_step}")
        self._maybe_stop(control)

    def on_train_end(self, args, state, control, **kwargs):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _maybe_stop(self, control):
        if self.stopped_because is not None:
            return
        if self.stop_on_nonfinite and self.nonfinite is not None:
            self.stopped_because = "non-finite " + self.nonfinite["kind"]
        elif self.stop_on_empty and self.empty_micro_batches:
            self.stopped_because = "a micro-batch with no graded token"
        if self.stopped_because is not None:
            control.should_training_stop = True

    # --- results ----------------------------------------------------------------------------
    @property
    def clip_rate(self) -> float:
        """Fraction of optimizer steps on which the gradient was clipped (NaN before any step)."""
        return sum(s["clipped"] for s in self.steps) / len(self.steps) if self.steps else float("nan")

    @property
    def empty_micro_batches(self) -> int:
        """Training micro-batches that had no graded token (each logs 0.0 in SFTTrainer)."""
        return sum(g == 0 for g in self.micro_batches)

    def summary(self) -> dict:
        return {"steps": len(self.steps), "micro_batches": len(self.micro_batches),
                "clip_rate": self.clip_rate, "empty_micro_batches": self.empty_micro_batches,
                "nonfinite": self.nonfinite, "stopped_because": self.stopped_because}

    def report(self) -> str:
        """A readable account of the run: what was measured and what it means."""
        lines = [f"SFTWatch: {len(self.steps)} optimizer steps, {len(self.micro_batches)} micro-batches"]
        if self.steps:
            lines.append(f"  clip rate {self.clip_rate:.0%} (max_grad_norm={self._max_grad_norm})"
                         + ("  <- clipping on most steps: check the loss scale (lesson 01)"
                            if self.clip_rate > 0.5 else ""))
        empty = self.empty_micro_batches
        hint = " <- SFTTrainer logs a silent 0.0 for each; check truncation (lesson 05)" if empty else ""
        lines.append(f"  micro-batches with no graded token: {empty}{hint}")
        if self.nonfinite:
            n = self.nonfinite
            lines.append(f"  first non-finite {n['kind']} at step {n['step']} "
                         f"(micro-batch {n['micro_batch']}): {n['where']} (lesson 06)")
        else:
            lines.append("  no non-finite loss, activation or gradient")
        if self.stopped_because:
            lines.append(f"  stopped the run: {self.stopped_because}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.report()
