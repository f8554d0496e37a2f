"""Lesson 03's exercises: the padding-incident diagnosis (7.1) and the block-mask fix (7.2), graded.

``padding_incident(seed)`` is the broken (or healthy) batch or batched generation a notebook shows: the
artefact only. The generator that also knows its cause, and the reference answers, live in
``answers/lesson03.py``, which no notebook imports; the graded incidents are drawn apart from the shown ones.
"""

from __future__ import annotations

import random

import torch

from .. import validate
from ..checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check
from ..padding import allowed_attention, block_causal_mask, packed_segments
from .answers.lesson03 import INCIDENT_CAUSES
from .answers.lesson03 import block_mask_from_position_ids as _reference_mask
from .answers.lesson03 import padding_incident_case as _incident_case  # knows the truth

__all__ = ["INCIDENT_CAUSES", "check_block_mask", "check_padding_diagnosis", "padding_incident"]

# ------------------------------------------------------------------------------------------------
# Exercise 7.1 (diagnosis): a broken batch or a batched generation, from one of several causes
# ------------------------------------------------------------------------------------------------

def padding_incident(seed: int) -> dict:
    """A broken (or healthy) batch or batched generation, as you would have it when debugging: what the
    diagnosis exercise (7.1) gives your ``diagnose``. ``seed`` picks cause and contents; the artefact never
    names its cause. Fields: ``kind`` ("forward" or "generate"), ``batch`` (the tensors passed to the model),
    ``call`` (extra keyword arguments; no ``use_cache`` means the config's ``True``), ``pad_token_id``,
    ``stop_ids``, ``cu_seq_lens`` (packed rows: where each example starts, as the data pipeline knows) and,
    for generations, ``generated`` (the new token ids of each row) and ``max_new_tokens``. The checker grades
    incidents drawn apart from these."""
    return _incident_case(validate.seed("seed", seed), graded=False)[0]


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
    ("packing_with_cache", "no_leak"):
        "this call passes use_cache=False and no mask: transformers infers the boundaries from position_ids.",
    ("left_padding_without_mask", "no_leak"):
        "these pads are hidden: pads AFTER every real token are hidden by the causal mask alone, pads before "
        "them by the attention_mask, if it is passed (section 2).",
    ("never_stops", "no_leak"):
        "every row emits a stop id before max_new_tokens: this generation stops.",
    ("no_leak", "packing_with_cache"):
        "the call builds a cache (no use_cache=False, and the config says True): section 3b's trap.",
    ("no_leak", "never_stops"):
        "count each row's stop ids: a row without one ran to max_new_tokens.",
}


def check_padding_diagnosis(fn):
    """Checker for exercise 7.1: ``fn(artefact) -> Diagnosis(cause, evidence)`` on fresh incidents.

    Four rounds through every cause (the healthy one in several layouts), drawn fresh on every run (no
    keyword fixes them: see ``checks.fresh_seeds``).
    """
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    return check_diagnosis(
        "padding_incident", fn, _incident_case, seeds=lambda: fresh_seeds(4 * len(INCIDENT_CAUSES)),
        evidence_ok=_evidence_ok,
        misconceptions=_INCIDENT_MISCONCEPTIONS,
        hint=Hints(question="Which tensor tells you where each example (or each prompt) begins, and what "
                            "was passed with it: a mask, reset positions, a cache?",
                   pointer="Sections 2 and 3 list the forward calls that leak and the ones that are exact; "
                           "section 3a says where generate() reads its first new token. Look at "
                           "artefact['batch'], artefact['call'] and, for generations, whether each row "
                           "contains a stop id. Some incidents are healthy.",
                   answer="generate: a pad in the last prompt column -> right_padded_generation (rows "
                          "with a pad); else rows without a stop id -> never_stops; else no_leak. Forward, "
                          "one packed row: position_ids without a reset -> packing_without_position_reset; "
                          "an attention_mask -> packing_with_all_ones_mask; use_cache not False -> "
                          "packing_with_cache (evidence cu_seq_lens[1]); else no_leak. Padded rows: pads at "
                          "the start and no attention_mask -> left_padding_without_mask (rows with pads); "
                          "else no_leak (None)."))


# ------------------------------------------------------------------------------------------------
# Exercise 7.2 (fix): a 4-D mask from position_ids, safe with a cache or an all-ones mask
# ------------------------------------------------------------------------------------------------

def _block_cases() -> list[Case]:
    """Packed rows without a window, then the same kind of rows for a model with a sliding window (Mistral,
    Gemma 2/3, Qwen2 with use_sliding_window): there a 4-D mask replaces the model's own window, so the
    window must be in it — the course's block_causal_mask and the mask transformers infers for the course
    model (no window) both miss it."""
    rng = random.Random(306)
    rows = []
    for lengths in ([3, 4, 2], [6], [1, 1, 5, 2]):
        rows.append([p for n in lengths for p in range(n)])
    cases = [Case((torch.tensor([r]),), _reference_mask(torch.tensor([r])), {"sliding_window": None},
                  label=f"one packed row, {len(r)} tokens", tag="one_row") for r in rows]
    two = []
    for _ in range(2):  # two packed rows of one width; TRL pads position_ids with 0 (a one-token "example")
        lengths = [rng.randint(1, 5) for _ in range(rng.randint(2, 3))]
        two.append([p for n in lengths for p in range(n)])
    width = max(map(len, two))
    pos = torch.tensor([r + [0] * (width - len(r)) for r in two])
    cases.append(Case((pos,), _reference_mask(pos), {"sliding_window": None},
                      label="two packed rows, padded with position 0", tag="two_rows"))
    for window, lengths in ((3, [7, 2, 5]), (2, [4, 6])):  # examples longer than the window
        row = torch.tensor([[p for n in lengths for p in range(n)]])
        cases.append(Case((row,), _reference_mask(row, window), {"sliding_window": window},
                          label=f"one packed row, sliding_window={window}", tag="window"))
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
    window = case.kwargs.get("sliding_window")
    if window is not None:
        if torch.equal(got, _reference_mask(case.args[0])):
            return ("the blocks are right, but the window is missing: transformers passes a 4-D mask through "
                    "unchanged, so a sliding-window model would attend further back than it was trained to — "
                    "also cut the keys sliding_window or more positions before the query.")
        for other in (window - 1, window + 1):
            if other > 0 and torch.equal(got, _reference_mask(case.args[0], other)):
                return (f"the window is off by one: a query sees itself and the {window - 1} keys before it "
                        f"(sliding_window={window} keys in all).")
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
    """Checker for exercise 7.2: ``fn(position_ids [B, T], sliding_window=None|int)`` -> a bool mask
    ``[B, 1, T, T]`` (True = may attend), called with ``sliding_window`` always given."""
    return run_check("block_mask_from_position_ids", fn, _block_cases, compare=_compare_mask,
                     diagnose=_diagnose_mask,
                     hint=Hints(
                         question="For a query at position i of a row, which keys belong to its own example "
                                  "and come no later than i?",
                         pointer="position_ids restart at 0 where an example begins (section 3b); a "
                                 "running count of those restarts numbers each token's example, and a "
                                 "lower-triangular matrix is the causal part (section 4's pictures); a "
                                 "window keeps the keys with query - key < sliding_window.",
                         answer="example = (position_ids == 0).cumsum(-1); mask = (example[:, :, None] == "
                                "example[:, None, :]) & causal (tril); with a window also & (query - key < "
                                "sliding_window); return mask[:, None]."),
                     out_of_reach=(block_causal_mask, packed_segments, allowed_attention))
