"""Lesson 01 (accumulation and clipping): the forgotten ``loss / K`` and the clip rate that gives it away.

What the lesson measures with these helpers:

- ``run_from`` / ``flat_params`` / ``relative_difference``: restart a run from the same weights and
  compare where two runs end up (SGD: the bug is a K-times learning rate; AdamW: nearly no change).
- ``threshold_between``: a clip threshold chosen from *measured* gradient norms (never by hand).
- ``clip_grid`` / ``plot_clip_setting`` / ``clip_explorer``: precomputed runs over accumulation steps
  and thresholds, and the ipywidgets explorer that browses them instantly.
- ``sft_first_grad_norm``: the pre-clip gradient norm that TRL's ``SFTTrainer`` logs, with its own loss
  or with a hand-written ``compute_loss`` (mean per micro-batch, or divided twice).
- Exercise checkers: ``check_accumulation_step`` (one accumulation step with the right scaling) and
  ``check_clip_rate`` (the clip-rate metric).
"""

from __future__ import annotations

import copy
import math
import random
import statistics
from collections.abc import Sequence

import torch

from .checks import Case, close, run_check
from .train import set_seed, token_losses, train

# ------------------------------------------------------------------------------------------------
# Runs from the same starting point, and how far apart they end
# ------------------------------------------------------------------------------------------------

def flat_params(model) -> torch.Tensor:
    """All trainable parameters as one detached fp64 vector (a snapshot to compare runs)."""
    return torch.cat([p.detach().double().flatten() for p in model.parameters() if p.requires_grad])


def run_from(model, start_state: dict, micro_batches, *, seed: int = 0, **train_kwargs):
    """Reset ``model`` to ``start_state``, seed, ``train(...)``; return ``(records, final_params)``.

    Every run of the lesson starts from the same weights and sees the same micro-batches, so any
    difference between two runs comes from the one setting that differs.
    """
    model.load_state_dict(start_state)
    set_seed(seed)
    records = train(model, micro_batches, **train_kwargs)
    return records, flat_params(model)


def relative_difference(a: torch.Tensor, b: torch.Tensor, reference: torch.Tensor) -> float:
    """``‖a − b‖ / ‖reference‖``: how far apart two runs ended, relative to e.g. how far one moved."""
    if a.shape != b.shape or a.shape != reference.shape:
        raise ValueError(f"shapes differ ({tuple(a.shape)}, {tuple(b.shape)}, {tuple(reference.shape)}) — "
                         "the runs must be of the same model — pass flat_params() of the same model.")
    scale = float(reference.norm())
    if scale == 0:
        raise ValueError("the reference has norm 0 — the ratio would divide by zero — pass the "
                         "displacement of a run that moved, e.g. final_params - start_params.")
    return float((a - b).norm()) / scale


@torch.no_grad()
def eval_loss(model, batches) -> float:
    """Token-weighted cross-entropy of ``model`` on held-out ``batches`` (nats per supervised token)."""
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        summed, n = token_losses(model, batch)
        total, count = total + float(summed), count + n
    return total / max(count, 1)


def median_norm(records: list[dict], skip: int = 0) -> float:
    """Median pre-clip gradient norm of ``records[skip:]`` (skip the first, untrained-token steps)."""
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
    low, high = statistics.median(low_norms), statistics.median(high_norms)
    if not 0 < low < high:
        raise ValueError(f"median norms {low:.3g} and {high:.3g} are not 0 < low < high — there is no "
                         "threshold between them — pass the divided run's norms first and check that "
                         "the undivided run was really unscaled.")
    return math.sqrt(low * high)


# ------------------------------------------------------------------------------------------------
# The explorer: precomputed runs over K and max_grad_norm
# ------------------------------------------------------------------------------------------------

def clip_grid(model, start_state: dict, micro_batches, *, ks: Sequence[int], thresholds: Sequence,
              steps: int, lr: float, known: dict | None = None) -> dict:
    """``{(K, max_grad_norm, divided): records}`` for every combination (``None`` = no clipping).

    ``known`` holds runs already made with the same settings, so they are not made twice. With
    ``K == 1`` dividing changes nothing, so that run is stored under both keys.
    """
    grid = dict(known or {})
    for k in ks:
        for threshold in thresholds:
            for divided in (True, False):
                key = (k, threshold, divided)
                if key in grid:
                    continue
                if k == 1 and (1, threshold, not divided) in grid:
                    grid[key] = grid[(1, threshold, not divided)]
                    continue
                grid[key], _ = run_from(model, start_state, micro_batches, steps=steps, accum_steps=k,
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

    from .train import clip_rate
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
    return f"pre-clip gradient norm, K = {k}, max_grad_norm = {_label(threshold)}"


def clip_frame(grid: dict, k: int, threshold) -> str:
    """One explorer frame: the plot of ``(K, max_grad_norm)`` as an ``<img>`` whose alt text is its title.

    Drawn on a pyplot-free Figure (no global figure state) and sent as one HTML string, so the picture
    and its title reach the browser in one message.
    """
    import base64
    import html
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.3), dpi=90)
    plot_clip_setting(grid, k, threshold, ax=fig.add_subplot())
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    title = html.escape(clip_title(k, threshold))
    return (f'<img src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}" '
            f'alt="{title}" title="{title}">')


def clip_explorer(grid: dict):
    """An ipywidgets explorer over the precomputed grid: K and max_grad_norm sliders → curves and clip rates.

    Every point is a finished run, so moving a slider only redraws. The plot is replaced in place (one
    HTML value: picture and title together), so quick successive moves always end on the last
    setting; "no clipping" is the option "off" (a slider cannot hold ``None``). Without a widget
    frontend (nbval, a static render) the widget shows nothing and nothing fails.
    """
    import ipywidgets as widgets

    ks = sorted({k for k, _, _ in grid})
    by_label = {_label(t): t for _, t, _ in grid}
    labels = sorted(by_label, key=lambda lab: math.inf if by_label[lab] is None else by_label[lab])
    room = {"style": {"description_width": "initial"}, "layout": widgets.Layout(width="420px")}
    k_slider = widgets.SelectionSlider(options=ks, value=ks[-1], description="K (accumulation steps)", **room)
    t_slider = widgets.SelectionSlider(options=labels, value=labels[0], description="max_grad_norm", **room)
    plot = widgets.HTML()

    def redraw(_=None):
        plot.value = clip_frame(grid, k_slider.value, by_label[t_slider.value])

    k_slider.observe(redraw, names="value")
    t_slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([k_slider, t_slider, plot])


# ------------------------------------------------------------------------------------------------
# What TRL's SFTTrainer does with gradient accumulation (measured)
# ------------------------------------------------------------------------------------------------

LOSS_VARIANTS = ("trl", "micro_mean", "divided_again")


def _trainer_class(loss: str, loss_is_scaled_for_ga):
    from trl import SFTTrainer

    class LessonSFTTrainer(SFTTrainer):
        """SFTTrainer with a hand-written ``compute_loss``, as a user would write one."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if loss == "trl":
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if loss == "divided_again":  # TRL's correct loss, divided by K once more "to be safe"
                value = super().compute_loss(model, inputs, False, num_items_in_batch)
                return value / self.args.gradient_accumulation_steps
            # "micro_mean": the textbook mean over this micro-batch's tokens, ignoring num_items_in_batch
            summed, n = token_losses(model, inputs)
            return summed / max(n, 1)

    if loss_is_scaled_for_ga is not None:
        LessonSFTTrainer.loss_is_scaled_for_ga = loss_is_scaled_for_ga
    return LessonSFTTrainer


def sft_first_grad_norm(model, tokenizer, dataset, *, accum_steps: int, batch_size: int, loss: str = "trl",
                        loss_is_scaled_for_ga: bool | None = None) -> dict:
    """Train a copy of ``model`` for one step with TRL's ``SFTTrainer``; return what it logged.

    ``loss``: ``"trl"`` (SFTTrainer's own), ``"micro_mean"`` (a custom ``compute_loss`` returning the
    micro-batch mean) or ``"divided_again"`` (TRL's loss divided by K once more).
    ``loss_is_scaled_for_ga`` sets transformers' switch of that name (``None``: Trainer decides).
    Returns ``{"grad_norm", "loss"}`` of step 1: the norm is before clipping.
    """
    import warnings

    from .train import logged, make_sft_trainer

    if loss not in LOSS_VARIANTS:
        raise ValueError(f"loss={loss!r} is not one of {LOSS_VARIANTS} — each is a compute_loss the lesson "
                         "measures — pass one of them.")
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, dataset, max_steps=1,
                               gradient_accumulation_steps=accum_steps,
                               per_device_train_batch_size=batch_size,
                               trainer_cls=_trainer_class(loss, loss_is_scaled_for_ga))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return {"grad_norm": logged(trainer, "grad_norm")[0], "loss": logged(trainer, "loss")[0]}


# ------------------------------------------------------------------------------------------------
# Exercise 1: one accumulation step with the right scaling
# ------------------------------------------------------------------------------------------------

def accumulation_step_reference(model, micro_batches, max_grad_norm: float) -> float:
    """One optimizer step's gradient from K micro-batches, clipped; returns the PRE-clip norm.

    Each micro-batch contributes its mean token loss divided by K, so the summed gradient is the
    gradient of the average loss — the same scale as one batch, whatever K is.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()  # each .backward() adds to .grad; the / k makes the sum an average
    return float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))


_EXERCISE_DATA: dict = {}


def _exercise_setup():
    """The course model and a few micro-batches, built once per process for the checker."""
    if not _EXERCISE_DATA:
        from .data import make_batches, make_messages
        from .model import load_course_model

        model, tok = load_course_model()
        batches = make_batches(tok, make_messages("mixed", n=16, seed=101), batch_size=2)
        _EXERCISE_DATA.update(model=model, batches=batches)
    return _EXERCISE_DATA["model"], _EXERCISE_DATA["batches"]


def _observe_step(fn, model, micro_batches, max_grad_norm):
    """Run the learner's step on a fresh copy; return ``(returned norm, flat .grad afterwards)``."""
    work = copy.deepcopy(model)
    work.train()
    got = fn(work, micro_batches, max_grad_norm)
    grads = [p.grad.detach().double().flatten() if p.grad is not None
             else torch.zeros(p.numel(), dtype=torch.float64)
             for p in work.parameters() if p.requires_grad]
    norm = float(got) if isinstance(got, (int, float, torch.Tensor)) and not isinstance(got, bool) else got
    return {"grad_norm": norm, "grad": torch.cat(grads)}


def _step_cases():
    model, batches = _exercise_setup()
    reference_norms = {}
    cases = []
    for k, start in ((2, 0), (4, 2), (3, 4)):
        micro = batches[start: start + k]
        expected = _observe_step(accumulation_step_reference, model, micro, math.inf)
        reference_norms[k] = expected["grad_norm"]
        # 0.4 × the correct norm: the correct step clips; 0.4 is no 1/K, so a post-clip norm is recognisable.
        for label, threshold in (("no clip fires", 1e9), ("clip fires", 0.4 * expected["grad_norm"])):
            want = _observe_step(accumulation_step_reference, model, micro, threshold)
            cases.append(Case((model, micro, threshold), want, label=f"K={k}, {label}"))
    return cases


def _diagnose_step(got, case: Case):
    if not isinstance(got, dict) or not isinstance(got.get("grad_norm"), float):
        return ("return the pre-clip gradient norm as a float "
                "(clip_grad_norm_ returns it as a tensor: use float()).")
    _, micro, threshold = case.args
    k = len(micro)
    want_norm, got_norm = case.expected["grad_norm"], got["grad_norm"]
    if math.isclose(got_norm, threshold, rel_tol=1e-3) and threshold < want_norm:
        return ("you returned the norm AFTER clipping; return the value clip_grad_norm_ gives back, "
                "which is the norm before clipping (that is what a logger should show).")
    if k > 1 and math.isclose(got_norm, k * want_norm, rel_tol=1e-3):
        return (f"your gradient is {k}× too large: the division by K is missing. Each .backward() ADDS to "
                f".grad, so K micro-batch means sum to K times the mean — divide each loss by K "
                f"(here {k}) before .backward().")
    if k > 1 and math.isclose(got_norm, want_norm / k, rel_tol=1e-3):
        return f"your gradient is {k}× too small: you divided by K twice (or by K² somewhere)."
    if math.isclose(got_norm, want_norm, rel_tol=1e-4):
        return ("the norm is right but .grad is not: clip with torch.nn.utils.clip_grad_norm_(params, "
                "max_grad_norm) and leave the clipped gradient in .grad (and zero it before you start).")
    tokens = [int((b["labels"][:, 1:] != -100).sum()) for b in micro]  # supervised tokens per micro-batch
    if len(set(tokens)) > 1:
        return ("the scale is close but not equal: weight each micro-batch by 1/K of its own MEAN loss "
                "(summed / n / K), not by its share of all tokens — token weighting is lesson 07's topic.")
    return None


def check_accumulation_step(fn):
    """Checker: ``fn(model, micro_batches, max_grad_norm) -> float`` builds one clipped, accumulated gradient.

    It rejects the missing ``/ K`` (gradient K× too large), a double division, and the post-clip norm.
    """
    cases = _step_cases()
    return run_check("accumulation_step", lambda model, micro, t: _observe_step(fn, model, micro, t), cases,
                     diagnose=_diagnose_step,
                     compare=lambda got, exp: close(got, exp, rtol=1e-4, atol=1e-7),
                     hint="zero the grads; for each micro-batch: summed, n = token_losses(model, batch); "
                          "(summed / n / K).backward(); then return "
                          "float(clip_grad_norm_(params, max_grad_norm)).")


# ------------------------------------------------------------------------------------------------
# Exercise 2: the clip rate
# ------------------------------------------------------------------------------------------------

def clip_rate_reference(grad_norms: Sequence[float], max_grad_norm: float) -> float:
    """Fraction of steps whose pre-clip norm exceeded ``max_grad_norm`` (the steps the clip changed)."""
    return sum(g > max_grad_norm for g in grad_norms) / len(grad_norms)


def _rate_cases():
    rng = random.Random(7)
    cases = []
    for n, scale, threshold in ((10, 1.0, 1.3), (25, 5.0, 4.0), (40, 30.0, 10.0), (8, 0.5, 1.0)):
        norms = [scale * math.exp(rng.gauss(0, 0.5)) for _ in range(n)]
        cases.append(Case((norms, threshold), clip_rate_reference(norms, threshold),
                          label=f"{n} steps, max_grad_norm={threshold}"))
    return cases


def _diagnose_rate(got, case: Case):
    norms, threshold = case.args
    if isinstance(got, (int, float)) and not isinstance(got, bool):
        if got == sum(g > threshold for g in norms) and len(norms) > 1 and got > 1:
            return ("you returned a count; the clip rate is a fraction of steps "
                    "(divide by the number of steps).")
        if math.isclose(got, 1 - case.expected, abs_tol=1e-9):
            return ("you counted the steps that were NOT clipped; clipping fires when the norm is ABOVE "
                    "max_grad_norm.")
    return None


def check_clip_rate(fn):
    """Checker: ``fn(grad_norms, max_grad_norm) -> float`` is the fraction of clipped steps."""
    return run_check("clip_rate", fn, _rate_cases(), diagnose=_diagnose_rate,
                     hint="count the norms above max_grad_norm and divide by the number of steps.")
