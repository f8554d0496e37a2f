"""Lesson 05's exercises: the broken-log diagnosis (exercise 1) and the packer-input fix (exercise 2), graded.

``broken_log(seed)`` is the training log the notebook shows: the log only. The generator that also
knows its cause (``_broken_log``) stays private to this module, with the misconceptions and the cases
of ``check_diagnose_log`` and ``check_prepare_for_packer``. ``CAUSES`` lists what a log's cause can be.
Reference answers: ``answers/lesson05.py``.
"""

from __future__ import annotations

import math
import random

from .. import validate
from ..checks import Case, Diagnosis, Hints, check_diagnosis, run_check
from ..data import IGNORE_INDEX, n_graded
from ..model import course_seed

# ------------------------------------------------------------------------------------------------
# Exercise 1 (diagnosis): which mechanism broke this training log?
# ------------------------------------------------------------------------------------------------

CAUSES = ("clogged_packer", "truncated_examples", "loss_at_ignored_positions", "learning_rate")
"""The causes of a broken log: the best-fit buffer clogged; right truncation left random micro-batches
without a target; a per-token loss computed at every position (ignored labels replaced by a stand-in id),
then ``(nll * mask).sum() / mask.sum()``, turned one empty micro-batch into NaN weights; and lesson 06's
look-alike, a learning rate so high the run diverges with every batch full."""


def broken_log(seed: int) -> list[dict]:
    """A training log you have not seen, one record per step: ``step``, ``loss``, ``grad_norm``,
    ``targets`` in the step, ``consumed`` conversations. ``seed`` picks the run; the log never names
    its cause (exercise 1 asks for it)."""
    return _broken_log(validate.seed("seed", seed))[0]


def _broken_log(seed: int) -> tuple[list[dict], Diagnosis]:
    """``broken_log(seed)`` and its truth: ``Diagnosis(cause, evidence)`` with ``evidence`` the first step
    whose logged loss is not finite."""
    rng = random.Random(seed)
    cause = CAUSES[seed % len(CAUSES)]
    steps, first = rng.randint(14, 22), rng.randint(3, 9)
    log, consumed, loss = [], 0, rng.uniform(2.5, 4.0)
    empties = set()
    if cause == "truncated_examples":  # isolated empty steps, data keeps flowing
        empties = {first} | set(rng.sample(range(first + 2, steps + 1), 2))
    for step in range(1, steps + 1):
        targets, norm = rng.randint(40, 90), rng.uniform(0.8, 2.5)
        loss = max(0.3, loss * rng.uniform(0.9, 0.99))
        value = loss
        if cause == "clogged_packer" and step >= first:
            targets, norm, value = 0, 0.0, float("nan")
        elif cause == "truncated_examples" and step in empties:
            targets, norm, value = 0, 0.0, float("nan")
        elif cause == "loss_at_ignored_positions" and step == first:
            targets, norm, value = 0, float("nan"), float("nan")
        elif cause == "loss_at_ignored_positions" and step > first:
            norm, value = float("nan"), float("nan")  # NaN weights: data is fine, the model is gone
        elif cause == "learning_rate":
            if step >= first:
                norm, value = norm * 10 ** (step - first + 1), loss * 2 ** (step - first + 1)
            if step >= first + 3:
                norm, value = float("inf"), float("nan")
        consumed += 0 if targets == 0 and cause == "clogged_packer" else rng.randint(3, 6)
        log.append({"step": step, "loss": value, "grad_norm": norm, "targets": targets, "consumed": consumed})
    bad = next(r["step"] for r in log if not math.isfinite(r["loss"]))
    return log, Diagnosis(cause, bad)


def check_diagnose_log(fn, seeds=None) -> object:
    """Checker: ``fn(log) -> Diagnosis(cause, evidence)`` on fresh logs from ``broken_log``; ``cause`` is
    one of ``CAUSES``, ``evidence`` the first step whose logged loss is not finite. ``seeds`` default to
    two rounds through the causes, offset by the course seed."""
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    if seeds is None:
        base = 1000 + 8 * course_seed()
        seeds = range(base, base + 2 * len(CAUSES))
    return check_diagnosis(
        "diagnose_log", fn, _broken_log, seeds=validate.seeds("seeds", seeds),
        misconceptions={
            ("truncated_examples", "clogged_packer"): "isolated empty steps come back; here the targets "
            "never "
            "return and `consumed` stops moving: the buffer is clogged.",
            ("clogged_packer", "truncated_examples"): "a clogged buffer never recovers; here later steps "
            "carry "
            "targets again and `consumed` keeps growing.",
            ("clogged_packer", "loss_at_ignored_positions"): "look at `targets` after the first NaN: the "
            "data is full again, yet the loss stays NaN — the weights are NaN, not the batches empty.",
            ("learning_rate", "loss_at_ignored_positions"): "the first NaN step had no target at all and "
            "the norm was NaN at once, with no climb before it: 0/0 in the loss, not a divergence.",
            ("loss_at_ignored_positions", "learning_rate"): "every step had targets; the norm grew by "
            "orders of magnitude before the NaN: a divergence (lesson 06).",
            ("truncated_examples", "loss_at_ignored_positions"): "after the empty step the targets are "
            "back but the loss never is: the weights were poisoned (NaN gradients), not just one batch "
            "empty.",
        },
        hint=Hints(question="After the first non-finite step, do the steps have targets again, does "
                            "`consumed` still move, and did the gradient norm climb before it?",
                   pointer="Compare section 4's clogged-packer table (targets 0 for good, consumed frozen), "
                           "section 2's all-positions masked mean (NaN weights) and lesson 06's divergence "
                           "(norm climbs).",
                   answer="empty forever + frozen consumed -> clogged_packer; empty now and then -> "
                          "truncated_examples; one empty step, then NaN with targets -> "
                          "loss_at_ignored_positions; "
                          "targets everywhere, norm climbing -> learning_rate. Evidence: first non-finite "
                          "step."))


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): prepare conversations so a best-fit packer can neither clog nor pack empty rows
# ------------------------------------------------------------------------------------------------


def _ex(n_prompt: int, n_answer: int, tag: str, rng: random.Random) -> dict:
    ids = [rng.randrange(3, 5000) for _ in range(n_prompt + n_answer)]  # distinct: outputs are traceable
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * n_prompt + ids[n_prompt:], "tag": tag}


def _packer_cases() -> list[Case]:
    rng = random.Random(7)
    cases = []
    for i, cap in enumerate((16, 24, 33)):
        pool = [_ex(rng.randint(2, cap // 2), rng.randint(1, cap // 3), "fits", rng) for _ in range(5)]
        pool += [_ex(cap + rng.randint(1, 9), rng.randint(1, 5), "prompt longer than a row", rng)]
        pool += [_ex(cap // 2, cap, "answer crosses the row end", rng)]
        pool += [_ex(cap - 1, 2, "prompt fills the row but one", rng)]
        pool += [_ex(rng.randint(1, 4), 0, "no answer at all", rng)]
        pool += [_ex(0, 1, "one answer token in column 0: no target after the shift", rng)]
        rng.shuffle(pool)
        cases.append(Case((pool, cap), (pool, cap), label=f"row of {cap} tokens, {len(pool)} conversations",
                          tag=str(i)))
    cases.append(Case(([], 8), ([], 8), label="no conversations", tag="empty"))
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


def _compare_packer(got, case_args) -> str | None:
    examples, cap = case_args
    got = _as_rows(got)
    if got is None:
        return "expected a list of dicts whose 'input_ids' and 'labels' are lists of ints"
    if any(len(e["input_ids"]) > cap or len(e["labels"]) != len(e["input_ids"]) for e in got):
        return f"a conversation longer than the row ({cap} tokens) is left: it would never leave the buffer"
    if not all(n_graded(e["labels"]) > 0 for e in got):
        return "a conversation without a target is left: packed alone it makes a row with loss 0/0"
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
        return "a conversation that fits a row and has a target was dropped or cut: it is training data"
    return None


def _diagnose_packer(got, case: Case) -> str | None:
    examples, cap = case.args
    got = _as_rows(got)
    if got is None:
        return None
    if any(len(e["input_ids"]) > cap for e in got):
        return ("the oversized conversations are still there: a best-fit buffer never pops them, so it "
                "clogs. "
                "Crop or drop what is longer than the row.")
    empty = [e["labels"] for e in got if n_graded(e["labels"]) == 0]
    if empty and all(any(x != IGNORE_INDEX for x in labels) for labels in empty):
        return ("a label in column 0 is never a target: no logit comes before it (the one-token shift) — "
                "count the labels from index 1 on.")
    if empty:
        return ("cropping alone is not the fix: a crop that ends before the answer keeps only the prompt, "
                "a row "
                "with no target. Check the labels after the crop.")
    if len(got) < len(examples) - 3:
        return "you dropped conversations that fit a row and still have a target: they are training data."
    return None


def check_prepare_for_packer(fn) -> object:
    """Checker: ``fn(examples, row_capacity) -> list`` leaves, in order, only conversations that fit a row
    (``len <= row_capacity``) and keep a target after the shift; a conversation that fits and has a
    target is kept unchanged. Cropping the oversized ones or dropping them are both correct."""
    cases = [Case(c.args, c.args, label=c.label, tag=c.tag) for c in _packer_cases()]
    return run_check("prepare_for_packer", fn, cases, compare=_compare_packer, diagnose=_diagnose_packer,
                     hint=Hints(question="Which conversations can a best-fit buffer never pop, and which "
                                         "rows "
                                         "would have a loss of 0/0 even after they fit?",
                                pointer="Section 6 packs with crop=True and shows batches without targets; "
                                        "has_targets() tells whether labels still carry loss (after the "
                                        "shift).",
                                answer="for each example: cut ids and labels to row_capacity (or skip it if "
                                       "longer), then keep it only if has_targets(labels)."))
