"""The exercise-checker framework: run the learner's function on cases, explain what is wrong.

A lesson's checker (in the lesson's own module) builds a list of ``Case``s — inputs the learner
has not seen, and the expected output computed by a reference or an oracle — plus an optional
``diagnose`` function that recognises a *known wrong* answer and names the misconception
("your loss is K times too large: the division by K is missing"). ``run_check`` does the rest.

A checker never raises on a wrong answer: it prints why and returns a falsy ``CheckResult``, so an
exercise notebook survives Restart & Run All with unfinished exercises. Solution notebooks mark
their checker cells ``# NBVAL_CHECK_OUTPUT``, so a solution that stops passing fails the tests.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Case:
    """One call of the learner's function: ``fn(*args, **kwargs)`` should match ``expected``."""

    args: tuple
    expected: object
    kwargs: dict = field(default_factory=dict)
    label: str = ""


@dataclass
class CheckResult:
    """Truthy when every case passed; ``message`` is what the learner was told."""

    name: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult({self.name!r}, passed={self.passed})"

    def _ipython_display_(self) -> None:
        """Show nothing: the checker already printed its message (no duplicate ``Out[]``)."""


def close(got, expected, rtol: float = 1e-4, atol: float = 1e-6) -> str | None:
    """``None`` when ``got`` matches ``expected`` (numbers within tolerance, tensors elementwise,
    sequences and dicts recursively), else a short description of the first difference."""
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a torch.Tensor, got {type(got).__name__}"
        if got.shape != expected.shape:
            return f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
        if expected.is_floating_point():
            ok = torch.allclose(got.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True)
            gap = float((got.double() - expected.double()).abs().max())
            return None if ok else f"max difference {gap:.3g}"
        return None if torch.equal(got, expected) else "tensor values differ"
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return None if got == expected else f"expected {expected!r}, got {got!r}"
    if isinstance(expected, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"expected a number, got {type(got).__name__}"
        if math.isnan(expected) and math.isnan(got):
            return None
        if math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return None
        return f"expected {expected:.6g}, got {got:.6g}"
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            return f"expected a dict with keys {sorted(expected)}, got {got!r:.200}"
        for k in expected:
            diff = close(got[k], expected[k], rtol, atol)
            if diff:
                return f"[{k!r}]: {diff}"
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"expected a sequence of length {len(expected)}, got {got!r:.200}"
        for i, (g, e) in enumerate(zip(got, expected)):
            diff = close(g, e, rtol, atol)
            if diff:
                return f"[{i}]: {diff}"
        return None
    return None if got == expected else f"expected {expected!r}, got {got!r}"


def run_check(name: str, fn: Callable, cases: Sequence[Case], *,
              compare: Callable[[object, object], str | None] = close,
              diagnose: Callable[[object, Case], str | None] | None = None,
              hint: str = "", quiet: bool = False) -> CheckResult:
    """Call ``fn`` on every case; report the first failure with a targeted hint.

    ``diagnose(got, case)`` may return a sentence naming the misconception behind a wrong answer;
    ``hint`` is the general advice shown when no diagnosis matches.
    """
    if not callable(fn):
        raise ValueError(f"{name}: expected your function, got {type(fn).__name__} — the checker calls "
                         "it on its own inputs — pass the function itself, without calling it.")
    for i, case in enumerate(cases, 1):
        where = f"case {i}/{len(cases)}" + (f" ({case.label})" if case.label else "")
        try:
            got = fn(*case.args, **case.kwargs)
        except NotImplementedError:
            return _report(name, False, "⏳ not implemented yet: replace the `raise NotImplementedError` "
                           "with your code, then run this cell again.", quiet)
        except Exception as exc:  # the learner's bug: show it, not our traceback
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return _report(name, False, f"❌ {where}: your function raised {last}\nHint: {hint}", quiet)
        diff = compare(got, case.expected)
        if diff:
            reason = (diagnose(got, case) if diagnose else None) or hint
            return _report(name, False, f"❌ {where}: {diff}\nHint: {reason}", quiet)
    return _report(name, True, f"✅ {name}: all {len(cases)} cases pass.", quiet)


def _report(name: str, passed: bool, message: str, quiet: bool) -> CheckResult:
    if not quiet:
        print(message)
    return CheckResult(name, passed, message)
