"""Greedy, batched generation: the one ``generate()`` call the lessons share (00, 02, 08, 09, 10).

``generate_greedy`` left-pads a batch of prompts, generates greedily and returns one record per prompt
(``ids``, ``text``, ``ended``, ``opened_turn``, ``stopped``); the id checks it needs (``eos_token_id`` ids
the model can write) live here too, and lesson 02's ``eos`` module reuses them. Core: lessons import it,
it imports no lesson.
"""

from __future__ import annotations

import difflib
import inspect

import torch

from . import validate


def _vocab(model) -> int:
    """The number of token ids ``model`` can embed (and predict)."""
    return getattr(model, "module", model).get_input_embeddings().num_embeddings


def _check_eos_ids(name: str, value, vocab: int) -> list[int]:
    """An ``eos_token_id`` for ``generate()``: one id or a non-empty list of ids the model can write."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name}=[] lists no stop id — generate() would never stop before "
                             f"max_new_tokens — pass ids, e.g. stop_token_ids(tokenizer), or leave {name} "
                             "out to use the model's generation_config.")
        return [validate.vocab_id(f"{name}[{i}]", v, vocab_size=vocab, owner="the model")
                for i, v in enumerate(value)]
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name} is a tensor — the stop ids are compared one by one — pass a list: "
                        f"{name}=ids.tolist().")
    return [validate.vocab_id(name, value, vocab_size=vocab, owner="the model")]


def _generate_keywords(model) -> list[str]:
    """What ``generate()`` takes besides the prompt: ``GenerationConfig``'s fields, its own arguments, and the
    inputs of the model's forward pass (model kwargs)."""
    from transformers import GenerationConfig

    own = inspect.signature(type(model).generate).parameters
    forward = inspect.signature(model.forward).parameters
    extra = {"assistant_tokenizer", "use_model_defaults"}  # read from generate()'s **kwargs
    return sorted((set(GenerationConfig().to_dict()) | set(own) | set(forward) | extra)
                  - {"self", "kwargs", "inputs", "_from_model_config", "transformers_version"})


def _check_pair(model, tokenizer) -> None:
    validate.model("model", model)
    validate.tokenizer("tokenizer", tokenizer)
    validate.model_and_tokenizer(model, tokenizer)


def _as_list(eos) -> list[int]:
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


# generate_greedy sets these itself; passing them again would be a TypeError deep inside generate().
_SET_BY_GENERATE_GREEDY = ("input_ids", "attention_mask", "do_sample", "pad_token_id", "max_new_tokens")


def generate_greedy(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 40,
                    turn_markers: tuple[str, ...] = (), **generate_kwargs) -> list[dict]:
    """Greedy, batched, left-padded generation; one record per prompt.

    Records: ``ids`` (new tokens, up to and including the stop token), ``text``, ``n_new``,
    ``ended`` (a stop id was generated before ``max_new_tokens``), ``opened_turn`` (the reply
    writes one of ``turn_markers`` — e.g. ``<|im_start|>`` — before it ends: it invented a turn) and
    ``stopped`` = ended without opening a turn, the only stop a user would accept. Without
    ``eos_token_id`` in ``generate_kwargs``, ``generate()`` uses ``model.generation_config`` — the
    default a user meets. Left padding, because a decoder continues from the last position of each row.
    """
    _check_pair(model, tokenizer)
    prompts = validate.strings("prompts", prompts)
    validate.positive_int("max_new_tokens", max_new_tokens, why="it bounds every generation")
    turn_markers = validate.strings("turn_markers", turn_markers, allow_empty=True)
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise ValueError(f"prompts[{empty[0]}] is empty — generation continues from a prompt's last "
                         "token, and an empty prompt has none — pass the prompt text, e.g. "
                         "chat_prompts(tokenizer, conversations).")
    clash = [k for k in _SET_BY_GENERATE_GREEDY if k in generate_kwargs]
    if clash:
        raise TypeError(f"generate_greedy sets {clash} itself — it generates greedily from the tokenized "
                        "prompts, with the tokenizer's pad id — drop them (max_new_tokens is its own "
                        "argument).")
    known = _generate_keywords(model)
    unknown = [k for k in generate_kwargs if k not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=3, cutoff=0.6)
        fix = f"use {' or '.join(map(repr, close))}" if close else "drop it"
        raise TypeError(f"generate_greedy got {unknown} — not a generate() keyword (GenerationConfig's "
                        "fields, generate()'s own arguments, the model's inputs), so generate() would "
                        f"refuse it — {fix} (known ones include eos_token_id, repetition_penalty, "
                        "no_repeat_ngram_size).")
    if "eos_token_id" in generate_kwargs and generate_kwargs["eos_token_id"] is not None:
        _check_eos_ids("eos_token_id", generate_kwargs["eos_token_id"], _vocab(model))
    if tokenizer.pad_token_id is None and len(prompts) > 1:
        raise ValueError("the tokenizer has no pad token — prompts of different lengths are left-padded "
                         "into one batch — set tokenizer.pad_token (e.g. tokenizer.pad_token = "
                         "tokenizer.eos_token).")
    return _generate(model, tokenizer, prompts, max_new_tokens, tuple(turn_markers), generate_kwargs)


def _generate(model, tokenizer, prompts: list[str], max_new_tokens: int, turn_markers: tuple[str, ...],
              generate_kwargs: dict) -> list[dict]:
    """``generate_greedy`` on checked arguments (the explorer and the criterion call it per frame/check)."""
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    encoded = encoded.to(model.device)
    validate.ids_fit_model(model, encoded["input_ids"], name="the tokenized prompts")
    limit = getattr(model.config, "max_position_embeddings", None)
    prompt_len = encoded["input_ids"].shape[1]
    if limit is not None and prompt_len + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={max_new_tokens} plus the {prompt_len}-token prompt exceeds the "
                         f"model's {limit} positions — past them the model has no position to use — pass "
                         f"max_new_tokens <= {limit - prompt_len}.")
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, **generate_kwargs)
    stops = set(_as_list(generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)))
    records = []
    for row in out[:, encoded["input_ids"].shape[1]:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stops), None)
        ids = row[:end] if end else row
        text = tokenizer.decode(ids)
        opened = any(m in text for m in turn_markers)
        records.append({"ids": ids, "text": text, "n_new": len(ids), "ended": end is not None,
                        "opened_turn": opened, "stopped": end is not None and not opened})
    return records
