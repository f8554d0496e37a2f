"""Lesson 12's exercise graders (``course_utils.exercises.lesson12``): the tables of its checkers (the
reference answer, a second correct answer, each known wrong answer with its misconception:
``tests/test_checkers.py`` runs them), the set-up generator covers every verdict with measured truth,
shortcuts a learner has fail, and the graders refuse bad non-learner arguments."""

import json
from pathlib import Path

import pytest
import torch
from conftest import Row, graded

from course_utils.checks import Diagnosis
from course_utils.exercises import lesson12 as L
from course_utils.exercises.answers import lesson12

ROOT = Path(__file__).resolve().parent.parent
COPY = ROOT / "notebooks" / "12_packing_new_architectures.ipynb"

# =================================================================================================
# Answers: a second correct one per checker, and the wrong ones (each docstring names its misconception)
# =================================================================================================


def _probe_with_the_real_collator(model, a, b):
    """A second correct probe: transformers' DataCollatorWithFlattening builds the packed row."""
    from transformers import DataCollatorWithFlattening

    batch = DataCollatorWithFlattening()([{"input_ids": list(a)}, {"input_ids": list(b)}])
    batch.pop("labels")
    with torch.no_grad():
        packed = model(**batch, use_cache=False).logits[0, len(a):]
        alone = model(input_ids=torch.tensor([list(b)]), use_cache=False).logits[0]
    return (packed - alone).abs().max()  # a 0-d tensor is accepted too


def _probe_without_position_reset(model, a, b):
    """Lesson 03's first mistake: one packed row, positions 0..T-1 (no restart where B begins)."""
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([a + b]), use_cache=False).logits[0, len(a):]
        alone = model(input_ids=torch.tensor([b]), use_cache=False).logits[0]
    return float((packed - alone).abs().max())


def _probe_with_default_call(model, a, b):
    """Lesson 03's trap: restarted positions, but the default call (config.use_cache=True builds a cache)."""
    pos = torch.tensor([list(range(len(a))) + list(range(len(b)))])
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([a + b]), position_ids=pos).logits[0, len(a):]
        alone = model(input_ids=torch.tensor([b])).logits[0]
    return float((packed - alone).abs().max())


def _probe_b_with_itself(model, a, b):
    """Compares B alone with B alone: nothing ever moves."""
    return 0.0


def _argmax_share(model, a, b):
    """Returns the share of B's argmax that changed, not a logit difference."""
    pos = torch.tensor([list(range(len(a))) + list(range(len(b)))])
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([a + b]), position_ids=pos, use_cache=False).logits[0, len(a):]
        alone = model(input_ids=torch.tensor([b]), use_cache=False).logits[0]
    return float((packed.argmax(-1) != alone.argmax(-1)).float().mean())


def _verdict_by_rule(setup):
    """A second correct verdict, from the mechanisms, no probe: hybrids raise on metadata and leak without it;
    padded rows never leak; mRoPE is clean only with its text row (4 rows, or Qwen3-VL's own 2-D expansion);
    the rest leak unless they are standard decoders."""
    model, batch = setup["model"], setup["batch"]
    kind = model.config.model_type
    if "attention_mask" in batch:
        return Diagnosis("clean")
    if kind in ("qwen3_5_text", "qwen3_next", "lfm2", "bamba", "falcon_h1", "granitemoehybrid"):
        return Diagnosis("raises" if "seq_idx" in batch else "leaks")
    rows = batch["position_ids"].shape[0] if batch["position_ids"].dim() == 3 else 2
    if kind == "qwen2_5_vl":
        return Diagnosis("clean" if rows == 4 else "leaks")
    if kind == "qwen3_vl":
        return Diagnosis("leaks" if rows == 3 else "clean")
    return Diagnosis("clean" if kind in ("qwen2", "qwen3", "llama", "mistral", "olmo2") else "leaks")


def _every_vl_leaks(setup):
    """Misconception: a vision-language model always leaks when packed (a name list)."""
    truth = lesson12.setup_verdict(setup)
    if setup["model"].config.model_type in ("qwen2_5_vl", "qwen3_vl"):
        return Diagnosis("leaks")
    return truth


def _hybrids_always_raise(setup):
    """Misconception: transformers refuses every packed batch of a hybrid (it refuses only boundary
    metadata)."""
    truth = lesson12.setup_verdict(setup)
    return Diagnosis("raises") if truth.cause == "leaks" and "seq_idx" not in setup["batch"] and \
        setup["model"].config.model_type in ("qwen3_5_text", "granitemoehybrid", "falcon_h1") else truth


def _restarted_positions_are_enough(setup):
    """Lesson 03's rule applied everywhere: restarted position_ids and no mask -> clean (unless it raises)."""
    truth = lesson12.setup_verdict(setup)
    return Diagnosis("clean") if truth.cause == "leaks" else truth


def _padded_rows_leak_too(setup):
    """Misconception: a family that leaks packed leaks unpacked too."""
    truth = lesson12.setup_verdict(setup)
    if "attention_mask" in setup["batch"] and setup["model"].config.model_type in ("mpt", "falcon_h1"):
        return Diagnosis("leaks")
    return truth


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

CHECKERS = [
    Row("packing_probe", graded(L.check_packing_probe), lesson12.packed_b_drift),
    Row("packing_verdict", graded(L.check_packing_verdict), lesson12.setup_verdict),
]

ALSO_CORRECT = [
    ("packing_probe", _probe_with_the_real_collator),
    ("packing_verdict", _verdict_by_rule),
]

WRONG = [
    ("packing_probe", _probe_without_position_reset, "position_ids never restart"),
    ("packing_probe", _probe_with_default_call, "builds a cache"),
    ("packing_probe", _probe_b_with_itself, "nothing moved"),
    ("packing_probe", _argmax_share, "not a share of positions"),
    ("packing_verdict", _every_vl_leaks, "A name is not a verdict"),
    ("packing_verdict", _hybrids_always_raise, "ignores the boundaries silently"),
    ("packing_verdict", _restarted_positions_are_enough, "lesson 03's rule for one code path"),
    ("packing_verdict", _padded_rows_leak_too, "unpacked rows have nothing to leak"),
]


# =================================================================================================
# The generators: measured truth, every verdict, the artefact without its verdict
# =================================================================================================

def test_setups_cover_every_verdict_and_the_truth_is_measured():
    truths = [lesson12.setup_case(s)[1].cause for s in range(len(lesson12.SETUPS))]
    assert set(truths) == set(L.VERDICTS)
    assert truths.count("clean") >= 5 and truths.count("leaks") >= 5 and truths.count("raises") >= 3


def test_the_public_setup_is_the_artefact_only_and_the_graded_stream_is_apart():
    shown = L.packing_setup(3)
    assert set(shown) == {"model", "features", "batch"}
    assert not any(isinstance(v, Diagnosis) for v in shown.values())
    graded_case = lesson12.setup_case(3, graded=True)[0]
    assert shown["features"] != graded_case["features"], "drawn apart"
    assert not hasattr(L, "setup_case") and not hasattr(L, "probe_case"), "the truth lives with the answers"


def test_probe_cases_are_families_the_notebook_does_not_show():
    cells = json.loads(COPY.read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for family, _ in lesson12.PROBE_ARCHITECTURES:
        assert f'"{family}"' not in code, f"{family} is in the notebook: exercise 1 grades unseen families"


# =================================================================================================
# Shortcuts a learner has at each exercise: each fails the checker (issue 33)
# =================================================================================================

def _lesson03_drift_on_a_cached_call(model, a, b):
    """Exercise 1: lesson 03's packed_drift, called on the model's default (cached) forward."""
    from course_utils.padding import collate_packed, packed_drift

    batch = collate_packed([{"input_ids": a, "labels": a}, {"input_ids": b, "labels": b}])
    with torch.no_grad():
        return packed_drift(model, batch, model(input_ids=batch["input_ids"],
                                                position_ids=batch["position_ids"]).logits)


def _the_notebooks_table_value(model, a, b):
    """Exercise 1: a value read off the notebook's table (one leak, for every model)."""
    return 3.3


def _always_leaks(setup):
    """Exercise 2: the lesson's headline as a blanket answer."""
    return Diagnosis("leaks")


def _always_clean(setup):
    """Exercise 2: a constant 'clean'."""
    return Diagnosis("clean")


class _AlwaysEqual(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def _always_equal_object(setup):
    """Exercise 2: a cause that compares equal to everything."""
    return Diagnosis(_AlwaysEqual("clean"))


def _packing_leak_probe(model, a, b):
    """The audit's shortcut (issue 43): packing_arch.packing_leak, the lesson's finished probe."""
    from course_utils.packing_arch import packing_leak
    return packing_leak(model, "flattening", features=[{"input_ids": a}, {"input_ids": b}]).max_delta


def _packing_leak_verdict(setup):
    """The audit's shortcut (issue 43): the collator read off the batch's keys, then packing_leak."""
    from course_utils.checks import Diagnosis
    from course_utils.packing_arch import packing_leak
    keys = set(setup["batch"])
    collator = "padded" if "attention_mask" in keys else "trl" if "cu_seq_lens_q" in keys else "flattening"
    positions = setup["batch"].get("position_ids")
    rows = positions.shape[0] if positions is not None and positions.dim() == 3 else None
    leak = packing_leak(setup["model"], collator, features=setup["features"], position_rows=rows)
    return Diagnosis(leak.verdict)


SHORTCUTS = [
    ("packing_probe", "packing_arch.packing_leak (issue 43)", _packing_leak_probe),
    ("packing_verdict", "packing_arch.packing_leak's verdict (issue 43)", _packing_leak_verdict),
    ("packing_probe", "lesson 03's packed_drift on the default call", _lesson03_drift_on_a_cached_call),
    ("packing_probe", "a number read off the notebook's table", _the_notebooks_table_value),
    ("packing_verdict", "always leaks", _always_leaks),
    ("packing_verdict", "always clean", _always_clean),
    ("packing_verdict", "an always-equal cause", _always_equal_object),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, capsys):
    check = {"packing_probe": L.check_packing_probe, "packing_verdict": L.check_packing_verdict}[exercise]
    assert not check(function), f"{description} passes exercise {exercise}"


def test_the_probe_helpers_are_out_of_the_exercises_reach():
    """Before exercise 2 ends, the copy neither imports nor names the finished probe (packing_leak,
    trl_packing_raises): they are the doctor's, introduced in an optional section after the exercises."""
    cells = json.loads(COPY.read_text(encoding="utf-8"))["cells"]
    text = ["".join(c["source"]) for c in cells]
    exercise_2_check = next(i for i, t in enumerate(text) if "check_packing_verdict(verdict)" in t)
    before = "\n".join(text[:exercise_2_check + 1])
    for name in ("packing_leak", "trl_packing_raises", "setup_verdict", "packed_b_drift"):
        assert name not in before, f"{name} is in reach of the exercises"


# =================================================================================================
# Bad non-learner arguments: refused with what/why/fix, never a pass with zero cases
# =================================================================================================

@pytest.mark.parametrize("bad_call, phrase", [
    (lambda: L.check_packing_verdict(42), "must be a function"),
    (lambda: L.check_packing_probe(None), "expected your function"),
    (lambda: L.packing_setup(None), "deterministic"),
    (lambda: L.packing_setup(1.5), "integer"),
])
def test_bad_grader_arguments_are_refused(bad_call, phrase):
    with pytest.raises((ValueError, TypeError), match=phrase) as error:
        bad_call()
    assert " — " in str(error.value), "what — why — fix"


def test_a_checker_never_raises_on_a_wrong_answer(capsys):
    assert not L.check_packing_probe(lambda model, a, b: "a number")
    assert not L.check_packing_verdict(lambda setup: "leaks")
    assert not L.check_packing_verdict(lambda setup: Diagnosis("maybe"))
