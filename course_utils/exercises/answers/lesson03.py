"""Reference answers of lesson 03 (padding & packing), and the incident generator that knows each incident's
cause (exercise 7.1's truth lives here, out of the exercise copy's reach). The notebook never imports this
module; ``course_utils.exercises.lesson03`` does."""

from __future__ import annotations

import random

import torch

from ...checks import Diagnosis
from ...padding import collate_padded

INCIDENT_CAUSES = (
    "left_padding_without_mask",        # forward: pads before real tokens, no attention_mask
    "no_leak",                          # healthy: a layout that is exact as called (several look-alikes)
    "packing_without_position_reset",   # forward: one packed row, position_ids 0..T-1
    "packing_with_all_ones_mask",       # forward: reset position_ids plus an all-ones attention_mask
    "packing_with_cache",               # forward: reset position_ids, no mask, default call (use_cache=True)
    "right_padded_generation",          # generate: pads after the prompt, mask passed
    "never_stops",                      # generate: lesson 02's look-alike, left padding is fine
)

# The healthy controls, each sharing its surface with a broken cause: right pads without a mask (looks like
# left_padding_without_mask), left pads with their mask (the same pads, the mask passed), a packed row with
# restarted positions called without a cache (packing_with_cache's tensors), a left-padded generation whose
# rows all stop (never_stops' layout).
_HEALTHY = ("right_pads_no_mask", "left_pads_with_mask", "packed_no_cache", "left_generation_stops")


def _content(rng: random.Random, n: int, avoid: set) -> list[int]:
    return [t for t in (rng.randrange(10, 500) for _ in range(4 * n)) if t not in avoid][:n]


def padding_incident_case(seed: int, graded: bool = True, short: bool = False) -> tuple[dict, Diagnosis]:
    """The incident of ``seed`` and its true ``Diagnosis``. ``graded`` picks the stream: the checker's
    incidents and the ones ``padding_incident`` shows are drawn apart, so matching a shown incident over seeds
    finds none of the graded ones. ``short`` draws shorter rows (the self-test prints them).

    The artefact is what you would have in hand when debugging: ``kind`` ("forward" or "generate"), the
    ``batch`` exactly as passed to the model, the ``call`` keyword arguments (``use_cache``; absent means the
    default, ``model.config.use_cache=True``), ``pad_token_id``, ``stop_ids``, for packed rows the
    ``cu_seq_lens`` the data pipeline knows (where each example starts), and for generation the ``generated``
    token lists and ``max_new_tokens``. Evidence: the sorted list of affected rows (padding and generation
    causes), the index of the first token that can see another example (packing causes), or ``None``.
    """
    rng = random.Random(f"{'graded' if graded else 'shown'}-{seed}")
    cause = INCIDENT_CAUSES[seed % len(INCIDENT_CAUSES)]
    # consecutive rounds through the causes walk through the healthy layouts (the checker draws four)
    healthy = _HEALTHY[(seed // len(INCIDENT_CAUSES)) % len(_HEALTHY)] if cause == "no_leak" else None
    pad, im_end = rng.sample(range(0, 8), 2)
    avoid = {pad, im_end}
    longest = 7 if short else 10
    art: dict = {"pad_token_id": pad, "stop_ids": (pad, im_end), "call": {}, "cu_seq_lens": None}
    if cause.startswith("packing") or healthy == "packed_no_cache":
        lengths = [rng.randint(3, 6) if short else rng.randint(4, 12) for _ in range(rng.randint(2, 3 if short
                                                                                                 else 4))]
        ids = _content(rng, sum(lengths), avoid)
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        reset = torch.tensor([[p for n in lengths for p in range(n)]])
        batch = {"input_ids": torch.tensor([ids])}
        if cause == "packing_without_position_reset":
            batch["position_ids"] = torch.arange(len(ids))[None]
            art["call"] = {"use_cache": False}
        elif cause == "packing_with_all_ones_mask":
            batch["attention_mask"] = torch.ones(1, len(ids), dtype=torch.long)
            batch["position_ids"] = reset
            art["call"] = {"use_cache": False}
        elif cause == "packing_with_cache":
            batch["position_ids"] = reset  # the default call: config.use_cache=True
        else:
            batch["position_ids"] = reset
            art["call"] = {"use_cache": False}  # as SFTTrainer calls it
        art.update(kind="forward", batch=batch, cu_seq_lens=starts + [len(ids)])
        return art, Diagnosis(cause, None if healthy else starts[1])
    rows = rng.randint(3, 5)
    lengths = [rng.randint(3, longest - 1) for _ in range(rows)]
    lengths[rng.randrange(rows)] = longest  # one longest row, so at least one row has no pads
    prompts = [_content(rng, n, avoid) for n in lengths]
    padded_rows = [i for i, n in enumerate(lengths) if n < longest]
    side = "right" if cause == "right_padded_generation" or healthy == "right_pads_no_mask" else "left"
    batch = collate_padded([{"input_ids": p, "labels": p} for p in prompts], pad, side)
    del batch["labels"]
    if cause == "left_padding_without_mask" or healthy in ("right_pads_no_mask", "left_pads_with_mask"):
        if healthy != "left_pads_with_mask":
            del batch["attention_mask"]
        art.update(kind="forward", batch=batch)
        return art, Diagnosis(cause, None if healthy else padded_rows)
    max_new = 6 if short else 8
    art.update(kind="generate", batch=batch, max_new_tokens=max_new)
    if cause == "right_padded_generation":
        first = rng.randrange(10, 500)  # every padded row continues from the pad token: the same first token
        art["generated"] = [([first] if i in padded_rows else []) + _content(rng, rng.randint(2, 4), avoid)
                            + [im_end] for i in range(rows)]
        return art, Diagnosis(cause, padded_rows)
    never = sorted(rng.sample(range(rows), rng.randint(1, rows))) if cause == "never_stops" else []
    art["generated"] = [_content(rng, max_new, avoid) if i in never else
                        _content(rng, rng.randint(1, max_new - 1), avoid) + [im_end] for i in range(rows)]
    return art, Diagnosis(cause, never or None)


def diagnose_padding_incident(artefact: dict) -> Diagnosis:
    """Exercise 7.1: name what broke a batch (or a batched generation), and show where."""
    batch, pad = artefact["batch"], artefact["pad_token_id"]
    ids = batch["input_ids"]
    if artefact["kind"] == "generate":
        padded = [r for r in range(ids.shape[0]) if batch["attention_mask"][r, -1] == 0]
        if padded:  # generate() appends after the last column: a pad for these rows
            return Diagnosis("right_padded_generation", padded)
        stops = set(artefact["stop_ids"])
        never = [r for r, g in enumerate(artefact["generated"]) if not stops.intersection(g)]
        return Diagnosis("never_stops", never) if never else Diagnosis("no_leak", None)
    if ids.shape[0] == 1 and artefact.get("cu_seq_lens"):
        first_boundary = artefact["cu_seq_lens"][1]
        pos = batch.get("position_ids")
        if pos is None or int((pos[0] == 0).sum()) < 2:
            return Diagnosis("packing_without_position_reset", first_boundary)
        if "attention_mask" in batch:
            return Diagnosis("packing_with_all_ones_mask", first_boundary)
        if artefact["call"].get("use_cache", True):  # absent: the config's use_cache=True
            return Diagnosis("packing_with_cache", first_boundary)
        return Diagnosis("no_leak", None)
    left = [r for r in range(ids.shape[0]) if ids[r, 0] == pad]
    if left and "attention_mask" not in batch:
        return Diagnosis("left_padding_without_mask", left)
    return Diagnosis("no_leak", None)


def block_mask_from_position_ids(position_ids: torch.Tensor,
                                 sliding_window: int | None = None) -> torch.Tensor:
    """Exercise 7.2: [B, 1, T, T] booleans, causal inside each example and nothing across; with a
    ``sliding_window`` W, a query also sees only the keys fewer than W positions back (itself included).

    An example starts wherever ``position_ids`` is 0, so a running count of those zeros names each
    token's example. transformers passes a 4-D mask through unchanged, the model's own window too, so a
    sliding-window model needs the window in the mask.
    """
    example = (position_ids == 0).cumsum(-1)
    same = example[:, :, None] == example[:, None, :]
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    if sliding_window is not None:  # keys i - W + 1 .. i: what transformers' sliding mask allows
        ones = torch.ones(length, length, dtype=torch.bool, device=position_ids.device)
        too_far = ones.tril(-sliding_window)
        causal &= ~too_far
    return (same & causal)[:, None]


# The self-test's plain phrases, in a fixed order (what a learner of lesson 03 can name).
SELF_TEST_CAUSES = {
    "left_padding_without_mask": "left padding without an attention_mask",
    "packing_without_position_reset": "packed examples whose position_ids never restart",
    "packing_with_all_ones_mask": "packed examples with an all-ones attention_mask",
    "packing_with_cache": "packed examples called with the cache on and no mask",
    "right_padded_generation": "batched generation from right-padded prompts",
    "never_stops": "the model never emits a stop token",
    "no_leak": "nothing: every example sees only its own tokens",
}


def _row(tensor) -> str:
    return " ".join(f"{int(t):>3}" for t in tensor)


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: a batch as it was passed to the model (or a batched generation), its true cause
    as a plain phrase, and the phrases to choose from (fixed order). Deterministic per seed; no model."""
    art, truth = padding_incident_case(seed, graded=False, short=True)
    batch = art["batch"]
    call = "model(**batch)" if not art["call"] else "model(**batch, use_cache=False)"
    if art["kind"] == "generate":
        lines = [f"Batched generation: model.generate(**batch, max_new_tokens={art['max_new_tokens']}); "
                 f"pad id {art['pad_token_id']}, stop ids {list(art['stop_ids'])}"]
    else:
        lines = [f"An evaluation loop calls {call} (the config says use_cache=True); pad id "
                 f"{art['pad_token_id']}"]
        if art["cu_seq_lens"]:
            lines.append(f"the data pipeline packed examples starting at {art['cu_seq_lens'][:-1]}")
    for name in ("input_ids", "attention_mask", "position_ids"):
        if name in batch:
            lines.append(f"{name}:")
            lines += [f"  [{_row(r)}]" for r in batch[name]]
    if art["kind"] == "generate":
        lines.append("new tokens per row:")
        lines += [f"  row {i}: {g}" for i, g in enumerate(art["generated"])]
    return "\n".join(lines), SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())
