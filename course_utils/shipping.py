"""Lesson 10 (the fix that did not ship): what a saved model directory holds, how a user or a serving
stack loads it, and whether that model is the one you trained.

A run can be healthy and the model a user downloads still broken: what was fixed in memory is not what
was written to disk. ``PeftModel.save_pretrained`` writes the adapter and its config only — no
``generation_config.json`` — so an end-of-turn fix made through ``SFTConfig(eos_token=...)`` stays in
memory; a LoRA-only loader drops the embedding rows ``modules_to_save`` trained; a model saved in bf16
loads in bf16 under transformers 5's ``dtype="auto"``. This module measures each:

- ``saved_files(directory)``: what is on disk, as a practitioner reads it — the files, the kind
  (``"adapter"`` or ``"full"``), the eos ids of its own ``generation_config.json``, the dtype, the
  quantization, the tied embeddings, the tokenizer and chat template.
- ``load_saved(directory, base=None)``: load it as a user or a server does — an adapter on its base
  (peft uses the *base's* ``generation_config``; an adapter directory's own ``generation_config.json``
  is not read; the base is resized to the adapter's tokenizer, as ``AutoPeftModelForCausalLM`` does), a
  full directory with ``dtype="auto"`` (and its ``quantization_config``, if any).
- ``end_of_turn_after_final(tokenizer)`` / ``user_turn_header(tokenizer)``: the stop token a reply must
  end on, taken after the *final* message (gpt-oss: ``<|return|>``, not ``<|end|>``), and the text that
  opens a new user turn (``<|start_header_id|>user<|end_header_id|>``, not ``<|begin_of_text|>``).
- ``lora_only_copy(adapter_dir, out_dir)``: the adapter as a loader that keeps only the LoRA matrices
  sees it (no ``modules_to_save``).
- ``logit_drift(reference, model, batches)``: max |Δlogit|, the mean next-token KL and the greedy
  agreement on real tokens.
- ``ship_report(trained_model, trained_tokenizer, saved_dir)``: the ship check — one finding per question
  (files, stopping, served prompt, precision, token rows, dtype), each ``pass`` / ``warn`` / ``fail`` (or
  ``could-not-measure``) with what / why / fix. ``python -m course_utils.ship --trained DIR --saved DIR``
  runs it from a shell (exit 0 no failure, 1 a failure, 2 an input it cannot load).

The exercises' checkers (a ``save_for_serving`` to write, saved directories to diagnose) are in
``course_utils.exercises.lesson10``; the reference answers in ``course_utils.exercises.answers.lesson10``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import validate
from .data import first_special_after, make_messages
from .quantization import nf4_config, unsound_4bit_widths

# max |Δlogit| of a faithful float32 copy. Merging a LoRA adapter into the float32 base and reloading moves
# logits by ~2e-5 (round-off of W + BA). Lesson 10 uses it to show what round-off alone does; the ship check
# does not decide on it (a correct bf16 save moves logits by ~0.2 and serves the same replies).
LOGIT_TOLERANCE = 1e-3
# What a user feels decides the precision finding: the mean next-token KL (nats per token) and the share of
# positions where the greedy (argmax) token agrees, on the probe chats. Per served precision, the defaults
# sit far above what rounding alone costs and far below a model that is not the trained one (measured on
# the course models, tests/test_shipping.py: a bf16 save ~1e-5 nats, a QLoRA run merged into a bf16 base
# ~1e-3; an adapter served without its trained rows ~5 nats; another seed of the same recipe ~0.09).
# The looser of the trained and the served precision's applies (a QLoRA reference is itself 4-bit).
PRECISION_TOLERANCE = {"float32": (1e-3, 0.95), "bfloat16": (1e-2, 0.9), "float16": (1e-2, 0.9),
                       "4-bit": (3e-2, 0.85), "8-bit": (3e-2, 0.85)}
STOP_SLACK = 0.1  # the saved model may stop on this fraction fewer probe prompts than the trained one
REFERENCE_STOPS = 0.5  # below this stop rate the reference itself does not stop: stopping cannot be compared
PROBE_SEED = 9_000  # probe conversations no lesson trains on
ADAPTER_FILES = ("adapter_config.json",)
FULL_FILES = ("config.json",)
VERDICTS = ("pass", "warn", "fail", "could-not-measure")


@dataclass(frozen=True)
class ShipFinding:
    """One question of the ship report: its ``verdict`` (one of ``VERDICTS``), ``what`` was measured, ``why``
    it matters, and the ``fix`` (empty when it passes)."""

    check: str
    verdict: str
    what: str
    why: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        """No failure: ``pass``, ``warn`` or ``could-not-measure``."""
        return self.verdict != "fail"

    @property
    def detail(self) -> str:
        return self.what

    def __str__(self) -> str:
        text = f"[{self.verdict.upper()}] {self.check}: {self.what}"
        if self.verdict != "pass":
            text += f"\n       why: {self.why}" if self.why else ""
            text += f"\n       fix: {self.fix}" if self.fix else ""
        return text


class ShipInputError(ValueError):
    """The ship check cannot run on what it was given (not a model directory, a base it cannot find, an
    adapter that does not fit its base)."""


# ------------------------------------------------------------------------------------------------
# What is on disk
# ------------------------------------------------------------------------------------------------

def _directory(name: str, value) -> Path:
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise TypeError(f"{name}={value!r} is not a directory path — the helper reads the files a "
                        "save_pretrained() wrote there — pass the directory, e.g. trainer.args.output_dir.")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ShipInputError(f"{name}={str(path)!r} is not a directory — there is nothing to load — pass the "
                             "directory save_pretrained() / trainer.save_model() wrote.")
    if not any((path / f).exists() for f in (*ADAPTER_FILES, *FULL_FILES)):
        raise ShipInputError(f"{name}={str(path)!r} holds neither config.json nor adapter_config.json "
                             f"(files: {sorted(p.name for p in path.iterdir())[:8]}) — it is not a saved "
                             "model — point at the directory that save_pretrained() wrote.")
    return path


def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ShipInputError(f"{str(path)!r} is not valid JSON ({exc}) — a loader would fail on it too — "
                             "write it again with save_pretrained().") from None
    return value if isinstance(value, dict) else None


def _eos_list(eos) -> list[int]:
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def _quantization(config: dict) -> str | None:
    """``"4-bit"`` / ``"8-bit"`` (bitsandbytes), another ``quant_method``, or None: read from config.json."""
    q = config.get("quantization_config")
    if not q:
        return None
    if q.get("load_in_4bit") or q.get("_load_in_4bit"):
        return "4-bit"
    if q.get("load_in_8bit") or q.get("_load_in_8bit"):
        return "8-bit"
    return str(q.get("quant_method", "quantized"))


def embedding_modules(model) -> list[str]:
    """The module paths of ``model``'s input embedding and output head, in that order, e.g.
    ``["model.embed_tokens", "lm_head"]`` (Llama, Qwen) or ``["gpt_neox.embed_in", "lm_head"]`` (GPT-NeoX).

    ``LoraConfig(modules_to_save=...)`` takes their last parts: peft matches a module by the end of its path,
    and a name from another architecture matches nothing, silently — the run then trains no full row."""
    model = validate.model("model", model)
    getter = getattr(model, "get_input_embeddings", None)
    inputs, head = (getter(), model.get_output_embeddings()) if callable(getter) else (None, None)
    if inputs is None or head is None:
        raise ValueError(f"model ({type(model).__name__}) has no input embedding or no output head — the "
                         "rows of both are what modules_to_save trains — pass a causal LM "
                         "(AutoModelForCausalLM, or a peft model of one).")
    paths = {id(m): name for name, m in model.named_modules()}
    return [paths[id(inputs)], paths[id(head)]]


def saved_files(directory) -> dict:
    """What a saved model directory holds, as a practitioner reads it.

    Returns ``files`` (sorted names), ``kind`` (``"adapter"`` when it has ``adapter_config.json``, else
    ``"full"``), ``base`` (an adapter's ``base_model_name_or_path``), ``modules_to_save`` (an adapter's
    fully saved modules), ``generation_eos`` (the ``eos_token_id`` of the directory's own
    ``generation_config.json``, None without one), ``has_weights``, ``has_tokenizer`` /
    ``has_chat_template``, and from a full directory's ``config.json``: ``dtype``, ``quantization``
    (``"4-bit"``, ``"8-bit"`` or None) and ``tie_word_embeddings``.
    """
    path = _directory("directory", directory)
    files = sorted(p.name for p in path.iterdir())
    adapter = _read_json(path / "adapter_config.json")
    config = _read_json(path / "config.json") or {}
    generation = _read_json(path / "generation_config.json")
    tokenizer_config = _read_json(path / "tokenizer_config.json") or {}
    weights = [f for f in files if f.endswith((".safetensors", ".bin")) and f != "training_args.bin"]
    return {
        "files": files,
        "kind": "adapter" if adapter is not None else "full",
        "base": (adapter or {}).get("base_model_name_or_path"),
        "modules_to_save": (adapter or {}).get("modules_to_save"),
        "generation_eos": None if generation is None else _eos_list(generation.get("eos_token_id")),
        "has_weights": bool(weights),
        "has_tokenizer": "tokenizer.json" in files or "tokenizer_config.json" in files,
        "has_chat_template": "chat_template.jinja" in files or "chat_template" in tokenizer_config,
        "dtype": config.get("dtype", config.get("torch_dtype")),
        "quantization": _quantization(config),
        "tie_word_embeddings": config.get("tie_word_embeddings"),
    }


# ------------------------------------------------------------------------------------------------
# The template's end of turn and its turn header
# ------------------------------------------------------------------------------------------------

_PROBE_ANSWER, _PROBE_NEXT = "Fine, thank you.", "And tomorrow?"


def end_of_turn_after_final(tokenizer) -> int | None:
    """The id of the special token the template writes right after the *final* assistant message (what a
    reply must end on, so what generation must stop on): ``<|im_end|>`` for ChatML, ``<|eot_id|>`` for
    Llama 3, ``<end_of_turn>`` for Gemma, ``<|return|>`` for gpt-oss (whose *earlier* turns end with
    ``<|end|>``, a token a harmony reply writes before its final channel). ``None`` when the template ends
    that turn with plain text. The doctor takes the stop token the same way."""
    validate.tokenizer("tokenizer", tokenizer)
    text = _render(tokenizer, [{"role": "user", "content": "How are you?"},
                               {"role": "assistant", "content": _PROBE_ANSWER}])
    if text is None or _PROBE_ANSWER not in text:
        return None
    return first_special_after(tokenizer, text[text.rindex(_PROBE_ANSWER) + len(_PROBE_ANSWER):])


def user_turn_header(tokenizer) -> str | None:
    """The text that opens a new *user* turn in the template (``<|im_start|>user``,
    ``<|start_header_id|>user<|end_header_id|>``, ``<start_of_turn>user``, ``<|start|>user<|message|>``):
    a reply that writes it before it stops invented the user's next message. Taken from the template's
    own rendering of a second user turn — not the first special token of a prompt, which is
    ``<|begin_of_text|>`` / ``<bos>`` on Llama 3 and Gemma. ``None`` when it cannot be rendered."""
    validate.tokenizer("tokenizer", tokenizer)
    text = _render(tokenizer, [{"role": "user", "content": "How are you?"},
                               {"role": "assistant", "content": _PROBE_ANSWER},
                               {"role": "user", "content": _PROBE_NEXT}])
    if text is None or _PROBE_NEXT not in text or _PROBE_ANSWER not in text:
        return None
    between = text[text.rindex(_PROBE_ANSWER) + len(_PROBE_ANSWER):text.rindex(_PROBE_NEXT)]
    closing = first_special_after(tokenizer, between)
    if closing is not None:  # drop the token that closed the assistant turn: the header follows it
        token = tokenizer.convert_ids_to_tokens(closing)
        between = between[between.index(token) + len(token):]
    return between.strip() or None


def _render(tokenizer, messages, **kwargs) -> str | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception:  # noqa: BLE001 — a template that rejects the probe chat: nothing to read from it
        return None


# ------------------------------------------------------------------------------------------------
# Loading it as a user or a server does
# ------------------------------------------------------------------------------------------------

def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _base_source(path: Path, base) -> str:
    """Where an adapter's base is: ``base`` if given, else its config's ``base_model_name_or_path``."""
    recorded = (_read_json(path / "adapter_config.json") or {}).get("base_model_name_or_path")
    source = base if base is not None else recorded
    if not source:
        raise ShipInputError(f"the adapter in {str(path)!r} names no base model and none was given — an "
                             "adapter is only the difference to a base — pass "
                             "base=<the base model's directory> (--base DIR).")
    local = Path(source).expanduser()
    if local.is_dir():
        if not (local / "config.json").exists():
            raise ShipInputError(f"the base {str(local)!r} has no config.json — the adapter needs the full "
                                 "base model — pass the directory the base was saved to (--base DIR).")
        return str(local)
    if _offline() and not (local.is_absolute() or str(source).startswith((".", "~"))):
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(str(source), "config.json"), str):
            return str(source)  # a hub id in the local cache: loads offline
    if local.is_absolute() or str(source).startswith((".", "~")) or _offline():
        raise ShipInputError(f"the adapter's base {source!r} cannot be found here (not a local directory, "
                             "and HF_HUB_OFFLINE forbids a download) — a server would fail the same way — "
                             "pass the base's local directory with base=... (--base DIR).")
    return str(source)


def _adapter_vocab(path: Path, embedding: str) -> int | None:
    """Rows of the input embedding (its module's last name, ``embedding``) the adapter saved in full
    (``modules_to_save``), if it saved one."""
    from safetensors import safe_open

    weights = path / "adapter_model.safetensors"
    if not weights.exists():
        return None
    with safe_open(str(weights), "pt") as f:
        rows = [f.get_slice(k).get_shape()[0] for k in f.keys()
                if f".{embedding}." in f".{k}" and "lora_" not in k and k.endswith("weight")]
    return max(rows) if rows else None


def load_saved(directory, base=None, *, dtype="auto", quantization: str | None = None):
    """``(model, tokenizer)`` as a user or a serving stack loads ``directory``, ready to run.

    An adapter directory: the base (``base``, else the adapter config's ``base_model_name_or_path``)
    resized to the adapter's tokenizer when it has more tokens (what ``AutoPeftModelForCausalLM`` does),
    with ``PeftModel.from_pretrained`` on top — whose ``generation_config`` is the *base's*: peft does not
    read a ``generation_config.json`` saved beside the adapter. The tokenizer comes from the directory
    when it has one, else from the base. ``quantization="nf4"`` loads the base in 4-bit, as a QLoRA run
    trained it (the reference of a QLoRA run). A full directory: ``AutoModelForCausalLM.from_pretrained``
    with ``dtype`` (transformers 5's default ``"auto"``: the dtype the config states) and the
    ``quantization_config`` it carries. Anything a loader would fail on raises ``ShipInputError``.
    """
    path = _directory("directory", directory)
    if base is not None:
        _directory("base", base)
    if dtype != "auto" and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype={dtype!r} must be 'auto' or a torch dtype — it is what the weights are "
                        "loaded in — pass 'auto' (what transformers does by default) or e.g. torch.bfloat16.")
    if quantization not in (None, "nf4"):
        raise ValueError(f"quantization={quantization!r} is not known — the course's QLoRA set-up loads the "
                         "base in bitsandbytes nf4 — pass 'nf4' or None.")
    info = saved_files(path)
    if info["kind"] == "full" and (base is not None or quantization is not None):
        given = f"base={str(base)!r}" if base is not None else f"quantization={quantization!r}"
        raise ShipInputError(f"{given} was given, but {str(path)!r} holds a full model — a base (and its "
                             "quantization) is what an adapter is loaded on; a full model loads alone, and "
                             "the option would be ignored — leave it out (--base / --trained-base, "
                             "--trained-quantization), or point at the adapter directory.")
    if not info["has_weights"]:
        raise ShipInputError(f"{str(path)!r} holds no weights file (files: {info['files'][:8]}) — there is "
                             "no model to serve — save with save_pretrained() / trainer.save_model().")
    source = _base_source(path, base) if info["kind"] == "adapter" else None  # bad input fails first
    if info["kind"] == "full" and not info["has_tokenizer"]:
        raise ShipInputError(f"{str(path)!r} holds a full model but no tokenizer — a user cannot render a "
                             "prompt for it — save the tokenizer there too "
                             "(tokenizer.save_pretrained(directory)).")
    try:
        model, tokenizer = _load(path, info, source, dtype, quantization)
    except ShipInputError:
        raise
    except Exception as exc:  # noqa: BLE001 — a size mismatch, another architecture: a loader fails the same way
        what = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ShipInputError(f"{str(path)!r} cannot be loaded ({type(exc).__name__}: {what}) — a user or a "
                             "server would fail the same way — check that the adapter was trained on this "
                             "base (--base DIR) and that the directory holds what save_pretrained() "
                             "wrote.") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    _ready(model)
    return model, tokenizer


def _load(path: Path, info: dict, source: str | None, dtype, quantization: str | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer  # seconds to import: after the checks

    from .quiet import no_progress_bars, quiet_libraries

    # the loaders' notices (peft's tied-layer warning, loading bars): the report measures what they warn of
    with quiet_libraries(python_warnings=False), no_progress_bars():
        if info["kind"] == "full":
            return (AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype),
                    AutoTokenizer.from_pretrained(str(path)))
        from peft import PeftModel

        kwargs = {"quantization_config": nf4_config(), "device_map": "cpu"} if quantization == "nf4" else {}
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(path) if info["has_tokenizer"] else source)
        embedding = embedding_modules(model)[0].rsplit(".", 1)[-1]
        rows = _adapter_vocab(path, embedding) or len(tokenizer)
        if rows > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(rows)  # as AutoPeftModelForCausalLM does for an added-token adapter
        return PeftModel.from_pretrained(model, str(path)), tokenizer


def _quantized(model) -> bool:
    return any(type(m).__name__ in ("Linear4bit", "Linear8bitLt") for m in model.modules())


def _ready(model) -> None:
    """Inference mode. A bitsandbytes 4-bit model stays in train mode on the CPU (its LoRA dropout is 0):
    bitsandbytes 0.50.2 repacks eval-mode 4-bit weights on CPUs with AVX512-BF16 and then fails
    (lesson 06)."""
    model.train() if _quantized(model) else model.eval()


def lora_only_copy(adapter_dir, out_dir) -> Path:
    """Write ``adapter_dir`` to ``out_dir`` with only its LoRA matrices: what a loader that keeps LoRA
    weights and drops ``modules_to_save`` (fully trained embedding and head rows) serves. Returns
    ``out_dir``."""
    from safetensors.torch import load_file, save_file

    path = _directory("adapter_dir", adapter_dir)
    if saved_files(path)["kind"] != "adapter":
        raise ValueError(f"adapter_dir={str(path)!r} holds a full model, not an adapter — only an adapter "
                         "has LoRA matrices to keep — pass the directory trainer.save_model() wrote for a "
                         "LoRA run.")
    # never the adapter itself: the copy drops its modules_to_save rows, and they would be lost for good
    out = validate.new_directory("out_dir", out_dir, inputs=[path], what="the LoRA-only copy's files")
    out.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(path / "adapter_model.safetensors"))
    save_file({k: v for k, v in weights.items() if "lora_" in k}, str(out / "adapter_model.safetensors"))
    config = _read_json(path / "adapter_config.json")
    config["modules_to_save"] = None
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------------------
# Comparing with the trained model
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
def _logits(model, batches: list[dict]) -> torch.Tensor:
    device = next(model.parameters()).device
    return torch.cat([model(input_ids=b["input_ids"].to(device),
                            attention_mask=b["attention_mask"].to(device)).logits.float().cpu()
                      for b in batches])


def logit_drift(reference, model, batches) -> dict:
    """How far ``model``'s next-token distribution is from ``reference``'s on ``batches`` (real tokens only):
    ``max_abs`` (max |Δlogit|), ``kl`` (mean KL(reference ‖ model) in nats per token) and ``agreement``
    (the share of positions whose greedy, argmax, token is the same)."""
    validate.model("reference", reference)
    validate.model("model", model)
    batches = validate.batches("batches", batches, need=("input_ids", "attention_mask"))
    for b in batches:
        validate.ids_fit_model(reference, b["input_ids"], name="batches' input_ids")
        validate.ids_fit_model(model, b["input_ids"], name="batches' input_ids")
    return _drift(_logits(reference, batches), _logits(model, batches), batches)


def _drift(ref: torch.Tensor, got: torch.Tensor, batches: list[dict]) -> dict:
    real = torch.cat([b["attention_mask"] for b in batches]).bool()
    vocab = min(ref.shape[-1], got.shape[-1])  # a resized head: compare the shared vocabulary
    ref, got = ref[..., :vocab][real], got[..., :vocab][real]
    log_p, log_q = ref.log_softmax(-1), got.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return {"max_abs": float((ref - got).abs().max()), "kl": max(0.0, float(kl)),  # round-off dips below 0
            "agreement": float((ref.argmax(-1) == got.argmax(-1)).float().mean())}


def _conversation_batches(tokenizer, conversations: list, size: int = 16) -> list[dict]:
    """The probe chats as the trained tokenizer renders them (any template), right-padded."""
    rows = [tokenizer(tokenizer.apply_chat_template(c, tokenize=False), add_special_tokens=False)["input_ids"]
            for c in conversations]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = []
    for i in range(0, len(rows), size):
        chunk = rows[i:i + size]
        width = max(len(r) for r in chunk)
        batches.append({
            "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in chunk]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in chunk])})
    return batches


@torch.no_grad()
def _stops(model, tokenizer, prompts: list[str], eos_ids: list[int] | None, max_new_tokens: int,
           header: str | None) -> list[bool]:
    """Per prompt: did greedy generation end on a stop id before opening a new user turn? ``eos_ids=None``:
    the model's own ``generation_config`` (what a user gets)."""
    from .generation import generate_greedy

    extra = {} if eos_ids is None else {"eos_token_id": eos_ids}
    records = generate_greedy(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                              turn_markers=(header,) if header else (), **extra)
    return [r["stopped"] for r in records]


@torch.no_grad()
def _first_reply_token(model, tokenizer, prompts: list[str]) -> torch.Tensor:
    """Log-probabilities of the first reply token after each rendered prompt."""
    out = []
    for text in prompts:
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        out.append(model(input_ids=ids.to(next(model.parameters()).device)).logits[0, -1].float().cpu())
    return torch.stack(out).log_softmax(-1)


def _rows_drift(trained, saved, ids: list[int]) -> float:
    """Max |Δ| over the input-embedding and output-head rows of ``ids`` (the special tokens)."""
    gap = 0.0
    for get in ("get_input_embeddings", "get_output_embeddings"):
        a, b = getattr(trained, get)(), getattr(saved, get)()
        if a is None or b is None or not a.weight.is_floating_point() or not b.weight.is_floating_point():
            continue
        # the trained rows rounded to the served dtype: a correct bf16 save then matches exactly
        a, b = a.weight.detach().to(b.weight.dtype).float(), b.weight.detach().float()
        ids_in = [i for i in ids if i < min(a.shape[0], b.shape[0])]
        if ids_in:
            gap = max(gap, float((a[ids_in] - b[ids_in]).abs().max()))
    return gap


def _dtype_of(model) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def precision_of(model) -> str:
    """How ``model``'s weights are stored — ``"4-bit"`` / ``"8-bit"`` or the floating dtype's name: what
    decides the ship check's default tolerances (``PRECISION_TOLERANCE``)."""
    validate.model("model", model)
    kinds = {type(m).__name__ for m in model.modules()}
    if "Linear4bit" in kinds:
        return "4-bit"
    if "Linear8bitLt" in kinds:
        return "8-bit"
    return str(_dtype_of(model)).removeprefix("torch.")


def _token(tokenizer, token_id: int | None) -> str:
    return "none" if token_id is None else f"{tokenizer.convert_ids_to_tokens(token_id)} = {token_id}"


# ------------------------------------------------------------------------------------------------
# The findings
# ------------------------------------------------------------------------------------------------

def _files_finding(info: dict) -> ShipFinding:
    missing = []
    if info["kind"] == "adapter":
        if info["generation_eos"] is None:
            missing.append("generation_config.json (a peft loader would ignore it anyway: the base's is "
                           "served)")
        if not info["has_tokenizer"]:
            missing.append("tokenizer files (the base's tokenizer and template are served)")
    elif not info["has_chat_template"]:
        missing.append("a chat template (a server cannot render a chat)")
    elif info["generation_eos"] is None:
        missing.append("generation_config.json (generate() falls back to config.json's eos)")
    quant = f", saved {info['quantization']}" if info["quantization"] else ""
    what = (f"{info['kind']} directory{quant}; files: {', '.join(info['files'])}"
            + (f"; missing: {'; '.join(missing)}" if missing else ""))
    return ShipFinding("files", "warn" if missing or info["quantization"] else "pass", what,
                       "a loader falls back on the base's or the library's defaults for what is not there; "
                       "a 4-bit save is served quantised (bitsandbytes), a re-quantised merge, not the "
                       "weights you trained" if info["quantization"] else
                       "a loader falls back on the base's or the library's defaults for what is not there",
                       "save the merged model with its tokenizer and generation_config "
                       "(merged.save_pretrained(d); tokenizer.save_pretrained(d)); for QLoRA reload the base "
                       "in bf16, load the adapter, merge, and copy the eos list onto it")


def _stop_finding(trained_model, trained_tok, saved, saved_tok, info, prompts, max_new_tokens) -> ShipFinding:
    eot = end_of_turn_after_final(trained_tok)
    served_eos = _eos_list(saved.generation_config.eos_token_id)
    where = ("the base's generation_config (peft does not read one saved beside the adapter)"
             if info["kind"] == "adapter" else "the directory's generation_config.json")
    why = ("generate() and servers stop on generation_config.eos_token_id; a reply the template ends with "
           "the end-of-turn token runs on to max_new_tokens when that id is not in the list")
    fix = (f"ship a generation_config whose eos_token_id includes {_token(trained_tok, eot)}: "
           "merge_and_unload() the trained (in-memory) model and save_pretrained() it, or copy the in-memory "
           "generation_config onto what you save (model.generation_config.save_pretrained(d)) — for an "
           "adapter onto the base it is served on, or into the server's stop list; an eval that passes "
           "eos_token_id to generate() does not ship")
    if eot is None:
        return ShipFinding("stops", "could-not-measure", "the trained template ends a turn with plain "
                           "text: there is no end-of-turn id to look for", why,
                           "stop on strings (stop_strings=...)")
    if eot not in served_eos:
        return ShipFinding("stops", "fail", f"served eos_token_id {served_eos}, from {where}: the end of "
                           f"turn {_token(trained_tok, eot)} is NOT in it", why, fix)
    header = user_turn_header(trained_tok)
    told = list(dict.fromkeys([eot, *_eos_list(trained_model.generation_config.eos_token_id)]))
    ref_rate = sum(_stops(trained_model, trained_tok, prompts, told, max_new_tokens, header)) / len(prompts)
    if ref_rate < REFERENCE_STOPS:
        return ShipFinding("stops", "could-not-measure",
                           f"served eos_token_id {served_eos} holds {_token(trained_tok, eot)}; the "
                           f"trained model itself stops on {ref_rate:.2f} of {len(prompts)} probe prompts "
                           f"within {max_new_tokens} new tokens, so the stop rates cannot be compared",
                           "a reasoning model thinks longer than a short probe",
                           "raise max_new_tokens (--max-new-tokens) or probe with your own prompts "
                           "(--prompts)")
    rate = sum(_stops(saved, saved_tok, prompts, None, max_new_tokens, header)) / len(prompts)
    verdict = "pass" if rate >= ref_rate - STOP_SLACK else "fail"
    return ShipFinding("stops", verdict, f"served eos_token_id {served_eos} ({where}) holds "
                       f"{_token(trained_tok, eot)}; the saved model stops on {rate:.2f} of {len(prompts)} "
                       f"probe prompts, the trained one on {ref_rate:.2f} (slack {STOP_SLACK})",
                       "the end of turn is in the list, but the served model does not write it: the weights "
                       "or the prompt it is served differ", "see the precision and served_prompt findings")


def _tokenizer_eos_finding(trained_tok, saved_tok) -> ShipFinding:
    same = saved_tok.eos_token == trained_tok.eos_token
    return ShipFinding("tokenizer_eos", "pass" if same else "fail",
                       f"served tokenizer eos_token {saved_tok.eos_token!r}, trained "
                       f"{trained_tok.eos_token!r}",
                       "servers that read the tokenizer's eos (TGI, llama.cpp conversions) stop on it; a "
                       "tokenizer saved from the base carries the base's",
                       "save the tokenizer you trained with (trainer.save_model() / "
                       "tokenizer.save_pretrained(d))")


def _served_prompt_finding(trained_model, trained_tok, saved, saved_tok, conversations, info) -> ShipFinding:
    asked = [[m for m in c if m["role"] != "assistant"] for c in conversations]
    mine = [_render(trained_tok, a, add_generation_prompt=True) for a in asked]
    theirs = [_render(saved_tok, a, add_generation_prompt=True) for a in asked]
    fix = ("save the tokenizer you trained with into the directory (tokenizer.save_pretrained(d); "
           "trainer.save_model() does it)")
    why = "a server renders the user's messages with the served tokenizer's chat template"
    if any(t is None for t in theirs):
        return ShipFinding("served_prompt", "fail", "the served tokenizer has no chat template (or it cannot "
                           "render the probe chats): a chat request cannot be rendered", why, fix)
    ids = [(trained_tok(a, add_special_tokens=False)["input_ids"],
            saved_tok(b, add_special_tokens=False)["input_ids"]) for a, b in zip(mine, theirs)]
    differ = sum(a != b for a, b in ids)
    if not differ:
        return ShipFinding("served_prompt", "pass", f"the served template renders all {len(asked)} probe "
                           "prompts to the ids the trained one does")
    ref = _first_reply_token(trained_model, trained_tok, mine)
    got = _first_reply_token(saved, saved_tok, theirs)
    vocab = min(ref.shape[-1], got.shape[-1])  # a resized head: the shared vocabulary, renormalised
    ref, got = ref[:, :vocab].log_softmax(-1), got[:, :vocab].log_softmax(-1)
    kl = max(0.0, float((ref.exp() * (ref - got)).sum(-1).mean()))
    first = next(i for i, (a, b) in enumerate(ids) if a != b)
    a, b = mine[first], theirs[first]
    at = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    source = "the saved tokenizer" if info["has_tokenizer"] else "the base's tokenizer (none saved)"
    return ShipFinding("served_prompt", "fail", f"{source} renders {differ} of {len(asked)} probe prompts "
                       f"differently (first at character {at}: served {b[at:at + 40]!r}, trained "
                       f"{a[at:at + 40]!r}); next-token KL on the first reply token {kl:.3g} nats", why, fix)


def _precision_finding(trained_model, saved, batches, kl_tolerance, agreement_tolerance) -> ShipFinding:
    served, trained = precision_of(saved), precision_of(trained_model)
    broken = {w for m in (trained_model, saved) for w in unsound_4bit_widths(m)}
    if broken:  # a 4-bit side computes with other weights than it stored: no comparison means anything
        return ShipFinding(
            "precision", "could-not-measure",
            f"this machine's bitsandbytes dequantizes 4-bit weights of in_features {sorted(broken)} wrongly "
            f"(the same nf4 blocks stored as rows of {sorted(broken)[0]} and of 64 dequantize to different "
            "numbers)",
            "a 4-bit model here computes with other weights than the ones it stored, so its logits are not "
            "the trained model's: a real run (widths a multiple of 64, or a GPU) never meets it",
            "compare on a GPU, or a model whose layer widths are multiples of 64; the other findings stand")
    loose = PRECISION_TOLERANCE["float32"]
    kl_default = max(PRECISION_TOLERANCE.get(served, loose)[0], PRECISION_TOLERANCE.get(trained, loose)[0])
    agree_default = min(PRECISION_TOLERANCE.get(served, loose)[1], PRECISION_TOLERANCE.get(trained, loose)[1])
    kl_tol = kl_default if kl_tolerance is None else kl_tolerance
    agree_tol = agree_default if agreement_tolerance is None else agreement_tolerance
    drift = _drift(_logits(trained_model, batches), _logits(saved, batches), batches)
    ok = drift["kl"] <= kl_tol and drift["agreement"] >= agree_tol
    origin = (f"the default for {trained} trained, {served} served" if kl_tolerance is None
              and agreement_tolerance is None else "given")
    return ShipFinding(
        "precision", "pass" if ok else "fail",
        f"served in {served}: next-token KL {drift['kl']:.3g} nats/token (tolerance {kl_tol:g}), greedy "
        f"agreement {drift['agreement']:.3f} (at least {agree_tol:g}), max |Δlogit| {drift['max_abs']:.3g} "
        f"(tolerances: {origin})",
        "what a user feels is the next-token distribution and the greedy reply, not round-off in a logit",
        "the saved weights are not the trained ones: save the adapter with everything it trained "
        "(modules_to_save), or merge_and_unload() the trained model (QLoRA: the adapter onto the base "
        "reloaded in bf16) and save that")


def _token_rows_finding(trained_model, trained_tok, saved, saved_tok, info, base_vocab) -> ShipFinding:
    special = sorted(set(trained_tok.get_added_vocab().values()))
    gap = _rows_drift(trained_model, saved, special)
    added = [i for i in special if base_vocab is not None and i >= base_vocab]
    rows_modules = [p.rsplit(".", 1)[-1] for p in embedding_modules(trained_model)]   # this architecture's
    trained_rows = set(info.get("modules_to_save") or []) & set(rows_modules)
    if info["kind"] == "adapter" and added and not trained_rows and not info.get("trainable_tokens"):
        return ShipFinding("token_rows", "fail", f"{len(added)} added token(s) beyond the base's "
                           f"{base_vocab} rows; the adapter neither trains nor saves their rows (no "
                           "modules_to_save, no trainable_token_indices)",
                           "their rows stayed at resize_token_embeddings' random initialisation, and a "
                           "loader that resizes the base draws another one",
                           f"train and save the rows: LoraConfig(modules_to_save={rows_modules}) "
                           "or trainable_token_indices, then merge")
    return ShipFinding("token_rows", "pass" if gap <= LOGIT_TOLERANCE else "fail",
                       f"max |Δ| of the {len(special)} special tokens' embedding and head rows: {gap:.3g}",
                       "the end-of-turn row is what makes a fine-tuned base stop",
                       "keep modules_to_save in the adapter and load it with peft, or merge and save the "
                       "full model")


def _dtype_finding(trained_model, saved, info) -> ShipFinding:
    trained, served = precision_of(trained_model), precision_of(saved)
    stated = info["dtype"] or "not stated: an adapter takes its base"
    same = trained == served
    quant = f", {info['quantization']} quantization_config" if info["quantization"] else ""
    return ShipFinding("dtype", "pass" if same else "warn",
                       f"trained in {trained}, served in {served} (config dtype {stated}{quant})",
                       "transformers 5 loads the dtype config.json states (dtype='auto'); the precision "
                       "finding says whether the change is felt",
                       "nothing if precision passes; else save in the dtype you trained and evaluated in")


def ship_report(trained_model, trained_tokenizer, saved_dir, *, base=None, conversations: list | None = None,
                n_prompts: int = 16, max_new_tokens: int = 64, kl_tolerance: float | None = None,
                agreement_tolerance: float | None = None, tolerance=None) -> list[ShipFinding]:
    """The ship check: load ``saved_dir`` as a user would (``load_saved``), compare it with the trained model.

    Findings, each ``pass`` / ``warn`` / ``fail`` / ``could-not-measure``: ``files`` (what a loader finds),
    ``stops`` (fail when the end of turn after the final message is not in the served eos list; else the
    served model's stop rate against the trained one's, could-not-measure when the trained model itself
    does not stop within ``max_new_tokens``), ``tokenizer_eos``, ``served_prompt`` (the served template
    renders the same prompt ids from the same messages; else the KL of the first reply token),
    ``precision`` (next-token KL and greedy agreement on the probe chats, within a per-precision default or
    the given tolerances), ``token_rows`` (special and added tokens' rows as trained) and ``dtype``.
    ``conversations``: your own probe chats (lists of messages), else the course's. ``tolerance`` is
    accepted for old callers and ignored: max |Δlogit| no longer decides.
    """
    validate.model("trained_model", trained_model)
    validate.tokenizer("trained_tokenizer", trained_tokenizer)
    validate.positive_int("n_prompts", n_prompts, why="it is how many probe chats the check generates for")
    validate.positive_int("max_new_tokens", max_new_tokens, why="it bounds every probe generation")
    for name, value in (("kl_tolerance", kl_tolerance), ("agreement_tolerance", agreement_tolerance)):
        validate.number(name, value, positive=True, allow_none=True,
                        why="it bounds what a faithful copy shows")
    if agreement_tolerance is not None and agreement_tolerance > 1:
        raise ValueError(f"agreement_tolerance={agreement_tolerance!r} is above 1 — it is the least share of "
                         "probe positions whose greedy token must agree, a fraction — pass e.g. 0.95.")
    if conversations is None:
        conversations = make_messages("mixed", n_prompts, seed=PROBE_SEED)
    else:
        validate.non_empty("conversations", conversations, what="conversations (lists of messages)",
                           fix="pass e.g. make_messages('mixed', 16), or leave it out (the course's).")
        conversations = [_probe_chat(f"conversations[{i}]", c) for i, c in enumerate(conversations)]
    if not getattr(trained_tokenizer, "chat_template", None):
        raise ShipInputError("the trained tokenizer has no chat template — the check renders probe chats "
                             "with it — pass the tokenizer the run trained with.")
    if trained_tokenizer.pad_token is None:
        trained_tokenizer.pad_token = trained_tokenizer.eos_token
    saved, saved_tok = load_saved(saved_dir, base)
    info = saved_files(saved_dir)
    info["trainable_tokens"] = bool((_read_json(Path(saved_dir) / "adapter_config.json") or {})
                                    .get("trainable_token_indices"))
    base_vocab = _base_vocab(Path(saved_dir), base) if info["kind"] == "adapter" else None
    _ready(trained_model)
    prompts = [_render(trained_tokenizer, [m for m in c if m["role"] != "assistant"],
                       add_generation_prompt=True) for c in conversations]
    trained = (trained_model, trained_tokenizer)
    findings = [_files_finding(info),
                _stop_finding(*trained, saved, saved_tok, info, prompts, max_new_tokens),
                _tokenizer_eos_finding(trained_tokenizer, saved_tok),
                _served_prompt_finding(*trained, saved, saved_tok, conversations, info)]
    batches = _conversation_batches(trained_tokenizer, conversations)
    if max(int(b["input_ids"].max()) for b in batches) >= saved.get_input_embeddings().num_embeddings:
        findings.append(ShipFinding("precision", "fail", "the served model has fewer embedding rows than the "
                                    "trained tokenizer has tokens", "an added token cannot be embedded",
                                    "resize the base to the tokenizer and save the trained rows"))
    else:
        findings.append(_precision_finding(trained_model, saved, batches, kl_tolerance, agreement_tolerance))
    findings += [_token_rows_finding(trained_model, trained_tokenizer, saved, saved_tok, info, base_vocab),
                 _dtype_finding(trained_model, saved, info)]
    return findings


def verdicts(findings) -> str:
    """One line for a ship report: ``"FAILS: stops (look at: files)"`` or ``"no failure"``."""
    if not isinstance(findings, (list, tuple)) or not findings or not all(isinstance(f, ShipFinding)
                                                                          for f in findings):
        raise TypeError(f"findings must be ship_report()'s list of ShipFinding, got "
                        f"{type(findings).__name__} — the line summarises their verdicts — pass "
                        "ship_report(...)'s result.")
    failed = [f.check for f in findings if f.verdict == "fail"]
    looked = [f.check for f in findings if f.verdict in ("warn", "could-not-measure")]
    return ((f"FAILS: {', '.join(failed)}" if failed else "no failure")
            + (f" (look at: {', '.join(looked)})" if looked else ""))


def _base_vocab(path: Path, base) -> int | None:
    try:
        source = Path(_base_source(path, base))
    except ShipInputError:
        return None
    return (_read_json(source / "config.json") or {}).get("vocab_size") if source.is_dir() else None


# ------------------------------------------------------------------------------------------------
# The command line: python -m course_utils.ship --trained DIR --saved DIR [--base DIR] [--json]
# ------------------------------------------------------------------------------------------------

def _probe_chat(name: str, chat) -> list[dict]:
    """One probe chat: messages a template renders (``validate.chat``), with a message before the reply —
    the prompt is the chat without its assistant turns, and an empty prompt renders nothing."""
    validate.chat(name, chat)
    if all(m["role"] == "assistant" for m in chat):
        raise ShipInputError(f"{name} holds only assistant messages — the check prompts both models with the "
                             "messages before the reply, and this chat has none (the served tokenizer would "
                             "be blamed for it) — start it with the user's message, e.g. "
                             '[{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}].')
    return chat


def _read_prompts(path: str) -> list:
    """Probe chats from a JSONL file: one ``{"messages": [...]}`` object (or a bare list) per line."""
    try:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        rows = [json.loads(line) for line in lines]
    except (OSError, ValueError) as exc:
        raise ShipInputError(f"--prompts {path!r} cannot be read as JSONL ({exc}) — one chat per line — "
                             'write lines like {"messages": [{"role": "user", "content": "..."}]}.') from None
    chats = [r.get("messages") if isinstance(r, dict) else r for r in rows]
    if not chats or any(not isinstance(c, list) for c in chats):
        raise ShipInputError(f"--prompts {path!r} holds no chats — each line needs a messages list — write "
                             'lines like {"messages": [{"role": "user", "content": "..."}]}.')
    try:
        return [_probe_chat(f"--prompts {path!r} chat {i + 1}", c) for i, c in enumerate(chats)]
    except ValueError as exc:
        raise ShipInputError(str(exc)) from None


def main(argv=None) -> int:
    """Exit 0 when nothing fails, 1 with what differs and the fix, 2 for an input it cannot load."""
    if argv is not None:
        validate.strings("argv", argv, allow_empty=True)  # main("--saved d") would parse one letter at a time
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.ship",
        description="Load a saved model as a user or server would and compare it with the trained one.")
    parser.add_argument("--trained", required=True, help="the model as trained: a full directory, or an "
                        "adapter directory (with --trained-base for its base)")
    parser.add_argument("--saved", required=True, help="what you ship: a full directory or an adapter")
    parser.add_argument("--base", help="the saved adapter's base (default: its adapter_config.json's)")
    parser.add_argument("--trained-base", help="the trained adapter's base (default: its adapter_config's)")
    parser.add_argument("--trained-quantization", choices=("nf4",), help="load the trained adapter's base "
                        "in 4-bit nf4, as a QLoRA run trained it")
    parser.add_argument("--prompts", help="probe chats, JSONL: one {\"messages\": [...]} per line")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="probe length (default %(default)s)")
    parser.add_argument("--kl-tolerance", type=float,
                        help="max mean next-token KL, nats (default: per dtype)")
    parser.add_argument("--agreement-tolerance", type=float, help="min greedy agreement (default: per dtype)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    from . import use_course_defaults

    use_course_defaults()
    try:
        conversations = _read_prompts(args.prompts) if args.prompts else None
        trained, tokenizer = load_saved(args.trained, args.trained_base,
                                        quantization=args.trained_quantization)
        findings = ship_report(trained, tokenizer, args.saved, base=args.base, conversations=conversations,
                               max_new_tokens=args.max_new_tokens, kl_tolerance=args.kl_tolerance,
                               agreement_tolerance=args.agreement_tolerance)
    except (ShipInputError, TypeError, ValueError) as exc:
        print(f"ship check: bad input: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{**asdict(f), "ok": f.ok} for f in findings], indent=1))
    else:
        for f in findings:
            print(f)
    print(f"ship check: {verdicts(findings)}", file=sys.stderr)
    return 1 if any(f.verdict == "fail" for f in findings) else 0


# ------------------------------------------------------------------------------------------------
# The lesson's "what if" control
# ------------------------------------------------------------------------------------------------

_ROUTE_KEYS = ("files", "served_eos", "max_abs", "kl", "stop_rate")


def shipping_explorer(routes: dict):
    """What if you had shipped it another way? ``routes`` maps a label to what that way measured (a dict
    with ``files``, ``served_eos``, ``max_abs``, ``kl``, ``stop_rate``): one dropdown, one frame per way."""
    from .viz import what_if

    if not isinstance(routes, dict) or not routes:
        raise ValueError(f"routes must be a non-empty dict {{label: measurements}}, got "
                         f"{type(routes).__name__} — each entry is one way of saving — pass the dict the "
                         "lesson measured.")
    for label, r in routes.items():
        if not isinstance(r, dict) or not set(_ROUTE_KEYS) <= set(r):
            raise ValueError(f"routes[{label!r}] must be a dict with {list(_ROUTE_KEYS)} — the frame shows "
                             "them — measure each with saved_files, logit_drift and a stop rate.")
    kl_tol = PRECISION_TOLERANCE["bfloat16"][0]

    def frame(route):
        r = routes[route]
        verdict = "ships the trained model" if r["kl"] <= kl_tol and r["stop_rate"] >= 0.5 \
            else "does NOT ship the trained model"
        return (f"{route}: {verdict}\n  files on disk : {', '.join(r['files'])}\n"
                f"  generate() stops on (served generation_config): {r['served_eos']}\n"
                f"  next-token KL vs the trained model: {r['kl']:.3g} nats (a user feels it above "
                f"~{kl_tol:g}); max |Δlogit| {r['max_abs']:.3g}\n"
                f"  stop rate with the served generation_config: {r['stop_rate']:.2f}")

    return what_if(frame, {"route": list(routes)}, descriptions={"route": "how it was saved"}, width="620px")
