"""Lesson 01 (accumulation and clipping): the forgotten ``loss / K`` and how to prove it without a threshold.

What the lesson measures with these helpers:

- ``split_micro_batches`` / ``split_norms``: the threshold-free test — the *same* examples cut into
  1 or K micro-batches; the pre-clip gradient norm with and without ``/ K`` (grows ∝ K on any model).
- ``run_from`` / ``flat_params`` / ``relative_difference``: restart a run from the same weights and
  compare where two runs end up (SGD: the bug is a K-times learning rate; AdamW: it is not).
- ``median_norm`` / ``threshold_between``: a clip threshold chosen from the run's *measured* norms.
- ``clip_grid`` / ``plot_clip_setting`` / ``clip_explorer``: precomputed runs over accumulation steps
  and thresholds, and the ipywidgets explorer that browses them instantly.
- ``MysteryRun``: a run you did not make: its log, its arguments, and its step to run the split test on.
- ``custom_loss_trainer`` / ``sft_run_log``: what TRL's ``SFTTrainer`` logs with its own loss or
  with a hand-written ``compute_loss`` (mean per micro-batch, or divided twice).

The exercises (a broken run to diagnose, one optimizer step to write) and their checkers are in
``course_utils.exercises.lesson01``; the reference answers in ``course_utils/exercises/answers/lesson01.py``.
"""

from __future__ import annotations

import copy
import inspect
import math
import statistics
import warnings
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch

from . import validate
from .data import make_batches
from .training import NORMALISATIONS, clip_rate, logged, make_sft_trainer, set_seed, token_losses, train
from .viz import figure, plot_curves, what_if

# ------------------------------------------------------------------------------------------------
# Argument checks shared by the helpers below
# ------------------------------------------------------------------------------------------------

# train()'s settings a run may change (run_from passes the model, the micro-batches and progress itself)
_TRAIN_SETTINGS = tuple(p for p in inspect.signature(train).parameters if p not in ("model", "micro_batches",
                                                                                     "progress"))


def _check_start_state(model, start_state) -> None:
    """``start_state`` must be a state dict of ``model`` (``copy.deepcopy(model.state_dict())``)."""
    if not isinstance(start_state, Mapping) or not start_state:
        raise TypeError(f"start_state must be the model's state dict, got {type(start_state).__name__} — "
                        "every run restarts from those weights — pass copy.deepcopy(model.state_dict()).")
    missing = set(model.state_dict()) - set(start_state)
    if missing:
        raise ValueError(f"start_state lacks {len(missing)} of the model's tensors (e.g. "
                         f"{sorted(missing)[0]!r}) — it belongs to another model — take it from this model: "
                         "copy.deepcopy(model.state_dict()).")


# what a True/False switch of this module does (validate.flag says it when the value is not a bool)
_FLAG_WHY = "it switches the division on or off, and any non-empty value would count as True"


def _check_by_k(micro_batches_by_k) -> None:
    """``{K: micro_batches}``: one entry per split, each a list of collated batches."""
    if not isinstance(micro_batches_by_k, Mapping) or not micro_batches_by_k:
        raise ValueError("micro_batches_by_k must be a non-empty {K: micro_batches} dict — one entry per "
                         "split — build each with split_micro_batches(..., k=K).")
    for k, micro in micro_batches_by_k.items():
        validate.positive_int("a key K of micro_batches_by_k", k, why="it is the micro-batches per step")
        validate.batches(f"micro_batches_by_k[{k}]", micro)
    # the split test compares the same examples cut differently: the first step of every K holds them all
    first = {k: _step_examples(micro, k) for k, micro in micro_batches_by_k.items()}
    k0 = next(iter(first))
    other = next((k for k in first if first[k] != first[k0]), None)
    if other is not None:
        raise ValueError(f"micro_batches_by_k[{other}] trains other examples in its first step than "
                         f"micro_batches_by_k[{k0}] — the runs must differ only in how one step's examples "
                         "are cut, or the norms compare different data — build every entry from the same "
                         "conversations: split_micro_batches(tok, conversations, group_size=G, k=K).")


def _step_examples(micro_batches, k: int) -> list[tuple]:
    """The (ids, labels) of the real tokens of each row the first optimizer step of ``k`` micro-batches trains
    (``train`` cycles through the micro-batches), sorted: the step's examples, however they are cut."""
    rows = []
    for j in range(k):
        batch = micro_batches[j % len(micro_batches)]
        mask = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
        for ids, labels, real in zip(batch["input_ids"], batch["labels"], mask):
            rows.append((tuple(ids[real].tolist()), tuple(labels[real].tolist())))
    return sorted(rows)


_THRESHOLD_WHY = "it is a max_grad_norm; None or 'off' for none"


def _check_grid(grid) -> None:
    """The dict ``clip_grid`` returns: ``{(K, max_grad_norm, divided): records}``."""
    if not isinstance(grid, dict) or not grid:
        raise TypeError(f"grid must be the non-empty dict clip_grid() returns, got {type(grid).__name__} — "
                        "the plot looks up (K, max_grad_norm, divided) in it — pass clip_grid(...)'s result.")
    for key, records in grid.items():
        if not (isinstance(key, tuple) and len(key) == 3 and isinstance(records, list) and records
                and isinstance(records[0], dict) and "grad_norm" in records[0]):
            raise ValueError(f"grid entry {key!r} is not (K, max_grad_norm, divided) -> train() records — "
                             "the plot reads each run's grad_norm — pass the dict clip_grid() returns.")


# ------------------------------------------------------------------------------------------------
# Runs from the same starting point, and how far apart they end
# ------------------------------------------------------------------------------------------------

def flat_params(model) -> torch.Tensor:
    """All trainable parameters as one detached fp64 vector (a snapshot to compare runs)."""
    validate.model("model", model)
    return torch.cat([p.detach().double().flatten() for p in model.parameters() if p.requires_grad])


def load_flat(model, params: torch.Tensor):
    """Put a ``flat_params`` snapshot back into ``model`` (in place; returns it): a run's final weights,
    to evaluate that run later without training it again. Exact: the snapshot is fp64 of fp32 weights."""
    validate.model("model", model)
    validate.tensor("params", params)
    trainable = [p for p in model.parameters() if p.requires_grad]
    size = sum(p.numel() for p in trainable)
    if params.dim() != 1 or params.numel() != size:
        raise ValueError(f"params has shape {tuple(params.shape)}, but this model's trainable parameters "
                         f"hold {size} numbers — a snapshot fits only the model it was taken from — pass "
                         "flat_params(model) of this model (or run_from's second result).")
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(params.to(trainable[0].dtype), trainable)
    return model


def run_from(model, start_state: dict, micro_batches, *, seed: int | None = None, **train_kwargs):
    """Reset ``model`` to ``start_state``, seed, ``train(...)``; return ``(records, final_params)``.

    Every run of the lesson starts from the same weights and sees the same micro-batches, so any
    difference between two runs comes from the one setting that differs. ``seed=None``: the course seed.
    ``train_kwargs``: ``train``'s settings (``steps`` is required).
    """
    validate.model("model", model)
    _check_start_state(model, start_state)
    if seed is not None:
        validate.seed("seed", seed)
    for name in train_kwargs:
        validate.key("a setting of run_from", name, _TRAIN_SETTINGS, where="train()'s settings")
    if "steps" not in train_kwargs:
        raise ValueError("run_from needs steps=... — it is the number of optimizer steps of the run — pass "
                         "e.g. steps=16 (and accum_steps=K).")
    return _run_from(model, start_state, micro_batches, seed=seed, **train_kwargs)


def _run_from(model, start_state: dict, micro_batches, *, seed: int | None = None, **train_kwargs):
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
    for name, t in (("a", a), ("b", b), ("reference", reference)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} holds NaN or inf — a run whose weights are not finite has no distance "
                             "to compare — check that run's records (weights_finite) first.")
    scale = float(reference.norm())
    if scale == 0:
        raise ValueError("the reference has norm 0 — the ratio would divide by zero — pass the "
                         "displacement of a run that moved, e.g. final_params - start_params.")
    return float((a - b).norm()) / scale


def _check_records(records) -> None:
    """``train()`` records: a non-empty list of dicts, each with a ``grad_norm``."""
    validate.non_empty("records", records, what="train() records",
                       fix="pass what train() or run_from returned.")
    if not all(isinstance(r, dict) and "grad_norm" in r for r in records):
        raise TypeError("records must be train()'s records (dicts with a grad_norm) — the helper reads each "
                        "step's pre-clip norm — pass what train() or run_from returned.")


def median_norm(records: list[dict], skip: int = 0) -> float:
    """Median pre-clip gradient norm of ``records[skip:]`` (skip the first, untrained-token steps)."""
    _check_records(records)
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
    for name, norms in (("low_norms", low_norms), ("high_norms", high_norms)):
        validate.non_empty(name, norms, what="gradient norms", fix="pass [r['grad_norm'] for r in records].")
        for norm in norms:
            validate.number(f"each of {name}", norm, minimum=0, why="a gradient norm is a finite number >= 0")
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
    validate.tokenizer("tokenizer", tokenizer)
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
    validate.model("model", model)
    _check_start_state(model, start_state)
    _check_by_k(micro_batches_by_k)
    validate.flag("divide_by_accum", divide_by_accum, why=_FLAG_WHY)
    validate.choice("normalise", normalise, NORMALISATIONS, why="the loop knows these two normalisations")
    norms = {}
    for k, micro in micro_batches_by_k.items():
        # one step; the record's grad_norm is taken before the (tiny, discarded) update
        records, _ = _run_from(model, start_state, micro, steps=1, accum_steps=k, optimizer="sgd",
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
    validate.model("model", model)
    _check_start_state(model, start_state)
    _check_by_k(micro_batches_by_k)
    validate.non_empty("thresholds", thresholds, what="max_grad_norm values (None: no clipping)",
                       fix="pass e.g. thresholds=[1.0, None].")
    for threshold in thresholds:
        if threshold is not None:  # "off" is the explorer's label; the grid's key for no clipping is None
            validate.number("each of thresholds", threshold, positive=True,
                            why="it is a max_grad_norm; None for no clipping")
    validate.positive_int("steps", steps, why="it counts optimizer steps")
    validate.number("lr", lr, positive=True, why="a learning rate of 0 or less trains nothing or backwards",
                    example=1e-3)
    if known is not None:
        _check_grid(known)
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
                grid[key], _ = _run_from(model, start_state, micro, steps=steps, accum_steps=k,
                                         lr=lr, max_grad_norm=threshold, divide_by_accum=divided)
    return grid


def _label(threshold) -> str:
    """``max_grad_norm`` as the explorer and the plots name it: "off" is no clipping (``None``)."""
    return "off" if threshold is None else f"{threshold:.3g}"


def _check_setting(grid, k, threshold) -> None:
    _check_grid(grid)
    validate.positive_int("k", k, why="it is the number of micro-batches per step")
    if threshold not in ("off", None):
        validate.number("threshold", threshold, positive=True, why=_THRESHOLD_WHY)
    threshold = None if threshold == "off" else threshold
    if (k, threshold, True) not in grid or (k, threshold, False) not in grid:
        known = sorted({(key[0], _label(key[1])) for key in grid}, key=str)
        raise ValueError(f"K={k}, max_grad_norm={threshold} is not in the grid — only precomputed runs can "
                         f"be shown — pick one of (K, max_grad_norm) {known}, or add it to clip_grid().")


def plot_clip_setting(grid: dict, k: int, threshold, ax=None):
    """Pre-clip gradient norm per step, divided vs undivided, for one ``(K, max_grad_norm)`` of the grid.

    ``threshold``: a number, or ``None`` / ``"off"`` for no clipping (the explorer's label).
    """
    _check_setting(grid, k, threshold)
    threshold = None if threshold == "off" else threshold
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
        validate.number("threshold", threshold, positive=True, why=_THRESHOLD_WHY)
    threshold = None if threshold == "off" else threshold
    return f"pre-clip gradient norm, K = {k}, max_grad_norm = {_label(threshold)}"


def clip_frame(grid: dict, k: int, threshold):
    """One explorer frame: the plot of ``(K, max_grad_norm)`` on a pyplot-free Figure, and its clip rates."""
    _check_setting(grid, k, threshold)
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
    ``start_threshold`` (default: the lowest threshold of the grid; ``"off"``: no clipping).
    """
    _check_grid(grid)
    ks = sorted({k for k, _, _ in grid})
    thresholds = sorted({t for _, t, _ in grid}, key=lambda t: math.inf if t is None else t)
    start = thresholds[0] if start_threshold is None else start_threshold
    start = None if start == "off" else start
    if start not in thresholds:
        raise ValueError(f"start_threshold={start_threshold!r} is not a threshold of the grid — the explorer "
                         f"can only open on a precomputed run — pass one of "
                         f"{[_label(t) for t in thresholds]} (a number, or 'off').")
    for k in ks:
        for t in thresholds:
            _check_setting(grid, k, t)  # every stop of the sliders: refused now, not at a later move
    return what_if(lambda k, max_grad_norm: clip_frame(grid, k, max_grad_norm),
                   {"k": ks, "max_grad_norm": {_label(t): t for t in thresholds}},
                   start={"k": ks[-1], "max_grad_norm": start}, descriptions={"k": "K (accumulation steps)"})


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
    from trl import SFTTrainer  # ~8 s on first import (transformers' Trainer): only where one is built

    validate.choice("loss", loss, LOSS_VARIANTS, why="each is a compute_loss the lesson measures")
    if loss_is_scaled_for_ga is not None:
        validate.flag("loss_is_scaled_for_ga", loss_is_scaled_for_ga, why=_FLAG_WHY)

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
    validate.model("model", model)
    validate.tokenizer("tokenizer", tokenizer)
    validate.model_and_tokenizer(model, tokenizer)
    validate.positive_int("accum_steps", accum_steps, why="it is gradient_accumulation_steps")
    validate.positive_int("batch_size", batch_size, why="it is per_device_train_batch_size")
    validate.positive_int("steps", steps, why="it counts optimizer steps")
    validate.number("max_grad_norm", max_grad_norm, positive=True, allow_none=True,
                    why="clipping to 0 or below would erase every update; None keeps SFTConfig's 1.0")
    if not hasattr(dataset, "column_names") or not hasattr(dataset, "__len__"):
        raise TypeError(f"dataset must be a datasets.Dataset, got {type(dataset).__name__} — SFTTrainer maps "
                        "and tokenizes it — build one with make_chat_dataset().")
    if len(dataset) < accum_steps * batch_size:
        raise ValueError(f"the dataset has {len(dataset)} rows but one optimizer step needs accum_steps × "
                         f"batch_size = {accum_steps * batch_size} — a shorter step would log another "
                         "gradient than the one asked for — pass more rows, or a smaller batch.")
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
# A run you did not make: its log, its arguments, and its training step to probe with the split test
# ------------------------------------------------------------------------------------------------

_LOGGED = ("step", "loss", "grad_norm")  # what the Trainer logs at each optimizer step


class MysteryRun:
    """A training run someone sends you when it "looks off" (lesson 01's diagnosis exercise).

    ``log``: what the Trainer logged, one ``{"step", "loss", "grad_norm"}`` per optimizer step
    (``grad_norm`` before clipping, as ``clip_grad_norm_`` returns it); ``args``: its
    ``gradient_accumulation_steps``, ``max_grad_norm`` and ``learning_rate``. ``grad_norm(k)`` runs the
    run's own training step on step 1's examples cut into ``k`` micro-batches and returns the pre-clip
    norm: the split test of §3, on code you cannot read.
    """

    def __init__(self, log: list[dict], args: dict, step_norm):
        validate.non_empty("log", log, what="logged steps",
                           fix="pass the run's log: one {'step', 'loss', 'grad_norm'} per optimizer step")
        for i, entry in enumerate(log):
            missing = [k for k in _LOGGED if not isinstance(entry, dict) or k not in entry]
            if missing:
                got = f"is a {type(entry).__name__}" if not isinstance(entry, dict) else f"has no {missing}"
                raise ValueError(f"log[{i}] {got} — the diagnosis reads each step's {list(_LOGGED)} — "
                                 "pass the run's log: one {'step', 'loss', 'grad_norm'} per optimizer step.")
            validate.positive_int(f"log[{i}]['step']", entry["step"], why="the Trainer counts steps from 1")
            for key in ("loss", "grad_norm"):
                if isinstance(entry[key], bool) or not isinstance(entry[key], (int, float)):
                    raise TypeError(f"log[{i}][{key!r}]={entry[key]!r:.40} is not a number — the diagnosis "
                                    f"plots and compares each step's {key} — pass the logged value (a float; "
                                    "NaN allowed).")
        if not isinstance(args, dict) or not args:
            raise ValueError(f"args={args!r:.60} is not the run's settings — the diagnosis reads its "
                             "accumulation steps, clip and learning rate — pass a dict such as "
                             "{'gradient_accumulation_steps': 4, 'max_grad_norm': 1.0, "
                             "'learning_rate': 1e-3}.")
        validate.positive_int("args['gradient_accumulation_steps']", args.get("gradient_accumulation_steps"),
                              why="the split test cuts a step into that many micro-batches",
                              fix="pass the run's TrainingArguments value, e.g. "
                                  "{'gradient_accumulation_steps': 4, ...}")
        if "max_grad_norm" in args:
            validate.number("args['max_grad_norm']", args["max_grad_norm"], positive=True, allow_none=True,
                            why="it is the run's clip threshold (None: no clipping)")
        if "learning_rate" in args:
            validate.number("args['learning_rate']", args["learning_rate"], positive=True,
                            why="it is the run's learning rate", example=1e-3)
        validate.function("step_norm", step_norm)  # k -> pre-clip norm: the run's own step, as a black box
        self.log = log
        self.args = args
        self._step_norm = step_norm  # k -> pre-clip norm of the same examples in k micro-batches

    def grad_norm(self, k: int) -> float:
        """The pre-clip gradient norm of step 1's examples cut into ``k`` micro-batches (1 = one batch)."""
        validate.positive_int("k", k, why="it is how many micro-batches the step's examples are cut into")
        return self._step_norm(k)

    def __repr__(self) -> str:
        return f"MysteryRun({len(self.log)} logged steps, args={self.args})"
