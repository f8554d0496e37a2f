"""Lesson 03's exercise graders (``course_utils.exercises.lesson03``): the tables of its checkers (the
reference answer, a second correct answer, each known wrong answer with its misconception:
``tests/test_checkers.py`` runs them), the incident generator covers every cause, and the graders refuse bad
non-learner arguments (issue 36: no pass with zero cases)."""

import pytest
import torch
from conftest import Row, graded

from course_utils.checks import Diagnosis
from course_utils.exercises import lesson03 as L
from course_utils.exercises.answers import lesson03

# =================================================================================================
# Answers: a second correct one per checker, and the wrong ones (each docstring names its misconception)
# =================================================================================================

def _diagnosis_variant(artefact):
    """A second correct diagnosis: reads the attention mask's first column and the pad positions."""
    batch = artefact["batch"]
    ids, pad = batch["input_ids"], artefact["pad_token_id"]
    if "generated" in artefact:
        short = [r for r in range(len(ids)) if int(ids[r, -1]) == pad]
        if short:
            return Diagnosis("right_padded_generation", short)
        stops = artefact["stop_ids"]
        never = [r for r, g in enumerate(artefact["generated"]) if not any(t in stops for t in g)]
        return Diagnosis("never_stops", never) if never else Diagnosis("no_leak", [])
    if ids.shape[0] == 1:
        pos = batch["position_ids"][0].tolist()
        if pos == list(range(len(pos))):
            cause = "packing_without_position_reset"
        elif "attention_mask" in batch:
            cause = "packing_with_all_ones_mask"
        elif artefact["call"].get("use_cache") is not False:
            cause = "packing_with_cache"
        else:
            return Diagnosis("no_leak", None)
        return Diagnosis(cause, pos.index(0, 1) if 0 in pos[1:] else artefact["cu_seq_lens"][1])
    rows = sorted({int(r) for r in (ids[:, 0] == pad).nonzero().flatten()})
    if rows and "attention_mask" not in batch:
        return Diagnosis("left_padding_without_mask", rows)
    return Diagnosis("no_leak", None)


def _always_left_padding(artefact):
    """Memorised: every incident is left padding without a mask, row 0."""
    return Diagnosis("left_padding_without_mask", [0])


def _mask_means_safe(artefact):
    """Misconception: 'the attention_mask was passed, so generation is fine' -> blames the model."""
    truth = lesson03.diagnose_padding_incident(artefact)
    if truth.cause == "right_padded_generation":
        return Diagnosis("never_stops", [])
    return truth


def _any_pad_leaks(artefact):
    """Misconception: any pad without a mask leaks, whichever side it is on."""
    truth = lesson03.diagnose_padding_incident(artefact)
    if truth.cause == "no_leak":
        ids = artefact["batch"]["input_ids"]
        return Diagnosis("left_padding_without_mask",
                         [r for r in range(len(ids)) if int(ids[r, -1]) == artefact["pad_token_id"]])
    return truth


def _cache_is_harmless(artefact):
    """Misconception: restarted position_ids are enough, whatever the call."""
    truth = lesson03.diagnose_padding_incident(artefact)
    if truth.cause == "packing_with_cache":
        return Diagnosis("no_leak", None)
    return truth


def _mask_by_position_difference(position_ids, sliding_window=None):
    """A second correct answer: a query at position p sees the p keys before it and itself."""
    batch, length = position_ids.shape
    out = torch.zeros(batch, 1, length, length, dtype=torch.bool)
    for b in range(batch):
        for i in range(length):
            back = int(position_ids[b, i]) if sliding_window is None else min(int(position_ids[b, i]),
                                                                              sliding_window - 1)
            out[b, 0, i, i - back: i + 1] = True
    return out


def _causal_only(position_ids, sliding_window=None):
    """A plain causal mask: packed examples attend to the ones before them."""
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return causal.expand(position_ids.shape[0], 1, length, length)


def _blocks_without_causal(position_ids, sliding_window=None):
    """Blocks only: a token attends to the later tokens of its own example."""
    example = (position_ids == 0).cumsum(-1)
    return (example[:, :, None] == example[:, None, :])[:, None]


def _inverted(position_ids, sliding_window=None):
    """True where attention is forbidden (the additive-mask reading): the mask is inverted."""
    return ~lesson03.block_mask_from_position_ids(position_ids, sliding_window)


def _boundary_off_by_one(position_ids, sliding_window=None):
    """Each example's first token joins the previous example: the block boundaries are off by one."""
    example = (position_ids == 0).cumsum(-1)
    example = torch.cat([example[:, :1], example[:, :-1]], dim=-1)  # a first token joins the previous example
    causal = torch.ones(position_ids.shape[-1], position_ids.shape[-1], dtype=torch.bool).tril()
    return ((example[:, :, None] == example[:, None, :]) & causal)[:, None]


def _three_dims(position_ids, sliding_window=None):
    """[B, T, T] without the head dimension the model expects."""
    return lesson03.block_mask_from_position_ids(position_ids, sliding_window)[:, 0]


def _segments_and_block_causal_mask(position_ids, sliding_window=None):
    """Issue 43: padding.packed_segments + padding.block_causal_mask, row by row (the Optional cell's helper,
    "the finished form of exercise 2")."""
    from course_utils.padding import block_causal_mask, packed_segments

    return torch.cat([block_causal_mask([end - start for start, end in packed_segments(row[None])])
                      for row in position_ids])


def _transformers_inferred_mask(position_ids, sliding_window=None):
    """Issue 43: padding.allowed_attention on the course model — the mask transformers infers from
    position_ids for a model without a window."""
    from course_utils import load_course_model
    from course_utils.padding import allowed_attention

    model = _transformers_inferred_mask.__dict__.setdefault("model", load_course_model()[0])
    return allowed_attention(model, torch.zeros_like(position_ids), position_ids=position_ids)[:, None]


def _window_off_by_one(position_ids, sliding_window=None):
    """Counts the window without the query itself: one key too many."""
    return lesson03.block_mask_from_position_ids(position_ids, sliding_window and sliding_window + 1)


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

CHECKERS = [
    Row("padding_diagnosis", graded(L.check_padding_diagnosis), lesson03.diagnose_padding_incident),
    Row("block_mask", graded(L.check_block_mask), lesson03.block_mask_from_position_ids),
]

ALSO_CORRECT = [
    ("padding_diagnosis", _diagnosis_variant),
    ("block_mask", _mask_by_position_difference),
]

WRONG = [
    ("padding_diagnosis", _always_left_padding, "is not what broke this run"),
    ("padding_diagnosis", _mask_means_safe, "generate() reads the first new token"),
    ("padding_diagnosis", _any_pad_leaks, "these pads are hidden"),
    ("padding_diagnosis", _cache_is_harmless, "the call builds a cache"),
    ("block_mask", _causal_only, "plain causal mask"),
    ("block_mask", _blocks_without_causal, "AND with the causal mask"),
    ("block_mask", _inverted, "True must mean"),
    ("block_mask", _boundary_off_by_one, "block boundaries are off"),
    ("block_mask", _three_dims, "add the head dimension"),
    ("block_mask", _segments_and_block_causal_mask, "finished form of this exercise"),
    ("block_mask", _window_off_by_one, "the window is off by one"),
]


# =================================================================================================
# The incident generator: every cause, an artefact without its cause
# =================================================================================================

def test_incidents_cover_every_cause_and_differ_by_seed():
    causes = {lesson03.padding_incident_case(s)[1].cause for s in range(14)}
    assert causes == set(L.INCIDENT_CAUSES)
    a, b = L.padding_incident(0), L.padding_incident(7)
    assert not torch.equal(a["batch"]["input_ids"], b["batch"]["input_ids"])


def test_the_public_incident_is_the_artefact_only_and_the_graded_stream_is_apart():
    """What a notebook may show: the artefact, never a Diagnosis; the truth lives with the answers."""
    artefact = L.padding_incident(3)
    assert isinstance(artefact, dict) and not any(isinstance(v, Diagnosis) for v in artefact.values())
    shown = lesson03.padding_incident_case(3, graded=False)[0]
    assert all(torch.equal(v, shown["batch"][k]) for k, v in artefact["batch"].items())
    graded = lesson03.padding_incident_case(3, graded=True)[0]
    assert not torch.equal(graded["batch"]["input_ids"], shown["batch"]["input_ids"]), "drawn apart"
    assert not hasattr(L, "_padding_incident") and not hasattr(L, "padding_incident_case"), \
        "the generator that knows the truth lives with the answers"


def test_healthy_controls_share_the_broken_causes_surface():
    """Healthy incidents: right pads without a mask, left pads with their mask, a packed row with restarted
    positions (use_cache=False), a left-padded generation whose rows all stop."""
    healthy = [a for a, d in map(lesson03.padding_incident_case, range(1, 400, 7)) if d.cause == "no_leak"]
    kinds = set()
    for a in healthy:
        ids = a["batch"]["input_ids"]
        if a["kind"] == "generate":
            kinds.add("generation that stops")
        elif a["cu_seq_lens"]:
            kinds.add("packed, restarted positions")
        elif "attention_mask" in a["batch"]:
            kinds.add("left pads with the mask")
            assert bool((ids[:, 0] == a["pad_token_id"]).any())
        else:
            kinds.add("right pads, no mask")
    assert len(kinds) == 4, kinds


# =================================================================================================
# Shortcuts a learner has at each exercise: each fails the checker (issue 33)
# =================================================================================================

def _match_shown_incidents(artefact):
    """Exercise 1: look the incident up among padding_incident(seed) and read the cause off the seed."""
    for seed in range(3000):
        shown = L.padding_incident(seed)
        if shown["kind"] == artefact["kind"] and shown["batch"]["input_ids"].shape == \
                artefact["batch"]["input_ids"].shape and torch.equal(shown["batch"]["input_ids"],
                                                                      artefact["batch"]["input_ids"]):
            return Diagnosis(L.INCIDENT_CAUSES[seed % len(L.INCIDENT_CAUSES)], None)
    return Diagnosis("no_leak", None)


def _pads_first_means_a_leak(artefact):
    """Exercise 1: pads at the start of a forward batch leak (section 2 as a rule), mask passed or not."""
    ids, pad = artefact["batch"]["input_ids"], artefact["pad_token_id"]
    left = [r for r in range(len(ids)) if int(ids[r, 0]) == pad]
    if artefact["kind"] == "forward" and left:
        return Diagnosis("left_padding_without_mask", left)
    return lesson03.diagnose_padding_incident(artefact)


def _restarted_positions_are_enough(artefact):
    """Exercise 1: restarted position_ids and no mask is always fine (section 3b without the cache)."""
    truth = lesson03.diagnose_padding_incident(artefact)
    return Diagnosis("no_leak", None) if truth.cause == "packing_with_cache" else truth


def _reset_positions_always_cached(artefact):
    """Exercise 1: restarted position_ids without a mask is always the cache trap, whatever the call says."""
    batch = artefact["batch"]
    restarted = int((batch["position_ids"] == 0).sum()) > 1
    if artefact["cu_seq_lens"] and "attention_mask" not in batch and restarted:
        return Diagnosis("packing_with_cache", artefact["cu_seq_lens"][1])
    return lesson03.diagnose_padding_incident(artefact)


def _a_generation_is_never_fine(artefact):
    """Exercise 1: a generation without right pads is lesson 02's never_stops (no healthy generation)."""
    truth = lesson03.diagnose_padding_incident(artefact)
    if artefact["kind"] == "generate" and truth.cause == "no_leak":
        return Diagnosis("never_stops", [])
    return truth


def _always_no_leak(artefact):
    """Exercise 1: a constant answer."""
    return Diagnosis("no_leak", None)


def _positions_compared(position_ids, sliding_window=None):
    """Exercise 2: 'a key at an earlier position' compared across the row, ignoring which example it is in."""
    return (position_ids[:, :, None] >= position_ids[:, None, :])[:, None]


def _all_ones(position_ids, sliding_window=None):
    """Exercise 2: the all-ones mask of TRL's wrapped packing (section 3b, call 2)."""
    b, t = position_ids.shape
    return torch.ones(b, 1, t, t, dtype=torch.bool)


def _first_row_for_all(position_ids, sliding_window=None):
    """Exercise 2: the boundaries of row 0 (one packed row, as in section 3b) used for every row."""
    mask = lesson03.block_mask_from_position_ids(position_ids[:1], sliding_window)
    return mask.expand(position_ids.shape[0], -1, -1, -1).clone()


def _the_notebooks_row(position_ids, sliding_window=None):
    """Exercise 2: the mask of the packed row the notebook showed (lengths 47, 50, 51), captured."""
    shown = torch.tensor([[p for n in (47, 50, 51) for p in range(n)]])
    return lesson03.block_mask_from_position_ids(shown, sliding_window)


def _segments_helpers_with_a_window_band(position_ids, sliding_window=None):
    """The audit's shortcut (issue 43): the two padding helpers, plus a two-line window band."""
    mask = _segments_and_block_causal_mask(position_ids)
    if sliding_window:
        i = torch.arange(position_ids.shape[1])
        mask = mask & ((i[:, None] - i[None, :]) < sliding_window)
    return mask


SHORTCUTS = [
    ("block_mask", "packed_segments + block_causal_mask (issue 43)", _segments_and_block_causal_mask),
    ("block_mask", "the helpers plus a window band (issue 43)", _segments_helpers_with_a_window_band),
    ("block_mask", "allowed_attention on the course model (issue 43)", _transformers_inferred_mask),
    ("padding_diagnosis", "match the shown incidents over seeds", _match_shown_incidents),
    ("padding_diagnosis", "pads first means a leak, mask or not", _pads_first_means_a_leak),
    ("padding_diagnosis", "restarted position_ids are enough", _restarted_positions_are_enough),
    ("padding_diagnosis", "restarted position_ids without a mask is always the cache trap",
     _reset_positions_always_cached),
    ("padding_diagnosis", "a generation without right pads never stops", _a_generation_is_never_fine),
    ("padding_diagnosis", "always healthy", _always_no_leak),
    ("block_mask", "the plain causal mask (the default call)", _causal_only),
    ("block_mask", "the all-ones mask", _all_ones),
    ("block_mask", "compare positions across the row", _positions_compared),
    ("block_mask", "row 0's boundaries for every row", _first_row_for_all),
    ("block_mask", "the notebook's packed row, captured", _the_notebooks_row),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, capsys):
    check = {"padding_diagnosis": L.check_padding_diagnosis, "block_mask": L.check_block_mask}[exercise]
    assert not check(function), f"{description} passes exercise {exercise}"


def test_the_finished_mask_helpers_are_out_of_the_exercises_reach():
    """Exercise 2 is built from position_ids by hand: before it, the copy neither imports nor names the
    helpers that give its answer (block_causal_mask + packed_segments, allowed_attention with the model)."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "03_padding_packing.ipynb")
                       .read_text(encoding="utf-8"))["cells"]
    text = ["".join(c["source"]) for c in cells]
    exercise_2 = next(i for i, t in enumerate(text) if "### Exercise 2" in t)
    before = "\n".join(text[:exercise_2 + 3])
    for name in ("block_causal_mask", "packed_segments", "allowed_attention"):
        assert name not in before, f"{name} is in reach of exercise 2"
    assert "block_causal_mask" not in "\n".join(L.check_block_mask.__doc__ or "")


# =================================================================================================
# The self-test's cases (issue 33)
# =================================================================================================

# =================================================================================================
# Bad non-learner arguments (issue 36): refused with what/why/fix, never a pass with zero cases
# =================================================================================================

REFERENCE = lesson03.diagnose_padding_incident


@pytest.mark.parametrize("bad_call, phrase", [
    (lambda: L.padding_incident(None), "deterministic"),
    (lambda: L.check_padding_diagnosis(42), "must be a function"),
    (lambda: L.check_block_mask(None), "expected your function"),
    (lambda: L.padding_incident(-1), ">= 0"),
    (lambda: L.padding_incident(1.5), "integer"),
])
def test_bad_grader_arguments_are_refused(bad_call, phrase):
    with pytest.raises((ValueError, TypeError), match=phrase) as error:
        bad_call()
    assert " — " in str(error.value), "what — why — fix"


def test_a_checker_never_raises_on_a_wrong_answer(capsys):
    """Answers of the wrong kind are reported, not raised."""
    assert not L.check_padding_diagnosis(lambda artefact: Diagnosis("no_leak", "row 1"))
    assert not L.check_padding_diagnosis(lambda artefact: Diagnosis("left_padding_without_mask", ["a"]))
    assert not L.check_block_mask(lambda position_ids: "a mask")
