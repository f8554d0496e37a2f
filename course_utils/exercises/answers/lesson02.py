"""Reference answers of lesson 02's exercises (``exercises/lesson02.py``'s checkers import them; notebooks
never do)."""

from __future__ import annotations

from ...checks import Diagnosis
from ...data import IGNORE_INDEX
from ...eos import end_of_turn_token, stop_token_ids  # noqa: F401  (exercise 1: the tools lesson 00 uses)


def diagnose_generations(artefact: dict) -> Diagnosis:
    """Exercise 2: read the generations first, then the config and the graded span.

    The look-alikes are ruled out first: garbling only on padded rows (lesson 03), and replies cut
    mid-answer without rambling (a too-small budget). Then: does the model write the end-of-turn
    token? If yes and generate() does not watch it: config. If no: was it ever graded?
    """
    gens, cfg = artefact["generations"], artefact["generate_config"]
    eot = artefact["end_of_turn_token"]
    if cfg["padding_side"] == "left" and not cfg["attention_mask_passed"]:
        longest = max(len(g["prompt_tokens"]) for g in gens)
        padded = [i for i, g in enumerate(gens) if len(g["prompt_tokens"]) < longest]
        if padded and not any(gens[i]["stopped"] for i in padded):
            return Diagnosis("left_padding_without_mask", padded[0])
    writes_eot = any(eot in g["tokens"] for g in gens)
    if writes_eot and eot not in cfg["eos_tokens"]:
        return Diagnosis("wrong_stop_ids", eot)
    if not any(g["stopped"] for g in gens) and not writes_eot:
        stop = eot if artefact["format"] == "chat" else artefact["eos_token"]
        if not any(stop in row for row in artefact["graded_span"]):
            cause = "pad_equals_eos" if artefact["pad_token"] == stop else "stop_token_not_graded"
            return Diagnosis(cause, stop)
    return Diagnosis("max_new_tokens_too_small", cfg["max_new_tokens"])


def collate_keep_eos(examples: list[dict], pad_token_id: int) -> dict:
    """Exercise 3: right-pad; labels are the example's own (``input_ids`` where it has none); every
    padding position is -100, by *position*, so the row's own eos keeps its label when pad == eos."""
    import torch

    width = max(len(e["input_ids"]) for e in examples)
    out = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        ids = list(e["input_ids"])
        labels = list(e.get("labels", ids))
        pad = width - len(ids)
        out["input_ids"].append(ids + [pad_token_id] * pad)
        out["attention_mask"].append([1] * len(ids) + [0] * pad)
        out["labels"].append(labels + [IGNORE_INDEX] * pad)
    return {k: torch.tensor(v) for k, v in out.items()}
