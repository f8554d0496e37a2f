"""Lesson 01's exercises: diagnose a broken run from its log (diagnosis), and write one optimizer step
with accumulation and clipping (fix).

- ``CAUSES``: what can be behind a run (the learner picks one); ``mystery_run(seed)``: a run's log, its
  arguments and its training step to probe (``accumulation.MysteryRun``), without its cause;
  ``check_diagnose_run``: grades a diagnosis function on fresh runs;
- ``check_accumulation_step``: grades ``fn(model, optimizer, micro_batches, max_grad_norm)`` against the
  reference answers (``answers/lesson01.py``) on micro-batches the notebook never shows.

The runs are generated together with their cause in ``answers/lesson01.py`` (``mystery_run_case``); only the
checker reads it, on a stream of runs the public ``mystery_run`` never shows.
"""

from __future__ import annotations

import copy
import math

import torch

from .. import validate
from ..accumulation import MysteryRun, flat_params
from ..checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import collate_right, make_messages, tokenize_chat
from ..model import course_seed, load_course_model
from .answers import lesson01 as answers

# ------------------------------------------------------------------------------------------------
# Exercise 1 (diagnosis): a training log from one of four causes
# ------------------------------------------------------------------------------------------------

CAUSES = answers.CAUSES  # what can be behind a run that "looks off" (the learner picks one)


def mystery_run(seed: int) -> MysteryRun:
    """A run a colleague sends you because it "looks off", for the diagnosis exercise.

    ``run.log``: the logged ``loss`` and pre-clip ``grad_norm`` per step; ``run.args``: its
    ``gradient_accumulation_steps``, ``max_grad_norm`` and ``learning_rate``; ``run.grad_norm(k)``: its own
    training step on step 1's examples cut into ``k`` micro-batches (the split test, on code you cannot
    read). The checker grades your diagnosis on runs drawn apart from these: read the run, not this function.
    """
    return answers.mystery_run_case(validate.seed("seed", seed), graded=False)[0]


def _evidence_ok(got, truth: Diagnosis) -> bool:
    if truth.evidence is None:  # a healthy run: nothing to point at
        return got is None
    if isinstance(truth.evidence, float):  # a measured ratio: any fair reading within 5 % passes
        ok = isinstance(got, (int, float)) and not isinstance(got, bool) and math.isfinite(got)
        return ok and abs(got - truth.evidence) <= 0.05 * truth.evidence
    return isinstance(got, int) and not isinstance(got, bool) and got == truth.evidence


_DIAGNOSIS_MISCONCEPTIONS = {
    ("clip_far_below_norm", "missing_division"):
        "a clip rate near 100 % has two causes; the split test tells them apart — here the norm grew "
        "with K, which only a missing / K does",
    ("missing_division", "clip_far_below_norm"):
        "the clip fires on every step, but the split test shows the same norm for 1 and K micro-batches: "
        "the scaling is right, the threshold is simply far below the natural norm",
    ("healthy", "missing_division"):
        "nothing clips and the loss falls, yet the split test grows K×: the / K is missing, and a threshold "
        "high above the norm hides it from the log",
    ("missing_division", "healthy"):
        "the split test gives the same norm for 1 and K micro-batches (a few % apart: a mean of means): the "
        "scaling is right",
    ("clip_far_below_norm", "healthy"):
        "a few early steps over the threshold are the untrained rows learning; is the MEDIAN grad_norm above "
        "max_grad_norm?",
    ("clip_far_below_norm", "lr_too_high"):
        "the clip fires more once the run diverges, but the loss climbing after it had fallen is the "
        "learning rate's signature",
    ("missing_division", "lr_too_high"):
        "big norms late in the run come from the divergence; the split test says the scaling is right",
}


def check_diagnose_run(fn):
    """Checker: ``fn(run) -> Diagnosis(cause, evidence)`` names what is behind fresh runs.

    Evidence per cause: ``missing_division`` the split test's norm ratio at the run's K (≈ K);
    ``clip_far_below_norm`` the median logged norm over ``max_grad_norm``; ``lr_too_high`` the step
    with the lowest loss (where the run turned); ``healthy`` ``None``. Cases are drawn from a stream
    the notebook never shows, fresh on every run (three per cause, healthy controls and look-alikes
    included; no keyword fixes them: see ``checks.fresh_seeds``).
    """
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    hints = Hints(
        question="Which number does not depend on any threshold, and what value would it take if the / K "
                 "were missing? Which two causes make the clip fire on every step?",
        pointer="§3's split test: run.grad_norm(1) against run.grad_norm(K). Then read the loss column (does "
                "it turn upward?) and the median grad_norm against max_grad_norm.",
        answer="r = run.grad_norm(K) / run.grad_norm(1): r ≈ K → missing_division (evidence r); loss rising "
               "after its minimum → lr_too_high (evidence: step of the lowest loss); median grad_norm above "
               "max_grad_norm → clip_far_below_norm (evidence: that ratio); else healthy (None).")
    return check_diagnosis("diagnose_run", fn, answers.mystery_run_case,
                           seeds=lambda: fresh_seeds(3 * len(CAUSES)), evidence_ok=_evidence_ok,
                           misconceptions=_DIAGNOSIS_MISCONCEPTIONS, hint=hints)


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): a full optimizer step with accumulation and clipping
# ------------------------------------------------------------------------------------------------

_STEP_DATA: dict = {}
_SGD_LR = 0.05  # SGD: every scaling mistake shows in the parameters (AdamW would hide some)


def _step_setup():
    """The course model and micro-batches of uneven sizes, built once per process for the checker."""
    if not _STEP_DATA:
        model, tok = load_course_model()
        chats = make_messages("mixed", n=24, seed=5000 + course_seed())
        examples = [tokenize_chat(tok, m) for m in chats]
        sizes, micro, i = (1, 3, 2, 1, 3, 1, 2, 2, 1, 3), [], 0
        for size in sizes:  # uneven sizes: the two correct normalisations give different gradients
            micro.append(collate_right(examples[i: i + size], tok.pad_token_id))
            i += size
        _STEP_DATA.update(model=model, micro=micro)
    return _STEP_DATA["model"], _STEP_DATA["micro"]


def _observe_steps(fn, model, groups, max_grad_norm) -> dict:
    """Run ``fn`` once per group on a fresh copy with a fresh SGD; return norms and final weights."""
    work = copy.deepcopy(model)
    work.train()
    # momentum: the optimizer carries state from step to step, so a step made with a fresh optimizer (the
    # lesson's own train(), a shortcut) differs from one made with the optimizer the checker hands in
    opt = torch.optim.SGD([p for p in work.parameters() if p.requires_grad], lr=_SGD_LR, momentum=0.9)
    norms = []
    for group in groups:
        got = fn(work, opt, group, max_grad_norm)
        norms.append(float(got) if isinstance(got, (float, torch.Tensor)) and not isinstance(got, bool)
                     else got)
    return {"norms": norms, "params": flat_params(work)}


def _compare_step(got, expected) -> str | None:
    if not isinstance(got, dict) or not all(isinstance(n, float) for n in got["norms"]):
        kinds = [type(n).__name__ for n in got["norms"]] if isinstance(got, dict) else type(got).__name__
        return f"return the pre-clip norm as a float (got {kinds})"
    for ref in expected.values():
        norms_ok = all(math.isclose(g, e, rel_tol=1e-4, abs_tol=1e-7)
                       for g, e in zip(got["norms"], ref["norms"]))
        if norms_ok and torch.allclose(got["params"], ref["params"], rtol=0, atol=1e-6):
            return None
    ref = expected["mean"]
    return (f"pre-clip norms {[round(n, 4) for n in got['norms']]} (a correct step: "
            f"{[round(n, 4) for n in ref['norms']]}), or the weights after the step differ")


def _step_cases():
    """The checker's cases with their reference results, computed once per grading process (``run_check``
    calls this in a forked child: the reference results never exist where the learner's function runs)."""
    if "cases" in _STEP_DATA:
        return _STEP_DATA["cases"]
    model, micro = _step_setup()
    cases = []

    def add(groups, threshold, tag, label):
        expected = {name: _observe_steps(ref, model, groups, threshold)
                    for name, ref in (("mean", answers.accumulation_step),
                                      ("token", answers.accumulation_step_token_weighted))}
        cases.append(Case((model, groups, threshold), expected, label=label, tag=tag))

    add([micro[0:2]], 1e9, "no_clip", "K=2, no clip fires")
    add([micro[2:5]], 1e9, "no_clip", "K=3, no clip fires")
    correct = _observe_steps(answers.accumulation_step, model, [micro[5:9]], 1e9)["norms"][0]
    # 0.3 × the correct norm: the step clips; 0.3 is no 1/K, so a post-clip norm is recognisable
    add([micro[5:9]], 0.3 * correct, "clip", "K=4, the clip fires")
    add([micro[0:3], micro[3:6]], 1e9, "two_steps", "two steps in a row (K=3)")
    _STEP_DATA["cases"] = cases
    return cases


def _diagnose_step(got, case: Case) -> str | None:
    if not isinstance(got, dict) or not all(isinstance(n, float) for n in got["norms"]):
        return ("return the value clip_grad_norm_ gives back, as a float: it is a tensor, so wrap it in "
                "float().")
    _, groups, threshold = case.args
    k = len(groups[0])
    first = got["norms"][0]
    refs = [ref["norms"][0] for ref in case.expected.values()]

    def near(x, y):
        return math.isclose(x, y, rel_tol=1e-3)

    if case.tag == "clip" and near(first, threshold):
        return ("you returned the norm AFTER clipping (it equals max_grad_norm): log the value "
                "clip_grad_norm_ returns, the norm before clipping — that is what shows a missing / K.")
    if any(near(first, k * r) for r in refs):
        return (f"missing division: your gradient is {k}× too large. Each .backward() ADDS to .grad, so K "
                f"micro-batch means sum to K times the mean — scale each micro-batch's loss so the K add up "
                f"to one average (here K = {k}).")
    if any(near(first, r / k) for r in refs):
        return (f"divided twice: your gradient is {k}× too small (divided by K², or by K on top of a "
                "token count).")
    if case.tag == "two_steps" and any(near(first, r) for r in refs):
        return ("stale gradients: your first step is right, your second is not — .grad still held the "
                "previous step's gradient. Zero the gradients before accumulating a new step.")
    if case.tag == "clip" and any(near(first, r) for r in refs):
        return ("the norm is right but the weights are not: clip once, the whole step's gradient, after the "
                "last .backward() and before optimizer.step() (not per micro-batch, not after the step).")
    if case.tag == "clip":
        return ("clipping per micro-batch: clip_grad_norm_ must see the summed gradient of all K "
                "micro-batches, once, after the last .backward().")
    if any(near(first, r) for r in refs):
        return "the norm is right but the weights after the step are not: did you call optimizer.step()?"
    return None


def check_accumulation_step(fn):
    """Checker: ``fn(model, optimizer, micro_batches, max_grad_norm) -> float`` is one full optimizer
    step of gradient accumulation with clipping; it returns the pre-clip norm.

    Accepts both correct normalisations (each micro-batch's mean / K, or every token weighted
    equally: summed / all tokens of the step). Rejects a missing / K, a double division, stale
    gradients (no zeroing between steps), clipping per micro-batch or after the step, and the
    post-clip norm. Checked with plain SGD on micro-batches the notebook never shows.
    """
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    hints = Hints(
        question="After K calls to .backward(), what does .grad hold: the average of the K micro-batch "
                 "gradients, or something else? And what did .grad hold before the first one?",
        pointer="§1's code comment and §4 Cause, fact 1; clip_grad_norm_'s return value (§3); the two-step "
                "case of this checker calls your function twice with the same optimizer.",
        answer="optimizer.zero_grad(); for each micro-batch: summed, n = token_losses(model, batch); "
               "(summed / n / K).backward()  [or (summed / total_tokens).backward()]; "
               "norm = clip_grad_norm_(params, max_grad_norm); optimizer.step(); return float(norm).")
    _step_setup()  # the model and micro-batches (no expected value), built here once: graders inherit them
    return run_check("accumulation_step", lambda model, groups, t: _observe_steps(fn, model, groups, t),
                     _step_cases, compare=_compare_step, diagnose=_diagnose_step, hint=hints)

