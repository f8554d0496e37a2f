"""Lesson 06's exercises (NaN detective): a generated broken run to diagnose, and a guard to write.

- ``broken_run(seed)``: the log of a QLoRA run — the artefact only; the generator that knows what broke it
  lives with the reference answers. ``show_run`` prints one as a learner sees it.
- ``check_diagnosis_run``: grades ``diagnose(run) -> Diagnosis(cause, evidence)`` on fresh runs, one of
  ``RUN_CAUSES`` each (healthy controls included), with the misconception behind each wrong cause.
- ``check_guard``: grades ``guard(model, control, scaler)`` (what ``nan_detective.GuardCallback`` runs before
  every optimizer step) on planted non-finite gradients, a healthy control, and an fp16 mixed-precision step
  whose ``GradScaler`` found an inf (a skipped step, not a death: the guard must leave it alone).

The reference answers are in ``course_utils.exercises.answers.lesson06``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import validate
from ..checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check
from .answers import lesson06 as _answers

# ------------------------------------------------------------------------------------------------
# Exercise 1 (diagnosis): an unseen broken run, generated
# ------------------------------------------------------------------------------------------------

RUN_CAUSES = _answers.RUN_CAUSES
"""What broke a run (or nothing): ``"all_masked_labels"`` (a batch without a target, and a loss whose NaN
gradients reached the weights), ``"fp16_overflow"``, ``"learning_rate_too_high"``, ``"empty_batch_zero_grad"``
(lesson 05's: a batch without a target whose gradient is exactly zero — a NaN or clamped 0.0 loss, and the run
goes on) and ``"healthy"``."""


def broken_run(seed: int) -> dict:
    """A Trainer-style log of a QLoRA run: what a practitioner would have, not what broke it (that is for
    the learner to find; the checker grades on runs drawn apart from these, so read the run, not this
    function).

    ``run`` = ``{"config", "log", "activation_max"}``: the config (lr, storage dtype, compute dtype, whether
    ``logging_nan_inf_filter`` logs a NaN loss as 0.0), one log row per step (``loss``, ``grad_norm``,
    ``n_tokens``), and the largest |output| of each module per step (forward hooks, execution order).
    One seed, one run."""
    return _answers.broken_run_case(validate.seed("seed", seed), graded=False)[0]


def _graded_case(seed: int):
    return _answers.broken_run_case(seed, graded=True)


def show_run(run: dict) -> None:
    """Print a generated run as a learner would see it: the config, then one line per step with the
    Trainer's log and each module's largest |activation| (execution order, left to right)."""
    if not (isinstance(run, dict) and {"config", "log", "activation_max"} <= set(run)):
        raise TypeError(f"run must be a run from broken_run(seed), got {type(run).__name__} — show_run "
                        "prints its config, log and activations — pass run = broken_run(seed).")
    print("config:", run["config"])
    modules = list(run["activation_max"])
    short = [m.replace("layers.", "L").replace("self_attn.", "").replace("mlp.", "") for m in modules]
    print(f"{'':31}| largest |output| per module (execution order →)")
    print(f"{'step':>4} {'loss':>8} {'grad_norm':>10} {'n_tok':>5} | " + " ".join(f"{s:>9}" for s in short))
    for i, row in enumerate(run["log"]):
        values = " ".join(f"{run['activation_max'][m][i]:9.3g}" for m in modules)
        print(f"{row['step']:4d} {row['loss']:8.4g} {row['grad_norm']:10.4g} {row['n_tokens']:5d} | {values}")


_MISCONCEPTIONS = {
    ("all_masked_labels", "fp16_overflow"): (
        "a logged loss of 0.0 is what the Trainer shows for *any* NaN step (logging_nan_inf_filter); "
        "n_tokens of that step is normal — read the activations of that step"),
    ("all_masked_labels", "learning_rate_too_high"): (
        "a logged 0.0 is any NaN; this step still had supervised tokens — "
        "what did the gradient norm do first?"),
    ("all_masked_labels", "empty_batch_zero_grad"): (
        "n_tokens is 0 there, but the gradient norm is exactly 0.0, not NaN, and the run goes on finite: "
        "ignore_index (or a clamped count) gave a zero gradient: a NaN loss alone does not kill the "
        "weights"),
    ("fp16_overflow", "healthy"): (
        "float16 storage alone is not evidence: every activation stays below 65504 and nothing is NaN"),
    ("learning_rate_too_high", "healthy"): (
        "a high learning rate or one gradient-norm spike is not a divergence: every step stays finite"),
    ("empty_batch_zero_grad", "healthy"): "every step has supervised tokens and nothing is NaN",
    ("healthy", "empty_batch_zero_grad"): (
        "a step has n_tokens 0: its loss is 0/0 (NaN, or 0.0 when clamped or filtered) — the run survives, "
        "but that batch taught nothing (lesson 05)"),
    ("empty_batch_zero_grad", "all_masked_labels"): (
        "the empty step's gradient norm is NaN and every step after it is dead: the mean was 0/0 and "
        "its NaN gradients reached the weights"),
    ("fp16_overflow", "all_masked_labels"): (
        "float16 storage alone is not evidence: at the first bad step no activation is inf, "
        "and n_tokens is 0"),
    ("fp16_overflow", "empty_batch_zero_grad"): (
        "float16 storage alone is not evidence: no activation is inf, and the bad step has n_tokens 0"),
    ("fp16_overflow", "learning_rate_too_high"): (
        "this run is not float16, and at the first bad step the forward is finite: the gradient norm "
        "turned inf first, after growing for several steps"),
    ("learning_rate_too_high", "fp16_overflow"): (
        "the gradient norm did not climb first: one module's activation reached inf (float16's ceiling "
        "is 65504) while the others stayed small"),
    ("learning_rate_too_high", "all_masked_labels"): (
        "the bad step has n_tokens 0: no token carried loss, whatever the learning rate"),
    ("learning_rate_too_high", "empty_batch_zero_grad"): (
        "the gradient norm of the odd step is exactly 0.0 and n_tokens is 0: no target, not a divergence"),
}

DIAGNOSIS_HINTS = Hints(
    question="Which step is the first one that is not healthy, if any — and at that step, which of "
             "n_tokens, grad_norm and the activations is unusual?",
    pointer="Section 3 (the step, the module) and 2d (no targets): a logged 0.0 can be a NaN (section 1). "
            "Read grad_norm of the first odd step: 0.0, NaN or inf? Then the activations of that step.",
    answer="n_tokens 0 at the first odd step: grad_norm 0.0 → empty_batch_zero_grad, NaN → "
           "all_masked_labels (evidence: that step). Else, an inf activation at that step → fp16_overflow "
           "(evidence: the first module in execution order that is inf). Else a non-finite grad_norm → "
           "learning_rate_too_high (evidence: that step). Nothing odd → healthy (None).")


def _evidence_ok(got, truth: Diagnosis) -> bool:
    if truth.evidence is None:
        return got is None
    if isinstance(truth.evidence, str):  # a module: accept the full name or a path that ends with it
        return isinstance(got, str) and bool(got) and (got == truth.evidence or got.endswith(truth.evidence))
    return not isinstance(got, bool) and isinstance(got, int) and got == truth.evidence


def check_diagnosis_run(fn):
    """Checker for exercise 1: ``fn(run) -> Diagnosis(cause, evidence)`` on fresh ``broken_run``s.
    Graded on fifteen runs drawn fresh on every run, three of each cause (no keyword fixes them: see
    ``checks.fresh_seeds``)."""
    validate.function("fn", fn)  # not an answer yet (e.g. diagnose(run) called): say so, do not grade it
    return check_diagnosis("diagnose_run", fn, _graded_case, seeds=lambda: fresh_seeds(3 * len(RUN_CAUSES)),
                           evidence_ok=_evidence_ok,
                           misconceptions=_MISCONCEPTIONS, hint=DIAGNOSIS_HINTS)


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): the guard a GuardCallback runs before each optimizer step
# ------------------------------------------------------------------------------------------------

class _Control:
    """Stands in for transformers' ``TrainerControl`` (the guard only sets ``should_training_stop``)."""

    def __init__(self):
        self.should_training_stop = False


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(3, 4)
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 2)
        self.frozen.requires_grad_(False)  # like a 4-bit base layer: no gradient at all

    def forward(self, x):
        return self.second(torch.relu(self.first(self.frozen(x))))


def _guard_case(bad: Sequence[tuple[str, float]], seed: int, scaled: bool):
    """A model after one healthy AdamW step and one more backward, with ``bad`` gradients planted. With
    ``scaled``, that backward ran under a ``GradScaler`` (fp16 mixed precision), and the gradients were
    unscaled before the guard runs — as the Trainer does before ``on_pre_optimizer_step`` when it clips."""
    torch.manual_seed(seed)
    model = _TwoLayers()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scaler = torch.amp.GradScaler("cpu") if scaled else None
    for _ in range(2):
        opt.zero_grad()
        loss = model(torch.randn(5, 3)).pow(2).mean()
        (scaler.scale(loss) if scaled else loss).backward()
        if _ == 0:
            scaler.step(opt) if scaled else opt.step()
            if scaled:
                scaler.update()
    params = dict(model.named_parameters())
    for name, value in bad:
        params[name].grad.view(-1)[seed % params[name].numel()] = value
    if scaled:
        scaler.unscale_(opt)  # records the inf: scaler.step will skip this step
    return model, opt, scaler


_GUARD_CASES = (  # (tag, bad gradients, expected name, under a GradScaler)
    ("healthy", (), None, False),
    ("nan", (("first.weight", float("nan")),), "first.weight", False),
    ("inf", (("second.bias", float("inf")),), "second.bias", False),
    ("neg_inf_two", (("first.bias", float("-inf")), ("second.weight", float("nan"))), "first.bias", False),
    ("scaler_inf", (("second.weight", float("inf")),), None, True),  # routine overflow: the scaler skips it
)


def _run_guard(fn, tag: str, seed: int):
    """The learner's guard on the case ``tag``, and what it left behind; the name it should return is the
    case's expected value, in the grading process only."""
    bad, scaled = next((b, s) for t, b, _, s in _GUARD_CASES if t == tag)
    model, opt, scaler = _guard_case(bad, seed, scaled)
    before = {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}
    control = _Control()
    found = fn(model, control, scaler)
    grads_after = {n: p.grad for n, p in model.named_parameters()}
    if scaler is None:
        opt.step()  # the Trainer calls optimizer.step() right after the callback, whatever it decided
    else:
        scaler.step(opt)  # ... under fp16 mixed precision, through the scaler, which skips an inf step
        scaler.update()
    return {"found": found, "stopped": control.should_training_stop, "before": before,
            "grads_after": grads_after, "weights_finite": all(bool(torch.isfinite(p).all())
                                                               for p in model.parameters()),
            "scaled": scaled}


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _compare_guard(got, expected):
    if got["scaled"]:
        if got["found"] is not None or got["stopped"]:
            return ("this step ran under a GradScaler, which found the inf: it skips the step and lowers its "
                    f"scale — a routine overflow, not a dead run — but your guard returned {got['found']!r}"
                    + (" and stopped the run" if got["stopped"] else ""))
        return None if got["weights_finite"] else "the weights are no longer finite after the scaler's step"
    if expected is None:
        if got["found"]:
            return f"the gradients are all finite, but your guard returned {got['found']!r}"
        if got["stopped"]:
            return "the gradients are all finite, but your guard stopped the run"
        changed = [n for n, g in got["grads_after"].items() if not _same(g, got["before"][n])]
        if changed:
            return f"the gradients are all finite, but your guard changed {changed[0]}'s gradient"
        return None
    name = got["found"]
    if not (isinstance(name, str) and name and (name == expected or expected.startswith(name + "."))):
        return f"expected the first parameter with a non-finite gradient ({expected!r}), got {name!r}"
    if not got["stopped"]:
        return "you found it, but control.should_training_stop is still False: the run goes on"
    if not got["weights_finite"]:
        return ("you stopped the run, but the optimizer step that follows wrote the non-finite gradient "
                "into the weights")
    return None


def _diagnose_guard(got, case: Case):
    if case.tag == "healthy":
        return None
    if case.tag == "scaler_inf":
        return ("with a GradScaler (fp16=True on a GPU) an inf gradient is a skipped step: scaler.step() "
                "skips it and halves the scale, and the next steps train (section 'fp16=True — autocast and "
                "GradScaler' measures it). When scaler is not None, return None and leave the gradients to "
                "it; stop only in a loop without a scaler.")
    if got["found"] is None:
        grads = [g for g in got["before"].values() if g is not None]
        bad = [g for g in grads if not bool(torch.isfinite(g).all())]
        if bad and not any(bool(v.isnan().any()) for v in bad):
            return "this gradient holds an inf, not a NaN: `isnan` misses it — test with torch.isfinite."
        return ("nothing found: look at each parameter's .grad (the weights are still finite before the "
                "step), skip parameters whose .grad is None, and test with torch.isfinite.")
    if isinstance(got["found"], str) and got["found"] != case.expected and case.tag == "neg_inf_two":
        return "two parameters are bad here: name the first one in model.named_parameters() order."
    if got["found"] and not got["stopped"]:
        return "set control.should_training_stop = True: the Trainer reads it after the step."
    if got["stopped"] and not got["weights_finite"]:
        return ("stopping is not enough: the Trainer still calls optimizer.step() for this step, right after "
                "the callback. Drop (or zero) the gradients so the step cannot spread the NaN.")
    return None


GUARD_HINTS = Hints(
    question="Where is the NaN before optimizer.step(): in the weights, or in their .grad? What does "
             "the Trainer do right after your callback returns — and what does a GradScaler do with an inf?",
    pointer="Section 5's guard (clip_grad_norm_ with error_if_nonfinite raises there): torch.isfinite "
            "catches inf and NaN; frozen 4-bit weights have .grad None; the Trainer reads "
            "control.should_training_stop only after optimizer.step(); a GradScaler skips a step whose "
            "gradient is inf and lowers its scale (a skipped step, not a dead run).",
    answer="if scaler is not None: return None (the scaler skips the step). Else: for name, p in "
           "model.named_parameters(): if p.grad is not None and not torch.isfinite(p.grad).all(): "
           "model.zero_grad(set_to_none=True); control.should_training_stop = True; return name — after the "
           "loop, return None.")


def check_guard(fn):
    """Checker for exercise 2: ``fn(model, control, scaler) -> str | None`` — see the notebook's exercise
    text."""
    validate.function("fn", fn)
    return run_check("guard", lambda tag, seed: _run_guard(fn, tag, seed),
                     lambda: [Case((tag, 3 + i), expected, label=f"gradients: {tag}", tag=tag)
                              for i, (tag, _, expected, _) in enumerate(_GUARD_CASES)],
                     compare=_compare_guard, diagnose=_diagnose_guard, hint=GUARD_HINTS)
