"""The rules that judge a training run from its numbers — one copy, for two readers (lesson 08).

``SFTWatch`` (``course_utils.watch``) applies them while a run trains; the doctor's autopsy
(``python -m course_utils.doctor --run OUTPUT_DIR``, ``doctor.autopsy``) applies them afterwards to the
``log_history`` the Trainer wrote to ``trainer_state.json``. Both hand ``judge`` the same thing — log
entries as the Trainer logs them (``{"step", "loss", "grad_norm", "learning_rate"}`` and
``{"step", "eval_loss"}``) — so a run that had no watch gets the same verdict afterwards.

Each rule states what lessons 01, 05 and 06 measure, and draws its threshold from the run's own numbers:

- ``run-nonfinite``       a NaN / inf loss, or gradient norms non-finite to the end (lesson 06); a finite loss
  with a few non-finite norms that finite ones follow is the fp16 GradScaler skipping steps (info)
- ``run-zero-loss``       a logged loss of exactly 0.0: a step with no graded token, or a NaN a custom loss
  turned into 0 (lesson 05). A cross-entropy over real tokens is never exactly 0 in floating point.
- ``run-clipping``        the gradient clipped on most steps: a loss summed instead of averaged (lesson 01)
- ``run-grad-spike``      a gradient norm ten times the median of the steps before it (lesson 06)
- ``run-loss-diverging`` / ``run-loss-flat``  the last quarter of the logged loss against the first
- ``run-lr-zero``         a learning rate of 0 on most logged steps: nothing trains
- ``run-eval-rising``     eval loss rising (by 1 % or more of its best) while the train loss falls

No torch here: the autopsy reads JSON and needs none.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from . import validate

CLIP_TOLERANCE = 1e-4  # relative: clip_grad_norm_ leaves the norm at max_norm * (1 - ~1e-6/norm)
MOSTLY = 0.5           # "most steps": the share of steps above which a per-step symptom is the run's
SPIKE = 10.0           # a gradient norm this many times the median of the steps before it is a spike
SPIKE_HISTORY = 5      # steps of history a spike is judged against
TREND_POINTS = 8       # logged losses needed to call a trend (a quarter is then at least two points)
FLAT = 0.01            # relative change of the loss, first quarter to last, below which it is flat
DIVERGING = 0.10       # relative rise of the loss, first quarter to last, above which it diverges
EVAL_POINTS = 3        # eval losses needed to call a rise
EVAL_RISE = 0.01       # relative rise of the eval loss over its best below which it is noise, not a rise
LOGGED = ("step", "loss", "grad_norm", "learning_rate", "eval_loss")  # the numbers the rules read
# max_grad_norm's one check, for the three public rules
_MAX_GRAD_NORM = dict(minimum=0, why="it is the clip threshold the run trained with (0: no clipping)",
                      fix="pass TrainingArguments.max_grad_norm, e.g. max_grad_norm=1.0")


@dataclass(frozen=True)
class Verdict:
    """One rule's judgement of a run: ``id`` (the doctor's check id), severity, what, evidence, fix,
    lesson."""

    id: str
    severity: str
    what: str
    evidence: str
    fix: str
    lesson: str


def was_clipped(norm, max_grad_norm) -> bool:
    """Whether ``clip_grad_norm_(max_norm=max_grad_norm)`` scaled a gradient of total norm ``norm`` down.
    True for the pre-clip norm the Trainer logs (``grad_norm``) and for the post-clip norm the watch
    measures (after a clip it equals ``max_grad_norm``, up to ``CLIP_TOLERANCE``)."""
    max_grad_norm = validate.number("max_grad_norm", max_grad_norm, **_MAX_GRAD_NORM)
    if not _number(norm):
        raise TypeError(f"norm={norm!r} must be a number — it is the step's gradient norm (the log's "
                        "grad_norm) — pass the logged value; skip steps that logged none.")
    return max_grad_norm > 0 and _finite(norm) and norm >= max_grad_norm * (1 - CLIP_TOLERANCE)


def clipping_verdict(clipped: list[bool], max_grad_norm) -> Verdict | None:
    """``run-clipping`` when more than ``MOSTLY`` of the steps clipped (``clipped``: one flag per step)."""
    validate.number("max_grad_norm", max_grad_norm, **_MAX_GRAD_NORM)
    flags = isinstance(clipped, (list, tuple)) and all(isinstance(c, bool) for c in clipped)
    if not flags or not clipped:
        raise TypeError(f"clipped={clipped!r:.60} must be a non-empty list of True/False, one per step — the "
                        "verdict is the share of clipped steps — pass [was_clipped(n, max_grad_norm) for n "
                        "in norms].")
    if sum(clipped) <= MOSTLY * len(clipped):
        return None
    return Verdict("run-clipping", "warning", f"the gradient was clipped on {sum(clipped)} of {len(clipped)} "
                   f"steps ({sum(clipped) / len(clipped):.0%}; max_grad_norm={max_grad_norm})",
                   "clipping on most steps turns every update into a fixed-length step in the gradient's "
                   "direction: the learning rate no longer sets the step size",
                   "check the loss scale first (a loss summed over micro-batches or tokens instead of "
                   "averaged: lesson 01), then the learning rate; raise max_grad_norm only once the norm is "
                   "explained", "01")


def judge(log: list[dict], max_grad_norm=1.0, clipped: list[bool] | None = None,
          fp16: bool | None = None) -> list[Verdict]:
    """Every rule's verdict on ``log`` (Trainer log entries, in step order). ``clipped``: the clip flag of
    each step when it was measured (the watch's); otherwise each logged ``grad_norm`` is judged with
    ``was_clipped``. ``fp16``: whether the run trained with fp16 mixed precision (its GradScaler skips the
    steps whose gradient overflows), None when it cannot be known. Returns the verdicts that fired, in the
    order of the module docstring. A log none of whose entries is a logged step (``step`` with ``loss``,
    ``eval_loss`` or the end-of-training ``train_loss``), a logged number that is not a number (a missing
    one is None or absent), or more clip flags than the run can have had steps are refused: each would be
    judged healthy."""
    if not isinstance(log, (list, tuple)) or not log or not all(isinstance(e, dict) for e in log):
        raise ValueError(f"log={log!r:.60} must be a non-empty list of Trainer log entries (dicts) — a run "
                         "is judged on its logged steps — pass trainer.state.log_history, or the log_history "
                         "of trainer_state.json.")
    _check_logged_numbers(log)
    max_grad_norm = validate.number("max_grad_norm", max_grad_norm, **_MAX_GRAD_NORM)
    if fp16 is not None:
        validate.flag("fp16", fp16, why="it says whether a GradScaler skipped steps",
                      fix="pass TrainingArguments.fp16, or None when it cannot be known")
    train = [e for e in log if "loss" in e and "step" in e]
    evals = [e for e in log if "eval_loss" in e and "step" in e]
    losses = [(e["step"], e["loss"]) for e in train if _number(e["loss"])]
    norms = [(e["step"], e["grad_norm"]) for e in train if _number(e.get("grad_norm"))]
    rates = [(e["step"], e["learning_rate"]) for e in train if _number(e.get("learning_rate"))]
    if clipped is None:
        clipped = [was_clipped(n, max_grad_norm) for _, n in norms]
    elif train and isinstance(clipped, (list, tuple)):  # no more flags than steps the run can have had:
        steps = sorted({e["step"] for e in train})  # to its last logged step, and less than an interval after
        interval = max(b - a for a, b in zip([0, *steps], steps))
        if len(clipped) >= steps[-1] + max(interval, 1):
            raise ValueError(f"clipped has {len(clipped)} flags but the log's last step is {steps[-1]} "
                             f"(logged every {interval} step(s) at most) — one flag per optimizer step, and "
                             "the run had fewer — pass the flags of this run's steps (the watch's), or "
                             "clipped=None to judge the logged grad_norm.")
    clipping = clipping_verdict(clipped, max_grad_norm) if clipped else None
    verdicts = [_nonfinite(losses, norms, fp16), _zero_loss(losses), clipping,
                _grad_spike(norms), _loss_trend(losses), _lr_zero(rates),
                _eval_rising(losses, [(e["step"], e["eval_loss"]) for e in evals if _number(e["eval_loss"])])]
    return [v for v in verdicts if v is not None]


def _check_logged_numbers(log) -> None:
    """Some entry a logged step, and every logged number a number (None: not logged)."""
    if not any("step" in e and ({"loss", "eval_loss", "train_loss"} & set(e)) for e in log):
        keys = sorted({k for e in log for k in e})[:8]
        raise ValueError(f"no entry of log is a logged step (keys: {keys}) — the rules read each entry's "
                         "'step' with its 'loss' (or 'eval_loss'), and a log without them would be judged "
                         "healthy — pass trainer.state.log_history, or the log_history of "
                         "trainer_state.json.")
    for i, entry in enumerate(log):
        for key in LOGGED:
            value = entry.get(key)
            if value is not None and not _number(value):
                raise ValueError(f"log[{i}][{key!r}]={value!r:.40} is not a number — the rules compare the "
                                 "logged numbers, and a text would be skipped as if nothing was logged — "
                                 "pass the entries as the Trainer logged them (numbers; None where nothing "
                                 "was).")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value) -> bool:
    return _number(value) and math.isfinite(value)


def _steps(pairs, limit: int = 8) -> str:
    shown = [s for s, _ in pairs[:limit]]
    return f"{shown}" + (f" and {len(pairs) - limit} more" if len(pairs) > limit else "")


def _nonfinite(losses, norms, fp16=None) -> Verdict | None:
    bad_loss = [(s, v) for s, v in losses if not math.isfinite(v)]
    bad_norm = [(s, v) for s, v in norms if not math.isfinite(v)]
    if not (bad_loss or bad_norm):
        return None
    if not bad_loss and math.isfinite(norms[-1][1]):  # finite norms follow: the steps were skipped
        return _skipped_steps(bad_norm, len(norms), losses, fp16)
    first = min(bad_loss + bad_norm)
    return Verdict("run-nonfinite", "error", f"a non-finite loss or gradient norm from step {first[0]} on",
                   f"loss {first[1] if first in bad_loss else 'finite'} at step {first[0]}; non-finite loss "
                   f"at steps {_steps(bad_loss)}, gradient norm at steps {_steps(bad_norm)}"
                   + ("" if bad_loss else " — and to the last logged step"),
                   "find the first module that overflows (SFTWatch(stop_on_nonfinite=True) names it), load "
                   "in bf16 or fp32 instead of fp16, lower the learning rate; resume from a checkpoint "
                   "before that step", "06")


def _skipped_steps(bad_norm, logged: int, losses, fp16) -> Verdict:
    """A finite loss throughout, and each non-finite gradient norm followed by finite ones: what fp16's
    GradScaler does while it finds its scale (it skips the step and halves the scale) — routine, unless
    most steps are skipped."""
    mostly = len(bad_norm) > MOSTLY * logged
    count = f"{len(bad_norm)} of {logged} logged steps"
    evidence = (f"gradient norm non-finite at steps {_steps(bad_norm)}, finite on the steps after; the loss "
                f"is finite on all {len(losses)} logged steps; ")
    if fp16 is False:
        return Verdict("run-nonfinite", "warning", f"a non-finite gradient norm on {count}, finite loss",
                       evidence + "the run did not train in fp16, so no GradScaler skipped them: a "
                       "non-finite gradient the optimizer applied would have made the weights, then the "
                       "loss, NaN",
                       "find what skipped those steps (a DeepSpeed loss scaler, a custom optimizer step); "
                       "SFTWatch names the first overflowing module", "06")
    precision = ("the run trained with fp16=True: its GradScaler skipped those steps (no update) and halved "
                 "the scale" if fp16 else "the run's precision cannot be known here (no training_args.bin, "
                 "no fp16 in --config): under fp16 its GradScaler skips such steps")
    return Verdict("run-nonfinite", "warning" if mostly else "info",
                   f"the fp16 GradScaler skipped {count} (non-finite gradient norm, finite loss)",
                   evidence + precision + (" — on most steps: the run hardly trains" if mostly else ""),
                   "nothing when a few steps skip (the scale's warm-up, an overflow now and then); when most "
                   "steps skip, train in bf16 or lower the learning rate", "06")


def _zero_loss(losses) -> Verdict | None:
    zero = [(s, v) for s, v in losses if v == 0.0]
    if not zero:
        return None
    return Verdict("run-zero-loss", "error",
                   f"the logged loss is exactly 0.0 on {len(zero)} of {len(losses)} logged steps",
                   f"steps {_steps(zero)}: a cross-entropy over real tokens is never exactly "
                   "0; these steps had no graded token (every label -100), or a loss replaced NaN by 0",
                   "find the rows whose answer truncation removed (the doctor's truncation check, lesson 05) "
                   "and drop or shorten them; never nan_to_num a loss", "05")


def _grad_spike(norms) -> Verdict | None:
    spikes = []
    for i in range(SPIKE_HISTORY, len(norms)):
        history = [v for _, v in norms[:i] if math.isfinite(v)]
        typical = statistics.median(history) if len(history) >= SPIKE_HISTORY else None
        step, value = norms[i]
        if typical and math.isfinite(value) and value > SPIKE * typical:
            spikes.append((step, value, typical))
    if not spikes:
        return None
    step, value, typical = spikes[0]
    return Verdict("run-grad-spike", "warning",
                   f"{len(spikes)} gradient-norm spike(s), the first at step {step}",
                   f"grad_norm {value:.3g} at step {step}, {value / typical:.0f}x the median {typical:.3g} "
                   f"of the steps before it (spike: > {SPIKE:g}x); steps {[s for s, _, _ in spikes[:8]]}",
                   "look at the rows of that step (an outlier length, a label bug) and at the precision "
                   "(fp16 activations near their limit, lesson 06); warmup and clipping bound the damage, "
                   "they do not explain it", "06")


def _quarters(values):
    q = max(len(values) // 4, 2)
    return statistics.fmean(values[:q]), statistics.fmean(values[-q:])


def _loss_trend(losses) -> Verdict | None:
    values = [v for _, v in losses if math.isfinite(v)]
    if len(values) < TREND_POINTS:
        return None
    first, last = _quarters(values)
    if first <= 0:
        return None
    change = (last - first) / first
    evidence = (f"mean logged loss {first:.4g} over the first quarter of {len(values)} logged steps, "
                f"{last:.4g} over the last ({change:+.1%})")
    if change > DIVERGING:
        return Verdict("run-loss-diverging", "error", "the training loss rose over the run", evidence,
                       "lower the learning rate (and check warmup); a loss that grows while the gradient is "
                       "clipped every step points at the loss scale (lesson 01)", "01")
    if abs(change) < FLAT:
        return Verdict("run-loss-flat", "warning", "the training loss did not move over the run", evidence,
                       "check that anything trains: the learning rate (run-lr-zero), frozen or unattached "
                       "LoRA parameters, labels all -100 (lesson 05)", "05")
    return None


def _lr_zero(rates) -> Verdict | None:
    zero = [(s, v) for s, v in rates if v == 0]
    # a linear schedule logs 0 on its very last step: only most steps at 0 is a run that did not train
    if len(rates) < 2 or len(zero) <= MOSTLY * len(rates):
        return None
    return Verdict("run-lr-zero", "error", f"the learning rate was 0 on {len(zero)} of {len(rates)} logged "
                   "steps", f"steps {_steps(zero)}: an update of size 0 changes no weight",
                   "check learning_rate, the scheduler (warmup longer than the run, a decay already over) "
                   "and a resumed run's scheduler state", "01")


def _eval_rising(losses, evals) -> Verdict | None:
    if len(evals) < EVAL_POINTS:
        return None
    best = min(range(len(evals)), key=lambda i: evals[i][1])
    after = evals[best:]
    rising = (len(after) >= EVAL_POINTS and all(b[1] > a[1] for a, b in zip(after, after[1:]))
              and after[-1][1] >= after[0][1] * (1 + EVAL_RISE))
    train = [v for s, v in losses if after[0][0] <= s <= after[-1][0] and math.isfinite(v)]
    if not rising or len(train) < 2 or train[-1] >= train[0]:
        return None
    return Verdict("run-eval-rising", "warning",
                   f"eval loss rose on the last {len(after) - 1} evaluations while the training loss fell",
                   f"eval loss {after[0][1]:.4g} at step {after[0][0]} -> {after[-1][1]:.4g} at step "
                   f"{after[-1][0]} ({after[-1][1] / after[0][1] - 1:+.1%}; a rise is {EVAL_RISE:.0%} or "
                   f"more); train loss {train[0]:.4g} -> {train[-1]:.4g}",
                   f"keep the checkpoint of step {after[0][0]} (load_best_model_at_end), train fewer epochs, "
                   "or add data; check for duplicated rows (the doctor's data checks)", "08")
