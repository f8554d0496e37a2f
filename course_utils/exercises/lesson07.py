"""Lesson 07's exercises: diagnose an accumulation trace (diagnosis), and accumulate a per-sequence mean
across micro-batches (fix).

- ``TRACE_CAUSES``: what can have set a step's token weights (the learner picks one);
  ``accumulation_trace(seed)``: a debug trace of one optimizer step, without its cause;
  ``check_trace_diagnosis``: grades a diagnosis function on fresh traces;
- ``check_sequence_weighted``: grades ``fn(model, micro_batches)`` against the reference answer
  (``answers/lesson07.py``) on hidden steps of the course model.

The traces are generated together with their cause in ``answers/lesson07.py`` (``accumulation_trace_case``);
only the checker reads it, on a stream of traces the public ``accumulation_trace`` never shows.
"""

from __future__ import annotations

import torch

from .. import validate
from ..checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import IGNORE_INDEX, collate_right, tokenize_chat
from ..model import load_course_model
from ..token_weighting import _accumulated_grad, _flat_grad, _relative_error, multi_turn_conversations
from .answers import lesson07 as _answers
from .answers.lesson07 import accumulate_sequence_weighted as _reference

# ------------------------------------------------------------------------------------------------
# Exercise 7.1 (diagnosis): an accumulation trace from one of several causes
# ------------------------------------------------------------------------------------------------

TRACE_CAUSES = _answers.TRACE_CAUSES  # what can have set a step's token weights (the learner picks one)


def accumulation_trace(seed: int) -> dict:
    """A debug trace of one optimizer step for exercise 7.1; ``seed`` picks the cause and the numbers.

    The trace is what a ``print`` in the training loop would show: ``world_size``, ``accum_steps`` and one
    row per ``.backward()`` call with ``rank``, ``micro_step``, ``n_tokens`` (supervised tokens of that
    micro-batch), ``summed_loss`` (its summed cross-entropy) and ``backward_loss`` (the number that was
    back-propagated). DDP averages the ranks' gradients. The checker grades your diagnosis on traces drawn
    apart from these (no seed of this function gives one of them), so read the trace, not this function.
    """
    return _answers.accumulation_trace_case(validate.seed("seed", seed), graded=False)[0]


def _graded_case(seed: int):
    """The checker's case: a trace from the graded stream (never one ``accumulation_trace`` shows) and its
    truth, which lives with the reference answers."""
    return _answers.accumulation_trace_case(seed, graded=True)


def _trace_evidence_ok(got, truth: Diagnosis) -> bool:
    if truth.evidence is None:
        return got is None
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    return abs(got - truth.evidence) < 1e-6


_TRACE_MISCONCEPTIONS = {
    ("per_micro_batch_mean", "missing_division_by_k"):
        "the token counts are all equal here, so the per-micro-batch mean would be exact; add up the weights "
        "(backward_loss / summed_loss) times the tokens: the step counts K times.",
    ("missing_division_by_k", "per_micro_batch_mean"):
        "the weights add up to 1 here (no missing ÷ K); compare the weight of one token across "
        "micro-batches.",
    ("per_micro_batch_mean", "per_rank_mean"):
        "there is one micro-batch per rank and world_size > 1: DDP averages the ranks' means.",
    ("per_rank_mean", "per_micro_batch_mean"):
        "world_size is 1: there are no ranks to average, only micro-batches.",
    ("per_micro_batch_mean", "token_weighted"):
        "every token has the same weight 1/N (DDP's average included): this step is the big batch.",
    ("missing_division_by_k", "token_weighted"):
        "equal token counts alone are no fault: add up the weights (backward_loss / summed_loss / "
        "world_size) times the tokens — here they make 1, the big batch.",
    ("per_rank_mean", "token_weighted"):
        "the ranks multiplied by world_size and divided by the GLOBAL count: after DDP's average every "
        "token weighs 1/N.",
}


def check_trace_diagnosis(fn):
    """Checker for exercise 7.1: ``fn(trace) -> Diagnosis(cause, evidence)`` on fresh traces of each cause
    (fifteen, three per cause, drawn fresh on every run: no keyword fixes them, see
    ``checks.fresh_seeds``)."""
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    return check_diagnosis(
        "accumulation_trace", fn, _graded_case, seeds=lambda: fresh_seeds(3 * len(TRACE_CAUSES)),
        evidence_ok=_trace_evidence_ok,
        misconceptions=_TRACE_MISCONCEPTIONS,
        hint=Hints(question="What weight does ONE token of each row get in the step's gradient, once DDP has "
                            "averaged the ranks?",
                   pointer="A row's per-token weight is backward_loss / summed_loss, divided by world_size "
                           "(DDP's average). Then two tests: is it the same for every row, and do the "
                           "weights times the tokens add up to 1? Section 4 gives the weights each scheme "
                           "should produce.",
                   answer="w = backward_loss / summed_loss / world_size; NaN -> empty_micro_batch (that "
                          "micro_step); all w equal and Σ w·n = K -> missing_division_by_k (evidence K); "
                          "all w "
                          "equal and Σ w·n = 1 -> token_weighted (None); unequal w -> per_rank_mean if "
                          "world_size > 1 (the rank with fewest tokens) else per_micro_batch_mean (the "
                          "micro_step with fewest tokens)."))


# ------------------------------------------------------------------------------------------------
# Exercise 7.2 (fix): per-sequence averaging across micro-batches
# ------------------------------------------------------------------------------------------------

_HIDDEN: dict = {}


def _hidden_setup():
    """The course model and hidden steps with micro-batches of different sizes (built once per kernel)."""
    if not _HIDDEN:
        model, tok = load_course_model(device="cpu")
        steps, labels = [], []
        for seed, sizes in ((101, (1, 3)), (102, (2, 2, 1)), (103, (3, 1, 2))):
            examples = [tokenize_chat(tok, c) for c in multi_turn_conversations(sum(sizes), seed)]
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            steps.append([collate_right(examples[s: s + n], tok.pad_token_id) for s, n in zip(starts, sizes)])
            labels.append(f"micro-batches of {list(sizes)} chats")
        # lesson 05's case: a row with no supervised token (truncated away) inside a micro-batch
        last = steps[-1][2]
        steps[-1][2] = {**last, "labels": torch.cat([torch.full_like(last["labels"][:1], IGNORE_INDEX),
                                                     last["labels"][1:]])}
        labels[-1] += ", one chat with no supervised token"
        _HIDDEN.update(model=model, tok=tok, steps=steps, labels=labels)
    return _HIDDEN


def _grad_compare(got, expected) -> str | None:
    if isinstance(got, str):
        return got
    if not isinstance(got, torch.Tensor):
        return f"expected the step's gradient, got {type(got).__name__}"
    if not torch.isfinite(got).all():
        return "the gradient has NaN/inf entries"
    err = _relative_error(got, expected)
    if err < 1e-4:
        return None
    return f"relative gradient error {err:.2e} vs the per-sequence objective (want < 1e-4)"


def check_sequence_weighted(fn):
    """Checker for exercise 7.2: after ``fn(model, micro_batches)``, ``.grad`` must be the gradient of the
    mean over the step's sequences (those with a supervised token) of each sequence's mean token loss."""
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    model = _hidden_setup()["model"]

    def grad_of(accumulate, micro_batches):
        model.zero_grad(set_to_none=True)
        accumulate(model, micro_batches)
        if all(p.grad is None for p in model.parameters()):
            return "no parameter has a .grad: call .backward() on each micro-batch's loss"
        grad = _flat_grad(model)
        model.zero_grad(set_to_none=True)
        return grad

    def cases():  # built in run_check's grading process: this one never holds the expected grads
        hidden = _hidden_setup()
        if "expected" not in hidden:  # the reference gradients, once per kernel like the steps themselves
            hidden["expected"] = [grad_of(_reference, mbs) for mbs in hidden["steps"]]
        return [Case((mbs,), expected, label=label, tag="step")
                for mbs, expected, label in zip(hidden["steps"], hidden["expected"], hidden["labels"])]

    def diagnose(got, case: Case):
        if not isinstance(got, torch.Tensor):
            return None
        if not torch.isfinite(got).all():
            return ("a sequence with no supervised token gave 0/0 = NaN: leave it out (it has no mean), "
                    "and do not count it among the sequences.")
        mbs = case.args[0]
        if _relative_error(got, _accumulated_grad(model, mbs, "token")) < 1e-4:
            return ("that is per-token averaging (summed loss ÷ the step's tokens): long answers dominate. "
                    "Average each sequence over its own tokens first.")

        def per_micro_batch(m, batches):  # each micro-batch's mean over its sequences, ÷ K
            for b in batches:
                _reference(m, [b], _scale=1 / len(batches))
        if _relative_error(got, grad_of(per_micro_batch, mbs)) < 1e-4:
            return ("that averages sequences inside each micro-batch, then ÷ K: a sequence in a small "
                    "micro-batch counts more. Divide by the number of sequences of the whole step.")
        ratio = float(got.norm() / case.expected.norm())
        if _relative_error(got / ratio, case.expected) < 1e-4:
            return (f"right direction, {ratio:.3g}x the size: check what you divide by — the sequences of "
                    "the whole step that have at least one supervised token.")
        return None

    return run_check("accumulate_sequence_weighted", lambda mbs: grad_of(fn, mbs), cases,
                     compare=_grad_compare, diagnose=diagnose,
                     hint=Hints(question="Under per-sequence averaging, what weight does one token of a "
                                         "sequence with n supervised tokens get, in a step of S sequences?",
                                pointer="The per-token loss comes from F.cross_entropy(..., "
                                        "reduction='none') on the shifted logits and labels (section 4's "
                                        "picture; lesson 05 for the "
                                        "sequence with no target).",
                                answer="S = rows with a supervised token over ALL micro-batches; for each "
                                       "micro-batch: per-row summed CE / per-row count, keep rows with "
                                       "count > 0, (their sum / S).backward()."))

