"""Bad input gets a clear error: every learner-facing public function, called with the typical slips.

For each public function of the learner-facing modules, each required argument in turn is replaced by
a wrong-kind value (``None``), an empty one (``[]``) and an out-of-range one (``-1``), the others by
``None``. What comes back is sorted into: a what/why/fix error raised by course_utils (the message has
the "what — why — fix" shape), another error (a raw one from torch/transformers, or from our own
indexing), or no error at all (a result from nonsense: the worst). The test holds the share of
what/why/fix errors at or above 90 % and allows no call that returns a result from ``None`` input.

Run it as a script for the table: ``python tests/test_bad_input.py``.
"""

from __future__ import annotations

import importlib
import inspect
import re
import signal
import sys
from collections import Counter

import pytest

pytestmark = pytest.mark.slow  # ~800 calls: `make test-slow` (and CI) run it

MODULES = ("data", "losses", "train", "model", "viz", "tour", "accumulation", "eos", "padding", "templates",
           "truncation", "nan_detective", "token_weighting")
# Not learner-facing: the checkers (they take the learner's function and never raise on a wrong one).
SKIP = re.compile(r"^(check_|main$)")
BAD_VALUES = (("None", None), ("empty", []), ("negative", -1))
WHAT_WHY_FIX = re.compile(r".+ — .+ — .+", re.S)


def learner_functions():
    for name in MODULES:
        try:
            module = importlib.import_module(f"course_utils.{name}")
        except ImportError:
            continue
        for attr, fn in list(vars(module).items()):
            if attr.startswith("_") or SKIP.match(attr) or not inspect.isfunction(fn):
                continue
            if fn.__module__ != module.__name__:
                continue
            yield f"{name}.{attr}", fn


def required_params(fn) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _timeout(*_):
    raise TimeoutError("over 20 s")


def classify(fn, kwargs) -> tuple[str, str]:
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(20)
    try:
        fn(**kwargs)
    except TimeoutError:
        return "over 20 s", ""
    except (ValueError, TypeError, FileNotFoundError) as exc:
        message = str(exc)
        origin = inspect.trace()[-1].filename
        ours = "course_utils" in origin
        if ours and WHAT_WHY_FIX.match(message):
            return "what/why/fix", message[:80]
        return "raw error", f"{type(exc).__name__}: {message[:80]}"
    except Exception as exc:  # noqa: BLE001 - classifying, not handling
        return "raw error", f"{type(exc).__name__}: {str(exc)[:80]}"
    finally:
        signal.alarm(0)
    return "result", ""


def measure():
    rows = []
    for label, fn in learner_functions():
        params = required_params(fn)
        for target in params:
            for bad_name, bad in BAD_VALUES:
                kwargs = {p: (bad if p == target else None) for p in params}
                outcome, detail = classify(fn, kwargs)
                rows.append((label, target, bad_name, outcome, detail))
    return rows


@pytest.fixture(scope="module")
def rows():
    return measure()


def test_most_bad_inputs_get_a_what_why_fix_error(rows):
    counts = Counter(outcome for *_, outcome, _ in rows)
    share = counts["what/why/fix"] / len(rows)
    raw = [f"{label}({target}={bad}): {detail}" for label, target, bad, outcome, detail in rows
           if outcome == "raw error"]
    assert share >= 0.9, f"{share:.0%} what/why/fix of {len(rows)} bad calls; raw errors:\n" + "\n".join(raw)


def test_no_function_returns_a_result_from_nonsense_or_hangs(rows):
    bad = [f"{label}({target}={name})" for label, target, name, outcome, _ in rows
           if outcome in ("over 20 s",) or (outcome == "result" and name == "None")]
    assert not bad, "these calls returned a result (or ran over 20 s) on a None argument:\n" + "\n".join(bad)


if __name__ == "__main__":
    table = measure()
    for row in table:
        print(" | ".join(str(x) for x in row))
    counts = Counter(row[3] for row in table)
    print(dict(counts), f"{counts['what/why/fix'] / len(table):.0%} what/why/fix")
    sys.exit(0)
