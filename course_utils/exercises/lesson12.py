"""Lesson 12's exercises: the two-sample probe on architectures the notebook never shows (7.1), and verdicts
on fresh (architecture, attention implementation, collator) set-ups (7.2), graded.

``packing_setup(seed)`` is a set-up a notebook may show: the model, the two samples and the batch, never the
verdict. The generators that measure the truth, and the reference answers, live in ``answers/lesson12.py``,
which no notebook imports; the graded set-ups are drawn apart from the shown ones.
"""

from __future__ import annotations

import math
import random

import torch

from .. import validate
from ..checks import Case, Hints, check_diagnosis, fresh_seeds, run_check
from ..model import course_seed
from ..packing_arch import packing_leak
from .answers.lesson12 import SETUPS, VERDICTS
from .answers.lesson12 import probe_case as _probe_case  # knows the truth
from .answers.lesson12 import setup_case as _setup_case  # knows the truth

__all__ = ["VERDICTS", "check_packing_probe", "check_packing_verdict", "packing_setup"]


# ------------------------------------------------------------------------------------------------
# Exercise 7.1 (the probe): max |Δlogit| of sample B packed after A vs B alone, on unseen families
# ------------------------------------------------------------------------------------------------

def _probe_cases() -> list[Case]:
    base = 100 * (course_seed() + 1) + random.Random().randrange(1000) * 7  # fresh each run
    cases = []
    for seed in range(base, base + 7):  # one round through the unshown families
        model, a, b, expected = _probe_case(seed)
        cases.append(Case((model, a, b), expected, label=f"{model.config.model_type}, "
                          f"{model.config._attn_implementation}, A {len(a)} + B {len(b)} "
                          f"tokens", tag="probe"))
    return cases


def _compare_drift(got, expected) -> str | None:
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = float(got)
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
        return f"expected one finite number (the max |Δlogit| of B), got {got!r:.80}"
    # round-off differs between equivalent calls (~1e-6); a wrong call differs by whole tenths of a logit
    if abs(got - expected) > 1e-4 + 1e-3 * abs(expected):
        return f"expected {expected:.4g}, got {got:.4g}"
    return None


@torch.no_grad()
def _diagnose_probe(got, case: Case):
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = float(got)
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return None
    model, a, b = case.args
    ids = torch.tensor([a + b])
    restart = torch.tensor([list(range(len(a))) + list(range(len(b)))])
    alone = model(input_ids=torch.tensor([b]), use_cache=False).logits[0]
    calls = {
        "position_ids never restart here: the model reads A and B as one long sequence, so even a healthy "
        "architecture lets B attend to A — restart them at 0 where B begins (lesson 03).":
            dict(use_cache=False),
        "this call builds a cache (config.use_cache=True), which switches off transformers' inference from "
        "position_ids (lesson 03's trap) — call the model with use_cache=False, as SFTTrainer does.":
            dict(position_ids=restart),
        "an attention_mask of ones switches off the inference from position_ids — a padding-free batch "
        "passes no "
        "attention_mask.": dict(position_ids=restart, attention_mask=torch.ones_like(ids), use_cache=False),
    }
    # On some families two wrong calls give the same number (falcon_h1: the cache path and unrestarted
    # positions leak alike): name every call the number fits, so each misconception is met on every draw.
    fits = []
    for message, call in calls.items():
        wrong = float((model(input_ids=ids, **call).logits[0, len(a):] - alone).abs().max())
        if abs(got - wrong) <= 1e-4 + 1e-3 * abs(wrong) and abs(wrong - case.expected) > 1e-3:
            fits.append(message)
    if fits:
        return " Or: ".join(fits)
    if got == 0 and case.expected > 1e-3:
        return "nothing moved: compare B *packed after A* with B alone, not B with itself."
    if 0 < got <= 1 and case.expected > 1:
        return ("return the max |Δlogit| over B's positions (a logit difference), not a share of positions "
                "or a probability.")
    return None


def check_packing_probe(fn):
    """Checker for exercise 7.1: ``fn(model, a, b) -> float``, the max |Δlogit| of sample ``b`` packed after
    ``a`` (a padding-free row, as SFTTrainer calls it) vs ``b`` alone, on families the notebook never
    shows."""
    if not callable(fn):  # before the cases are built (seven tiny models): a wrong argument is told at once
        raise ValueError(f"packing_probe: expected your function, got {type(fn).__name__} — the checker "
                         "calls it on its own inputs — pass the function itself, without calling it.")
    return run_check("packing_probe", fn, _probe_cases, compare=_compare_drift, diagnose=_diagnose_probe,
                     hint=Hints(
                         question="Which three things made lesson 03's packed call exact, and which logits "
                                  "of the packed row belong to B?",
                         pointer="Section 2 builds the packed row by hand: ids A+B, position_ids restarting "
                                 "at 0 where B begins, no attention_mask, use_cache=False; B's logits are "
                                 "the last len(b) positions. Compare them with model(input_ids=[b], "
                                 "use_cache=False).",
                         answer="ids = torch.tensor([a + b]); pos = torch.tensor([list(range(len(a))) + "
                                "list(range(len(b)))]); packed = model(input_ids=ids, position_ids=pos, "
                                "use_cache=False).logits[0, len(a):]; alone = "
                                "model(input_ids=torch.tensor([b]), use_cache=False).logits[0]; return "
                                "float((packed - alone).abs().max())."),
                     out_of_reach=(packing_leak,))


# ------------------------------------------------------------------------------------------------
# Exercise 7.2 (verdicts): clean, leaks or raises, for fresh set-ups
# ------------------------------------------------------------------------------------------------

def packing_setup(seed: int) -> dict:
    """A set-up as you would have it before training: ``model`` (a tiny random model of some family),
    ``features`` (samples A and B) and ``batch`` (what the collator built, passed as ``model(**batch,
    use_cache=False)``). ``seed`` picks family, attention implementation, collator and contents; the set-up
    never names its verdict. The checker grades set-ups drawn apart from these."""
    return _setup_case(validate.seed("seed", seed), graded=False)[0]


_VERDICT_MISCONCEPTIONS = {
    ("leaks", "clean"): "B equals B alone here. A name is not a verdict: unpacked rows have nothing to leak, "
                        "and mRoPE positions with the text row first (4 rows) or Qwen3-VL's 2-D positions "
                        "reach the mask builder — measure it.",
    ("clean", "leaks"): "restarted position_ids are lesson 03's rule for one code path; on this architecture "
                        "B's logits move — run the probe (B packed vs B alone) instead of reading the "
                        "positions.",
    ("leaks", "raises"): "this batch carries cu_seq_lens / seq_idx: transformers 5.24's torch fallback "
                         "refuses them (ValueError) instead of ignoring them — run the forward and catch the "
                         "error.",
    ("clean", "raises"): "call the model on the batch: with boundary metadata and no CUDA kernel it raises.",
    ("raises", "leaks"): "only position_ids here: the torch fallback ignores the boundaries silently (it "
                         "logs 'correct but much slower'), so B leaks.",
    ("raises", "clean"): "nothing raises here: call the model on the batch and compare B with B alone.",
}


def check_packing_verdict(fn):
    """Checker for exercise 7.2: ``fn(setup) -> Diagnosis(verdict)``, the verdict one of ``VERDICTS``, on
    set-ups drawn fresh on every run (one round through every family, attention implementation and collator
    of the pool; no keyword fixes them: see ``checks.fresh_seeds``)."""
    validate.function("fn", fn)
    return check_diagnosis(
        "packing_verdict", fn, _setup_case, seeds=lambda: fresh_seeds(len(SETUPS)),
        evidence_ok=lambda got, truth: True,
        misconceptions=_VERDICT_MISCONCEPTIONS,
        hint=Hints(question="What would prove a set-up clean, whatever its name: which logits of which run "
                            "do you compare?",
                   pointer="Run setup['batch'] as the trainer does (use_cache=False), catching ValueError; "
                           "find B's logits (packed: the last len(B) positions of the row; padded: row 1); "
                           "compare with B alone. Round-off is ~1e-6 of a logit, a leak tenths or more "
                           "(section 6).",
                   answer="try model(**batch, use_cache=False) except ValueError -> 'raises'; else max |Δ| "
                          "of B vs B alone above ~1e-3 x the logit scale -> 'leaks', else 'clean'; return "
                          "Diagnosis(verdict)."),
        out_of_reach=(packing_leak,))
