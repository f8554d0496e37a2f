"""Lesson 03's exercises: the padding-incident diagnosis (7.1) and the block-mask fix (7.2), graded.

``padding_incident(seed)`` is the broken batch (or batched generation) a notebook shows: the artefact
only. The generator that also knows its cause (``_padding_incident``) stays private to this module,
with the misconceptions and the cases of ``check_padding_diagnosis`` and ``check_block_mask``.
Reference answers: ``answers/lesson03.py``.
"""

from __future__ import annotations

import random

import torch

from .. import validate
from ..checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check
from ..padding import collate_padded
from .answers.lesson03 import block_mask_from_position_ids as _reference_mask

# ------------------------------------------------------------------------------------------------
# Exercise 7.1 (diagnosis): a broken batch or a batched generation, from one of several causes
# ------------------------------------------------------------------------------------------------

INCIDENT_CAUSES = (
    "left_padding_without_mask",        # forward: pads before real tokens, no attention_mask
    "no_leak",                          # forward: right padding, no attention_mask (looks alarming, is exact)
    "packing_without_position_reset",   # forward: one packed row, position_ids 0..T-1
    "packing_with_all_ones_mask",       # forward: reset position_ids plus an all-ones attention_mask
    "packing_with_cache",               # forward: reset position_ids, no mask, default call (use_cache=True)
    "right_padded_generation",          # generate: pads after the prompt, mask passed
    "never_stops",                      # generate: lesson 02's look-alike, left padding is fine
)


def _content(rng: random.Random, n: int, avoid: set) -> list[int]:
    return [t for t in (rng.randrange(10, 500) for _ in range(4 * n)) if t not in avoid][:n]


def padding_incident(seed: int) -> dict:
    """A broken (or look-alike) batch or batched generation, as you would have it when debugging:
    what the diagnosis exercise (7.1) gives your ``diagnose``. ``seed`` picks cause and contents; the
    artefact never names its cause (see ``_padding_incident`` for its fields)."""
    return _padding_incident(validate.seed("seed", seed))[0]


def _padding_incident(seed: int) -> tuple[dict, Diagnosis]:
    """A broken (or look-alike) artefact and its true ``Diagnosis``; ``seed`` picks cause and contents.

    The artefact is what you would have in hand when debugging: ``kind`` ("forward" or "generate"),
    the ``batch`` exactly as passed to the model, the ``call`` keyword arguments (``use_cache``; absent
    means the default, ``model.config.use_cache=True``), ``pad_token_id``, ``stop_ids``, for packed rows
    the ``cu_seq_lens`` the data pipeline knows (where each example starts), and for generation the
    ``generated`` token lists and ``max_new_tokens``. Evidence of the truth: the sorted list of affected
    rows (padding and generation causes), the index of the first token that can see another example
    (packing causes), or ``None`` (nothing leaks).
    """
    rng = random.Random(seed)
    cause = INCIDENT_CAUSES[seed % len(INCIDENT_CAUSES)]
    pad, im_end = rng.sample(range(0, 8), 2)
    avoid = {pad, im_end}
    art: dict = {"pad_token_id": pad, "stop_ids": (pad, im_end), "call": {}, "cu_seq_lens": None}
    if cause.startswith("packing"):
        lengths = [rng.randint(4, 12) for _ in range(rng.randint(2, 4))]
        ids = _content(rng, sum(lengths), avoid)
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        reset = [p for n in lengths for p in range(n)]
        batch = {"input_ids": torch.tensor([ids])}
        if cause == "packing_without_position_reset":
            batch["position_ids"] = torch.arange(len(ids))[None]
            art["call"] = {"use_cache": False}
        elif cause == "packing_with_all_ones_mask":
            batch["position_ids"] = torch.tensor([reset])
            batch["attention_mask"] = torch.ones(1, len(ids), dtype=torch.long)
            art["call"] = {"use_cache": False}
        else:
            batch["position_ids"] = torch.tensor([reset])  # the default call: config.use_cache=True
        art.update(kind="forward", batch=batch, cu_seq_lens=starts + [len(ids)])
        return art, Diagnosis(cause, starts[1])
    rows = rng.randint(3, 5)
    lengths = [rng.randint(3, 9) for _ in range(rows)]
    lengths[rng.randrange(rows)] = 10  # one longest row, so at least one row has no pads
    prompts = [_content(rng, n, avoid) for n in lengths]
    padded_rows = [i for i, n in enumerate(lengths) if n < 10]
    side = "right" if cause in ("no_leak", "right_padded_generation") else "left"
    batch = collate_padded([{"input_ids": p, "labels": p} for p in prompts], pad, side)
    del batch["labels"]
    if cause in ("left_padding_without_mask", "no_leak"):
        del batch["attention_mask"]
        art.update(kind="forward", batch=batch)
        return art, Diagnosis(cause, padded_rows if cause != "no_leak" else None)
    max_new = 8
    art.update(kind="generate", batch=batch, max_new_tokens=max_new)
    if cause == "right_padded_generation":
        first = rng.randrange(10, 500)  # every padded row continues from the pad token: the same first token
        generated = []
        for i in range(rows):
            body = ([first] if i in padded_rows else []) + _content(rng, rng.randint(2, 5), avoid)
            generated.append(body + [im_end])
        art["generated"] = generated
        return art, Diagnosis(cause, padded_rows)
    never = sorted(rng.sample(range(rows), rng.randint(1, rows)))
    art["generated"] = [_content(rng, max_new, avoid) if i in never else
                        _content(rng, rng.randint(1, max_new - 1), avoid) + [im_end] for i in range(rows)]
    return art, Diagnosis(cause, never)


def _evidence_ok(got, truth: Diagnosis) -> bool:
    if truth.evidence is None:
        return got is None or (isinstance(got, (list, tuple, set)) and not got)
    if isinstance(truth.evidence, list):
        try:
            return sorted(int(r) for r in got) == truth.evidence
        except (TypeError, ValueError):  # the learner's evidence is not a list of row numbers
            return False
    return not isinstance(got, bool) and isinstance(got, int) and got == truth.evidence


_INCIDENT_MISCONCEPTIONS = {
    ("left_padding_without_mask", "no_leak"):
        "the pads come AFTER every real token here: a causal mask already hides them (section 2).",
    ("no_leak", "left_padding_without_mask"):
        "pads BEFORE real tokens are visible to them unless attention_mask hides them (section 2).",
    ("right_padded_generation", "never_stops"):
        "the prompts end in the last column (left padding): the batch is fine, the rows never emit a "
        "stop token (lesson 02).",
    ("never_stops", "right_padded_generation"):
        "every row stops; look at the last column of the prompts: generate() reads the first new token "
        "there.",
    ("packing_with_cache", "packing_with_all_ones_mask"):
        "use_cache is off here; what else turns off transformers' inference from position_ids?",
    ("packing_with_all_ones_mask", "packing_with_cache"):
        "there is no attention_mask here; check the call's use_cache (absent = the config's True).",
    ("packing_with_cache", "packing_without_position_reset"):
        "position_ids never restart at 0: nothing marks where an example begins.",
    ("packing_with_all_ones_mask", "packing_without_position_reset"):
        "position_ids never restart at 0: nothing marks where an example begins.",
}


def check_padding_diagnosis(fn, seeds=None):
    """Checker for exercise 7.1: ``fn(artefact) -> Diagnosis(cause, evidence)`` on fresh incidents.

    ``seeds`` default to two rounds through every cause, offset by the course seed.
    """
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    seeds = fresh_seeds(2 * len(INCIDENT_CAUSES)) if seeds is None else validate.seeds("seeds", seeds)
    return check_diagnosis(
        "padding_incident", fn, _padding_incident, seeds=seeds, evidence_ok=_evidence_ok,
        misconceptions=_INCIDENT_MISCONCEPTIONS,
        hint=Hints(question="Which tensor tells you where each example (or each prompt) begins, and what "
                            "was passed with it: a mask, reset positions, a cache?",
                   pointer="Sections 2 and 3 list the forward calls that leak; section 1 shows where "
                           "generate() reads its first new token. Look at artefact['batch'], "
                           "artefact['call'] and, for generations, whether each row contains a stop id.",
                   answer="generate: a pad in the last prompt column -> right_padded_generation (rows "
                          "with a pad), else rows without a stop id -> never_stops. Forward, one packed row: "
                          "position_ids without a reset -> packing_without_position_reset; an attention_mask "
                          "-> packing_with_all_ones_mask; else packing_with_cache (evidence cu_seq_lens[1]). "
                          "Padded rows: pads at the start -> left_padding_without_mask (rows with pads), "
                          "at the end -> no_leak (None)."))


# ------------------------------------------------------------------------------------------------
# Exercise 7.2 (fix): a 4-D mask from position_ids, safe with a cache or an all-ones mask
# ------------------------------------------------------------------------------------------------

def _block_cases() -> list[Case]:
    rng = random.Random(306)
    rows = []
    for lengths in ([3, 4, 2], [6], [1, 1, 5, 2]):
        rows.append([p for n in lengths for p in range(n)])
    cases = [Case((torch.tensor([r]),), _reference_mask(torch.tensor([r])),
                  label=f"one packed row, {len(r)} tokens", tag="one_row") for r in rows]
    two = []
    for _ in range(2):  # two packed rows of one width; TRL pads position_ids with 0 (a one-token "example")
        lengths = [rng.randint(1, 5) for _ in range(rng.randint(2, 3))]
        two.append([p for n in lengths for p in range(n)])
    width = max(map(len, two))
    pos = torch.tensor([r + [0] * (width - len(r)) for r in two])
    cases.append(Case((pos,), _reference_mask(pos), label="two packed rows, padded with position 0",
                      tag="two_rows"))
    return cases


def _compare_mask(got, expected) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"expected a torch.Tensor, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)} ([batch, 1, query, key]), got {tuple(got.shape)}"
    if got.dtype != torch.bool:
        return f"expected a boolean mask (True = may attend), got dtype {got.dtype}"
    if not torch.equal(got, expected):
        diff = (got != expected).nonzero()[0].tolist()
        return f"first wrong cell [batch, head, query, key] = {diff}: got {bool(got[tuple(diff)])}"
    return None


def _diagnose_mask(got, case: Case):
    if not isinstance(got, torch.Tensor):
        return None
    want = case.expected
    if got.shape == want.shape[:1] + want.shape[2:] or got.shape == want.shape[2:]:
        return ("transformers passes only a 4-D mask through unchanged: add the head dimension, "
                "[batch, 1, T, T].")
    if got.shape != want.shape or got.dtype != torch.bool:
        return None
    length = want.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    if torch.equal(got, causal.expand_as(want)):
        return ("that is the plain causal mask: every example sees the ones before it — cut it where "
                "position_ids restart.")
    if torch.equal(got, ~want):
        return "True must mean 'may attend' (you returned the blocked cells)."
    same = want | (want.transpose(-1, -2))
    if torch.equal(got, same):
        return "inside an example a token may see only itself and earlier tokens: AND with the causal mask."
    if bool((got & ~causal).any()):
        return "a query sees a later key: keep the causal part (keys no later than the query)."
    return ("the block boundaries are off: a new example starts exactly where position_ids is 0 (that token "
            "belongs to the NEW example).")


def check_block_mask(fn):
    """Checker for exercise 7.2: ``fn(position_ids [B, T]) -> bool mask [B, 1, T, T]`` (True = may attend)."""
    return run_check("block_mask_from_position_ids", fn, _block_cases(), compare=_compare_mask,
                     diagnose=_diagnose_mask,
                     hint=Hints(
                         question="For a query at position i of a row, which keys belong to its own example "
                                  "and come no later than i?",
                         pointer="position_ids restart at 0 where an example begins (section 3's "
                                 "packed_segments); block_causal_mask builds the same picture from lengths.",
                         answer="example = (position_ids == 0).cumsum(-1); mask = (example[:, :, None] == "
                                "example[:, None, :]) & causal (tril); return mask[:, None]."))
