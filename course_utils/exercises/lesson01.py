"""Lesson 01's exercises: diagnose a broken run from its log (diagnosis), and write one optimizer step
with accumulation and clipping (fix).

- ``CAUSES``: what can have broken a run (the learner picks one); ``broken_run(seed)``: a broken run's
  artefacts, without its cause; ``check_diagnose_run``: grades a diagnosis function on fresh runs;
- ``check_accumulation_step``: grades ``fn(model, optimizer, micro_batches, max_grad_norm)`` against the
  reference answers (``answers/lesson01.py``) on micro-batches the notebook never shows.

The runs are generated together with their cause (``_broken_run_case``); only the checker reads it.
"""

from __future__ import annotations

import copy
import math
import random
import statistics

import torch

from .. import validate
from ..accumulation import flat_params
from ..checks import Case, Diagnosis, Hints, check_diagnosis, run_check
from ..data import collate_right, make_messages, tokenize_chat
from ..model import course_seed, load_course_model
from .answers import lesson01 as answers

# ------------------------------------------------------------------------------------------------
# Exercise 1 (diagnosis): a training log from one of four causes
# ------------------------------------------------------------------------------------------------

CAUSES = ("missing_division", "clip_far_below_norm", "lr_too_high", "unequal_token_counts")
LOG_STEPS = 30


def _loss_curve(rng: random.Random, n: int) -> list[float]:
    start, floor, tau = rng.uniform(2.5, 4.0), rng.uniform(0.3, 0.9), rng.uniform(4, 9)
    return [floor + (start - floor) * math.exp(-t / tau) * (1 + rng.gauss(0, 0.02)) for t in range(n)]


def _natural_norms(rng: random.Random, n: int, typical: float) -> list[float]:
    # the first steps train untrained token rows: large norms that decay, then noise around `typical`
    return [typical * (1 + 6 * math.exp(-t / 1.5)) * math.exp(rng.gauss(0, 0.2)) for t in range(n)]


def broken_run(seed: int) -> dict:
    """A broken run's artefacts, for the diagnosis exercise; the cause is picked by ``seed``.

    Returns ``{"config": {accum_steps, max_grad_norm, lr}, "log": [{step, loss, grad_norm}, ...],
    "split_test": {1: norm, K: norm}, "tokens_per_micro_batch": [...]}``: what a trainer logged
    (``grad_norm`` before clipping), and the threshold-free test of §3 run on the same examples
    cut into 1 and K micro-batches, with the supervised tokens of each of the K micro-batches.
    Causes: a missing ``/ K`` with clipping; ``max_grad_norm`` far below the natural norm; a
    learning rate too high; and lesson 07's look-alike, micro-batches with very unequal token counts.
    The numbers are generated (a fresh case per seed), shaped like the lesson's measured runs.
    """
    return _broken_run(validate.seed("seed", seed))


def _broken_run(seed: int) -> dict:
    rng = random.Random(seed)
    cause = CAUSES[seed % len(CAUSES)]
    k = rng.choice((4, 8)) if cause == "unequal_token_counts" else rng.choice((2, 4, 8))
    typical = math.exp(rng.uniform(math.log(0.5), math.log(40)))  # any model: norms vary by orders
    loss, norms = _loss_curve(rng, LOG_STEPS), _natural_norms(rng, LOG_STEPS, typical)
    threshold = typical * rng.uniform(1.5, 3.0)  # a sane clip: above the natural norm
    tokens = [rng.randint(40, 80) for _ in range(k)]
    ratio = rng.uniform(0.98, 1.02)  # the split changes nothing when the loss is normalised right
    if cause == "missing_division":
        norms = [k * g for g in norms]  # .backward() summed K micro-batch means
        ratio *= k
    elif cause == "clip_far_below_norm":
        threshold = typical / rng.uniform(8, 30)
    elif cause == "lr_too_high":
        turn = rng.randint(6, 18)  # the loss falls, then the updates overshoot and it climbs for good
        for t in range(turn, LOG_STEPS):
            growth = 1.25 ** (t - turn + 1)
            loss[t] = loss[turn - 1] * (1 + 0.15 * (t - turn + 1)) * growth ** 0.5
            norms[t] = norms[t] * growth
    else:  # unequal_token_counts: one micro-batch holds a handful of tokens but gets 1/K of the weight
        tokens[rng.randrange(k)] = rng.randint(2, 8)
        ratio = rng.uniform(1.2, 1.7) if rng.random() < 0.5 else rng.uniform(0.6, 0.85)
    n1 = typical * rng.uniform(0.9, 1.1)
    return {
        "config": {"accum_steps": k, "max_grad_norm": round(threshold, 4), "lr": 1e-3},
        "log": [{"step": t + 1, "loss": round(loss[t], 4), "grad_norm": round(norms[t], 4)}
                for t in range(LOG_STEPS)],
        "split_test": {1: round(n1, 4), k: round(n1 * ratio, 4)},
        "tokens_per_micro_batch": tokens,
    }


def _truth(artefact: dict, cause: str) -> Diagnosis:
    """The evidence each cause leaves, read from the artefact itself."""
    k = artefact["config"]["accum_steps"]
    if cause == "missing_division":
        return Diagnosis(cause, artefact["split_test"][k] / artefact["split_test"][1])  # ≈ K
    if cause == "clip_far_below_norm":
        norms = [r["grad_norm"] for r in artefact["log"]]
        return Diagnosis(cause, statistics.median(norms) / artefact["config"]["max_grad_norm"])
    if cause == "lr_too_high":
        return Diagnosis(cause, min(artefact["log"], key=lambda r: r["loss"])["step"])
    tokens = artefact["tokens_per_micro_batch"]
    return Diagnosis(cause, tokens.index(min(tokens)))


def _broken_run_case(seed: int) -> tuple[dict, Diagnosis]:
    """``(artefact, true Diagnosis)`` for ``seed`` — what ``check_diagnose_run`` grades against."""
    artefact = _broken_run(seed)
    return artefact, _truth(artefact, CAUSES[seed % len(CAUSES)])


def _evidence_ok(got, truth: Diagnosis) -> bool:
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
    ("missing_division", "unequal_token_counts"):
        "the K-split norm differs from the K = 1 norm, but not by a factor K: a mean of micro-batch means "
        "weights a micro-batch with few tokens up (lesson 07), the / K is there",
    ("unequal_token_counts", "missing_division"):
        "the split test's ratio is K itself, not an uneven weighting: the / K is missing",
    ("clip_far_below_norm", "lr_too_high"):
        "the clip fires more once the run diverges, but the loss climbing after it had fallen is the "
        "learning rate's signature",
    ("missing_division", "lr_too_high"):
        "big norms late in the run come from the divergence; the split test says the scaling is right",
}


def check_diagnose_run(fn, seeds=None):
    """Checker: ``fn(artefact) -> Diagnosis(cause, evidence)`` names what broke fresh runs.

    Evidence per cause: ``missing_division`` the split test's norm ratio (≈ K);
    ``clip_far_below_norm`` the median logged norm over ``max_grad_norm``; ``lr_too_high`` the step
    with the lowest loss (where the run turned); ``unequal_token_counts`` the index of the
    micro-batch with the fewest supervised tokens. Cases are generated from seeds the notebook
    never shows (two per cause); ``seeds`` replaces them.
    """
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    if seeds is None:
        base = 1000 + 8 * course_seed()
        seeds = range(base, base + 2 * len(CAUSES))
    else:
        seeds = validate.seeds("seeds", seeds)
    hints = Hints(
        question="Which number in the artefact does not depend on any threshold, and what value would it "
                 "take if the / K were missing?",
        pointer="§3's split test: the same examples in 1 and K micro-batches. Then read the loss column "
                "(does it turn upward?), the clip threshold against the median norm, and the token counts.",
        answer="r = split_test[K] / split_test[1]: r ≈ K → missing_division (evidence r); r far from 1 → "
               "unequal_token_counts (evidence: index of the smallest token count); loss rising after its "
               "minimum → lr_too_high (evidence: step of the lowest loss); else the median grad_norm is "
               "many times max_grad_norm → clip_far_below_norm (evidence: that ratio).")
    return check_diagnosis("diagnose_run", fn, _broken_run_case, seeds=seeds, evidence_ok=_evidence_ok,
                           misconceptions=_DIAGNOSIS_MISCONCEPTIONS, hint=hints)


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): a full optimizer step with accumulation and clipping
# ------------------------------------------------------------------------------------------------

_STEP_DATA: dict = {}
_SGD_LR = 0.05  # plain SGD: every scaling mistake shows in the parameters (AdamW would hide some)


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
    opt = torch.optim.SGD([p for p in work.parameters() if p.requires_grad], lr=_SGD_LR)
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
    """The checker's cases with their reference results, computed once per process (like
    ``_step_setup``): a learner re-running the checker, or a test trying many functions, waits once."""
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
    return run_check("accumulation_step", lambda model, groups, t: _observe_steps(fn, model, groups, t),
                     _step_cases(), compare=_compare_step, diagnose=_diagnose_step, hint=hints)

