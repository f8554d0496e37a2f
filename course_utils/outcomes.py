"""Outcome claims: a measured value against a threshold, with its margin, collected for the record.

A lesson makes two kinds of claim (README, "What holds where"):

- *exact* claims hold by construction on any model (a gradient ratio of K, zero gradients from an
  all-ignored cross-entropy); the notebook asserts them directly, tightly;
- *outcome* claims are what a trained model does (it stops, it diverges, the clip fires). Their
  threshold comes from the run's own measurements, and how far the value clears it — the margin —
  is what tells a robust claim from a lucky one. Such a claim goes through ``report_outcome``::

      ok = report_outcome("stop rate after the fix", stop_rate, 0.9)
      assert ok, "with <|im_end|> graded, the model stops"

``report_outcome`` is silent when the claim holds — the learner reads the lesson's measurement, not proof
chatter from a collapsed cell — and prints one line (value, threshold, margin) when it fails, or always with
``verbose=True`` or ``$COURSE_OUTCOMES_VERBOSE=1`` (for an instructor). When ``$COURSE_OUTCOMES`` names a
file it appends the claim to it as one JSON line; ``python -m tools.robustness`` sets that
variable for every notebook × configuration and builds ROBUSTNESS.md from the lines.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .model import course_model_name, course_seed


@dataclass(frozen=True)
class Outcome:
    """One checked outcome claim; true when the value clears its threshold (``margin >= 0``)."""

    name: str
    value: float
    threshold: float
    higher_is_better: bool
    margin: float  # value - threshold when higher is better, else threshold - value

    def __bool__(self) -> bool:
        return self.margin >= 0

    def __str__(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        verdict = "holds" if self else "FAILS"
        return (f"outcome {self.name!r}: {self.value:.4g} {sign} {self.threshold:.4g} "
                f"(margin {self.margin:+.4g}) {verdict}")


def _number(argument: str, value) -> float:
    try:  # a Python/numpy number or a one-element tensor; bools are facts, not measurements
        number = None if isinstance(value, (bool, str)) else float(value)
    except (TypeError, ValueError, RuntimeError):
        number = None
    if number is None:
        raise ValueError(
            f"{argument}={value!r} is not a number — an outcome claim compares one measurement with a "
            "threshold; a yes/no fact is an exact claim — pass a float (e.g. a rate), or assert the "
            "fact directly."
        )
    return number


def _context(lesson: str | None) -> dict:
    """Who made the claim: lesson, model, seed and thread count, for the robustness table."""
    try:
        import torch

        threads = torch.get_num_threads()
    except ImportError:  # pragma: no cover - torch is a dependency; keep the record anyway
        threads = os.environ.get("OMP_NUM_THREADS")
    lesson = lesson or os.environ.get("COURSE_NOTEBOOK") or os.environ.get("JPY_SESSION_NAME")
    return {"lesson": Path(lesson).name if lesson else None, "model": course_model_name(),
            "seed": course_seed(), "threads": threads}


def report_outcome(name: str, value, threshold, *, higher_is_better: bool = True,
                   lesson: str | None = None, verbose: bool | None = None) -> Outcome:
    """Check ``value`` against ``threshold``; return an ``Outcome`` that is true when it holds.

    ``higher_is_better=True`` means the claim is ``value >= threshold`` (a stop rate), False means
    ``value <= threshold`` (a loss, a clip rate after a fix). ``lesson`` names the notebook
    (default: ``$COURSE_NOTEBOOK``, which the robustness runner sets). Prints the claim with its
    margin when it fails (``verbose=None``, the default), always (``verbose=True``, or
    ``$COURSE_OUTCOMES_VERBOSE=1``) or never (``verbose=False``); appends it as a JSON line to
    ``$COURSE_OUTCOMES`` when set. A NaN or infinite value raises ``ValueError`` after its record (a failed
    claim) is appended: NaN compares false with any threshold and inf clears every one, so neither is a
    measurement the claim can be judged on.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"name={name!r} is not a non-empty string — it labels the claim in the robustness "
            "table — pass a short description such as 'stop rate after the fix'."
        )
    if verbose is not None and not isinstance(verbose, bool):
        raise ValueError(f"verbose={verbose!r} is not None/True/False — it says when the claim is printed — "
                         "leave it out (printed only when it fails), or pass True (always) or False (never).")
    if not isinstance(higher_is_better, bool):
        raise ValueError(
            f"higher_is_better={higher_is_better!r} is not True/False — it says which side of the "
            "threshold passes — pass True for 'value >= threshold', False for 'value <= threshold'."
        )
    value = _number("value", value)
    threshold = _number("threshold", threshold)
    if not math.isfinite(threshold):
        raise ValueError(f"threshold={threshold!r} is not finite — a threshold must be a number the value "
                         "can be compared with — derive it from a finite measurement of the run.")
    margin = value - threshold if higher_is_better else threshold - value
    outcome = Outcome(name, value, threshold, higher_is_better, margin)
    finite = math.isfinite(value)
    if verbose is None:  # the learner's view: a claim that holds says nothing; one that fails says why
        verbose = not outcome or os.environ.get("COURSE_OUTCOMES_VERBOSE", "") not in ("", "0")
    if verbose:
        print(outcome)
    path = os.environ.get("COURSE_OUTCOMES")
    if path:
        record = {**_context(lesson), "name": name, "value": value, "threshold": threshold,
                  "higher_is_better": higher_is_better, "margin": margin, "passed": bool(outcome) and finite}
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(record, allow_nan=True) + "\n")
    if not finite:
        raise ValueError(f"value={value!r} for the claim {name!r} is not finite — NaN compares false with "
                         "any threshold and inf clears every one, so the claim cannot be judged (recorded as "
                         "failed) — find the step where the measurement stopped being finite (a NaN loss: "
                         "lesson 06) and measure again.")
    return outcome


RECORD_KEYS = ("name", "value", "threshold", "higher_is_better", "margin", "passed")  # one claim's line


def read_outcomes(path) -> list[dict]:
    """The claims ``report_outcome`` appended to ``path`` (one JSON object per line; [] if absent). A
    directory, or a line that is not such a claim, is refused naming it: the table would miss it."""
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise TypeError(f"path={path!r} must be a file path — the claims are read from that file — pass the "
                        "COURSE_OUTCOMES path the robustness runner set.")
    path = Path(path)
    if not path.exists():
        return []
    if not path.is_file():
        raise ValueError(f"path={str(path)!r} is a directory, not a file — report_outcome appends the claims "
                         "to one JSON Lines file — pass that file (the COURSE_OUTCOMES path).")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not set(RECORD_KEYS) <= set(record):
            raise ValueError(f"{path}: line {number} is not a claim report_outcome wrote ({line[:60]!r}) — "
                             f"each line is one JSON object with {list(RECORD_KEYS)} — pass the "
                             "COURSE_OUTCOMES file, not another JSON file.")
        records.append(record)
    return records
