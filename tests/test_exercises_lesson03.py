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
        return Diagnosis("never_stops", [r for r, g in enumerate(artefact["generated"])
                                         if not any(t in artefact["stop_ids"] for t in g)])
    if ids.shape[0] == 1:
        pos = batch["position_ids"][0].tolist()
        if pos == list(range(len(pos))):
            cause = "packing_without_position_reset"
        elif "attention_mask" in batch:
            cause = "packing_with_all_ones_mask"
        else:
            cause = "packing_with_cache"
        return Diagnosis(cause, pos.index(0, 1) if 0 in pos[1:] else artefact["cu_seq_lens"][1])
    rows = sorted({int(r) for r in (ids[:, 0] == pad).nonzero().flatten()})
    return Diagnosis("left_padding_without_mask", rows) if rows else Diagnosis("no_leak", None)


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


def _mask_by_position_difference(position_ids):
    """A second correct answer: a query at position p sees the p keys before it and itself."""
    batch, length = position_ids.shape
    out = torch.zeros(batch, 1, length, length, dtype=torch.bool)
    for b in range(batch):
        for i in range(length):
            out[b, 0, i, i - int(position_ids[b, i]): i + 1] = True
    return out


def _causal_only(position_ids):
    """A plain causal mask: packed examples attend to the ones before them."""
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return causal.expand(position_ids.shape[0], 1, length, length)


def _blocks_without_causal(position_ids):
    """Blocks only: a token attends to the later tokens of its own example."""
    example = (position_ids == 0).cumsum(-1)
    return (example[:, :, None] == example[:, None, :])[:, None]


def _inverted(position_ids):
    """True where attention is forbidden (the additive-mask reading): the mask is inverted."""
    return ~lesson03.block_mask_from_position_ids(position_ids)


def _boundary_off_by_one(position_ids):
    """Each example's first token joins the previous example: the block boundaries are off by one."""
    example = (position_ids == 0).cumsum(-1)
    example = torch.cat([example[:, :1], example[:, :-1]], dim=-1)  # a first token joins the previous example
    causal = torch.ones(position_ids.shape[-1], position_ids.shape[-1], dtype=torch.bool).tril()
    return ((example[:, :, None] == example[:, None, :]) & causal)[:, None]


def _three_dims(position_ids):
    """[B, T, T] without the head dimension the model expects."""
    return lesson03.block_mask_from_position_ids(position_ids)[:, 0]


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
    ("padding_diagnosis", _any_pad_leaks, "causal mask already hides them"),
    ("padding_diagnosis", _cache_is_harmless, "is not what broke this run"),
    ("block_mask", _causal_only, "plain causal mask"),
    ("block_mask", _blocks_without_causal, "AND with the causal mask"),
    ("block_mask", _inverted, "True must mean"),
    ("block_mask", _boundary_off_by_one, "block boundaries are off"),
    ("block_mask", _three_dims, "add the head dimension"),
]


# =================================================================================================
# The incident generator: every cause, an artefact without its cause
# =================================================================================================

def test_incidents_cover_every_cause_and_differ_by_seed():
    causes = {L._padding_incident(s)[1].cause for s in range(14)}
    assert causes == set(L.INCIDENT_CAUSES)
    a, b = L.padding_incident(0), L.padding_incident(7)
    assert not torch.equal(a["batch"]["input_ids"], b["batch"]["input_ids"])


def test_the_public_incident_is_the_artefact_only():
    """What a notebook may show: the artefact, never a Diagnosis (the exercise copy reaches no cause)."""
    artefact = L.padding_incident(3)
    assert isinstance(artefact, dict) and not any(isinstance(v, Diagnosis) for v in artefact.values())
    truth_artefact = L._padding_incident(3)[0]
    assert artefact.keys() == truth_artefact.keys()
    assert all(torch.equal(v, truth_artefact["batch"][k]) for k, v in artefact["batch"].items())


# =================================================================================================
# Bad non-learner arguments (issue 36): refused with what/why/fix, never a pass with zero cases
# =================================================================================================

REFERENCE = lesson03.diagnose_padding_incident


@pytest.mark.parametrize("bad_call, phrase", [
    (lambda: L.check_padding_diagnosis(REFERENCE, seeds=[]), "with none it would pass"),
    (lambda: L.check_padding_diagnosis(REFERENCE, seeds=range(0)), "non-empty"),
    (lambda: L.check_padding_diagnosis(REFERENCE, seeds=5), "non-empty list"),
    (lambda: L.check_padding_diagnosis(REFERENCE, seeds=[None]), "deterministic"),
    (lambda: L.check_padding_diagnosis(REFERENCE, seeds=[-1]), ">= 0"),
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
