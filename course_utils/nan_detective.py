"""Lesson 06 (NaN detective): a QLoRA run, the ways it turns non-finite, and the tools that find where.

Used by lesson 06 only. What is here:

- ``qlora_model``: the course model (any shipped or local model) with 4-bit nf4 base weights
  (bitsandbytes, works on CPU) and LoRA adapters on every linear layer (peft ``"all-linear"``).
- ``nonfinite_steps`` / ``first_nonfinite_step``: the steps whose loss or gradient norm is inf/NaN;
  the latter *raises* when there is none (a search that finds nothing must not return ``None``).
- ``learned_vs_control``: did a run learn more than its own noise (an untrained control on the same batches)?
- ``lowest_diverging_lr``: a short search for the smallest learning rate on a grid that diverges;
  ``lr_explorer`` browses the runs it made (a learning-rate slider: loss, gradient norm, first bad step).
- ``qk_norms`` / ``without_qk_norm``: the query and key norms of Qwen3, OLMo 2 and Gemma 3 (QK-norm), which
  bound the attention logits — and the same model without them, where a too-high learning rate overflows.
- ``plant_large_update`` / ``overflow_scale``: make one MLP projection's output large on purpose (a
  large LoRA update), until a forward holds values float16 cannot (the course model's activations
  are far too small to reach 65,504 by themselves).
- ``watch_activations`` / ``first_nonfinite_module``: forward hooks that name the first module, in
  execution order, whose output is not finite, and track the largest |activation| per forward.
- ``debug_underflow_overflow``: the same question answered by transformers' ``DebugUnderflowOverflow``.
- ``anomaly_report``: what ``torch.autograd.detect_anomaly`` says about a NaN backward.
- ``norm_on_inf``: what the model's own normalisation layer makes of one inf.
- ``GuardCallback``: a ``TrainerCallback`` that runs *your* guard before every optimizer step (it hands the
  guard the run's ``GradScaler``, if any: under one, an inf gradient is a skipped step).
- ``fraction_updated`` / ``low_precision_master_weights``: the load-dtype trap of transformers 5 — a bf16
  checkpoint loads in bf16, a full fine-tune then has no float32 master weights and small updates round
  away; the first measures it, the second decides it from the weights' dtype alone (for the doctor).
- ``CAUSES``: the four causes of a non-finite (or silently zero) step the lesson tells apart (exercise 1 adds
  healthy runs: ``exercises.lesson06.RUN_CAUSES``).
- ``plot_checklist``: the decision flow of the lesson as one picture.

The exercises (a generated broken run to diagnose, the guard's checker) are in
``course_utils.exercises.lesson06``; their reference answers in ``course_utils.exercises.answers``.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import warnings
from collections.abc import Callable, Sequence

import torch

from . import internals, validate
from .model import load_course_model
from .quantization import nf4_config
from .training import make_sft_trainer, set_seed
from .viz import figure, what_if

FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504: the largest finite float16
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class NotFound(ValueError):
    """A search for an event (a non-finite step, a module, a learning rate) found none."""


def _dtype(value, name: str) -> torch.dtype:
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(f"{name}={value!r} is not one of {sorted(DTYPES)} — the lesson compares these three "
                     f"floating-point formats — pass e.g. {name}=torch.bfloat16.")


def qlora_model(*, compute_dtype=torch.float32, dtype=None, r: int = 8, lora_alpha: int = 16,
                seed: int | None = None):
    """``(peft_model, tokenizer)``: the course model, base Linear layers quantised to 4-bit nf4, LoRA on
    every linear layer but the output head (peft's ``"all-linear"``, so any architecture works).

    ``compute_dtype`` is ``bnb_4bit_compute_dtype``: the dtype each ``Linear4bit`` dequantises its
    weight to and runs its matmul in. ``dtype`` is the storage dtype of everything that is *not*
    quantised (embeddings, norms, lm_head; ``None`` keeps the checkpoint's float32). The LoRA
    adapters are float32 either way: peft upcasts them (``autocast_adapter_dtype``, peft PR 1706).
    ``seed``: LoRA's A matrices are random (``None``: the course seed).
    """
    # peft (and transformers' quantisation config) load the whole trainer stack: ~9 s more than torch
    # on a 2-core CPU (measured: import peft 11.5 s, import torch 3.3 s); the record-reading tools of
    # this module do not need them
    from peft import LoraConfig, get_peft_model

    compute_dtype = _dtype(compute_dtype, "compute_dtype")
    kwargs = {} if dtype is None else {"dtype": _dtype(dtype, "dtype")}
    validate.positive_int("r", r, why="it is the LoRA rank")
    validate.positive_int("lora_alpha", lora_alpha, why="it scales the LoRA update (alpha / r)")
    if seed is not None:
        validate.seed("seed", seed)
    set_seed(seed)
    model, tokenizer = load_course_model(quantization_config=nf4_config(compute_dtype), **kwargs)
    with warnings.catch_warnings():  # transformers 5 deprecation notice raised from inside peft
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=0.0,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    # Ready to train, so in train mode. It also matters on CPUs with AVX512-BF16: there bitsandbytes 0.50
    # repacks a 4-bit weight for fast inference the first time an *eval-mode* layer sees an input without
    # grad, and the repacking fails unless in_features is a multiple of the 64-value quantisation block
    # (tiny-llama's 96: "shape '[96, 1]' is invalid for input of size 144"). Measured; train mode skips it.
    model.train()
    return model, tokenizer


# ------------------------------------------------------------------------------------------------
# The step
# ------------------------------------------------------------------------------------------------

def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _check_records(name: str, records) -> Sequence[dict]:
    """A non-empty list of training records, each with ``step``, ``loss`` and ``grad_norm``."""
    validate.non_empty(name, records, what="training records", fix="pass train()'s output.")
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not {"step", "loss", "grad_norm"} <= set(record):
            got = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"{name}[{i}] is {got}, not a record with 'step', 'loss' and 'grad_norm' — "
                             "the search reads those three per step — pass train()'s output (one dict per "
                             "optimizer step).")
    return records


def _nonfinite(records: Sequence[dict]) -> list[int]:
    return [r["step"] for r in records if not (_finite(r["loss"]) and _finite(r["grad_norm"]))]


def nonfinite_steps(records: Sequence[dict]) -> list[int]:
    """The ``step`` of every record whose ``loss`` or ``grad_norm`` is inf or NaN (empty: all finite).

    The gradient norm counts as much as the loss: a forward can be finite while its backward is not.
    """
    return _nonfinite(_check_records("records", records))


def first_nonfinite_step(records: Sequence[dict]) -> int:
    """The first step whose loss or gradient norm is inf/NaN. Raises ``NotFound`` when every step is
    finite: code that asked for the bad step must not go on with ``None``."""
    bad = _nonfinite(_check_records("records", records))
    if not bad:
        raise NotFound(f"every one of the {len(records)} steps has a finite loss and gradient norm — there "
                       "is no non-finite step to find — train longer or harder (higher learning rate, "
                       "float16), or use nonfinite_steps(records) to test for finiteness.")
    return bad[0]


def batch_at_step(batches: Sequence[dict], step: int) -> dict:
    """The micro-batch ``training.train`` (with ``accum_steps=1``) uses at 1-based ``step``: it cycles."""
    validate.positive_int("step", step, why="train() counts steps from 1")
    validate.batches("batches", batches, need=("input_ids",))
    return batches[(step - 1) % len(batches)]


def learned_vs_control(untrained, step_batches: Sequence[dict],
                       losses: Sequence[float]) -> tuple[float, float]:
    """Did a run learn, measured against its own noise? ``untrained`` (the run's starting model, not
    trained) scores ``step_batches`` -- the batch of each logged step, in order -- so that batch difficulty
    cancels. Returns ``(learned, noise)``: how far the run's logged ``losses`` sit below the control's over
    the last half of the run (nats, mean; at least two steps), and the control's mean step-to-step change.
    A run learned when ``learned > noise``. Half the run, not its last step or two: a run that learned and
    then spiked (a planted outlier in fp32, on a QK-norm model at one seed: 6.2 nats at step 9, 8.8 at
    step 12, back to 6.3 by step 15; measured) has learned, and the spike stays in its logged losses."""
    from .losses import mean_ignore_index, model_logits

    validate.model("untrained", untrained)
    validate.batches("step_batches", step_batches, need=("input_ids", "labels"))
    validate.non_empty("losses", losses, what="logged losses (one float per logged step)",
                       fix="pass e.g. training.logged(trainer), or [r['loss'] for r in records].")
    for i, value in enumerate(losses):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"losses[{i}] is {value!r:.40} ({type(value).__name__}), not a number — the "
                            "run's last logged losses are compared with the control's — pass the logged loss "
                            "of each step, e.g. training.logged(trainer).")
    if len(losses) != len(step_batches) or len(losses) < 2:
        raise ValueError(f"losses has {len(losses)} values and step_batches {len(step_batches)} batches — "
                         "one logged loss per batch, at least two steps — pass the batch of every logged "
                         "step.")
    # left in train mode: qlora_model's LoRA has no dropout, and bitsandbytes 0.50 repacks eval-mode
    # 4-bit weights on AVX512-BF16 CPUs, which fails for some widths (see qlora_model)
    with torch.no_grad():
        control = [mean_ignore_index(model_logits(untrained, b), b["labels"]).item() for b in step_batches]
    tail = max(2, len(losses) // 2)
    learned = (sum(control[-tail:]) - sum(losses[-tail:])) / tail
    noise = sum(abs(a - b) for a, b in zip(control, control[1:])) / (len(control) - 1)
    return learned, noise


_QK_NORM_NAMES = ("q_norm", "k_norm", "q_layernorm", "k_layernorm")


def qk_norms(model) -> list[str]:
    """The names of ``model``'s query and key norms (QK-norm: Qwen3, OLMo 2, Gemma 3), ``[]`` if it has none
    (Qwen2, Llama, Mistral, GPT-2). They matter to lesson 06's learning-rate search: the attention logits are
    dot products of queries and keys, which a too-high rate makes grow; normalised queries and keys bound
    them. Measured on heldout-bos (a Qwen3-style test model, ``tools/build_course_model.py``; 6 QLoRA steps in
    float32): with its norms no rate up to 300 turned the run non-finite; the same weights without them turned
    NaN from lr 3."""
    validate.model("model", model)
    return [name for name, module in model.named_modules()
            if name.rsplit(".", 1)[-1] in _QK_NORM_NAMES and "norm" in type(module).__name__.lower()]


def without_qk_norm(model):
    """``model`` with its query and key norms replaced by identities, in place (the same weights, the
    attention of Qwen2 or Llama); returns it. Lesson 06 searches the learning rate that overflows on this
    when the model has QK-norm: the failure the guard removes, reproduced where it still happens."""
    names = qk_norms(model)
    if not names:
        raise ValueError(f"{type(model).__name__} has no query or key norms ({', '.join(_QK_NORM_NAMES)}) — "
                         "there is nothing to remove — call it only when qk_norms(model) is not empty.")
    for name in names:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, torch.nn.Identity())
    return model


def lowest_diverging_lr(run: Callable[[float], list[dict]], lrs: Sequence[float]) -> tuple[float, dict]:
    """Try ``run(lr)`` for each learning rate of ``lrs`` in increasing order; stop at the first whose
    records hold a non-finite step. Returns ``(lr, {lr: records})`` — every run tried, so a lesson
    can show the last healthy one beside the first broken one. Raises ``NotFound`` if none diverges.
    """
    validate.function("run", run)
    validate.non_empty("lrs", lrs, what="learning rates", fix="pass a grid, e.g. lrs=[1e-3, 1e-2, 1e-1].")
    grid = sorted(validate.number(f"lrs[{i}]", x, positive=True, why="each is a learning rate to try")
                  for i, x in enumerate(lrs))  # all checked before the first (slow) run
    runs = {}
    for lr in grid:
        runs[lr] = _check_records(f"run({lr:g})", run(lr))
        if _nonfinite(runs[lr]):
            return lr, runs
    raise NotFound(f"no learning rate up to {max(lrs):g} turned the run non-finite — the grid stops too "
                   "low for this model — extend lrs upwards or train more steps per run.")


def _steps_text(values: Sequence[float]) -> str:
    return " ".join(f"{v:.3g}" for v in values)


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}×" if ratio >= 10 else f"{ratio:.2g}×"


def _check_runs(lr_runs) -> dict:
    if not isinstance(lr_runs, dict) or not lr_runs:
        raise ValueError("lr_runs must be a non-empty {learning rate: records} dict — one slider position "
                         "per run — pass the runs lowest_diverging_lr returned.")
    for lr, records in lr_runs.items():
        validate.number("learning rate", lr, positive=True, why="each key of lr_runs is a run's rate")
        _check_records(f"lr_runs[{lr!r}]", records)
    return lr_runs


def _check_healthy(healthy, healthy_lr) -> None:
    _check_records("healthy", healthy)
    validate.number("healthy_lr", healthy_lr, positive=True, why="it is the healthy run's learning rate")
    if _nonfinite(healthy) or not max(r["grad_norm"] for r in healthy) > 0:
        raise ValueError("healthy is not a healthy run (a non-finite step, or no gradient at all) — every "
                         "frame divides by its largest gradient norm — pass the records of a run that "
                         "learned, e.g. train() at the lesson's usual learning rate.")


def lr_frame(lr_runs: dict, lr: float, healthy: Sequence[dict], healthy_lr: float):
    """One frame of ``lr_explorer``: the run at ``lr`` beside the healthy run, over the same steps.

    Returns ``(text, figure)``: the first non-finite step (or "finite"), the loss and gradient norm of
    every step, the largest norm before the break over the healthy run's largest, and where the search
    put the threshold; the figure draws both runs' gradient norms (log) and losses, with the break marked.
    """
    _check_runs(lr_runs)
    validate.choice("lr", lr, sorted(lr_runs), why="a frame only shows runs already made")
    _check_healthy(healthy, healthy_lr)
    return _lr_frame(lr_runs, lr, healthy, healthy_lr)


def _lr_frame(lr_runs: dict, lr: float, healthy: Sequence[dict], healthy_lr: float):
    # matplotlib costs ~1.3 s to import; like viz, the module loads it on the first plot
    from matplotlib.ticker import NullLocator

    records = lr_runs[lr]
    bad = _nonfinite(records)
    reference = healthy[: len(records)]
    steps = [r["step"] for r in records]
    before = [r["grad_norm"] for r in records[: (bad[0] - records[0]["step"]) if bad else None]]
    ratio = max(before, default=0.0) / max(r["grad_norm"] for r in reference)
    finite_lrs = [x for x, rec in lr_runs.items() if not _nonfinite(rec)]
    diverging = [x for x, rec in lr_runs.items() if _nonfinite(rec)]
    search = (f"highest finite lr {max(finite_lrs):.3g}" if finite_lrs else "no finite lr")
    search += f", lowest diverging {min(diverging):.3g}" if diverging else ", none diverged"
    text = "\n".join([
        f"lr {lr:.3g} ({_times(lr / healthy_lr)} the healthy run's {healthy_lr:g}): "
        + (f"first non-finite step {bad[0]}" if bad else f"finite for all {len(records)} steps"),
        f"  grad norm per step: {_steps_text([r['grad_norm'] for r in records])}",
        f"  loss per step:      {_steps_text([r['loss'] for r in records])}",
        f"  largest grad norm before the break / the healthy run's largest: {ratio:.3g}",
        f"  the search: {search}",
    ])
    fig, ax = figure(7.5, 3.3)
    # a non-finite norm is drawn as a gap (log axes cannot place inf)
    shown = [r["grad_norm"] if _finite(r["grad_norm"]) else float("nan") for r in records]
    ax.plot(steps, shown, "o-", color="tab:red" if bad else "tab:blue", label=f"grad norm, lr {lr:.3g}")
    ax.plot([r["step"] for r in reference], [r["grad_norm"] for r in reference], "o--", color="grey",
            label=f"grad norm, healthy lr {healthy_lr:g}")
    if bad:
        ax.axvline(bad[0], color="k", ls=":", label=f"first non-finite step {bad[0]}")
    ax.set(yscale="log", xlabel="optimizer step", ylabel="gradient norm before clipping (log)",
           title=f"lr {lr:.3g}: gradient norm and loss per step")
    ax.yaxis.set_minor_locator(NullLocator())  # decades are enough, and the frame draws faster
    loss_ax = ax.twinx()
    loss_ax.plot(steps, [r["loss"] if _finite(r["loss"]) else float("nan") for r in records], "s-",
                 color="tab:orange", ms=3, lw=1, label=f"loss, lr {lr:.3g}")
    loss_ax.set_ylabel("loss (nats)")
    lines = ax.get_legend_handles_labels()
    more = loss_ax.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return text, fig


def lr_explorer(lr_runs: dict, healthy: Sequence[dict], healthy_lr: float, *, start: float | None = None):
    """A "what if" over the learning rate (``viz.what_if``), browsing the runs ``lowest_diverging_lr``
    already made: one slider position per run, each frame ``lr_frame`` (no training). ``healthy``: the
    records of a run at ``healthy_lr`` that learned, drawn beside each run. ``start``: the learning rate
    shown first (default: the lowest diverging one, else the highest).
    """
    _check_runs(lr_runs)
    _check_healthy(healthy, healthy_lr)
    lrs = sorted(lr_runs)
    if start is None:
        start = next((x for x in lrs if _nonfinite(lr_runs[x])), lrs[-1])
    validate.choice("start", start, lrs, why="the explorer starts on one of the runs already made")
    return what_if(lambda lr: _lr_frame(lr_runs, lr, healthy, healthy_lr),
                   {"lr": {f"{x:.3g}": x for x in lrs}}, start={"lr": start},
                   descriptions={"lr": "learning rate"})


# ------------------------------------------------------------------------------------------------
# The module: forward hooks
# ------------------------------------------------------------------------------------------------

def _compute_dtype(module) -> str | None:
    """A ``Linear4bit``'s ``compute_dtype`` (also through peft's LoRA wrapper), e.g. "float16"; else None."""
    for candidate in (module, getattr(module, "base_layer", None)):
        dtype = getattr(candidate, "compute_dtype", None)
        if isinstance(dtype, torch.dtype):
            return str(dtype).replace("torch.", "")
    return None


def _largest_finite(t: torch.Tensor) -> float:
    # nan_to_num instead of values[isfinite(values)]: boolean indexing copies and syncs, 20x slower
    # on the hooks' small tensors (lesson 06 ran it 5,000 times: 3.9 s of its 27)
    values = t.detach().abs()  # no -inf left, so nan and +inf are the non-finite values
    return float(torch.nan_to_num(values, nan=0.0, posinf=0.0).amax()) if values.numel() else 0.0


class watch_activations(contextlib.AbstractContextManager):
    """Forward hooks on every module while the ``with`` block runs.

    Records, per forward pass of the whole model: ``max_abs`` (the largest finite |input or output|
    of any module — inputs too, because an overflow can happen *between* modules, e.g. in the MLP's
    ``act(gate) * up``), and, the first time it happens, ``first_nonfinite`` = ``{forward, module,
    type, dtype, compute_dtype, max_abs_before}``: the first module *in execution order* whose output
    held an inf or NaN. Hooks fire when a module finishes, so a child is found before its parent.
    ``culprit()`` returns that record or raises ``NotFound``.
    """

    def __init__(self, model):
        self.model, self.handles = validate.model("model", model), []
        self.max_abs: list[float] = []
        self.first_nonfinite: dict | None = None
        self._current = 0.0

    def __enter__(self):
        for name, module in self.model.named_modules():
            hook = self._hook(name or "<model>", module is self.model)
            self.handles.append(module.register_forward_hook(hook))
        return self

    def _hook(self, name: str, is_root: bool):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else getattr(output, "logits", output)
            for t in [a for a in args if torch.is_tensor(a) and a.is_floating_point()]:
                self._current = max(self._current, _largest_finite(t))
            if torch.is_tensor(out) and out.is_floating_point():
                if self.first_nonfinite is None and not bool(torch.isfinite(out).all()):
                    self.first_nonfinite = {
                        "forward": len(self.max_abs) + 1, "module": name, "type": type(module).__name__,
                        "dtype": str(out.dtype).replace("torch.", ""),
                        "compute_dtype": _compute_dtype(module), "max_abs_before": self._current}
                self._current = max(self._current, _largest_finite(out))
            if is_root:  # the model's own hook fires last: one forward pass is complete
                self.max_abs.append(self._current)
                self._current = 0.0
        return hook

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        return False

    def culprit(self) -> dict:
        if self.first_nonfinite is None:
            raise NotFound(f"no module produced an inf/NaN in the {len(self.max_abs)} forward pass(es) "
                           "watched "
                           f"(largest |activation| {max(self.max_abs, default=0.0):.3g}) — the forward is "
                           "finite — look at the loss and the backward instead (anomaly_report).")
        return self.first_nonfinite


def _check_model_and_batch(model, batch) -> None:
    """A model and a collated batch of token ids it can embed (a forward of the two must make sense)."""
    validate.model("model", model)
    validate.batch("batch", batch, need=("input_ids",))
    validate.ids_fit_model(model, batch["input_ids"], name="batch['input_ids']")


def _forward(model, batch: dict):
    """One forward without gradients, in train mode (identical here: LoRA dropout is 0).

    Why train mode: on CPUs with AVX512-BF16, bitsandbytes 0.50.2 repacks a ``Linear4bit``'s weight
    for its inference kernel on an eval-mode, no-grad forward and does not undo it in ``train()``;
    the next training forward then fails ("a view of a leaf Variable ... in-place operation").
    """
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
    finally:
        model.train(was_training)


def forward_watch(model, batch: dict) -> watch_activations:
    """One forward pass of ``batch`` under ``watch_activations``; returns the watch (``.max_abs[0]``,
    ``.first_nonfinite`` — None when the forward is finite, ``.culprit()`` to insist)."""
    _check_model_and_batch(model, batch)
    return _forward_watch(model, batch)


def _forward_watch(model, batch: dict) -> watch_activations:
    with watch_activations(model) as watch:
        _forward(model, batch)
    return watch


def first_nonfinite_module(model, batch: dict) -> dict:
    """The first module whose output is inf/NaN in one forward of ``batch``; raises ``NotFound`` if none."""
    _check_model_and_batch(model, batch)
    return _forward_watch(model, batch).culprit()


def debug_underflow_overflow(model, batch: dict) -> tuple[str, str]:
    """Run transformers' ``DebugUnderflowOverflow`` over one forward; return ``(module, report)``.

    ``module`` is the module of the last frame it dumped (the one whose output held inf/NaN);
    ``report`` its printed report (abs min / abs max of each module's weights, inputs and outputs,
    for the last frames before the overflow). The tool raises ``ValueError`` to abort the run at the
    overflow; that is caught here, and its hooks (which it never removes) are removed. Raises
    ``NotFound`` when it detected nothing.
    """
    _check_model_and_batch(model, batch)
    handles = []
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            internals.removable_underflow_overflow(model, handles, max_frames_to_save=4)
            try:
                _forward(model, batch)
            except ValueError as exc:
                if "DebugUnderflowOverflow" not in str(exc):
                    raise
    finally:
        for handle in handles:
            handle.remove()
    report = buffer.getvalue()
    frames = re.findall(r"^ {17} (\S+) (\w+)$", report, flags=re.MULTILINE)
    if "Detected inf/nan" not in report or not frames:
        raise NotFound("DebugUnderflowOverflow saw no inf/NaN in this forward — the forward is finite — "
                       "pass the batch of the bad step to a model replayed to just before it.")
    return frames[-1][0], report.strip()  # frames start with 17 spaces: the last one is the culprit


def anomaly_report(compute_loss: Callable[[], torch.Tensor]) -> dict:
    """Run ``compute_loss()`` and its backward under ``torch.autograd.detect_anomaly``.

    Returns ``{"error", "forward_line"}``: the first line of anomaly mode's error ("Function
    'MulBackward0' returned nan values in its 0th output.") and the source line of the forward
    operation that created that function (the forward must run inside the mode to be recorded).
    Raises ``NotFound`` when the backward was finite.
    """
    if not callable(compute_loss):
        raise TypeError("compute_loss must be a function of no arguments returning the loss — anomaly mode "
                        "has to run the forward itself to record it — "
                        "pass e.g. lambda: loss_fn(model, batch).")
    error, forward_line = "", ""
    with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly():
        warnings.simplefilter("always")
        loss = compute_loss()
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
            shape = f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else ""
            raise TypeError(f"compute_loss() returned {type(loss).__name__}{shape}, not a scalar loss with a "
                            "gradient — the report runs its backward — return the loss tensor itself (not "
                            ".item(), not computed under torch.no_grad()).")
        try:
            loss.backward()
        except RuntimeError as exc:
            error = str(exc).splitlines()[0]
    if not error:
        raise NotFound("the backward produced no NaN under detect_anomaly — nothing to report — check the "
                       "forward (watch_activations) or the optimizer step instead.")
    for warning in caught:
        text = str(warning.message)
        if text.startswith("Error detected in"):
            lines = re.findall(r'File "[^"]+", line \d+, in (\w+)\n\s+(.+)', text)
            if lines:  # the traceback ends with the line that called the failing op; keep its code only
                forward_line = f"{lines[-1][0]}: {lines[-1][1].strip()}"
    return {"error": error, "forward_line": forward_line}


# ------------------------------------------------------------------------------------------------
# Creating float16 overflow on purpose
# ------------------------------------------------------------------------------------------------

def _first_mlp_lora_b(model) -> tuple[str, torch.nn.Module]:
    """The LoRA ``B`` matrix of the first adapted projection inside an MLP (``gate_proj`` in Qwen2 and
    Llama, ``dense_h_to_4h`` in GPT-NeoX): the first place an MLP's input is multiplied."""
    for name, module in model.named_modules():
        if ".mlp." in name and name.endswith("lora_B.default") and hasattr(module, "weight"):
            return name, module
    raise ValueError(f"{type(model).__name__} has no LoRA adapter inside an MLP — plant_large_update writes "
                     "into one — pass a model from qlora_model().")


def plant_large_update(model, value: float) -> str:
    """Set every entry of the first MLP projection's LoRA ``B`` matrix to ``value``; return its name.

    Why: in a real run the numbers that overflow float16 are *there*: LLMs carry a few huge "outlier"
    activations (hundreds to thousands), and a LoRA update grows as it trains. The course model's
    activations are ~10 and its fresh ``B`` is zero. Writing a large ``B`` makes the projection's
    output large — linearly in ``value``, on any architecture — while the weight itself stays small
    enough for every format (peft keeps adapters in float32; TRL casts them to bfloat16).
    """
    validate.model("model", model)
    validate.number("value", value, positive=True, why="it is written into the LoRA B matrix")
    name, lora_b = _first_mlp_lora_b(model)
    with torch.no_grad():
        lora_b.weight.fill_(value)
    return name


def overflow_scale(model, batch: dict, *, max_doublings: int = 30) -> float:
    """The smallest power-of-two ``plant_large_update`` value at which one forward of ``batch`` holds a
    value float16 cannot store: above 65,504 (a float32/bfloat16 model) or already inf/NaN (a
    float16 one). The model is left planted at that value. A short search, so the lesson does not
    depend on one model's activation sizes (run it on a float32 model: float16 is slow on a CPU).
    Raises ``NotFound`` if ``2**max_doublings`` is not enough.
    """
    _check_model_and_batch(model, batch)
    validate.positive_int("max_doublings", max_doublings, why="it bounds the search")
    _first_mlp_lora_b(model)  # a model without an MLP adapter is refused before the search starts
    value = 1.0
    for _ in range(max_doublings + 1):
        plant_large_update(model, value)
        watch = _forward_watch(model, batch)
        if watch.first_nonfinite is not None or watch.max_abs[0] > FP16_MAX:
            return value
        value *= 2
    raise NotFound(f"the largest activation stayed below float16's 65,504 up to a LoRA B of {value / 2:g} — "
                   "this model does not pass the update on — raise max_doublings.")


def norm_on_inf(norm: torch.nn.Module, hidden_size: int, position: int = 0) -> dict:
    """Feed the model's normalisation layer one token whose hidden vector holds a single +inf at
    ``position`` (the rest 1.0) and count what comes out: ``{"nan", "zero", "inf", "finite_nonzero"}``.

    RMSNorm (Qwen2, Llama) has no subtraction: ``x * rsqrt(mean(x**2))`` = ``x * rsqrt(inf)`` =
    ``x * 0`` — the finite entries become 0 and the inf entry ``inf * 0`` = NaN. LayerNorm
    (GPT-NeoX) subtracts the mean: ``inf - inf`` = NaN.
    """
    weight = getattr(norm, "weight", None)
    if not (isinstance(norm, torch.nn.Module) and isinstance(weight, torch.Tensor)):
        raise TypeError(f"norm must be a normalisation layer with a weight (RMSNorm, LayerNorm), got "
                        f"{type(norm).__name__} — the helper feeds it one hidden vector — pass "
                        "first_norm(model).")
    validate.positive_int("hidden_size", hidden_size, why="it is the width of the hidden vector")
    if weight.shape[-1] != hidden_size:
        raise ValueError(f"hidden_size={hidden_size} but the layer normalises vectors of {weight.shape[-1]} "
                         "entries — the vector must have the layer's width — pass model.config.hidden_size "
                         f"(here {weight.shape[-1]}).")
    validate.integer("position", position, minimum=0, why="it indexes the hidden vector")
    if position >= hidden_size:
        raise ValueError(f"position={position} is outside a hidden vector of {hidden_size} entries — the inf "
                         f"goes at that index — pass 0 to {hidden_size - 1}.")
    x = torch.ones(1, 1, hidden_size, dtype=weight.dtype)
    x[..., position] = float("inf")
    with torch.no_grad():
        y = norm(x)
    return {"nan": int(y.isnan().sum()), "zero": int((y == 0).sum()), "inf": int(y.isinf().sum()),
            "finite_nonzero": int((torch.isfinite(y) & (y != 0)).sum()), "type": type(norm).__name__}


def first_norm(model) -> torch.nn.Module:
    """The model's first normalisation layer over the hidden state (RMSNorm or LayerNorm), for
    ``norm_on_inf``. Query and key norms (``qk_norms``: Qwen3, OLMo 2, Gemma 3) are passed over: they
    normalise queries and keys, not the hidden state an inf arrives in (Qwen3 builds its attention, q_norm
    included, before its input_layernorm, so module order alone would pick q_norm)."""
    validate.model("model", model)
    skip = set(qk_norms(model))
    for name, module in model.named_modules():
        if (name not in skip and "norm" in type(module).__name__.lower()
                and getattr(module, "weight", None) is not None):
            return module
    raise ValueError(f"{type(model).__name__} has no normalisation module with a weight besides its query "
                     "and key norms — norm_on_inf needs one — pass a transformer language model.")


def sft_run(model, tokenizer, dataset, callback=None, **config):
    """Train a TRL ``SFTTrainer`` (``course_utils.make_sft_trainer``: quiet, fp32 unless you pass
    ``bf16``/``fp16``) with an optional callback; return the trainer. Read ``training.logged(trainer)``.
    """
    # transformers' trainer stack costs ~9 s to import (see qlora_model); make_sft_trainer loads it anyway
    from transformers import TrainerCallback

    validate.model("model", model)
    validate.tokenizer("tokenizer", tokenizer)
    validate.model_and_tokenizer(model, tokenizer)
    is_callback = isinstance(callback, TrainerCallback) or (isinstance(callback, type)
                                                            and issubclass(callback, TrainerCallback))
    if callback is not None and not is_callback:
        raise TypeError(f"callback must be a transformers TrainerCallback, got {type(callback).__name__} — "
                        "the Trainer calls its on_* methods during training — pass e.g. GuardCallback(guard) "
                        "(the callback, not the guard function itself).")
    trainer = make_sft_trainer(model, tokenizer, dataset, **config)
    if callback is not None:
        trainer.add_callback(callback)
    trainer.train()
    return trainer


# ------------------------------------------------------------------------------------------------
# The guard: a TrainerCallback that runs a guard function before every optimizer step
# ------------------------------------------------------------------------------------------------

def _make_guard_callback_class():
    from transformers import TrainerCallback

    class GuardCallback(TrainerCallback):
        """Run ``guard(model, control, scaler)`` in ``on_pre_optimizer_step`` — after the backward and the
        clipping, just before ``optimizer.step()``, the last moment a bad gradient can be stopped.
        ``scaler`` is the run's ``GradScaler`` (accelerate keeps it on the optimizer it wraps; None
        without fp16 mixed precision): with one, an inf gradient is a step the scaler skips.
        ``guard`` returns the name of what it found non-finite (or None) and does the rest itself:
        keeping the bad gradient out of the weights and asking the Trainer to stop. The callback
        records ``stopped_at`` (the 1-based step) and ``culprit`` (what the guard named).
        """

        def __init__(self, guard: Callable):
            if not callable(guard):
                raise TypeError("guard must be a function guard(model, control, scaler), got "
                                f"{type(guard).__name__}"
                                " — the callback calls it before each optimizer step — pass your function.")
            self.guard, self.stopped_at, self.culprit = guard, None, None

        def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
            found = self.guard(model, control, getattr(optimizer, "scaler", None))
            if found and self.stopped_at is None:
                self.stopped_at, self.culprit = state.global_step + 1, found  # global_step counts done steps
            return control

    return GuardCallback


def __getattr__(name):  # the class is built on first use: transformers' trainer stack costs ~9 s
    if name == "GuardCallback":
        cls = _make_guard_callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# ------------------------------------------------------------------------------------------------
# Load dtype: no float32 master weights, small updates lost
# ------------------------------------------------------------------------------------------------

LOW_PRECISION = (torch.bfloat16, torch.float16)


def fraction_updated(model, batch: dict, lr: float = 1e-5) -> float:
    """One AdamW step at ``lr`` on ``batch`` (the mean loss over its labels): the fraction of the trainable
    weights whose stored value changed. AdamW's first step moves every weight by about ``lr``; a bfloat16
    weight keeps 8 bits of mantissa, so a step below half its ulp (|w|·2⁻⁸) rounds back to the same value.
    In float32 nearly every weight moves. The model is updated in place: pass a copy."""
    validate.model("model", model)
    validate.number("lr", lr, positive=True, why="it is the optimizer's step size", example=1e-3)
    if not isinstance(batch, dict) or not {"input_ids", "labels"} <= set(batch):
        raise ValueError("batch must be a dict with input_ids and labels — one step needs a loss — pass one "
                         "of make_batches(tok, chats)'s batches.")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter — nothing can be updated — pass a model that "
                         "trains (a full fine-tune, or one with LoRA adapters).")
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=lr)
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                 labels=batch["labels"]).loss
    loss.backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)
    changed = sum(int((b != p.detach()).sum()) for b, p in zip(before, params))
    return changed / sum(b.numel() for b in before)


def low_precision_master_weights(model) -> dict:
    """Which trainable weights are stored in bfloat16/float16, from their dtype alone (for the doctor).

    Transformers 5 loads a checkpoint in the dtype it was saved in (``dtype="auto"``): a bf16 checkpoint
    comes back bf16. A full fine-tune of it has no float32 master copy — the optimizer writes its updates
    into bf16 weights, and ``bf16=True`` (autocast) does not change that. Returns ``{"dtype": the most common
    low-precision dtype or None, "share": the share of trainable weights in it, "trainable": their count}``;
    ``share > 0`` is the finding. Fix: load with ``dtype=torch.float32`` (autocast still computes in bf16),
    or train adapters (peft keeps them in float32)."""
    validate.model("model", model)
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    by_dtype: dict = {}
    for p in params:
        if p.dtype in LOW_PRECISION:
            by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel()
    if not by_dtype:
        return {"dtype": None, "share": 0.0, "trainable": total}
    dtype = max(by_dtype, key=by_dtype.get)
    return {"dtype": str(dtype).replace("torch.", ""), "share": sum(by_dtype.values()) / total,
            "trainable": total}


# ------------------------------------------------------------------------------------------------
# The causes the lesson tells apart (exercise 1 asks for one of them, or "healthy")
# ------------------------------------------------------------------------------------------------

CAUSES = ("all_masked_labels", "fp16_overflow", "learning_rate_too_high", "empty_batch_zero_grad")


# ------------------------------------------------------------------------------------------------
# The checklist as a picture
# ------------------------------------------------------------------------------------------------

CHECKLIST = (
    ("Loss or grad norm inf/NaN at step k?\n(grad_norm column; logged loss 0.0 = NaN)", None),
    ("Step k has 0 supervised tokens?\n(n_tokens, detect_anomaly names the op)",
     "drop fully masked batches, or clamp\nthe count (lesson 05); ignore_index"),
    ("A module's forward output is inf?\n(watch_activations, DebugUnderflowOverflow)",
     "fp16 past 65504: store/compute in bf16\n(fp16=True's GradScaler only skips steps)"),
    ("Grad norm inf while the forward is finite?\nlr near the lowest diverging one?",
     "lower the learning rate (measure it);\nclipping does not shrink Adam's step"),
    ("Long sequences, gradient checkpointing,\nfp4 instead of nf4?",
     "same NaN rules; checkpointing recomputes,\nit does not change the numbers"),
    ("Still unexplained?", "versions: a library bug\n(bitsandbytes #663 was one)"),
)


def plot_checklist(ax=None):
    """Draw the lesson's checklist: questions in order of cost, each with its fix. Returns the axes."""
    import matplotlib.pyplot as plt  # ~1.3 s to import: loaded on the first plot, as viz does

    if ax is not None and not (hasattr(ax, "annotate") and hasattr(ax, "set_xlim")):
        raise TypeError(f"ax must be a matplotlib Axes or None, got {type(ax).__name__} — the checklist is "
                        "drawn into it — pass e.g. plt.subplots()[1], or leave it out for a new figure.")
    if ax is None:
        _, ax = plt.subplots(figsize=(9.5, 6.4))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, len(CHECKLIST) * 2)
    ax.axis("off")
    fix = dict(boxstyle="round,pad=0.4", fc="#d8f3dc", ec="#2d6a4f")
    for i, (question, remedy) in enumerate(CHECKLIST):
        y = len(CHECKLIST) * 2 - 1 - 2 * i
        ax.text(2.6, y, question, ha="center", va="center", fontsize=8.5,
                bbox=dict(boxstyle="round,pad=0.4", fc="#fde2e4" if i == 0 else "#edf2fb",
                          ec="#9d0208" if i == 0 else "#1d3557"))
        if i + 1 < len(CHECKLIST):
            ax.annotate("", xy=(2.6, y - 1.45), xytext=(2.6, y - 0.55), arrowprops=dict(arrowstyle="->"))
            if i:
                ax.text(2.75, y - 1.0, "no", fontsize=8)
        if remedy:
            ax.annotate("", xy=(5.6, y), xytext=(4.75, y), arrowprops=dict(arrowstyle="->"))
            ax.text(5.0, y + 0.18, "yes", fontsize=8)
            ax.text(7.7, y, remedy, ha="center", va="center", fontsize=8.5, bbox=fix)
    ax.set_title("NaN checklist: cheapest check first (each 'yes' leads to the fix measured in this lesson)",
                 fontsize=9.5)
    return ax
