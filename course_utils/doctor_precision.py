"""The doctor's precision measurements (private helpers of ``course_utils.doctor``): will fp16 overflow on
*this* set-up, and do the weights' dtype and the precision flags fit together? (Lesson 06's mechanisms,
applied to a practitioner's checkpoint.)

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
import warnings
from pathlib import Path

import torch

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

    from .quiet import no_progress_bars

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


def _peft_config_from(fields: dict):
    """A ``peft.LoraConfig`` from a dict of its fields (what a practitioner passes to
    ``SFTTrainer(peft_config=...)``); ``task_type`` defaults to causal LM."""
    from peft import LoraConfig

    return LoraConfig(**{"task_type": "CAUSAL_LM", **fields})
