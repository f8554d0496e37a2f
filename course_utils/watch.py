"""``SFTWatch``: a training-time watch for ``Trainer``/``SFTTrainer`` (lesson 08, and your own runs).

The doctor (``course_utils.doctor``) checks a set-up before training; the watch records, while it
trains, what this course showed goes wrong silently:

- **clip rate**: the fraction of applied optimizer steps on which ``max_grad_norm`` clipped the gradient
  (lesson 01). The Trainer clips *before* callbacks run, so the watch measures the gradient norm in
  ``on_pre_optimizer_step``: after a clip it equals ``max_grad_norm`` (clip_grad_norm_ scales it by
  ``max_norm / (norm + 1e-6)``); the pre-clip norm comes from the log (``grad_norm``) when logged.
- **micro-batches with no graded token** (lessons 05, 07): a callback never sees the batch, so the
  watch puts a forward *pre*-hook (``with_kwargs=True``) on the model and counts the ``labels`` that
  are not ``-100`` in every training forward. TRL's ``compute_loss`` divides by ``num_items_in_batch``,
  the graded tokens of the whole optimizer step (every micro-batch, every process; for model classes that
  accept loss kwargs — not Gemma 4 / Qwen2.5-VL / Qwen3-VL, lesson 07): such a micro-batch
  adds nothing and the logged loss stays the mean of the rest; only a step without any graded token
  contributes 0.0 (the logged value itself at ``logging_steps=1``; a lower window mean at the default 10)
  (a hand-written loop's per-micro-batch mean logs 0/0 = NaN; with ``F.cross_entropy(ignore_index)``
  — a mean, or ``reduction="none"`` times a mask — its gradients are exactly zero; only a per-token loss
  computed at every position and then masked makes them NaN). Each is data the run paid
  for and did not train on. (A custom ``compute_loss`` that calls the model without ``labels`` is
  invisible to this count.)
- **non-finite values** (lesson 06). With ``stop_on_nonfinite=True`` the watch stops the run on a
  non-finite loss, on a non-finite gradient the optimizer would apply, or on weights an update made
  non-finite; before such a step it drops the gradients (so the weights stay finite), and ``report()``
  says where the first inf/NaN of that step appeared: forward hooks on every module (the first module
  whose output holds inf/NaN) and one gradient hook on the trainable parameters
  (``torch.autograd.graph.register_multi_grad_hook``: each micro-batch's own gradients, before they are
  accumulated and before a clip by an inf/NaN norm spreads it to all of them), named in backward order,
  the module nearest the loss first.
- **skipped fp16 steps**: with fp16 mixed precision the GradScaler multiplies the loss by a large scale;
  when that overflows, the scaler finds inf in the *unscaled* gradients, skips ``optimizer.step()`` and
  halves the scale. That is routine (a run starts at scale 65536 and backs off), so the watch counts
  such a step (``skipped_steps``) and lets the run go on; only a non-finite loss or weight stops it.
  It reads the skip from the gradients: accelerate's ``optimizer_step_was_skipped`` stays False when the
  optimizer is a fused AdamW (TRL's default), which skips inside its kernel.

Cost: no check waits for the device. The checks are reductions that stay there (a sum per module
output, one fused norm of the gradients per micro-batch, fused norms of the gradients and the weights
per step); the watch reads them back once per optimizer step (one ``.tolist()``: one device sync, one
per device for a model split over several) and looks closer only on a step where something is
non-finite. Measured with ``python -m tools.watch_overhead`` (course model, batch 8, fp32, one thread,
12 runs of 40 steps per arm in rotated order, a 2-core CPU shared with other jobs), against the same
run without the watch: the watch's own CPU time is 1.35 ms (min) / 1.65 ms (median) a step, 4.6 % /
4.7 % of the 30-35 ms step, and 0.6-0.8 ms (2.0-2.2 %) with ``locate=False``; the whole step's CPU time
grew by 2.8 % (min) / 6.7 % (median), and by 1.5 % / 0.1 % with ``locate=False`` (the median moves a
few per cent from one benchmark to the next on that machine). The cost is per module and per parameter
tensor, not per token: on a real model with a real batch it is a far smaller share of the step.

What it cannot see: under DeepSpeed ZeRO (stage 2 and 3) and FSDP the gradients are sharded and are not
in ``p.grad`` (ZeRO keeps them in its own buffers; under ZeRO-3 a parameter is an empty placeholder
outside the forward), so the gradient and weight checks and the clip rate see nothing, or one process's
shard; the loss, the activation hooks and the graded-token count still work, per process. DeepSpeed's
own fp16 loss scaler skips steps inside its engine: the watch counts them only through accelerate's
``optimizer_step_was_skipped``. Under FSDP2 the parameters are DTensors: the watch has not been tried
there. Under DDP each process has its own watch: a stop that only one process sees (an empty micro-batch
with ``stop_on_empty``, a NaN loss whose gradients are zero) leaves the others waiting in an all-reduce
until the process group's timeout (30 min by default; lesson 07 section 8.3 measures it).

Usage (a Trainer takes callbacks with ``add_callback``, or ``callbacks=[watch]`` when you build a
``transformers.Trainer`` yourself; ``make_sft_trainer`` takes SFTConfig fields only)::

    from course_utils import load_course_model, make_chat_dataset, make_sft_trainer
    from course_utils.watch import SFTWatch

    model, tokenizer = load_course_model()
    trainer = make_sft_trainer(model, tokenizer, make_chat_dataset(n=48), max_steps=5)
    watch = SFTWatch()
    trainer.add_callback(watch)
    trainer.train()
    print(watch.report())

One watch per run: it refuses a second ``train()``, whose numbers would mix with the first one's.
"""

from __future__ import annotations

import math
import os

import torch

from . import run_rules, validate
from .data import graded


def _trainer_callback_class():
    """``transformers.TrainerCallback``, imported without a trace in ``os.environ``: the import reaches
    ``torch._dynamo``, which writes ``TORCHINDUCTOR_CACHE_DIR`` (torch/_inductor/runtime/cache_dir_utils.py:
    cache_dir); importing the watch must leave a user's environment as it was, and torch recomputes the
    same default whenever it needs the directory."""
    unset = "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    from transformers import TrainerCallback

    if unset:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return TrainerCallback


TrainerCallback = _trainer_callback_class()


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    for key in ("loss", "log_probs", "logits"):
        value = getattr(output, key, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _probe(tensor: torch.Tensor) -> torch.Tensor:
    """A 0-d float32 tensor, still on the device, that is inf/NaN when ``tensor`` holds inf/NaN.

    One reduction and no host sync (``bool(torch.isfinite(t).all())`` would wait for the device at every
    call). A float32 sum overflows only for values near float32's limit, and the watch reads a probe
    only to say *where*, then confirms with ``isfinite`` before it stops anything."""
    return torch.sum(tensor.detach(), dtype=torch.float32)


def _read(chunks: list) -> list:
    """Values of ``chunks`` ([(labels, 1-d float32 tensor)]) as [(label, float)], one sync per device."""
    by_device: dict = {}
    for _, values in chunks:
        by_device.setdefault(values.device, []).append(values)
    fetched = {device: iter(torch.cat(group).tolist()) for device, group in by_device.items()}
    return [(label, next(fetched[values.device])) for labels, values in chunks for label in labels]


def _chunks(labels: list, tensors: list) -> list:
    """Stack 0-d tensors into one 1-d float32 tensor per device (a model may be split over several)."""
    if not tensors:
        return []
    try:
        return [(labels, torch.stack(tensors).float())]  # one device: one op, no Python loop
    except RuntimeError:  # "Expected all tensors to be on the same device"
        by_device: dict = {}
        for label, tensor in zip(labels, tensors, strict=True):
            by_device.setdefault(tensor.device, ([], []))
            by_device[tensor.device][0].append(label)
            by_device[tensor.device][1].append(tensor)
        return [(group_labels, torch.stack(group).float()) for group_labels, group in by_device.values()]


def _norms(tensors: list) -> list:
    # one fused kernel per device and dtype; float32 so that an fp16 gradient's norm cannot overflow
    return list(torch._foreach_norm(tensors, 2, dtype=torch.float32)) if tensors else []


class SFTWatch(TrainerCallback):
    """Records clip rate, empty micro-batches, skipped fp16 steps and the first non-finite value; can stop.

    ``stop_on_nonfinite`` (default True) stops at a non-finite loss, a non-finite gradient the optimizer
    would apply, or non-finite weights (a step the fp16 GradScaler skips is counted, not a stop);
    ``stop_on_empty`` (default False) stops at the first micro-batch with no graded token; ``locate``
    (default True) installs the per-module and per-parameter hooks that name where a non-finite value
    first appeared (one on-device reduction per module output and per gradient, read back once a step).
    """

    SWITCHES = ("stop_on_nonfinite", "stop_on_empty", "locate")

    def __init__(self, *positional, stop_on_nonfinite: bool = True, stop_on_empty: bool = False,
                 locate: bool = True, **unknown):
        if positional:  # SFTWatch(True): which of the three switches would that be?
            raise TypeError(f"SFTWatch takes its switches by name, got {len(positional)} positional "
                            f"argument(s) {positional!r:.60} — a bare value could mean any of "
                            f"{list(self.SWITCHES)} — pass e.g. SFTWatch(stop_on_empty=True).")
        for name in unknown:
            validate.choice("SFTWatch argument", name, self.SWITCHES, why="the watch has these switches")
        for name, value in (("stop_on_nonfinite", stop_on_nonfinite), ("stop_on_empty", stop_on_empty),
                            ("locate", locate)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r} must be True or False — it switches one behaviour of the "
                                 f"watch — pass {name}=True or False.")
        self.stop_on_nonfinite, self.stop_on_empty, self.locate = stop_on_nonfinite, stop_on_empty, locate
        self.steps: list[dict] = []          # one record per optimizer step
        self.micro_batches: list[int] = []   # graded tokens per training micro-batch
        self.skipped_steps: list[dict] = []  # steps the fp16 GradScaler skipped: step, scale, where
        self.nonfinite: dict | None = None   # the first non-finite value that mattered: kind, where, step
        self.evals: list[dict] = []          # logged eval losses: step, eval_loss
        self.stopped_because: str | None = None
        self._handles: list = []
        self._step = 0
        self._max_grad_norm = None
        self._fp16 = None                    # the run's fp16 flag, known once training begins
        self._trainable: list = []           # (name, parameter) the optimizer updates
        self._n_micro = 0                    # training forwards so far (micro_batches lags until read)
        self._graded: list = []              # this step's graded-token counts, still on the device
        self._raw: tuple[list, list] = ([], [])  # this micro-batch's probes: labels, 0-d tensors
        self._chunks: list = []              # this step's probes, stacked per micro-batch
        self._scaler_seen = False
        self._backward_order: dict[int, None] = {}  # indices into _trainable, in backward order
        self._rank: dict[str, int] = {}      # a trainable parameter's place in backward order
        self._grad_names: list[str] = []
        self._order_handles: list = []

    # --- hooks (no host sync in any of them) -----------------------------------------------------
    def _add_probe(self, kind: str, where: str, tensor: torch.Tensor):
        self._raw[0].append((kind, where, self._n_micro))
        self._raw[1].append(_probe(tensor))

    def _flush(self):
        if self._raw[1]:
            self._chunks.extend(_chunks(*self._raw))
            self._raw = ([], [])

    def _count_graded(self, module, args, kwargs):
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation or generation: not a training micro-batch
        self._n_micro += 1
        labels = kwargs.get("labels")
        if labels is not None:
            mask = graded(labels)  # the course's rule: shifted by one, not -100
            self._graded.append(mask.sum() if isinstance(mask, torch.Tensor) else torch.tensor(sum(mask)))

    def _output_hook(self, module, args, output):
        if not (module.training and torch.is_grad_enabled()):
            return
        tensor = _first_tensor(output)
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor):
            self._add_probe("loss", "the model's output", loss)
        elif self.locate and tensor is not None and tensor.is_floating_point():
            self._add_probe("model output", "the model's output", tensor)
        self._flush()

    def _forward_hook(self, name: str):
        def hook(module, args, output):
            tensor = output if type(output) is torch.Tensor else _first_tensor(output)
            if module.training and tensor is not None and tensor.is_floating_point():
                self._add_probe("activation", name, tensor)
        return hook

    def _gradients_hook(self, grads):
        # this micro-batch's own gradients, before they are accumulated and before a clip by a non-finite
        # total norm spreads inf/NaN to every one of them: one fused norm per backward, still on the device
        present = [(name, g) for name, g in zip(self._grad_names, grads, strict=True) if g is not None]
        self._chunks.extend(_chunks([("gradient", name, self._n_micro) for name, _ in present],
                                    _norms([grad for _, grad in present])))

    def _order_hook(self, index: int):
        def hook(param):  # only the order: a backward visits the parameters in the same order every step
            self._backward_order.setdefault(index, None)
        return hook

    # --- callback events --------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("SFTWatch got no model from the Trainer — it hooks the model to see "
                             "micro-batches — add it with trainer.add_callback(watch) on a transformers "
                             "Trainer.")
        if self.steps or self.micro_batches or self._handles:
            raise ValueError(f"this SFTWatch already watched a run ({len(self.steps)} optimizer step(s)) — a "
                             "second train() would mix its numbers with the first run's — give each run its "
                             "own watch: trainer.add_callback(SFTWatch()).")
        self._max_grad_norm = args.max_grad_norm or 0  # None or 0: the Trainer does not clip
        self._fp16 = bool(getattr(args, "fp16", False))  # run_rules: a GradScaler skips steps under fp16
        self._trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self._handles.append(model.register_forward_pre_hook(self._count_graded, with_kwargs=True))
        if self.locate:
            for name, module in model.named_modules():
                if name:
                    self._handles.append(module.register_forward_hook(self._forward_hook(name)))
            self._grad_names = [name for name, _ in self._trainable]
            if self._trainable:
                self._handles.append(torch.autograd.graph.register_multi_grad_hook(
                    [param for _, param in self._trainable], self._gradients_hook, mode="all"))
            self._order_handles = [param.register_post_accumulate_grad_hook(self._order_hook(index))
                                   for index, (_, param) in enumerate(self._trainable)]
        self._handles.append(model.register_forward_hook(self._output_hook))  # after the modules' hooks

    def on_step_begin(self, args, state, control, **kwargs):
        self._graded, self._chunks = [], []

    def _read_step(self, with_weights: bool) -> list:
        """The step's probes, gradient norms and (after an update) weight norms, in the order they
        happened, as [((kind, where, micro_batch), value)]: one read-back from the device."""
        self._flush()
        if self._order_handles:  # the first backward is over: its order is the parameters' order from now on
            for handle in self._order_handles:
                handle.remove()
            self._order_handles = []
            rest = [i for i in range(len(self._trainable)) if i not in self._backward_order]
            self._trainable = [self._trainable[i] for i in [*self._backward_order, *rest]]
            self._rank = {name: rank for rank, (name, _) in enumerate(self._trainable)}
        labels = [("update", name, self._n_micro) for name, p in self._trainable if p.grad is not None]
        tensors = [p.grad.detach() for _, p in self._trainable if p.grad is not None]
        if with_weights:  # what the previous update wrote (their place in the list does not matter)
            before = self._n_micro - len(self._graded)
            labels += [("weight", name, before) for name, _ in self._trainable]
            tensors += [p.detach() for _, p in self._trainable]
        chunks = self._chunks + _chunks(labels, _norms(tensors))  # the probes first, in the order they ran
        chunks += _chunks([("graded", None, i) for i in range(len(self._graded))], self._graded)
        values = _read(chunks)
        self._graded, self._chunks = [], []
        self.micro_batches.extend(int(v) for (kind, _, _), v in values if kind == "graded")
        return [(label, v) for label, v in values if label[0] != "graded"]

    def _record_nonfinite(self, kind: str, where: str, step: int, micro_batch: int):
        if self.nonfinite is None:
            self.nonfinite = {"kind": kind, "where": where, "step": step, "micro_batch": micro_batch}

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        before = len(self.micro_batches)
        values = self._read_step(with_weights=self._step > 0)
        graded_tokens = self.micro_batches[before:]
        norms = [v for (kind, _, _), v in values if kind == "update"]
        norm = math.sqrt(sum(v * v for v in norms)) if norms else 0.0
        step = state.global_step + 1
        bad = [label for label, v in values if not math.isfinite(v)]
        # fp16 mixed precision: accelerate's AcceleratedOptimizer carries the GradScaler
        # (accelerate/accelerator.py: Accelerator.__init__ builds it, prepare_optimizer hands it over), and
        # the Trainer has unscaled the gradients by now (transformers/trainer.py: _inner_training_loop ->
        # _clip_grad_norm / _get_grad_norm -> accelerate/accelerator.py: Accelerator.clip_grad_norm_ ->
        # unscale_gradients -> GradScaler.unscale_). GradScaler.step then skips the update whenever those
        # unscaled gradients hold inf/NaN (torch/amp/grad_scaler.py: GradScaler.step; a fused AdamW, TRL's
        # default optim, skips inside its kernel from the scaler's found_inf). accelerate's
        # optimizer_step_was_skipped (accelerate/optimizer.py: AcceleratedOptimizer.step) misses that
        # second case — it only sees whether optimizer.step() was called; measured with adamw_torch_fused:
        # 16 skipped steps, step_was_skipped False on each — so the watch decides from the gradients.
        scaler = getattr(optimizer, "scaler", None)
        scaling = scaler is not None and scaler.is_enabled()
        self._scaler_seen = self._scaler_seen or scaling
        bad_weights = self._confirm([where for kind, where, _ in bad if kind == "weight"])
        bad_grads = self._confirm([where for kind, where, _ in bad if kind == "update"], grad=True)
        bad_loss = any(kind == "loss" for kind, _, _ in bad)
        harmful = bool(bad_weights or bad_loss or (bad_grads and not scaling))
        skipped = bool(bad_grads) and not harmful  # routine under fp16: a smaller scale, and on
        clipped = not skipped and run_rules.was_clipped(norm, self._max_grad_norm)
        self.steps.append({"step": step, "post_clip_norm": norm, "clipped": clipped, "skipped": skipped,
                           "graded_tokens": sum(graded_tokens),
                           "empty_micro_batches": sum(g == 0 for g in graded_tokens),
                           "pre_clip_norm": None, "loss": None})
        first = self._first([label for label in bad if label[0] != "weight"])
        if skipped:
            self.skipped_steps.append({"step": step, "scale": float(scaler.get_scale()), "where": first[1],
                                       "micro_batch": first[2]})
        elif bad_weights:  # the previous update wrote them
            self._record_nonfinite("weight", bad_weights[0], self._step, before)
        elif harmful:
            kind, where, micro = first
            self._record_nonfinite(kind, where, step, micro)
        if harmful and self.stop_on_nonfinite:
            if bad_grads and not scaling:
                # the Trainer calls optimizer.step() right after this event: without gradients AdamW
                # leaves every weight as it is, so the run stops with finite weights, not NaN ones
                for _, param in self._trainable:
                    param.grad = None
            if self.stopped_because is None:
                self.stopped_because = "non-finite " + self.nonfinite["kind"]
                control.should_training_stop = True
        self._step = step
        self._maybe_stop(control)

    def _first(self, bad: list):
        """Where the step's first inf/NaN appeared: by micro-batch, then activations in forward order, the
        loss, gradients in backward order (the module nearest the loss first); the post-clip gradients only
        without ``locate``, where nothing else saw them (a clip by an inf/NaN norm spreads it to all)."""
        if not bad:
            return None
        kind, _, micro = bad[0]
        if kind == "update":
            return ("gradient", "total norm", micro)
        if kind == "gradient":
            same = [label for label in bad if label[0] == "gradient" and label[2] == micro]
            return min(same, key=lambda label: self._rank.get(label[1], len(self._rank)))
        return bad[0]

    def _confirm(self, names: list, grad: bool = False) -> list:
        """Of the parameters whose norm came back non-finite, those that really hold inf/NaN (a float32
        sum of squares can overflow for finite values above ~1e19); syncs only on such a step."""
        tensors = dict(self._trainable)
        return [name for name in names
                if not bool(torch.isfinite(tensors[name].grad if grad else tensors[name]).all())]

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        # DeepSpeed's own fp16 loss scaler skips inside its engine, where the gradients are out of sight;
        # accelerate reports it (accelerate/utils/deepspeed.py: DeepSpeedOptimizerWrapper.step_was_skipped)
        if (getattr(optimizer, "step_was_skipped", False) and self.steps and not self.steps[-1]["skipped"]
                and self.stopped_because is None):
            self.steps[-1]["skipped"] = True
            self.steps[-1]["clipped"] = False
            self.skipped_steps.append({"step": self.steps[-1]["step"], "scale": None, "where": None,
                                       "micro_batch": None})

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if self.steps and "train_runtime" not in logs and "loss" in logs:
            self.steps[-1]["pre_clip_norm"] = logs.get("grad_norm")
            self.steps[-1]["loss"] = logs.get("loss")
            self.steps[-1]["learning_rate"] = logs.get("learning_rate")
        if "eval_loss" in logs:
            self.evals.append({"step": state.global_step, "eval_loss": logs["eval_loss"]})
        loss = logs.get("loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            self._record_nonfinite("logged loss", f"log at step {state.global_step}", state.global_step,
                                   self._n_micro)
            if self.stop_on_nonfinite and self.stopped_because is None:
                self.stopped_because = "non-finite " + self.nonfinite["kind"]
                control.should_training_stop = True
        self._maybe_stop(control)

    def on_train_end(self, args, state, control, **kwargs):
        for handle in self._handles + self._order_handles:
            handle.remove()
        self._handles.clear()
        # the last update's weights, and any micro-batch after the last optimizer step
        values = self._read_step(with_weights=self._step > 0)
        bad = self._confirm([where for (kind, where, _), v in values
                             if kind == "weight" and not math.isfinite(v)])
        if bad:
            self._record_nonfinite("weight", bad[0], self._step, self._n_micro)
        self._trainable = []

    def _maybe_stop(self, control):
        if self.stopped_because is None and self.stop_on_empty and self.empty_micro_batches:
            self.stopped_because = "a micro-batch with no graded token"
            control.should_training_stop = True

    # --- results ----------------------------------------------------------------------------
    @property
    def clip_rate(self) -> float:
        """Fraction of applied optimizer steps on which the gradient was clipped (NaN before any step);
        steps the fp16 GradScaler skipped applied nothing and are left out."""
        applied = [s for s in self.steps if not s["skipped"]]
        return sum(s["clipped"] for s in applied) / len(applied) if applied else float("nan")

    @property
    def empty_micro_batches(self) -> int:
        """Training micro-batches that had no graded token (they add nothing to SFTTrainer's loss; a whole
        step of them contributes 0.0, which is the logged value only at ``logging_steps=1``)."""
        return sum(g == 0 for g in self.micro_batches)

    def verdicts(self) -> list:
        """``run_rules.judge`` on this run: the logged loss, gradient norm, learning rate and eval loss of
        each step, with the clip flags the watch measured — the verdicts the doctor's autopsy
        (``--run OUTPUT_DIR``) gives the same run from its ``trainer_state.json`` afterwards."""
        log = [{"step": s["step"], "loss": s["loss"], "grad_norm": s.get("pre_clip_norm"),
                "learning_rate": s.get("learning_rate")} for s in self.steps if s["loss"] is not None]
        applied = [s["clipped"] for s in self.steps if not s["skipped"]]
        if not log + self.evals:
            return []  # nothing logged yet: no rule has a step to judge
        return run_rules.judge(log + self.evals, self._max_grad_norm, clipped=applied, fp16=self._fp16)

    def summary(self) -> dict:
        return {"steps": len(self.steps), "micro_batches": len(self.micro_batches),
                "clip_rate": self.clip_rate, "empty_micro_batches": self.empty_micro_batches,
                "skipped_steps": len(self.skipped_steps), "nonfinite": self.nonfinite,
                "stopped_because": self.stopped_because}

    def report(self) -> str:
        """A readable account of the run: what was measured and what it means."""
        lines = [f"SFTWatch: {len(self.steps)} optimizer steps, {len(self.micro_batches)} micro-batches"]
        if self.steps and not math.isnan(self.clip_rate):
            lines.append(f"  clip rate {self.clip_rate:.0%} (max_grad_norm={self._max_grad_norm})"
                         + ("  <- clipping on most steps: check the loss scale (lesson 01)"
                            if self.clip_rate > run_rules.MOSTLY else ""))
        empty = self.empty_micro_batches
        hint = " <- each trains nothing (a step made only of them logs 0.0); check truncation (lesson 05)" \
            if empty else ""
        lines.append(f"  micro-batches with no graded token: {empty}{hint}")
        if self._scaler_seen or self.skipped_steps:
            last = self.skipped_steps[-1] if self.skipped_steps else None
            lines.append(f"  steps the fp16 GradScaler skipped (overflow, then a smaller scale; routine): "
                         f"{len(self.skipped_steps)}" + (f", the last at step {last['step']}" if last else "")
                         + (" <- most steps skipped: the run hardly trains" if
                            len(self.skipped_steps) > run_rules.MOSTLY * len(self.steps) else ""))
        if self.nonfinite:
            n = self.nonfinite
            lines.append(f"  first non-finite {n['kind']} at step {n['step']} "
                         f"(micro-batch {n['micro_batch']}): {n['where']} (lesson 06)")
        else:
            lines.append("  no non-finite loss, activation or gradient")
        if self.stopped_because:
            lines.append(f"  stopped the run: {self.stopped_because}")
        lines += [f"  {v.severity} {v.id}: {v.what} (lesson {v.lesson})" for v in self.verdicts()
                  if v.id not in ("run-clipping", "run-nonfinite")]  # those two are told above
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.report()
