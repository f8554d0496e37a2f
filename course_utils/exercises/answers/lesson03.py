"""Reference answers of lesson 03 (padding & packing). The notebook never imports this module."""

from __future__ import annotations

import torch

from ...checks import Diagnosis


def diagnose_padding_incident(artefact: dict) -> Diagnosis:
    """Exercise 7.1: name what broke a batch (or a batched generation), and show where."""
    batch, pad = artefact["batch"], artefact["pad_token_id"]
    ids = batch["input_ids"]
    if artefact["kind"] == "generate":
        padded = [r for r in range(ids.shape[0]) if batch["attention_mask"][r, -1] == 0]
        if padded:  # generate() appends after the last column: a pad for these rows
            return Diagnosis("right_padded_generation", padded)
        stops = set(artefact["stop_ids"])
        return Diagnosis("never_stops", [r for r, g in enumerate(artefact["generated"])
                                         if not stops.intersection(g)])
    if ids.shape[0] == 1 and artefact.get("cu_seq_lens"):
        first_boundary = artefact["cu_seq_lens"][1]
        pos = batch.get("position_ids")
        if pos is None or int((pos[0] == 0).sum()) < 2:
            return Diagnosis("packing_without_position_reset", first_boundary)
        if "attention_mask" in batch:
            return Diagnosis("packing_with_all_ones_mask", first_boundary)
        return Diagnosis("packing_with_cache", first_boundary)
    left = [r for r in range(ids.shape[0]) if ids[r, 0] == pad]
    if left:
        return Diagnosis("left_padding_without_mask", left)
    return Diagnosis("no_leak", None)


def block_mask_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Exercise 7.2: [B, 1, T, T] booleans, causal inside each example and nothing across.

    An example starts wherever ``position_ids`` is 0, so a running count of those zeros names each
    token's example.
    """
    example = (position_ids == 0).cumsum(-1)
    same = example[:, :, None] == example[:, None, :]
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal)[:, None]
