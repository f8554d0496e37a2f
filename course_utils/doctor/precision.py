"""The doctor's precision checks (lesson 06's mechanisms, applied to a practitioner's checkpoint): will fp16
overflow on *this* set-up, do the weights' dtype and the precision flags fit together, and is the learning
rate far outside the usual range?

Measured, not ruled: the fp16 check runs the first few optimizer steps of the set-up at its own learning
rate (full fine-tuning, or the user's LoRA adapters) on a float32 copy of the model and records the
largest activation any module outputs before and after each step. fp16 autocast computes those
activations in float16, which ends at 65504: a peak past it is an inf in the real run. A learning rate
alone decides nothing — the QLoRA recipe's ``2e-4`` grows no activation, a rate of ``0.05`` on a full
fine-tune can — so the doctor measures which.

Bounded: the model is loaded only when its weight files add up to at most ``LOAD_LIMIT_GB`` (a
practitioner's 8 B checkpoint is 16 GB: then the check says it did not measure, and why).
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import torch

from ..quiet import no_progress_bars
from .report import Finding

# A room of the doctor, not an API: its names serve the package; users import ``course_utils.doctor``
__all__ = []

FP16_MAX = 65504.0  # torch.finfo(torch.float16).max
FP16_HEADROOM = 16.0  # activations within 16x of fp16's max leave no room for training to grow them
LOAD_LIMIT_GB = 2.0  # the largest checkpoint the doctor loads on the CPU for the fp16 measurement
PROBE_STEPS = 8  # optimizer steps of the fp16 probe: a hot learning rate shows within a few (lesson 06)
# A growth that, kept up, passes fp16's max within this many steps is an overflow of a short run. Measured on
# both course models: 0.05 grows ~1,000-4,000 per step (crossing in ~20-60 steps); 2e-5..3e-3 at most
# ~0.4 per step (>100,000 steps), so the horizon sits far from both.
PROBE_HORIZON = 1000
PROBE_ROWS = 4  # rows per probe step, each cut to PROBE_TOKENS
PROBE_TOKENS = 256
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
# Learning rates commonly used for SFT (HF/TRL docs and model cards): full fine-tuning 1e-6..1e-4,
# LoRA 1e-5..1e-3. "Far outside" is 10x beyond either end.
LR_RANGES = {"full": (1e-6, 1e-4), "lora": (1e-5, 1e-3)}
LR_FAR = 10.0


def _checkpoint_gb(source) -> float | None:
    """The size of a local checkpoint's weight files in GB, or None when ``source`` is not a directory."""
    path = Path(str(source))
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for pattern in WEIGHT_FILES for f in path.glob(pattern)) / 1e9


def _checkpoint_dtype(source) -> str | None:
    """The dtype a checkpoint's config.json records (``dtype``, or the older ``torch_dtype``)."""
    config = Path(str(source)) / "config.json"
    if not config.is_file():
        return None
    fields = json.loads(config.read_text(encoding="utf-8"))
    return fields.get("dtype") or fields.get("torch_dtype")


def _load_bounded(source, limit_gb: float = LOAD_LIMIT_GB):
    """``(model, None)`` in float32 on the CPU, or ``(None, why not)``: no weights, or more than
    ``limit_gb`` of them (the doctor never loads a checkpoint it was not asked to pay for)."""
    from transformers import AutoModelForCausalLM

    size = _checkpoint_gb(source)
    if size is None:
        return None, f"{source!r} is not a local directory: the doctor loads no weights from the hub"
    if size == 0:
        return None, "no weight files in the model directory"
    if size > limit_gb:
        return None, (f"the checkpoint's weights are {size:.1f} GB, above the doctor's load limit of "
                      f"{limit_gb:g} GB (--max-load-gb)")
    try:
        with no_progress_bars():
            return AutoModelForCausalLM.from_pretrained(source, device_map="cpu", dtype=torch.float32), None
    except Exception as exc:  # noqa: BLE001 — weights it cannot load: the check says unmeasured, and why
        return None, f"the weights did not load ({type(exc).__name__}: {str(exc)[:120]})"


def _activation_peaks(model, rows: list[list[int]], learning_rate: float, peft_config=None,
                     steps: int = PROBE_STEPS) -> tuple[list[float], str]:
    """The largest |activation| of any module before training and after each of ``steps`` AdamW steps at
    ``learning_rate`` on ``rows`` (full-sequence loss), on a float32 copy of ``model`` (the caller's is
    untouched) — with the user's LoRA adapters when ``peft_config`` is given, as ``SFTTrainer`` would
    train them. Returns ``(peaks, module of the largest)``."""
    probe = copy.deepcopy(model).float().train()
    if peft_config is not None:
        from peft import get_peft_model

        with warnings.catch_warnings():  # peft reads a deprecated transformers attribute: not user news
            warnings.simplefilter("ignore", FutureWarning)
            probe = get_peft_model(probe, copy.deepcopy(peft_config))
    params = [p for p in probe.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate)
    largest, where = [0.0], [""]

    def record(name):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
                value = float(out.detach().abs().max())
                if value > largest[0] or value != value:  # NaN: the run is already past fp16's range
                    largest[0], where[0] = value, name
        return hook

    handles = [m.register_forward_hook(record(n)) for n, m in probe.named_modules() if n]
    peaks = []
    try:
        for step in range(steps + 1):
            largest[0] = 0.0
            optimizer.zero_grad()
            loss = sum(probe(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss for ids in rows)
            peaks.append(largest[0])
            if step == steps or not torch.isfinite(loss):
                break
            loss.backward()
            optimizer.step()
    finally:
        for h in handles:
            h.remove()
    return peaks, where[0]


def _growth(peaks: list[float]) -> tuple[float, float]:
    """``(growth per step, steps until fp16's max)`` of the activation peak over the probe's second half
    (its first steps include Adam's warm-up); steps is 0 once past the max, ``inf`` when it does not grow."""
    half = len(peaks) // 2
    slope = (peaks[-1] - peaks[half]) / max(len(peaks) - 1 - half, 1)
    if not peaks[-1] < FP16_MAX:
        return slope, 0.0
    return slope, (FP16_MAX - peaks[-1]) / slope if slope > 0 else float("inf")


def loaded_model(setup):
    """``(model, why not)`` for the fp16 measurement: the caller's model, or the checkpoint loaded within
    the size limit (``_load_bounded``), or None and the reason."""
    if setup.model is not None:
        return setup.model, None
    if not setup.forward:
        return None, "forward=False (--no-forward): the doctor was asked not to load the weights"
    if not setup.precision["fp16"] or setup.source is None:
        return None, None
    return _load_bounded(setup.source, setup.max_load_gb)


def precision_and_lr_findings(config, precision, args, loaded, tokenizer, prepared, peft) -> list[Finding]:
    """The learning rate against the usual range (a warning), and fp16's range measured on the set-up's
    own first optimizer steps (``_activation_peaks``): an error only when the measured activations leave
    fp16's range, never for a flag or a rate alone."""
    model_obj, why_unloaded = loaded
    findings = []
    low, high = LR_RANGES["lora" if peft is not None else "full"]
    lr, kind = args.learning_rate, "LoRA" if peft is not None else "full fine-tuning"
    if lr > high * LR_FAR or lr < low / LR_FAR:
        ratio = lr / (high if lr > high else low)
        findings.append(Finding(
            "warning", "learning-rate", f"learning_rate={lr:g} is far outside the usual range for {kind}",
            f"usual {low:g}..{high:g}; this is {ratio:.3g}x that end",
            "a tiny model can take it, a real one diverges or forgets: sweep a few values around "
            f"{math.sqrt(low * high):.0e} and watch the loss and grad_norm", "06"))
    if not precision["fp16"]:
        return findings
    if model_obj is None or prepared is None:
        findings.append(Finding("info", "fp16-range", "fp16=True: the activation range was not measured",
                                why_unloaded or "no tokenized rows to run the model on",
                                "run the doctor where it can load the weights (--max-load-gb), or use bf16 "
                                "(float32's range) where the hardware has it", "06"))
        return findings
    rows = [ids[:PROBE_TOKENS] for ids in prepared["input_ids"][:PROBE_ROWS]]
    peaks, where = _activation_peaks(model_obj, rows, lr, peft)
    before, worst = peaks[0], (math.nan if any(p != p for p in peaks) else max(peaks))
    trained = "LoRA adapters" if peft is not None else "all weights"
    run = (f"{len(peaks) - 1} AdamW steps at learning_rate={lr:g} on {trained} (a float32 copy, "
           f"{len(rows)} rows)")
    fix = ("use bf16 (float32's range) or fp32; if fp16 is a must, lower the learning rate and keep "
           "max_grad_norm")
    if before * FP16_HEADROOM > FP16_MAX:
        findings.append(Finding("error", "fp16-overflow-risk", "fp16 training risks overflow to inf/NaN",
                                f"activations already reach {before:.3g} in {where} before training "
                                f"({FP16_MAX / before:.3g}x below fp16's max {FP16_MAX:g})", fix, "06"))
    elif not worst <= FP16_MAX or _growth(peaks)[1] <= PROBE_HORIZON:
        slope, steps = _growth(peaks)
        when = (f"past fp16's max {FP16_MAX:g}" if steps == 0 else
                f"growing {slope:.3g} a step: at that rate past fp16's max {FP16_MAX:g} in ~{steps:.0f} "
                "more steps")
        findings.append(Finding("error", "fp16-overflow-risk", "fp16 training overflows to inf/NaN",
                                f"measured: after {run} activations reach {worst:.3g} in {where} (from "
                                f"{before:.3g}), {when}", fix, "06"))
    elif worst * FP16_HEADROOM > FP16_MAX:
        findings.append(Finding("warning", "fp16-range", "fp16: activations grow toward fp16's max",
                                f"measured: after {run} they reach {worst:.3g} in {where} (from "
                                f"{before:.3g}), within {FP16_HEADROOM:g}x of fp16's max {FP16_MAX:g}",
                                fix, "06"))
    else:
        findings.append(Finding("info", "fp16-range", f"fp16: activations peak at {worst:.3g} ({where})",
                                f"measured: {before:.3g} before and {worst:.3g} after {run}; "
                                f"{FP16_MAX / max(worst, 1e-30):.3g}x headroom below fp16's max "
                                f"{FP16_MAX:g}", "bf16 removes the question where the hardware has it",
                                "06"))
    return findings


def load_dtype_findings(config, precision, source, model_obj, peft) -> list[Finding]:
    """The dtype the weights train in against the precision flags. ``SFTTrainer`` loads a model path in
    float32 unless ``model_init_kwargs`` says otherwise; a model you load yourself with transformers 5's
    ``from_pretrained`` keeps the checkpoint's dtype. fp16 weights under ``fp16=True`` fail at the first
    step: the GradScaler refuses to unscale fp16 gradients (measured: ``ValueError: Attempting to unscale
    FP16 gradients.``). LoRA adapters train in float32 (peft upcasts them), so only full fine-tuning."""
    requested = (config.get("model_init_kwargs") or {}).get("dtype") or (
        config.get("model_init_kwargs") or {}).get("torch_dtype")
    if model_obj is not None and source is None:  # a (model, tokenizer) pair: its weights as they are
        dtype, how = str(next(model_obj.parameters()).dtype).removeprefix("torch."), "the model you pass"
    elif requested not in (None, "auto"):
        dtype, how = str(requested).removeprefix("torch."), "model_init_kwargs"
    else:
        stored = _checkpoint_dtype(source) if source is not None else None
        if requested == "auto":
            dtype, how = stored, "model_init_kwargs dtype='auto' (the checkpoint's)"
        else:
            if precision["fp16"] and peft is None and stored == "float16":
                return [Finding("info", "load-dtype", "SFTTrainer loads this float16 checkpoint in float32",
                                "a model path with no model_init_kwargs dtype: TRL loads float32, which fp16 "
                                "mixed precision needs; from_pretrained() yourself (transformers 5: the "
                                "checkpoint's dtype) gives float16 weights, and fp16 training then fails",
                                "load it with dtype=torch.float32 when you load it yourself", "06")]
            return []
    if dtype == "float16" and precision["fp16"] and peft is None:
        return [Finding("error", "load-dtype", "fp16=True on float16 weights fails at the first step",
                        f"the weights are float16 ({how}); full fine-tuning with fp16 mixed precision needs "
                        "float32 weights: the GradScaler raises 'ValueError: Attempting to unscale FP16 "
                        "gradients.'",
                        "load the model in float32 (model_init_kwargs={'dtype': 'float32'}, or "
                        "from_pretrained(..., dtype=torch.float32)), or train LoRA adapters", "06")]
    if dtype in ("float16", "bfloat16") and peft is None:
        # bf16=True / fp16=True autocast the compute; they add no float32 copy of weights stored in half
        # precision, so the optimizer's update is rounded to the weight's 8 (bf16) or 11 (fp16) bits
        flags = ("bf16=True changes the compute, not the storage" if precision["bf16"] else
                 "fp16=True changes the compute, not the storage" if precision["fp16"] else
                 f"with no precision flag the compute runs in {dtype} too")
        return [Finding("warning", "load-dtype", f"full fine-tuning updates {dtype} weights: there are no "
                        "float32 master weights, and small updates round away",
                        f"the weights are {dtype} ({how}); {flags}; an "
                        "AdamW step smaller than ~1/256 of a weight leaves it unchanged (lesson 06 measures "
                        "the share of weights one small step moves, bf16 vs float32)",
                        "load the weights in float32 (model_init_kwargs={'dtype': 'float32'}, SFTTrainer's "
                        "default for a model path, or from_pretrained(..., dtype=torch.float32)) and train "
                        "with bf16=True; or train LoRA adapters (peft keeps them in float32)", "06")]
    return []
