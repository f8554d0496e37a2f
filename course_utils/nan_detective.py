"""Lesson 06 (NaN detective): a QLoRA run on the course model, the ways it turns non-finite, the tools.

Used by lesson 06 only. What is here:

- ``qlora_model``: the course model with 4-bit nf4 base weights (bitsandbytes, works on CPU) and
  LoRA adapters (peft), ready for ``course_utils.train``.
- ``first_nonfinite_step``: the first step whose loss or gradient norm is inf/NaN (exercise 1).
- ``watch_activations`` / ``first_nonfinite_module``: forward hooks that name the first module,
  in execution order, whose output is not finite, and track the largest |activation| per forward.
- ``debug_underflow_overflow``: the same question answered by transformers' own
  ``DebugUnderflowOverflow``, with its report captured and its hooks removed afterwards.
- ``anomaly_report``: what ``torch.autograd.detect_anomaly`` says about a NaN backward.
- ``StopOnNonFinite``: a ``TrainerCallback`` that stops a Trainer at the first non-finite loss or
  gradient, reports the step and keeps the bad gradient out of the weights.
- ``mystery_run`` and ``check_mystery_diagnosis``: exercise 2, a broken run to diagnose.
- ``plot_checklist``: the decision flow of the lesson as one picture.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import warnings
from collections.abc import Sequence

import torch

from .checks import Case, run_check
from .data import IGNORE_INDEX

# bitsandbytes 0.50 logs (once, at import, on CPUs with AVX512-BF16) that the optional `kernels`
# package is missing and falls back to its own CPU 4-bit matmul. The fallback is what we measure;
# the message is noise for a learner, so this one logger is quietened before anything imports bnb.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504: the largest finite float16
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CAUSES = ("all_masked_labels", "fp16_overflow", "learning_rate_too_high", "gradient_explosion")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(value, name: str) -> torch.dtype:
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(f"{name}={value!r} is not one of {sorted(DTYPES)} — the lesson compares these three "
                     f"floating-point formats — pass e.g. {name}=torch.bfloat16.")


def qlora_model(*, compute_dtype=torch.float32, dtype=None, r: int = 8, lora_alpha: int = 16, seed: int = 0):
    """``(peft_model, tokenizer)``: the course model, base Linear layers quantised to 4-bit nf4, LoRA on
    every projection.

    ``compute_dtype`` is ``bnb_4bit_compute_dtype``: the dtype each ``Linear4bit`` dequantises its
    weight to and runs its matmul in. ``dtype`` is the storage dtype of everything that is *not*
    quantised (embeddings, norms, lm_head; ``None`` keeps the checkpoint's float32). The LoRA
    adapters are float32 either way: peft upcasts them (``autocast_adapter_dtype``, peft PR 1706).
    """
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import BitsAndBytesConfig

    from .model import load_course_model
    from .train import set_seed

    compute_dtype = _dtype(compute_dtype, "compute_dtype")
    kwargs = {} if dtype is None else {"dtype": _dtype(dtype, "dtype")}
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"r={r!r} must be a positive integer — it is the LoRA rank — pass e.g. r=8.")
    set_seed(seed)  # LoRA's A matrices are random: the seed makes every run of the lesson identical
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=compute_dtype)
    transformers.logging.disable_progress_bar()  # "Loading weights" bar, 26 tensors: not the lesson
    model, tokenizer = load_course_model(quantization_config=quant, **kwargs)
    with warnings.catch_warnings():  # transformers 5 deprecation notice raised from inside peft
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=0.0,
                                                 target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM"))
    return model, tokenizer


def first_nonfinite_step(records: Sequence[dict]) -> int | None:
    """The ``step`` of the first record whose ``loss`` or ``grad_norm`` is inf or NaN; ``None`` if all finite.

    The gradient norm counts as much as the loss: a forward can be finite while its backward is not.
    """
    for record in records:
        if not (math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])):
            return record["step"]
    return None


def batch_at_step(batches: Sequence[dict], step: int) -> dict:
    """The micro-batch ``course_utils.train`` (with ``accum_steps=1``) uses at 1-based ``step``: it cycles."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step={step!r} must be an integer >= 1 — train() counts steps from 1 — "
                         "pass a step from its records, e.g. records[0]['step'].")
    return batches[(step - 1) % len(batches)]


# ------------------------------------------------------------------------------------------------
# Forward hooks: where does the first inf/NaN appear?
# ------------------------------------------------------------------------------------------------

def _compute_dtype(module) -> str | None:
    """A ``Linear4bit``'s ``compute_dtype`` (also through peft's LoRA wrapper), e.g. "float16"; else None."""
    for candidate in (module, getattr(module, "base_layer", None)):
        dtype = getattr(candidate, "compute_dtype", None)
        if isinstance(dtype, torch.dtype):
            return str(dtype).replace("torch.", "")
    return None


class watch_activations(contextlib.AbstractContextManager):
    """Forward hooks on every module while the ``with`` block runs.

    Records, per forward pass of the whole model: ``max_abs`` (the largest |output| of any module)
    and, the first time it happens, ``first_nonfinite`` = ``{forward, module, type, dtype,
    compute_dtype, max_abs_before}``: the first module *in execution order* whose output held an inf
    or NaN. Hooks fire when a module finishes, so a parent finishes after its children and the
    innermost culprit is found first.
    """

    def __init__(self, model):
        self.model, self.handles = model, []
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
            if torch.is_tensor(out) and out.is_floating_point():
                finite = torch.isfinite(out)
                if not bool(finite.all()) and self.first_nonfinite is None:
                    self.first_nonfinite = {
                        "forward": len(self.max_abs) + 1, "module": name, "type": type(module).__name__,
                        "dtype": str(out.dtype).replace("torch.", ""),
                        "compute_dtype": _compute_dtype(module), "max_abs_before": self._current}
                values = out.detach().abs()[finite] if not bool(finite.all()) else out.detach().abs()
                if values.numel():
                    self._current = max(self._current, float(values.max()))
            if is_root:  # the model's own hook fires last: one forward pass is complete
                self.max_abs.append(self._current)
                self._current = 0.0
        return hook

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        return False


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


def first_nonfinite_module(model, batch: dict) -> dict | None:
    """One forward pass of ``batch`` under ``watch_activations``: the first non-finite module, or None."""
    with watch_activations(model) as watch:
        _forward(model, batch)
    return watch.first_nonfinite


def debug_underflow_overflow(model, batch: dict) -> tuple[str | None, str]:
    """Run transformers' ``DebugUnderflowOverflow`` over one forward; return ``(module, report)``.

    ``module`` is the module of the last frame it dumped (the one whose output held inf/NaN), or
    None if it detected nothing; ``report`` is its printed report (abs min / abs max of each
    module's weights, inputs and outputs, for the last frames before the overflow). The tool raises
    ``ValueError`` to abort the run at the overflow; that is caught here, and its hooks (which it
    never removes itself) are removed so the model can be used again.
    """
    from transformers.debug_utils import DebugUnderflowOverflow

    handles = []

    class _Removable(DebugUnderflowOverflow):
        def _register_forward_hook(self, module):
            handles.append(module.register_forward_hook(self.forward_hook))

    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            _Removable(model, max_frames_to_save=4)
            try:
                _forward(model, batch)
            except ValueError as exc:
                if "DebugUnderflowOverflow" not in str(exc):
                    raise
    finally:
        for handle in handles:
            handle.remove()
    report = buffer.getvalue()
    if "Detected inf/nan" not in report:
        return None, report
    # frames start with 17 spaces, the module name and its class: the last one is the culprit
    frames = re.findall(r"^ {17} (\S+) (\w+)$", report, flags=re.MULTILINE)
    return (frames[-1][0] if frames else None), report.strip()


def anomaly_report(compute_loss) -> dict:
    """Run ``compute_loss()`` and its backward under ``torch.autograd.detect_anomaly``.

    Returns ``{"error", "forward_line"}``: the first line of anomaly mode's error ("Function
    'MulBackward0' returned nan values in its 0th output."), and the source line of the forward
    operation that created that function, taken from the traceback anomaly mode records (the
    forward has to run inside the mode for it to be recorded). Both are "" if nothing was NaN.
    """
    error, forward_line = "", ""
    with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly():
        warnings.simplefilter("always")
        try:
            compute_loss().backward()
        except RuntimeError as exc:
            error = str(exc).splitlines()[0]
    for warning in caught:
        text = str(warning.message)
        if text.startswith("Error detected in"):
            # the traceback's frames end with the line that called the failing op; keep its code only
            lines = re.findall(r'File "[^"]+", line \d+, in (\w+)\n\s+(.+)', text)
            if lines:
                forward_line = f"{lines[-1][0]}: {lines[-1][1].strip()}"
    return {"error": error, "forward_line": forward_line}


def masked_mean_loss(model, batch: dict) -> torch.Tensor:
    """The hand-written masked mean many loops use: ``-(logp * mask).sum() / mask.sum()``.

    When every label is -100 it is 0/0 = NaN, and its backward multiplies 0 by inf: NaN gradients
    in every tensor. (``course_utils.train`` divides torch's ``cross_entropy(reduction="sum")``
    instead, whose backward writes exact zeros at ignored positions: NaN loss, zero gradient.)
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    mask = (labels != IGNORE_INDEX).float()
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(logp * mask).sum() / mask.sum()


def all_masked(batch: dict) -> dict:
    """A copy of ``batch`` whose labels are all -100: no token carries loss (lesson 05 shows how truncation
    gets there in real data)."""
    return {**batch, "labels": torch.full_like(batch["labels"], IGNORE_INDEX)}


def drop_fully_masked(batches: Sequence[dict]) -> list[dict]:
    """The micro-batches that have at least one supervised target (TRL drops fully masked examples too)."""
    return [b for b in batches if int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) > 0]


def weights_finite(model) -> bool:
    """True when every trainable parameter is finite (after a NaN step, AdamW makes them all NaN)."""
    return all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.requires_grad)


# ------------------------------------------------------------------------------------------------
# The Trainer callback
# ------------------------------------------------------------------------------------------------

def sft_run(model, tokenizer, dataset, callback=None, **config):
    """Train a TRL ``SFTTrainer`` (``course_utils.make_sft_trainer``: quiet, fp32 unless you pass
    ``bf16``/``fp16``) with an optional callback; return the trainer. Read ``train.logged(trainer)``.
    """
    from .train import make_sft_trainer

    trainer = make_sft_trainer(model, tokenizer, dataset, **config)
    if callback is not None:
        trainer.add_callback(callback)
    trainer.train()
    return trainer


def _make_stop_callback_class():
    from transformers import TrainerCallback

    class StopOnNonFinite(TrainerCallback):
        """Stop a ``Trainer`` at the first non-finite gradient or logged loss; keep the weights clean.

        ``on_pre_optimizer_step`` (after clipping, before ``optimizer.step()``) looks at every
        gradient: if one is inf/NaN it drops all gradients (the optimizer then skips every
        parameter, as a GradScaler skips an overflowed fp16 step), records the step and asks the
        Trainer to stop. ``on_log`` checks the logged ``loss`` and ``grad_norm`` too — set
        ``logging_nan_inf_filter=False``, or the Trainer replaces a NaN loss by an average before
        logging it. ``stopped_at`` is the 1-based step, ``reason`` says what was non-finite.
        Unlike a Trainer subclass, it composes with any Trainer (SFTTrainer included).
        """

        def __init__(self):
            self.stopped_at: int | None = None
            self.reason = ""

        def _stop(self, control, step: int, reason: str):
            if self.stopped_at is None:
                self.stopped_at, self.reason = step, reason
            control.should_training_stop = True
            return control

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            bad = [n for n, p in model.named_parameters()
                   if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
            if bad:
                model.zero_grad(set_to_none=True)  # no gradient, no update: the weights stay as they were
                return self._stop(control, state.global_step + 1,
                                  f"non-finite gradient in {len(bad)} tensors, e.g. {bad[0]}")
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            for key in ("loss", "grad_norm"):
                value = (logs or {}).get(key)
                if value is not None and not math.isfinite(value):
                    return self._stop(control, state.global_step, f"logged {key} = {value}")
            return control

    return StopOnNonFinite


def __getattr__(name):  # build the callback class lazily: importing transformers costs seconds
    if name == "StopOnNonFinite":
        cls = _make_stop_callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# ------------------------------------------------------------------------------------------------
# Exercise 1: find the first non-finite step
# ------------------------------------------------------------------------------------------------

def _records(losses, norms):
    return [{"step": i + 1, "loss": lo, "grad_norm": g, "clipped": False, "n_tokens": 10, "nonfinite": 0}
            for i, (lo, g) in enumerate(zip(losses, norms))]


def _first_step_cases() -> list[Case]:
    nan, inf = float("nan"), float("inf")
    return [
        Case((_records([5.0, 4.0, 3.5], [2.0, 1.5, 1.0]),), None, label="a healthy run"),
        Case((_records([5.0, 4.0, nan, nan], [2.0, 9.0, nan, nan]),), 3, label="loss turns NaN at step 3"),
        Case((_records([5.0, 4.0, 3.9, nan], [2.0, 3.0, inf, nan]),), 3,
             label="the gradient norm is inf one step before the loss"),
        Case((_records([nan, 4.0], [0.0, 1.0]),), 1, label="NaN on the very first step"),
    ]


def _diagnose_first_step(got, case: Case):
    records = case.args[0]
    if isinstance(got, int) and case.expected and got == case.expected - 1:
        return "off by one: return the record's `step` (counted from 1), not its index in the list."
    loss_only = next((r["step"] for r in records if not math.isfinite(r["loss"])), None)
    if got == loss_only and loss_only != case.expected:
        return ("you only checked the loss: at this step the loss is still finite but the gradient norm is "
                "inf — the backward broke first. Check `grad_norm` too.")
    if case.expected is None and got is not None:
        return "every loss and gradient norm here is finite: return None."
    return None


def check_first_nonfinite_step(fn):
    """Checker for exercise 1: ``fn(records) -> int | None``, the first step with a non-finite loss/norm."""
    return run_check("first_nonfinite_step", fn, _first_step_cases(), diagnose=_diagnose_first_step,
                     compare=lambda got, exp: None if got == exp and not isinstance(got, bool)
                     else f"expected {exp!r}, got {got!r}",
                     hint="walk the records in order; a step is non-finite when math.isfinite() is False for "
                          "its loss or its grad_norm; return that record's 'step', or None.")


# ------------------------------------------------------------------------------------------------
# Exercise 2: the mystery run
# ------------------------------------------------------------------------------------------------

MYSTERY_CONFIG = {"lr": 0.01, "optimizer": "adamw", "batch_size": 8, "max_length": 96, "steps": 12,
                  "bnb_4bit_compute_dtype": "bfloat16", "dtype": "bfloat16", "lora_r": 8}


def mystery_batches(tokenizer) -> list[dict]:
    """The mystery run's micro-batches, in the order the run sees them (from two data sources).

    Read the code only after you have made your diagnosis with the tools: it gives the answer away.
    """
    from .data import make_batches, make_messages

    short = make_messages(n=48, seed=6)
    long = make_messages(n=16, seed=7, context_words=120)
    return make_batches(tokenizer, short + long, MYSTERY_CONFIG["batch_size"],
                        max_length=MYSTERY_CONFIG["max_length"])


def mystery_run(steps: int | None = None):
    """``(model, batches, records)`` of the mystery run after ``steps`` optimizer steps (default: all).

    Its configuration is ``MYSTERY_CONFIG``: read it like your own training script. Replay it to
    ``k - 1`` steps to look at the model just before step ``k``.
    """
    from .train import train

    steps = MYSTERY_CONFIG["steps"] if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps={steps!r} must be an integer >= 0 — the number of optimizer steps to replay "
                         "— pass e.g. steps=3, or None for the whole run.")
    model, tokenizer = qlora_model(compute_dtype=MYSTERY_CONFIG["bnb_4bit_compute_dtype"],
                                   dtype=MYSTERY_CONFIG["dtype"], r=MYSTERY_CONFIG["lora_r"])
    batches = mystery_batches(tokenizer)
    records = train(model, batches, steps=steps, lr=MYSTERY_CONFIG["lr"],
                    optimizer=MYSTERY_CONFIG["optimizer"]) if steps else []
    return model, batches, records


MYSTERY_CAUSE = "all_masked_labels"
_WRONG = {
    "fp16_overflow": (
        "there is no float16 in this run: it stores and computes in bfloat16, which has float32's range "
        "(max ~3.4e38), and forward hooks on the model just before the bad step find no module whose output "
        "is inf/NaN. The NaN is born after the model, in the loss."),
    "learning_rate_too_high": (
        "a too-high learning rate diverges and stays diverged (the gradient norm grows first, then "
        "everything is NaN). Here the loss is NaN on two steps only, their gradient norm is exactly 0, "
        "and the steps after them are finite again. Look at n_tokens of the bad steps."),
    "gradient_explosion": (
        "an exploding gradient shows a huge gradient norm around the NaN; here the gradient norm of the NaN "
        "steps is exactly 0.0 — there is nothing to clip. Look at n_tokens of the bad steps."),
}


def _compare_cause(got, expected):
    if not isinstance(got, str) or got not in CAUSES:
        return f"expected one of {CAUSES}, got {got!r}"
    return None if got == expected else f"{got!r} is not the cause"


def _diagnose_cause(got, case: Case):
    return _WRONG.get(got)


def check_mystery_diagnosis(fn):
    """Checker for exercise 2: ``fn() -> str``, the mystery run's cause, one of ``CAUSES``."""
    return run_check("mystery_diagnosis", fn, [Case((), MYSTERY_CAUSE, label="the mystery run")],
                     compare=_compare_cause, diagnose=_diagnose_cause,
                     hint=f"return one of {CAUSES}. Use the tools: the first non-finite step, n_tokens "
                          "of that step, first_nonfinite_module on the model just before it, "
                          "anomaly_report.")


# ------------------------------------------------------------------------------------------------
# The checklist as a picture
# ------------------------------------------------------------------------------------------------

CHECKLIST = (
    ("Loss or grad norm inf/NaN at step k\n(first_nonfinite_step, StopOnNonFinite)", None),
    ("Step k has 0 supervised tokens?\n(n_tokens, detect_anomaly names the op)",
     "all labels -100: drop fully masked batches,\nclamp the count (lesson 05)"),
    ("A module's forward output is inf?\n(watch_activations, DebugUnderflowOverflow)",
     "fp16 past 65504: compute in bf16/fp32\n(dtype, bnb_4bit_compute_dtype)"),
    ("Grad norm / activations growing\nover the steps before k?",
     "learning rate too high: lower it, warm up\n(clipping alone did not rescue AdamW)"),
    ("Still unexplained?", "versions: a library bug\n(bitsandbytes #663 was one)"),
)


def plot_checklist(ax=None):
    """Draw the lesson's checklist: questions in order of cost, each with its fix. Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9.5, 5.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, len(CHECKLIST) * 2)
    ax.axis("off")
    box = dict(boxstyle="round,pad=0.4", fc="#fde2e4", ec="#9d0208")
    fix = dict(boxstyle="round,pad=0.4", fc="#d8f3dc", ec="#2d6a4f")
    for i, (question, remedy) in enumerate(CHECKLIST):
        y = len(CHECKLIST) * 2 - 1 - 2 * i
        ax.text(2.6, y, question, ha="center", va="center", fontsize=8.5, bbox=box if i == 0 else
                dict(boxstyle="round,pad=0.4", fc="#edf2fb", ec="#1d3557"))
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
