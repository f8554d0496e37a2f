"""Load the course model: the embedded tiny Qwen2 by default, a real checkpoint when asked.

Used by every lesson. ``load_course_model()`` returns the ~0.6 M-parameter model that ships in
``course_utils/course_model`` (built by ``python -m course_utils.build_course_model``). Set
``COURSE_MODEL=Qwen/Qwen2.5-0.5B`` (a hub id or a local path) and ``COURSE_DEVICE=cuda`` to run the
same notebooks on a real model; nothing is downloaded unless you ask for such a model.
"""

from __future__ import annotations

import os
from pathlib import Path

COURSE_MODEL_DIR = Path(__file__).parent / "course_model"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def course_seed() -> int:
    """The seed every lesson's randomness comes from: ``$COURSE_SEED``, default 0.

    The one place the seed is read, so that ``make robustness`` can rerun every lesson with other
    data, initialisations and orders, and a claim that holds only for seed 0 shows up.
    """
    raw = os.environ.get("COURSE_SEED", "0").strip() or "0"
    try:
        seed = int(raw)
    except ValueError:
        seed = -1
    if seed < 0:
        raise ValueError(f"COURSE_SEED={raw!r} is not a non-negative integer — it seeds every lesson's data, "
                         "initialisation and order — set e.g. COURSE_SEED=1, or unset it for 0.")
    return seed


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _resolve_device(device: str | None) -> str:
    import torch

    device = device or os.environ.get("COURSE_DEVICE") or "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} but torch sees no CUDA GPU (torch {torch.__version__}) — a CPU build "
            "of torch or no driver — use device='cpu' (the course model trains in seconds on a CPU), "
            "or install a CUDA build of torch as the README explains."
        )
    return device


def _resolve_source(name_or_path) -> Path | str:
    source = name_or_path
    if source is None:  # "" is a mistake to report, not a request for the default
        source = os.environ.get("COURSE_MODEL") or COURSE_MODEL_DIR
    if not isinstance(source, (str, Path)) or not str(source).strip():
        raise ValueError(
            f"name_or_path={name_or_path!r} is not a path or hub id — the loader needs to know where "
            "the weights are — pass None for the embedded course model, a local directory, or a hub "
            "id such as 'Qwen/Qwen2.5-0.5B'."
        )
    path = Path(source).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ValueError(
                f"{path} exists but has no config.json — it is not a saved transformers model — "
                "point at the directory that save_pretrained() wrote."
            )
        return path
    if source == COURSE_MODEL_DIR:
        raise FileNotFoundError(
            f"the embedded course model is missing from {COURSE_MODEL_DIR} — it ships with the "
            "repository — restore it with `git checkout course_utils/course_model` or rebuild it "
            "with `python -m course_utils.build_course_model`."
        )
    return str(source)  # a hub id: from the cache when offline, else downloaded by transformers


def _not_available_offline(source) -> ValueError:
    return ValueError(
        f"{source!r} is not a local directory nor in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids "
        "downloading it — a hub id needs the network once — run with HF_HUB_OFFLINE=0 (e.g. `make lab "
        "HF_HUB_OFFLINE=0 COURSE_MODEL=...`), or unset COURSE_MODEL and call load_course_model() to use "
        "the embedded course model, or pass a local path."
    )


def load_course_model(name_or_path=None, device: str | None = None, **model_kwargs):
    """Return ``(model, tokenizer)``.

    ``name_or_path``: ``None`` for the embedded course model (or ``$COURSE_MODEL`` when set), a
    local directory, or a hub id. ``device``: ``"cpu"``, ``"cuda"``… (default ``$COURSE_DEVICE``
    or ``"cpu"``). Extra keyword arguments go to ``AutoModelForCausalLM.from_pretrained`` (e.g.
    ``quantization_config`` in lesson 06). The model comes back in eval mode, as
    ``from_pretrained`` leaves it; call ``model.train()`` before a hand-written training loop.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _resolve_source(name_or_path)
    device = _resolve_device(device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as exc:  # transformers' "couldn't connect / not in cache" for a hub id
        if isinstance(source, str) and _offline():
            raise _not_available_offline(source) from exc
        raise
    if "device_map" not in model_kwargs:
        model_kwargs["device_map"] = device
    model = AutoModelForCausalLM.from_pretrained(source, **model_kwargs)
    if tokenizer.pad_token is None:  # real base checkpoints may lack one; Qwen2.5 pads with eos
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def token_id(tokenizer, token: str) -> int:
    """The id of a single token string, or a what/why/fix error if the vocabulary lacks it."""
    ids = tokenizer.convert_tokens_to_ids([token])
    if not ids or ids[0] is None or (ids[0] == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ValueError(
            f"{token!r} is not a token of this tokenizer — it would be split into pieces or "
            f"mapped to unk — check the spelling, e.g. one of {SPECIAL_TOKENS}."
        )
    return ids[0]
