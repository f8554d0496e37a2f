"""Reference answers of lesson 06 (NaN detective), and the generator of exercise 1's runs, which knows their
cause (``course_utils.exercises.lesson06`` holds the checkers; no notebook imports this module)."""

from __future__ import annotations

import math
import random

import torch

from ...checks import Diagnosis
from ...nan_detective import FP16_MAX

# What a broken (or healthy) QLoRA run of exercise 1 can come from: the lesson's three mechanisms, lesson 05's
# look-alike (a batch without a target whose gradient is exactly zero: a NaN loss under ignore_index, or a
# clamped 0.0, and the run goes on) and healthy controls that share the surface (float16 storage with large
# but finite activations, a gradient-norm spike, a high learning rate that trains).
RUN_CAUSES = ("all_masked_labels", "fp16_overflow", "learning_rate_too_high", "empty_batch_zero_grad",
              "healthy")

_MODULES = ("embed_tokens", "layers.0.self_attn.o_proj", "layers.0.mlp.up_proj", "layers.0.mlp.down_proj",
            "layers.1.self_attn.o_proj", "layers.1.mlp.up_proj", "layers.1.mlp.down_proj", "norm", "lm_head")


def broken_run_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """``(run, truth)``: a run for exercise 1 and what broke it. ``graded`` picks the stream: the checker's
    runs and the ones ``broken_run`` shows are drawn apart. The truth's evidence: the first bad step, for
    fp16 the first module (in execution order) whose output is inf, for a healthy run None."""
    rng = random.Random(f"{'graded' if graded else 'shown'}-06-{seed}")
    cause = RUN_CAUSES[seed % len(RUN_CAUSES)]
    n = rng.randint(10, 14)
    k = rng.randint(4, n - 3)  # the first bad step
    lr = rng.choice((1e-4, 2e-4, 5e-4, 1e-3))
    storage = rng.choice(("float16", "bfloat16", "float32"))
    if cause == "fp16_overflow":
        storage = "float16"
    if cause == "learning_rate_too_high":
        lr, storage = rng.choice((0.3, 1.0, 3.0)), rng.choice(("bfloat16", "float32"))
    if cause == "healthy" and rng.random() < 0.4:
        lr = rng.choice((0.01, 0.03))  # a high rate that still trains: the rate alone is no evidence
    compute = storage if storage != "float32" else rng.choice(("float32", "bfloat16"))
    nan_filter = rng.random() < 0.6  # logging_nan_inf_filter: a NaN loss is logged as 0.0 when it is on
    base = {m: rng.uniform(2.0, 30.0) for m in _MODULES}
    loss0, nan = rng.uniform(9.0, 12.0), float("nan")
    culprit = rng.choice([m for m in _MODULES if "mlp" in m])
    near = rng.uniform(0.3, 0.8) * FP16_MAX  # healthy float16: large activations, below the ceiling
    spike = rng.randint(3, n) if cause == "healthy" and rng.random() < 0.6 else None
    log, acts = [], {m: [] for m in _MODULES}
    for step in range(1, n + 1):
        loss = loss0 * (0.75 + 0.25 * math.exp(-step / 3)) + rng.uniform(-0.3, 0.3)
        norm = rng.uniform(1.0, 6.0) * (3.0 if step <= 2 else 1.0)
        if step == spike:
            norm *= rng.uniform(8, 20)
        tokens = rng.randint(35, 60)
        grow = {m: 1.0 for m in _MODULES}
        dead = False
        if cause == "learning_rate_too_high":
            blow = 4.0 ** max(0, step - 1)
            grow = {m: blow for m in _MODULES}
            norm *= blow if step < k else 1.0
            loss = loss0 * (1.0 + 0.2 * max(0, step - k + 3)) if step <= k else loss
            if step == k:
                norm = float("inf")  # the backward overflows while the forward is still finite
            dead = step > k
        elif cause == "fp16_overflow":
            g = (FP16_MAX / base[culprit]) ** (min(step, k) / k)
            grow[culprit] = g
            grow.update({m: min(g, 1.5) for m in _MODULES if m != culprit})
            dead = step >= k
        elif cause == "healthy" and storage == "float16":
            grow[culprit] = (near / base[culprit]) ** (min(step, k) / k)
        elif cause in ("all_masked_labels", "empty_batch_zero_grad"):
            if step == k or (cause == "empty_batch_zero_grad" and step == k + rng.choice((1, 2))):
                tokens = 0
            dead = cause == "all_masked_labels" and step >= k
        for i, m in enumerate(_MODULES):
            value = base[m] * grow[m] * rng.uniform(0.9, 1.1)
            if cause == "fp16_overflow" and step >= k:
                after = i > _MODULES.index(culprit) or step > k
                value = float("inf") if m == culprit else (nan if after else value)
            elif dead and not (cause == "all_masked_labels" and step == k) and not (
                    cause == "learning_rate_too_high" and step == k):
                value = nan
            acts[m].append(min(value, FP16_MAX) if (storage == "float16" and math.isfinite(value)) else value)
        if cause == "empty_batch_zero_grad" and tokens == 0:
            loss, norm = (0.0 if nan_filter else nan), 0.0  # 0/0 = NaN (or a clamped 0.0), zero gradient
        elif dead or (cause == "all_masked_labels" and step == k):
            loss, norm = (0.0 if nan_filter else nan), nan  # grad_norm is logged unfiltered
        log.append({"step": step, "loss": round(loss, 4), "grad_norm": norm, "n_tokens": tokens})
    config = {"learning_rate": lr, "dtype": storage, "bnb_4bit_compute_dtype": compute,
              "optim": "adamw_torch", "logging_nan_inf_filter": nan_filter}
    evidence = {"fp16_overflow": culprit, "healthy": None}.get(cause, k)
    return {"config": config, "log": log, "activation_max": acts}, Diagnosis(cause, evidence)


def diagnose_run(run: dict) -> Diagnosis:
    """Exercise 1: the first odd step decides; n_tokens, then grad_norm, then the activations."""
    log, acts = run["log"], run["activation_max"]
    for i, row in enumerate(log):
        inf_module = next((m for m, values in acts.items() if not math.isfinite(values[i])), None)
        if row["n_tokens"] == 0:  # no target: a zero gradient survives, a NaN one kills the weights
            cause = "empty_batch_zero_grad" if row["grad_norm"] == 0.0 else "all_masked_labels"
            return Diagnosis(cause, row["step"])
        if inf_module is not None:
            return Diagnosis("fp16_overflow", inf_module)
        if not math.isfinite(row["grad_norm"]):
            return Diagnosis("learning_rate_too_high", row["step"])
    return Diagnosis("healthy", None)


# The self-test's plain phrases, in a fixed order (what a learner of lesson 06 can name).
SELF_TEST_CAUSES = {
    "all_masked_labels": "a batch with no target, and a loss whose NaN gradients reached the weights",
    "fp16_overflow": "float16 overflow: an activation passed 65504",
    "learning_rate_too_high": "the learning rate is too high: the run diverged",
    "empty_batch_zero_grad": "a batch with no target, zero gradient: the run survives",
    "healthy": "nothing: the run is healthy",
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: the config and a Trainer-style log with each step's largest activation, its
    true cause as a plain phrase, and the phrases to choose from (fixed order). Deterministic; no training."""
    run, truth = broken_run_case(seed, graded=False)
    lines = [f"config: {run['config']}",
             "step | loss | grad_norm | n_tokens | largest |output| of any module (first non-finite one)"]
    for i, row in enumerate(run["log"][:20]):
        values = {m: v[i] for m, v in run["activation_max"].items()}
        bad = next((m for m, v in values.items() if not math.isfinite(v)), None)
        top = max((v for v in values.values() if math.isfinite(v)), default=float("nan"))
        lines.append(f"{row['step']:4d} | {row['loss']:7.4g} | {row['grad_norm']:9.4g} "
                     f"| {row['n_tokens']:3d} | {top:9.4g}"
                     + (f" | first non-finite: {bad} = {values[bad]}" if bad else ""))
    return "\n".join(lines), SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())


def guard(model, control, scaler=None):
    """Exercise 2: name the first parameter whose gradient is not finite, drop every gradient so the
    optimizer step that follows changes nothing, and ask the Trainer to stop. Under a ``GradScaler`` (fp16
    mixed precision) an inf gradient is routine: the scaler skips that step and lowers its scale, so the
    guard leaves it alone (a guard that stopped there would end a healthy run at step 1)."""
    if scaler is not None:
        return None
    for name, param in model.named_parameters():
        if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None
