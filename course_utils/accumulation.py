"""Lesson 01 (accumulation and clipping): the forgotten ``loss / K`` and how to prove it without a threshold.

What the lesson measures with these helpers:

- ``split_micro_batches`` / ``split_norms``: the threshold-free test — the *same* examples cut into
  1 or K micro-batches; the pre-clip gradient norm with and without ``/ K`` (grows ∝ K on any model).
- ``run_from`` / ``flat_params`` / ``relative_difference``: restart a run from the same weights and
  compare where two runs end up (SGD: the bug is a K-times learning rate; AdamW: it is not).
- ``median_norm`` / ``threshold_between``: a clip threshold chosen from the run's *measured* norms.
- ``clip_grid`` / ``plot_clip_setting`` / ``clip_explorer``: precomputed runs over accumulation steps
  and thresholds, and the ipywidgets explorer that browses them instantly.
- ``custom_loss_trainer`` / ``sft_run_log``: what TRL's ``SFTTrainer`` logs with its own loss or
  with a hand-written ``compute_loss`` (mean per micro-batch, or divided twice).
- Exercises: ``broken_run`` (the diagnosis exercise's generator: a training log from one of four
  causes) with ``check_diagnose_run``; ``check_accumulation_step`` (a full optimizer step with
  accumulation and clipping). Reference answers live in ``course_utils/answers/lesson01.py``.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
from collections.abc import Mapping, Sequence

import torch

from . import validate
from .checks import Case, Diagnosis, Hints, check_diagnosis, run_check
from .training import set_seed, train

# ------------------------------------------------------------------------------------------------
# Runs from the same starting point, and how far apart they end
# ------------------------------------------------------------------------------------------------

def flat_params(model) -> torch.Tensor:
    """All trainable parameters as one detached fp64 vector (a snapshot to compare runs)."""
    return torch.cat([p.detach().double().flatten() for p in model.parameters() if p.requires_grad])


def run_from(model, start_state: dict, micro_batches, *, seed: int | None = None, **train_kwargs):
    """Reset ``model`` to ``start_state``, seed, ``train(...)``; return ``(records, final_params)``.

    Every run of the lesson starts from the same weights and sees the same micro-batches, so any
    difference between two runs comes from the one setting that differs. ``seed=None``: the course seed.
    """
    model.load_state_dict(start_state)
    set_seed(seed)
    records = train(model, micro_batches, progress=False, **train_kwargs)
    return records, flat_params(model)


def relative_difference(a: torch.Tensor, b: torch.Tensor, reference: torch.Tensor) -> float:
    """``‖a − b‖ / ‖reference‖``: how far apart two runs ended, relative to e.g. how far one moved."""
    for name, t in (("a", a), ("b", b), ("reference", reference)):
        validate.tensor(name, t)
    if a.shape != b.shape or a.shape != reference.shape:
        raise ValueError(f"shapes differ ({tuple(a.shape)}, {tuple(b.shape)}, {tuple(reference.shape)}) — "
                         "the runs must be of the same model — pass flat_params() of the same model.")
    scale = float(reference.norm())
    if scale == 0:
        raise ValueError("the reference has norm 0 — the ratio would divide by zero — pass the "
                         "displacement of a run that moved, e.g. final_params - start_params.")
    return float((a - b).norm()) / scale


def median_norm(records: list[dict], skip: int = 0) -> float:
    """Median pre-clip gradient norm of ``records[skip:]`` (skip the first, untrained-token steps)."""
    validate.integer("skip", skip, minimum=0, why="it counts the first steps left out")
    norms = [r["grad_norm"] for r in records[skip:]]
    if not norms:
        raise ValueError(f"no records left after skip={skip} — the median needs at least one step — "
                         "pass a smaller skip or a longer run.")
    return statistics.median(norms)


def threshold_between(low_norms: Sequence[float], high_norms: Sequence[float]) -> float:
    """A clip threshold between two runs' typical norms: the geometric mean of their medians.

    Used to put ``max_grad_norm`` above the correctly scaled run and below the unscaled one, from
    measurements rather than by hand. Raises when the medians are not separated.
    """
    validate.non_empty("low_norms", low_norms, what="gradient norms")
    validate.non_empty("high_norms", high_norms, what="gradient norms")
    low, high = statistics.median(low_norms), statistics.median(high_norms)
    if not 0 < low < high:
        raise ValueError(f"median norms {low:.3g} and {high:.3g} are not 0 < low < high — there is no "
                         "threshold between them — pass the divided run's norms first and check that "
                         "the undivided run was really unscaled.")
    return math.sqrt(low * high)


# ------------------------------------------------------------------------------------------------
# The threshold-free test: the same examples, cut into 1 or K micro-batches
# ------------------------------------------------------------------------------------------------

def split_micro_batches(tokenizer, conversations: list, *, group_size: int, k: int) -> list[dict]:
    """Micro-batches in which every K consecutive ones hold the same ``group_size`` examples.

    Group g of ``group_size`` conversations is cut, in order, into ``k`` micro-batches of
    ``group_size / k``; ``train(..., accum_steps=k)`` then sees exactly the examples of a K = 1 run
    with batch ``group_size`` on every optimizer step — only the split differs.
    """
    from .data import make_batches

    validate.positive_int("group_size", group_size, why="it is the examples per optimizer step")
    validate.positive_int("k", k, why="it is the number of micro-batches per optimizer step")
    if group_size % k:
        raise ValueError(f"group_size={group_size} is not divisible by k={k} — every micro-batch must "
                         "hold the same number of examples — pick k among the divisors of group_size.")
    validate.non_empty("conversations", conversations, what="conversations",
                       fix="pass make_messages(...) output.")
    n_groups = len(conversations) // group_size
    if n_groups == 0:
        raise ValueError(f"{len(conversations)} conversations are fewer than group_size={group_size} — "
                         "there is not one full optimizer step — pass more conversations.")
    usable = conversations[: n_groups * group_size]
    return make_batches(tokenizer, usable, batch_size=group_size // k)


def split_norms(model, start_state: dict, micro_batches_by_k: Mapping[int, list], *,
                divide_by_accum: bool = True, normalise: str = "mean") -> dict[int, float]:
    """``{K: pre-clip gradient norm of the first optimizer step}`` at the weights ``start_state``.

    ``micro_batches_by_k[K]`` must hold the same examples for every K (``split_micro_batches``):
    the only change between the entries is how the step's examples are cut. The norm is the one
    ``train`` records before its update, so it is the loop's own loss code that is measured.
    """
    if not isinstance(micro_batches_by_k, Mapping) or not micro_batches_by_k:
        raise ValueError("micro_batches_by_k must be a non-empty {K: micro_batches} dict — one entry per "
                         "split — build each with split_micro_batches(..., k=K).")
    norms = {}
    for k, micro in micro_batches_by_k.items():
        # one step; the record's grad_norm is taken before the (tiny, discarded) update
        records, _ = run_from(model, start_state, micro, steps=1, accum_steps=k, optimizer="sgd",
                              lr=1e-12, divide_by_accum=divide_by_accum, normalise=normalise)
        norms[k] = records[0]["grad_norm"]
    model.load_state_dict(start_state)
    return norms


# ------------------------------------------------------------------------------------------------
# The explorer: precomputed runs over K and max_grad_norm
# ------------------------------------------------------------------------------------------------

def clip_grid(model, start_state: dict, micro_batches_by_k: Mapping[int, list], *, thresholds: Sequence,
              steps: int, lr: float, known: dict | None = None) -> dict:
    """``{(K, max_grad_norm, divided): records}`` for every K of ``micro_batches_by_k`` and threshold.

    ``micro_batches_by_k[K]`` holds the same examples for every K (``split_micro_batches``), so the
    runs differ only in the split. ``None`` = no clipping. ``known`` holds runs already made with
    the same settings, so they are not made twice. With ``K == 1`` dividing changes nothing, so
    that run is stored under both keys.
    """
    if not isinstance(micro_batches_by_k, Mapping) or not micro_batches_by_k:
        raise ValueError("micro_batches_by_k must be a non-empty {K: micro_batches} dict — the grid has "
                         "one row per K — build each with split_micro_batches(..., k=K).")
    grid = dict(known or {})
    for k, micro in micro_batches_by_k.items():
        for threshold in thresholds:
            for divided in (True, False):
                key = (k, threshold, divided)
                if key in grid:
                    continue
                if k == 1 and (1, threshold, not divided) in grid:
                    grid[key] = grid[(1, threshold, not divided)]
                    continue
                grid[key], _ = run_from(model, start_state, micro, steps=steps, accum_steps=k,
                                        lr=lr, max_grad_norm=threshold, divide_by_accum=divided)
    return grid


def _label(threshold) -> str:
    """``max_grad_norm`` as the explorer and the plots name it: "off" is no clipping (``None``)."""
    return "off" if threshold is None else f"{threshold:.3g}"


def plot_clip_setting(grid: dict, k: int, threshold, ax=None):
    """Pre-clip gradient norm per step, divided vs undivided, for one ``(K, max_grad_norm)`` of the grid.

    ``threshold``: a number, or ``None`` / ``"off"`` for no clipping (the explorer's label).
    """
    import matplotlib.pyplot as plt

    from .training import clip_rate
    from .viz import plot_curves

    if threshold == "off":
        threshold = None
    if (k, threshold, True) not in grid:
        raise ValueError(f"K={k}, max_grad_norm={threshold} is not in the grid — only precomputed runs can "
                         "be shown — pick values from the sliders, or add them to clip_grid().")
    runs = {}
    for divided, name in ((True, "loss / K"), (False, "no division")):
        records = grid[(k, threshold, divided)]
        rate = f", clip rate {clip_rate(records):.0%}" if threshold is not None else ""
        runs[f"{name}{rate}"] = records
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.3))
    plot_curves(runs, "grad_norm", threshold=threshold,
                threshold_label=f"max_grad_norm = {_label(threshold)}",
                title=clip_title(k, threshold), ylabel="‖g‖ before clipping", logy=True, ax=ax)
    return ax


def clip_title(k: int, threshold) -> str:
    """The title ``plot_clip_setting`` gives the plot of ``(K, max_grad_norm)``."""
    validate.positive_int("k", k, why="it is the number of micro-batches per step")
    if threshold not in ("off", None):
        validate.number("threshold", threshold, positive=True, why="it is a max_grad_norm; 'off' for none")
    return f"pre-clip gradient norm, K = {k}, max_grad_norm = {_label(threshold)}"


def clip_frame(grid: dict, k: int, threshold):
    """One explorer frame: the plot of ``(K, max_grad_norm)`` on a pyplot-free Figure, and its clip rates."""
    from .training import clip_rate
    from .viz import figure

    fig, ax = figure(7, 3.3)
    plot_clip_setting(grid, k, threshold, ax=ax)
    if threshold in ("off", None):
        return "no clipping: both runs take every step as it comes", fig
    rates = (f"{name}: clip rate {clip_rate(grid[(k, threshold, divided)]):.0%}"
             for divided, name in ((True, "loss / K"), (False, "no division")))
    return " · ".join(rates), fig


def clip_explorer(grid: dict, start_threshold=None):
    """An explorer over the precomputed grid: K and max_grad_norm sliders → curves and clip rates.

    Every point is a finished run, so moving a slider only redraws (``viz.what_if``); "no clipping" is
    the option "off" (a slider cannot hold ``None``). It opens at the largest K and
    ``start_threshold`` (default: the lowest threshold of the grid).
    """
    from .viz import what_if

    ks = sorted({k for k, _, _ in grid})
    thresholds = sorted({t for _, t, _ in grid}, key=lambda t: math.inf if t is None else t)
    return what_if(lambda k, max_grad_norm: clip_frame(grid, k, max_grad_norm),
                   {"k": ks, "max_grad_norm": {_label(t): t for t in thresholds}},
                   start={"k": ks[-1], "max_grad_norm": thresholds[0] if start_threshold is None
                          else start_threshold},
                   descriptions={"k": "K (accumulation steps)"})



# ------------------------------------------------------------------------------------------------
# What TRL's SFTTrainer does with gradient accumulation (measured)
# ------------------------------------------------------------------------------------------------

LOSS_VARIANTS = ("micro_mean", "divided_again")


def custom_loss_trainer(loss: str, loss_is_scaled_for_ga: bool | None = None):
    """An ``SFTTrainer`` subclass with a hand-written ``compute_loss``, as users write them.

    ``"micro_mean"``: the mean over this micro-batch's tokens, ``num_items_in_batch`` ignored (the
    lesson's symptom). ``"divided_again"``: TRL's correct loss, divided by K once more "to be
    safe". ``loss_is_scaled_for_ga`` sets transformers' switch of that name (``None``: Trainer decides).
    """
    from trl import SFTTrainer

    from .training import token_losses

    validate.choice("loss", loss, LOSS_VARIANTS, why="each is a compute_loss the lesson measures")

    class LessonSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if loss == "divided_again":
                value = super().compute_loss(model, inputs, False, num_items_in_batch)
                return value / self.args.gradient_accumulation_steps
            summed, n = token_losses(model, inputs)
            return summed / max(n, 1)

    if loss_is_scaled_for_ga is not None:
        LessonSFTTrainer.loss_is_scaled_for_ga = loss_is_scaled_for_ga
    return LessonSFTTrainer


def sft_run_log(model, tokenizer, dataset, *, accum_steps: int, batch_size: int, steps: int = 1,
                trainer_cls=None, max_grad_norm: float | None = None) -> dict:
    """Train a copy of ``model`` for ``steps`` steps with TRL's ``SFTTrainer``; return what it logged.

    ``trainer_cls``: an ``SFTTrainer`` subclass (e.g. one with your own ``compute_loss``).
    ``max_grad_norm``: ``None`` keeps SFTConfig's default. Returns ``{"grad_norm": [...], "loss":
    [...]}`` per step — the logged norm is the one *before* clipping.
    """
    import warnings

    from .training import logged, make_sft_trainer

    validate.positive_int("accum_steps", accum_steps, why="it is gradient_accumulation_steps")
    validate.positive_int("batch_size", batch_size, why="it is per_device_train_batch_size")
    validate.positive_int("steps", steps, why="it counts optimizer steps")
    extra = {} if max_grad_norm is None else {"max_grad_norm": max_grad_norm}
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, dataset, max_steps=steps,
                               gradient_accumulation_steps=accum_steps,
                               per_device_train_batch_size=batch_size,
                               trainer_cls=trainer_cls, progress=False, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return {"grad_norm": logged(trainer, "grad_norm"), "loss": logged(trainer, "loss")}


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


def broken_run(seed: int | None = None) -> dict:
    """A broken run's artefacts, for the diagnosis exercise; the cause is picked by ``seed``.

    Returns ``{"config": {accum_steps, max_grad_norm, lr}, "log": [{step, loss, grad_norm}, ...],
    "split_test": {1: norm, K: norm}, "tokens_per_micro_batch": [...]}``: what a trainer logged
    (``grad_norm`` before clipping), and the threshold-free test of §3 run on the same examples
    cut into 1 and K micro-batches, with the supervised tokens of each of the K micro-batches.
    Causes: a missing ``/ K`` with clipping; ``max_grad_norm`` far below the natural norm; a
    learning rate too high; and lesson 07's look-alike, micro-batches with very unequal token counts.
    The numbers are generated (a fresh case per seed), shaped like the lesson's measured runs.
    """
    from .model import course_seed

    seed = course_seed() if seed is None else validate.integer("seed", seed, minimum=0,
                                                                why="it picks the case")
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


def broken_run_case(seed: int) -> tuple[dict, Diagnosis]:
    """``(artefact, true Diagnosis)`` for ``seed`` — what ``check_diagnose_run`` grades against."""
    artefact = broken_run(seed)
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


def check_diagnose_run(fn, seeds: Sequence[int] | None = None):
    """Checker: ``fn(artefact) -> Diagnosis(cause, evidence)`` names what broke fresh runs.

    Evidence per cause: ``missing_division`` the split test's norm ratio (≈ K);
    ``clip_far_below_norm`` the median logged norm over ``max_grad_norm``; ``lr_too_high`` the step
    with the lowest loss (where the run turned); ``unequal_token_counts`` the index of the
    micro-batch with the fewest supervised tokens. Cases are generated from seeds the notebook
    never shows (two per cause).
    """
    from .model import course_seed

    if seeds is None:
        base = 1000 + 8 * course_seed()
        seeds = range(base, base + 2 * len(CAUSES))
    hints = Hints(
        question="Which number in the artefact does not depend on any threshold, and what value would it "
                 "take if the / K were missing?",
        pointer="§3's split test: the same examples in 1 and K micro-batches. Then read the loss column "
                "(does it turn upward?), the clip threshold against the median norm, and the token counts.",
        answer="r = split_test[K] / split_test[1]: r ≈ K → missing_division (evidence r); r far from 1 → "
               "unequal_token_counts (evidence: index of the smallest token count); loss rising after its "
               "minimum → lr_too_high (evidence: step of the lowest loss); else the median grad_norm is "
               "many times max_grad_norm → clip_far_below_norm (evidence: that ratio).")
    return check_diagnosis("diagnose_run", fn, broken_run_case, seeds=seeds, evidence_ok=_evidence_ok,
                           misconceptions=_DIAGNOSIS_MISCONCEPTIONS, hint=hints)


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): a full optimizer step with accumulation and clipping
# ------------------------------------------------------------------------------------------------

_STEP_DATA: dict = {}
_SGD_LR = 0.05  # plain SGD: every scaling mistake shows in the parameters (AdamW would hide some)


def _step_setup():
    """The course model and micro-batches of uneven sizes, built once per process for the checker."""
    if not _STEP_DATA:
        from .data import collate_right, make_messages, tokenize_chat
        from .model import course_seed, load_course_model

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
    from .exercises.answers import lesson01

    if "cases" in _STEP_DATA:
        return _STEP_DATA["cases"]
    model, micro = _step_setup()
    cases = []

    def add(groups, threshold, tag, label):
        expected = {name: _observe_steps(ref, model, groups, threshold)
                    for name, ref in (("mean", lesson01.accumulation_step),
                                      ("token", lesson01.accumulation_step_token_weighted))}
        cases.append(Case((model, groups, threshold), expected, label=label, tag=tag))

    add([micro[0:2]], 1e9, "no_clip", "K=2, no clip fires")
    add([micro[2:5]], 1e9, "no_clip", "K=3, no clip fires")
    correct = _observe_steps(lesson01.accumulation_step, model, [micro[5:9]], 1e9)["norms"][0]
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


# Every public function above checks its arguments by their conventional names (model, tokenizer,
# batch, steps, ...) before it runs: one what/why/fix message for the slips learners make most.
validate.check_module_arguments(globals())
