"""Bad input gets a clear error from every public function of the package — never a result, never a hang.

Every public function of every ``course_utils`` module (learner tools, the core, the checkers and their
case generators, the doctor, the watch; 260+) is called with the mistakes learners and users make. Where
the package can build a valid value for each required argument (``good_values``: the course model, its
tokenizer, a collated batch, tokenized examples, …) one argument at a time is replaced by a bad one of
each category, the others kept valid — so the check that must catch it is the one reached:

- ``None``; the wrong kind (a string for a number, one string for a list of strings, a list for a
  tensor, a tokenizer for a model and back); empty (``[]``, ``""``, ``{}``); negative (``-1``, ``-0.5``);
  a percentage where a fraction is meant (a good value in (0, 1] times 100).

Functions with an argument the sweep cannot build get ``None`` / ``[]`` / ``-1`` for each required
argument in turn (the others ``None``). Each call ends in one of: a what/why/fix error raised by
``course_utils`` (the message has the "what — why — fix" shape), another error (raw, from a library or
from our own indexing), a result, or a time-out. A result from ``None``, the wrong kind or empty input
is a silent wrong answer; so is a time-out. ~1,100 calls, ~10 s of one core: part of `make test`.
The figures are printed (``python tests/test_bad_input.py`` prints the whole table) and quoted in
the README.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
import signal
import sys
from collections import Counter

import pytest
import torch

import course_utils

# Never called: entry points that exit the process, the course's settings (they take no argument).
SKIP = re.compile(r"^(main|use_course_defaults)$")
# Modules whose functions are the validation itself: ``validate.x(name, value)`` is called by the package
# with a literal name, and its job is to raise on a bad ``value`` (its own tests check the messages).
# The reference answers (exercises/answers/) are what a learner writes in a cell: kept as short as theirs.
NOT_SWEPT = ("course_utils.validate",)
NOT_SWEPT_PACKAGES = ("course_utils.exercises.answers",)
# Functions for which None, empty or the wrong kind is valid input, with why.
ACCEPTS_ANYTHING = {
    "checks.close": "it compares any two values (None equals None): it is the checkers' comparison",
}
WHAT_WHY_FIX = re.compile(r".+ — .+ — .+", re.S)
SILENT = ("None", "wrong kind", "empty")


def public_functions():
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        if "course_model" in info.name or info.name in NOT_SWEPT or info.name.startswith(NOT_SWEPT_PACKAGES):
            continue
        module = importlib.import_module(info.name)
        for attr, fn in sorted(vars(module).items()):
            label = f"{info.name.removeprefix('course_utils.')}.{attr}"
            if (not attr.startswith("_") and _swept_kind(fn) and fn.__module__ == module.__name__
                    and not SKIP.match(attr) and label not in ACCEPTS_ANYTHING):
                yield label, fn


def _swept_kind(obj) -> bool:
    """Functions, and classes a user constructs (``SFTWatch``, ``StopCriterion``); not exceptions, and not
    dataclasses, which are records the package builds and hands back (``Setup``, ``Case``, ``Diagnosis``)."""
    if inspect.isfunction(obj):
        return True
    return (inspect.isclass(obj) and not issubclass(obj, BaseException)
            and not dataclasses.is_dataclass(obj))


def required_params(fn) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def good_values() -> dict:
    """A valid value for the argument names the package shares (``name -> value``)."""
    from course_utils import load_course_model
    from course_utils.data import collate_right, make_chat_dataset, make_messages, tokenize_chat

    model, tokenizer = load_course_model()
    conversations = make_messages("add", 4, seed=0)
    examples = [tokenize_chat(tokenizer, m) for m in conversations]
    batch = collate_right(examples, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    return {
        "model": model, "tokenizer": tokenizer, "tok": tokenizer, "messages": conversations[0],
        "conversations": conversations, "examples": examples, "example": examples[0], "batch": batch,
        "micro_batches": [batch, batch], "batches": [batch, batch], "labels": batch["labels"],
        "input_ids": batch["input_ids"], "logits": logits, "seed": 0, "n": 2, "steps": 1, "k": 2,
        "batch_size": 2, "accum_steps": 2, "pad_token_id": tokenizer.pad_token_id, "max_length": 64,
        "lr": 1e-3, "template": tokenizer.chat_template, "chat_template": tokenizer.chat_template,
        "eot": "<|im_end|>", "dataset": make_chat_dataset("add", 4, seed=0),
    }


def bad_values(good) -> list[tuple[str, object]]:
    """The mistakes to try in place of ``good``, by category."""
    out = [("None", None)]
    if isinstance(good, bool):
        return out + [("wrong kind", "yes")]
    if isinstance(good, int):
        out += [("wrong kind", str(good)), ("negative", -1)]
    elif isinstance(good, float):
        out += [("wrong kind", str(good)), ("negative", -0.5)]
        if 0 < good <= 1:
            out.append(("percentage for a fraction", good * 100))
    elif isinstance(good, str):
        out += [("wrong kind", 3), ("empty", "")]
    elif isinstance(good, torch.Tensor):
        out += [("wrong kind", good.tolist()), ("empty", good[:0])]
    elif isinstance(good, dict):
        out += [("wrong kind", list(good.values())), ("empty", {})]
    elif isinstance(good, (list, tuple)):
        out += [("wrong kind", "x"), ("empty", [])]
    elif isinstance(good, torch.nn.Module):
        out.append(("wrong kind", "a model name"))
    else:  # a tokenizer, a dataset
        out.append(("wrong kind", 3))
    return out


def _timeout(*_):
    raise TimeoutError("over 20 s")


def classify(fn, kwargs) -> tuple[str, str]:
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(20)
    try:
        fn(**kwargs)
    except TimeoutError:
        return "time-out", ""
    except Exception as exc:  # noqa: BLE001 - classifying, not handling
        message = str(exc)
        ours = "course_utils" in inspect.trace()[-1].filename
        clear = isinstance(exc, (ValueError, TypeError, FileNotFoundError)) and WHAT_WHY_FIX.match(message)
        if ours and clear:
            return "what/why/fix", message[:120]
        return "raw error", f"{type(exc).__name__}: {message[:100]}"
    finally:
        signal.alarm(0)
    return "result", ""


def measure(good: dict | None = None):
    good = good_values() if good is None else good
    rows = []
    for label, fn in public_functions():
        params = required_params(fn)
        if all(p in good for p in params):
            for target in params:
                for category, bad in bad_values(good[target]):
                    kwargs = {p: (bad if p == target else good[p]) for p in params}
                    rows.append((label, target, category, *classify(fn, kwargs)))
        else:
            for target in params:
                for category, bad in (("None", None), ("empty", []), ("negative", -1)):
                    kwargs = {p: (bad if p == target else None) for p in params}
                    rows.append((label, target, category, *classify(fn, kwargs)))
    return rows


@pytest.fixture(scope="module")
def rows():
    return measure()


def test_errors_from_bad_input_carry_what_why_fix(rows):
    errors = [r for r in rows if r[3] in ("what/why/fix", "raw error")]
    share = sum(r[3] == "what/why/fix" for r in errors) / len(errors)
    raw = [f"{label}({target}: {category}): {detail}" for label, target, category, outcome, detail in rows
           if outcome == "raw error"]
    assert share >= 0.9, f"{share:.0%} what/why/fix of {len(errors)} errors; raw errors:\n" + "\n".join(raw)


def test_no_silent_result_and_no_hang(rows):
    bad = [f"{label}({target}: {category})" for label, target, category, outcome, _ in rows
           if outcome == "time-out" or (outcome == "result" and category in SILENT)]
    assert not bad, "a result (or a time-out) from input that should have been refused:\n" + "\n".join(bad)


def test_the_sweep_reaches_every_module_and_the_check_it_aims_at(rows):
    """Every module with a public function or class that takes a required argument is swept (the rest,
    e.g. ``quiet``'s context managers, take keyword switches with defaults); and where the neighbours are
    valid, the error is about the argument that was made bad."""
    swept = {label.rsplit(".", 1)[0] for label, *_ in rows}
    expected = {label.rsplit(".", 1)[0] for label, fn in public_functions() if required_params(fn)}
    assert expected <= swept, expected - swept
    aimed = [r for r in rows if r[2] == "wrong kind"]
    named = sum(r[1] in r[4] for r in aimed)
    assert aimed and named >= 0.9 * len(aimed), f"{named} of {len(aimed)} wrong-kind errors name the argument"


if __name__ == "__main__":
    table = measure()
    for row in table:
        print(" | ".join(str(x) for x in row))
    counts = Counter(row[3] for row in table)
    errors = counts["what/why/fix"] + counts["raw error"]
    silent = sum(1 for r in table if r[3] == "result" and r[2] in SILENT)
    print(f"{len(table)} calls of {len({r[0] for r in table})} functions: {dict(counts)}; "
          f"{counts['what/why/fix'] / errors:.0%} of errors what/why/fix; {silent} silent results")
    sys.exit(0)
