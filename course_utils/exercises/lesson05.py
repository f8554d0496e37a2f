"""Lesson 05's exercises: diagnose a training log (exercise 1) and prepare a dataset so that no example
reaches the loss without a target (exercise 2), graded.

``training_log(seed)`` is a log the notebook shows: the log only. The generator that also knows its cause
lives with the reference answers (``answers/lesson05.py``); the checker grades on a stream of logs that
``training_log`` never shows. ``CAUSES`` lists what a log's cause can be.
"""

from __future__ import annotations

import random

from .. import validate
from ..checks import Case, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import IGNORE_INDEX, is_graded, n_graded
from .answers import lesson05 as _answers

# ------------------------------------------------------------------------------------------------
# Exercise 1 (diagnosis): what happened in this training log?
# ------------------------------------------------------------------------------------------------

CAUSES = _answers.LOG_CAUSES
"""What a log can show: ``"empty_micro_batch"`` (right truncation left a step without a graded token: 0/0,
a zero gradient, and the run goes on), ``"nan_weights"`` (a per-token loss computed at every position and
masked by multiplication turned one such step into NaN weights), ``"healthy"`` (nothing is wrong)."""


def training_log(seed: int) -> list[dict]:
    """A training log you have not seen, one record per optimizer step: ``step``, ``loss`` (this step's),
    ``avg_loss`` (the running mean a logger prints), ``grad_norm`` (before clipping) and ``num_tokens``
    (graded tokens in the step). ``seed`` picks the run; the checker grades on logs drawn apart from these,
    so read the log, not this function."""
    return _answers.training_log_case(validate.seed("seed", seed), graded=False)[0]


def _graded_case(seed: int):
    return _answers.training_log_case(seed, graded=True)


def check_diagnose_log(fn) -> object:
    """Checker: ``fn(log) -> Diagnosis(cause, evidence)`` on fresh logs; ``cause`` is one of ``CAUSES``,
    ``evidence`` the first step without a graded token (``None`` for a healthy run). Graded on twelve logs
    drawn fresh on every run, four per cause (no keyword fixes them: see ``checks.fresh_seeds``)."""
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    return check_diagnosis(
        "diagnose_log", fn, _graded_case, seeds=lambda: fresh_seeds(4 * len(CAUSES)),
        misconceptions={
            ("nan_weights", "empty_micro_batch"): "after the step without a graded token the losses are "
            "finite again and its gradient norm was 0: the weights survived (the running average stays NaN "
            "only because one NaN entered the sum).",
            ("empty_micro_batch", "nan_weights"): "after the empty step the steps have graded tokens again, "
            "yet loss and gradient norm stay NaN: the weights are NaN, not just one batch empty.",
            ("empty_micro_batch", "healthy"): "every step has graded tokens: a step with a few of them, or a "
            "spike, is noise, not 0/0.",
            ("healthy", "empty_micro_batch"): "a step has num_tokens 0: its loss is 0/0 (or a clamped 0.0 — "
            "not a perfect step), even when the run goes on.",
            ("nan_weights", "healthy"): "no step lacks a graded token and nothing is NaN.",
        },
        hint=Hints(question="What does a step with no graded token look like in this log, and how would a "
                            "run that survived it differ from one whose weights it broke?",
                   pointer="Section 2's table: an all-masked micro-batch gives NaN loss with a ZERO "
                           "gradient under ignore_index (0.0 under a clamped count), NaN gradients with a "
                           "loss computed at every position; section 1: one NaN keeps a running average "
                           "NaN for good.",
                   answer="no step with num_tokens == 0 -> healthy (None); else the first such step is the "
                          "evidence; its grad_norm finite (0) and the later steps with tokens finite -> "
                          "empty_micro_batch; else nan_weights."))


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): prepare examples so that every one fits max_length and keeps a target
# ------------------------------------------------------------------------------------------------


def _ex(n_prompt: int, n_answer: int, tag: str, rng: random.Random) -> dict:
    ids = [rng.randrange(3, 5000) for _ in range(n_prompt + n_answer)]  # distinct: outputs are traceable
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * n_prompt + ids[n_prompt:], "tag": tag}


def _examples_cases() -> list[Case]:
    rng = random.Random(7)
    cases = []
    for i, cap in enumerate((16, 24, 33)):
        pool = [_ex(rng.randint(2, cap // 2), rng.randint(1, cap // 3), "fits", rng) for _ in range(5)]
        pool += [_ex(cap + rng.randint(1, 9), rng.randint(1, 5), "prompt longer than max_length", rng)]
        pool += [_ex(cap // 2, cap, "answer crosses max_length", rng)]
        pool += [_ex(cap - 1, 2, "prompt fills max_length but one", rng)]
        pool += [_ex(rng.randint(1, 4), 0, "no answer at all", rng)]
        pool += [_ex(0, 1, "one answer token in column 0: no target after the shift", rng)]
        rng.shuffle(pool)
        cases.append(Case((pool, cap), (pool, cap), label=f"max_length {cap}, {len(pool)} examples",
                          tag=str(i)))
    cases.append(Case(([], 8), ([], 8), label="no examples", tag="empty"))
    return cases


def _as_rows(got) -> list[dict] | None:
    """The learner's output as ``{"input_ids": [int], "labels": [int]}`` rows, or None if it is not a list
    of such dicts (lists, tuples or 1-D integer tensors): the checker reports it, never raises on it."""
    def ints(value):
        if hasattr(value, "tolist") and getattr(value, "ndim", None) == 1:
            value = value.tolist()
        if isinstance(value, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool)
                                                    for x in value):
            return list(value)
        return None

    if not isinstance(got, list) or not all(isinstance(e, dict) for e in got):
        return None
    rows = [{"input_ids": ints(e.get("input_ids")), "labels": ints(e.get("labels"))} for e in got]
    return None if any(r["input_ids"] is None or r["labels"] is None for r in rows) else rows


def _compare_examples(got, case_args) -> str | None:
    examples, cap = case_args
    got = _as_rows(got)
    if got is None:
        return "expected a list of dicts whose 'input_ids' and 'labels' are lists of ints"
    if any(len(e["input_ids"]) > cap or len(e["labels"]) != len(e["input_ids"]) for e in got):
        return f"an example longer than max_length ({cap} tokens) is left"
    if not all(n_graded(e["labels"]) > 0 for e in got):
        return "an example without a target is left: alone in a micro-batch its loss is 0/0"
    j = 0  # each output must be a prefix of a distinct input, in order
    for e in got:
        ids = list(e["input_ids"])
        while j < len(examples) and list(examples[j]["input_ids"][:len(ids)]) != ids:
            j += 1
        if j == len(examples) or list(examples[j]["labels"][:len(e["labels"])]) != list(e["labels"]):
            return "an output is not a (cropped) copy of an input, in the input order"
        j += 1
    fits = [e for e in examples if len(e["input_ids"]) <= cap and n_graded(e["labels"]) > 0]
    kept = [list(e["input_ids"]) for e in got]
    if any(list(e["input_ids"]) not in kept for e in fits):
        return "an example that fits max_length and has a target was dropped or cut: it is training data"
    return None


def _diagnose_examples(got, case: Case) -> str | None:
    examples, cap = case.args
    got = _as_rows(got)
    if got is None:
        return None
    if any(len(e["input_ids"]) > cap for e in got):
        return ("the examples longer than max_length are still there: crop them (right truncation, as TRL "
                "does) or drop them.")
    empty = [e["labels"] for e in got if n_graded(e["labels"]) == 0]
    if empty and all(any(is_graded(x) for x in labels) for labels in empty):
        return ("a label in column 0 is never a target: no logit comes before it (the one-token shift) — "
                "count the labels from index 1 on.")
    if empty:
        return ("cropping alone is not the fix: a crop that ends before the answer keeps only the prompt, "
                "an example with no target. Check the labels after the crop.")
    if len(got) < len(examples) - 3:
        return "you dropped examples that fit max_length and still have a target: they are training data."
    return None


def check_prepare_examples(fn) -> object:
    """Checker: ``fn(examples, max_length) -> list`` leaves, in order, only examples of at most
    ``max_length`` tokens that keep a target after the shift; an example that fits and has a target is kept
    unchanged. Cropping the longer ones or dropping them are both correct."""
    return run_check("prepare_examples", fn,  # the cases built in the grading process, not here
                     lambda: [Case(c.args, c.args, label=c.label, tag=c.tag) for c in _examples_cases()],
                     compare=_compare_examples, diagnose=_diagnose_examples,
                     hint=Hints(question="Which examples would still reach the loss with no label to learn "
                                         "from — before any cut, and after a cut at max_length?",
                                pointer="Section 3 counted the fully masked examples; has_targets() tells "
                                        "whether labels still carry loss (after the shift). Fix 1 of "
                                        "section 5.",
                                answer="for each example: cut ids and labels to max_length (or skip it if "
                                       "longer), then keep it only if has_targets(labels)."))
