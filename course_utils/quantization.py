"""4-bit (bitsandbytes nf4) loading, and whether this machine's 4-bit kernel can be trusted for a model.

Lessons 06 (QLoRA's NaN family) and 10 (shipping a QLoRA run) load the course model in nf4 the way a QLoRA
run does (``nf4_config``). Before a lesson or the ship check compares a 4-bit model with anything, it asks
``unsound_4bit_widths``: bitsandbytes 0.50.2's CPU kernel dequantizes an nf4 weight wrongly when the layer's
``in_features`` is not a multiple of the 64-value quantisation block (tiny-llama's 96; measured ~27 %
relative weight error instead of nf4's ~9 %, a next-token KL of ~0.9 nats against the float32 model where
tiny-qwen's width 128 gives ~0.03). Real checkpoints' widths are multiples of 64 (Qwen2.5-0.5B: 896), so a
real run never meets it; a test model of odd width does, and then a 4-bit reference is not the model a
GPU would train. The check is a measurement, not a version list: a fixed kernel passes it.
"""

from __future__ import annotations

import difflib

import torch

from . import validate

NF4_BLOCK = 64  # transformers' BitsAndBytesConfig quantises 4-bit weights in blocks of 64 values


def nf4_config(compute_dtype=torch.float32):
    """The ``BitsAndBytesConfig`` of the course's QLoRA set-up: nf4 weights, matmuls in ``compute_dtype``
    (``bnb_4bit_compute_dtype``; float32 by default: a CPU has no fast half-precision matmul)."""
    from transformers import BitsAndBytesConfig

    if not isinstance(compute_dtype, torch.dtype) or not compute_dtype.is_floating_point:
        raise ValueError(f"compute_dtype={compute_dtype!r} is not a floating torch dtype — it is the dtype "
                         "each 4-bit layer dequantises to and multiplies in — pass torch.float32 or "
                         "torch.bfloat16.")
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=compute_dtype)


def nf4_dequantizes_exactly(in_features: int, device="cpu") -> bool:
    """Whether bitsandbytes, on ``device``, gives back the nf4 values it stored for a weight with
    ``in_features`` columns. The same numbers are quantised twice, as rows of 64 (one block per row) and as
    rows of ``in_features`` (blocks that run across rows): the blocks are the same 64 values either way, so a
    sound kernel dequantises both to the same numbers, bit for bit. A kernel that reads blocks row by row
    (bitsandbytes 0.50.2 on CPU) does not, unless ``in_features`` is a multiple of 64."""
    import bitsandbytes.functional as F

    validate.positive_int("in_features", in_features, why="it is a 4-bit layer's input width")
    device = _device(device)
    values = torch.randn(NF4_BLOCK * in_features, generator=torch.Generator().manual_seed(0)).to(device)
    as_blocks, as_rows = (F.dequantize_4bit(*F.quantize_4bit(values.view(-1, width), blocksize=NF4_BLOCK,
                                                            quant_type="nf4")).flatten()
                          for width in (NF4_BLOCK, in_features))
    return torch.equal(as_blocks, as_rows)


def _device(device) -> torch.device:
    """``device`` (a name such as ``"cpu"`` or ``"cuda:0"``, or a ``torch.device``) that exists here: a typo,
    a blank or a device this machine lacks is named, not torch's error from deep inside ``.to()``."""
    if not isinstance(device, (str, torch.device)) or (isinstance(device, str) and not device.strip()):
        raise TypeError(f"device={device!r} is not a device name — the test values are moved there and "
                        "quantised by that device's kernel — pass e.g. device='cpu' or 'cuda:0' (a str or a "
                        "torch.device).")
    try:
        device = torch.device(device)
        torch.empty(0, device=device)  # a device this machine has
    except (RuntimeError, ValueError, AssertionError) as error:  # a CPU-only torch asserts on "cuda"
        kind = str(device).split(":")[0]
        close = difflib.get_close_matches(kind, ("cpu", "cuda", "mps", "xpu"), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close and close[0] != kind else ""
        raise ValueError(f"device={str(device)!r} cannot be used here{hint} — torch says: "
                         f"{str(error).splitlines()[0][:120]} — pass 'cpu', or a device torch sees "
                         "(torch.cuda.is_available()).") from None
    return device


def unsound_4bit_widths(model) -> list[int]:
    """The ``in_features`` of ``model``'s 4-bit layers that bitsandbytes dequantises wrongly on the model's
    device (``nf4_dequantizes_exactly``); ``[]`` for a model without 4-bit layers or a sound kernel. A
    non-empty list means the 4-bit model computes with other weights than the ones it stored: compare it
    with nothing on this machine."""
    validate.model("model", model)
    widths = {}
    for module in model.modules():
        if type(module).__name__ == "Linear4bit":
            widths.setdefault(module.in_features, module.weight.device)
    return sorted(w for w, device in widths.items() if not nf4_dequantizes_exactly(w, device))
