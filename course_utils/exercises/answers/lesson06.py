"""Reference answers of lesson 06 (NaN detective). The checkers import this lazily; no notebook does."""

from __future__ import annotations

import math

import torch

from ...checks import Diagnosis


def diagnose_run(run: dict) -> Diagnosis:
    """Exercise 1: the first odd step decides; n_tokens, then grad_norm, then the activations."""
    log, acts = run["log"], run["activation_max"]
    for i, row in enumerate(log):
        step_acts = [(m, values[i]) for m, values in acts.items()]
        inf_module = next((m for m, v in step_acts if not math.isfinite(v)), None)
        if row["n_tokens"] == 0:
            cause = "silent_zero_loss" if row["grad_norm"] == 0.0 else "all_masked_labels"
            return Diagnosis(cause, row["step"])
        if inf_module is not None:
            return Diagnosis("fp16_overflow", inf_module)
        if not math.isfinite(row["grad_norm"]):
            return Diagnosis("learning_rate_too_high", row["step"])
    raise ValueError("every step of this run looks healthy — nothing to diagnose — check the generator.")


def guard(model, control):
    """Exercise 2: name the first parameter whose gradient is not finite, drop every gradient so the
    optimizer step that follows changes nothing, and ask the Trainer to stop."""
    for name, param in model.named_parameters():
        if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None
