"""Load the course model (a shipped tiny one by default, a real checkpoint when asked) and the seed.

Used by every lesson. ``load_course_model()`` returns one of the two small models that ship in
the repository (built by ``python -m tools.build_course_model``), chosen by ``COURSE_MODEL``:

- ``tiny-qwen`` (default): Qwen2 architecture, ~0.6 M parameters, ``course_utils/course_model``;
- ``tiny-llama``: Llama architecture, other width/depth and its own BPE vocabulary trained on other
  text, ``course_utils/course_model_llama``. Both carry Qwen2.5's special tokens and chat template,
  so every lesson applies to both; a claim that holds on both is not a property of one model.

``COURSE_MODEL`` may also be a local directory or a hub id (``Qwen/Qwen2.5-0.5B``; with
``COURSE_DEVICE=cuda`` for a GPU); nothing is downloaded unless you ask for such a model.
``course_seed()`` reads ``COURSE_SEED`` (default 0): the one place a lesson's randomness comes from.
``is_instruct_checkpoint`` / ``load_base_checkpoint``: whether a checkpoint ships the instruct stop convention
(eos = the end of a turn), and the model as a base checkpoint for the lessons whose failure is a base's.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

from . import validate
from .quiet import no_progress_bars

COURSE_MODEL_DIR = Path(__file__).parent / "course_model"
# Short names a learner can put in COURSE_MODEL; the first is the default.
SHIPPED_MODELS = {
    "tiny-qwen": COURSE_MODEL_DIR,
    "tiny-llama": Path(__file__).parent / "course_model_llama",
}
DEFAULT_MODEL = "tiny-qwen"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _resolve_device(device: str | None) -> str:
    import torch

    if device is not None and (not isinstance(device, str)
                               or not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device)):
        raise ValueError(f"device={device!r} is not a device name — torch takes 'cpu', 'cuda', 'cuda:N' or "
                         "'mps', and the course will not guess (an int 0 once loaded on the CPU silently) — "
                         "pass device='cuda:0' for the first GPU, or leave it out (COURSE_DEVICE, else CPU).")
    device = device or os.environ.get("COURSE_DEVICE") or "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} but torch sees no CUDA GPU (torch {torch.__version__}) — a CPU build "
            "of torch or no driver — use device='cpu' (the course model trains in seconds on a CPU), "
            "or install a CUDA build of torch as the README explains."
        )
    return device


def _requested_model(name_or_path):
    """What the caller asked for: the argument, else ``$COURSE_MODEL``, else the default name — a non-blank
    string or a path (``""`` is a mistake to report, not a request for the default)."""
    source = (os.environ.get("COURSE_MODEL") or DEFAULT_MODEL) if name_or_path is None else name_or_path
    if not isinstance(source, (str, Path)) or not str(source).strip():
        raise ValueError(
            f"name_or_path={name_or_path!r} is not a path or hub id — the loader needs to know where "
            f"the weights are — pass None for the default course model, a shipped name "
            f"({', '.join(SHIPPED_MODELS)}), a local directory, or a hub id such as 'Qwen/Qwen2.5-0.5B'."
        )
    return source


_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")  # what only a filesystem path starts with


def model_source(name_or_path=None) -> Path | str:
    """Where ``name_or_path`` loads from: a shipped model's directory (by short name or path), a local
    directory holding a ``config.json``, or a hub id (a ``str``: the cache when offline). ``None`` is
    ``$COURSE_MODEL`` or the default course model. Raises ``ValueError`` for what is neither."""
    source = _requested_model(name_or_path)
    shipped = SHIPPED_MODELS.get(source) if isinstance(source, str) else None
    if shipped is not None or Path(source) in SHIPPED_MODELS.values():
        shipped = shipped or Path(source)
        if not (shipped / "config.json").exists():
            raise FileNotFoundError(
                f"the shipped course model is missing from {shipped} — it ships with the repository "
                "— restore it with `git checkout course_utils/` or rebuild it with "
                "`python -m tools.build_course_model`."
            )
        return shipped
    path = Path(source).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ValueError(
                f"{path} exists but has no config.json — it is not a saved transformers model — "
                "point at the directory that save_pretrained() wrote."
            )
        return path
    if isinstance(source, Path) or source.startswith(_PATH_PREFIXES):
        given = f"name_or_path={str(source)!r}" if name_or_path is not None else f"COURSE_MODEL={source!r}"
        raise ValueError(
            f"{given} is a filesystem path and nothing is there ({path.resolve()}) — a hub id is "
            "'org/name', so it would be looked up on the hub and fail with a download error instead — check "
            "the path, or save the model there first (model.save_pretrained(path))."
        )
    return str(source)  # a hub id: from the cache when offline, else downloaded by transformers


def course_model_name(name_or_path=None) -> str:
    """Which model ``load_course_model(name_or_path)`` loads, as a short readable string.

    A shipped model's short name (``"tiny-qwen"``, ``"tiny-llama"``) — also when given by its
    directory — else the path or hub id as given. Notebooks print it, so a run says what it ran on. Refuses
    what ``model_source`` refuses as no path or hub id (``""``, a number).
    """
    source = _requested_model(name_or_path)
    if isinstance(source, str) and source in SHIPPED_MODELS:
        return source
    for name, directory in SHIPPED_MODELS.items():
        if isinstance(source, (str, Path)) and Path(source).expanduser().resolve() == directory.resolve():
            return name
    return str(source)


def course_seed() -> int:
    """The course's seed: ``$COURSE_SEED`` as a non-negative integer, 0 when unset.

    The single place a lesson's randomness (data, weight init, batch order) comes from, so that
    ``COURSE_SEED=1`` checks that no claim depends on one lucky draw.
    """
    raw = os.environ.get("COURSE_SEED", "").strip()
    if not raw:
        return 0
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(
            f"COURSE_SEED={raw!r} is not a non-negative integer — it seeds every lesson's data, "
            "initialisation and batch order — set it to e.g. COURSE_SEED=0, or unset it."
        )
    return int(raw)


def offline_error(source) -> ValueError | None:
    """The error to raise when loading ``source`` failed: a hub id while ``HF_HUB_OFFLINE`` is on gets a
    ValueError saying how to reach it; anything else ``None`` (the loader's own error stands)."""
    if not isinstance(source, (str, Path)) or not str(source).strip():
        raise TypeError(f"source={source!r:.60} is not what model_source() returns — a directory or a hub "
                        "id — pass model_source(name_or_path).")
    if not (isinstance(source, str) and _offline()):
        return None
    return ValueError(
        f"{source!r} is not a local directory nor in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids "
        "downloading it — a hub id needs the network once — run with HF_HUB_OFFLINE=0 (e.g. `make lab "
        "HF_HUB_OFFLINE=0 COURSE_MODEL=...`), or unset COURSE_MODEL and call load_course_model() to use "
        "the default course model (or COURSE_MODEL=tiny-llama), or pass a local path."
    )


def load_course_model(name_or_path=None, device: str | None = None, **model_kwargs):
    """Return ``(model, tokenizer)``.

    ``name_or_path``: ``None`` for ``$COURSE_MODEL`` (default ``"tiny-qwen"``), a shipped model's
    short name (``"tiny-qwen"``, ``"tiny-llama"``), a local directory, or a hub id.
    ``device``: ``"cpu"``, ``"cuda"``… (default ``$COURSE_DEVICE`` or ``"cpu"``). Extra keyword
    arguments go to ``AutoModelForCausalLM.from_pretrained`` (e.g. ``quantization_config`` in
    lesson 06). The model comes back in eval mode, as
    ``from_pretrained`` leaves it; call ``model.train()`` before a hand-written training loop.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import freeze_lesson_imports

    freeze_lesson_imports()  # a lesson kernel's first model: the imports before it are frozen (see there)
    source = model_source(name_or_path)
    device = _resolve_device(device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as exc:  # transformers' "couldn't connect / not in cache" for a hub id
        offline = offline_error(source)
        if offline is not None:
            raise offline from exc
        raise
    if "device_map" not in model_kwargs:
        model_kwargs["device_map"] = device
    # A local directory loads in a blink: no "Loading weights" bar in the notebook. A hub id keeps it.
    with no_progress_bars(datasets=False) if isinstance(source, Path) else contextlib.nullcontext():
        model = AutoModelForCausalLM.from_pretrained(source, **model_kwargs)
    if tokenizer.pad_token is None:  # real base checkpoints may lack one; Qwen2.5 pads with eos
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def token_id(tokenizer, token: str) -> int:
    """The id of a single token string, or a what/why/fix error if the vocabulary lacks it."""
    validate.tokenizer("tokenizer", tokenizer)
    if not isinstance(token, str) or not token:
        raise TypeError(f"token must be a non-empty string, got {token!r} — it is looked up in the "
                        "vocabulary — pass e.g. '<|im_end|>'.")
    ids = tokenizer.convert_tokens_to_ids([token])
    if not ids or ids[0] is None or (ids[0] == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ValueError(
            f"{token!r} is not a token of this tokenizer — it would be split into pieces or "
            f"mapped to unk — check the spelling, e.g. one of {SPECIAL_TOKENS}."
        )
    return ids[0]


# ------------------------------------------------------------------------------------------------
# The checkpoint's stop convention: base (eos ends the document) or instruct (eos ends the turn). Lessons
# 02, 04, 08, 09 and 10 read it: the core.
# ------------------------------------------------------------------------------------------------

# The end-of-document tokens of the families the course names: Qwen and GPT-2, Llama 2 and Mistral,
# Llama 3, Gemma. A base checkpoint's eos is one of these.
DOCUMENT_ENDS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
# Where a reply's text ends: the template's end of turn or an end of document, whichever the vocabulary has
# (a Llama-style one ends documents with "</s>" and has no "<|endoftext|>").
REPLY_ENDS = ("<|im_end|>", *DOCUMENT_ENDS)


def is_instruct_checkpoint(tokenizer) -> bool:
    """True when the tokenizer's eos *is* the chat template's end-of-turn token: the instruct convention
    (Qwen2.5-Instruct ships eos = ``<|im_end|>``), under which ``generate()`` already stops at the end of a
    turn. A base checkpoint's eos ends the *document* (Qwen2.5 base: ``<|endoftext|>``): lesson 02's
    never-stopping model is a fine-tuned base checkpoint."""
    from .data import end_of_turn_token  # here: this module stays free of torch (the doctor's data checks)

    validate.tokenizer("tokenizer", tokenizer)
    try:
        eot = tokenizer.convert_tokens_to_ids(end_of_turn_token(tokenizer))
    except ValueError:  # no template, or turns that end in plain text: no end-of-turn token to stop on
        return False
    return tokenizer.eos_token_id is not None and tokenizer.eos_token_id == eot


def _document_end(tokenizer) -> str | None:
    """The instruct checkpoint's end-of-document token: its pad when that is a token of its own
    (Qwen2.5-Instruct pads with ``<|endoftext|>``), else the first of ``DOCUMENT_ENDS`` it has."""
    if tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id \
            and tokenizer.pad_token in DOCUMENT_ENDS:
        return tokenizer.pad_token
    vocab = tokenizer.get_vocab()
    return next((t for t in DOCUMENT_ENDS if t in vocab), None)


def give_base_convention(model, tokenizer) -> bool:
    """Give an instruct-convention checkpoint the base one, in place: eos = its end-of-document token in the
    tokenizer, ``model.config`` and ``generation_config``. Returns whether anything changed (a base
    checkpoint is left as it is).

    For a lesson that reproduces a base checkpoint's failure on whatever ``COURSE_MODEL`` holds: the
    failure is planted, as the course plants every other, instead of silently missing."""
    validate.model("model", model)
    if not is_instruct_checkpoint(tokenizer):
        return False
    end = _document_end(tokenizer)
    if end is None:
        raise ValueError(f"this instruct checkpoint (eos = {tokenizer.eos_token!r}, the end of a turn) has "
                         f"no end-of-document token ({', '.join(DOCUMENT_ENDS)}) — a base checkpoint stops "
                         "on one — point COURSE_MODEL at the base checkpoint of the family instead.")
    tokenizer.eos_token = end
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    return True


_BASE_COPIES: dict[str, str] = {}   # instruct checkpoint -> the directory of its base-convention copy


def load_base_checkpoint(name_or_path=None):
    """``load_course_model(name_or_path)`` as a *base* checkpoint: ``(model, tokenizer)``; lessons that start
    from a base checkpoint load it with this.

    When the checkpoint ships the instruct convention, a copy with the base one (``give_base_convention``)
    is saved once per process, one line says so, and the model comes from that copy: whatever reloads it by
    path (an adapter's ``base_model_name_or_path``, lesson 10) gets the base convention too."""
    model, tokenizer = load_course_model(name_or_path)
    if not is_instruct_checkpoint(tokenizer):
        return model, tokenizer
    source = str(model.name_or_path)
    if source not in _BASE_COPIES:
        instruct_eos = tokenizer.eos_token
        give_base_convention(model, tokenizer)
        directory = tempfile.mkdtemp(prefix="base-convention-")
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        _BASE_COPIES[source] = directory
        print(f"this checkpoint ships the instruct convention (eos = {instruct_eos}, the end of a turn): "
              f"the lesson uses a copy with the base one (eos = {tokenizer.eos_token}), as a base checkpoint "
              f"ships, saved in {directory}.")
    return load_course_model(_BASE_COPIES[source])


# The reasoning and tool-call markers of Qwen3's tokenizer (lesson 09). There they are added tokens with
# special=False: single ids that decode as text, kept by skip_special_tokens — a reasoning parser reads them.
REASONING_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>",
                    "<tool_response>", "</tool_response>")


def add_reasoning_tokens(model, tokenizer) -> list[int]:
    """Give ``(model, tokenizer)`` Qwen3's reasoning and tool-call tokens (``REASONING_TOKENS``) as single
    added tokens, and grow the embeddings by one row each; returns the new ids. Changes both in place.

    Why a function and not a rebuilt course model: every other lesson loads the shipped models as they
    are, and their outputs depend on the vocabulary; lesson 09 adds the tokens on its own copy. This is
    also what a practitioner does to teach a base model to reason: ``add_tokens`` + resize. Each new row
    starts as the **mean of the rows of the pieces the old tokenizer spelled it with** (``<think>`` was
    ``<``, ``t``, ``h``, ``ink``, ``>``), in the input embedding and — where it is a separate matrix — the
    output head: a row near what the model already read there, instead of a random one that makes the
    new token's logit arbitrary (transformers' ``mean_resizing`` uses the mean of *all* rows instead).
    Deterministic: no random draw. Tokens the tokenizer already has are left alone (calling it twice is
    harmless).
    """
    import torch
    from tokenizers import AddedToken

    validate.model("model", model)
    validate.tokenizer("tokenizer", tokenizer)
    validate.model_and_tokenizer(model, tokenizer)
    new = [t for t in REASONING_TOKENS if t not in tokenizer.get_vocab()]
    if not new:
        return [tokenizer.convert_tokens_to_ids(t) for t in REASONING_TOKENS]
    pieces = {t: tokenizer(t, add_special_tokens=False)["input_ids"] for t in new}  # before they exist
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in new])
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    matrices = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight is not matrices[0]:  # untied (tiny-llama): the head gets its own mean
        matrices.append(head.weight)
    with torch.no_grad():
        for token, ids in pieces.items():
            row = tokenizer.convert_tokens_to_ids(token)
            for weight in matrices:
                weight[row] = weight[ids].mean(dim=0)
    return [tokenizer.convert_tokens_to_ids(t) for t in REASONING_TOKENS]
