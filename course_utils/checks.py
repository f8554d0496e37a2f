"""The exercise-checker framework: run the learner's function on cases, explain what is wrong.

Used by every lesson's exercises. A lesson's checker (in the lesson's own module) builds a list of
``Case``s — inputs the learner has not seen, and the expected output computed by a reference or an
oracle — plus an optional ``diagnose`` that recognises a *known wrong* answer and names the
misconception ("your loss is K times too large: the division by K is missing"). ``run_check`` does
the rest.

Hints come in levels (``Hints``): a question first, then a pointer (which cell, which tool), and the
answer only at the last level, only when the learner asks for it with ``result.hint()``, and only after
two failed checks of that exercise. A
diagnosis exercise (``check_diagnosis``) asks the learner for a *function* that reads a broken
artefact and returns a ``Diagnosis(cause, evidence)``; the checker grades it on freshly generated
artefacts, so one memorised answer fails.

A checker never raises on a wrong answer: it prints why and returns a falsy ``CheckResult``, so an
exercise notebook survives Restart & Run All with unfinished exercises. Solution notebooks mark
their checker cells ``# NBVAL_CHECK_OUTPUT``, so a solution that stops passing fails the tests.

Reference answers live in ``course_utils/answers/``, which no lesson notebook imports: the
learner's copy never holds the answer (``tests/test_giveaway.py`` enforces it).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import validate
from .model import course_seed


@dataclass
class Case:
    """One call of the learner's function: ``fn(*args, **kwargs)`` should match ``expected``.

    ``tag`` names what the case probes ("all_masked", "crlf", …): a ``diagnose`` function reads
    the tag, never the human-readable ``label``, so renaming a label cannot break a diagnosis.
    """

    args: tuple
    expected: object
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    tag: str = ""


@dataclass(frozen=True)
class Hints:
    """Graded hints: ``question`` (makes the learner look), ``pointer`` (where to look: a cell, a
    tool), ``answer`` (shown only at the last level, only when asked). The question must not
    contain the answer's code."""

    question: str
    pointer: str
    answer: str

    def levels(self) -> tuple[str, str, str]:
        return (self.question, self.pointer, self.answer)


@dataclass(frozen=True)
class Diagnosis:
    """A learner's answer to a diagnosis exercise: the ``cause`` (one of the exercise's named
    causes) and its ``evidence`` (the step, the row, the token or the module that shows it)."""

    cause: str
    evidence: object = None


@dataclass
class CheckResult:
    """Truthy when every case passed; ``message`` is what the learner was told.

    ``hint()`` prints the next hint level each time it is called: question → pointer → answer.
    """

    name: str
    passed: bool
    message: str
    hints: Hints | None = None
    _level: int = 0

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult({self.name!r}, passed={self.passed})"

    def _ipython_display_(self) -> None:
        """Show nothing: the checker already printed its message (no duplicate ``Out[]``)."""

    def hint(self) -> str:
        """Print (and return) the next hint level. The answer level opens only after two failed checks
        of this exercise: a learner who has not tried twice gets the pointer again, not the answer."""
        if self.hints is None:
            text = "No hints for this exercise: read the checker's message above."
        else:
            levels = self.hints.levels()
            names = ("question", "pointer", "answer")
            i = min(self._level, len(levels) - 1)
            failed = failed_checks(self.name)
            if i == len(levels) - 1 and not self.passed and failed < ANSWER_AFTER_FAILURES:
                print(f"Hint {i}/{len(levels)} ({names[i - 1]}): {levels[i - 1]}\n"
                      f"The answer opens after {ANSWER_AFTER_FAILURES} failed checks of this exercise "
                      f"(so far: {failed}) — try once more with the pointer above, then ask again.")
                return levels[i - 1]
            self._level += 1
            more = " (call .hint() again for more)" if i < len(levels) - 1 else ""
            text = f"Hint {i + 1}/{len(levels)} ({names[i]}): {levels[i]}{more}"
        print(text)
        return text


# Failed checks per exercise in this kernel: the answer hint opens only after ANSWER_AFTER_FAILURES of them,
# because an answer read before trying teaches the answer, not the skill.
ANSWER_AFTER_FAILURES = 2
_FAILURES: dict[str, int] = {}


def failed_checks(name: str) -> int:
    """How many times the checker ``name`` has failed (not counting "not implemented yet") in this kernel."""
    validate.non_empty_string("name", name, why="failures are counted per exercise checker, by its name")
    return _FAILURES.get(name, 0)


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


def _as_hints(hint: str | Hints) -> Hints | None:
    return hint if isinstance(hint, Hints) else None


def _first_hint(hint: str | Hints) -> str:
    """What a wrong answer without a diagnosis is told: the question level, never the answer."""
    if isinstance(hint, Hints):
        return f"{hint.question} (more: call .hint() on the result)"
    return hint


def run_check(name: str, fn: Callable, cases: Sequence[Case], *,
              compare: Callable[[object, object], str | None] = close,
              diagnose: Callable[[object, Case], str | None] | None = None,
              hint: str | Hints = "", quiet: bool = False) -> CheckResult:
    """Call ``fn`` on every case; report the first failure with a targeted hint.

    ``diagnose(got, case)`` may return a sentence naming the misconception behind a wrong answer;
    ``hint`` (a ``Hints`` with levels, or a plain sentence) is the general advice shown when no
    diagnosis matches — its first level only.
    """
    if not callable(fn):
        raise ValueError(f"{name}: expected your function, got {type(fn).__name__} — the checker calls "
                         "it on its own inputs — pass the function itself, without calling it.")
    if isinstance(cases, (str, bytes)) or not isinstance(cases, Sequence) or not cases:
        raise ValueError(f"{name}: no cases to check ({cases!r:.60}) — a checker that runs nothing would "
                         "pass any function — give it at least one Case (for a diagnosis checker: seeds).")
    hints = _as_hints(hint)
    for i, case in enumerate(cases, 1):
        where = f"case {i}/{len(cases)}" + (f" ({case.label})" if case.label else "")
        try:
            got = fn(*case.args, **case.kwargs)
        except NotImplementedError:
            return _report(name, False, "⏳ not implemented yet: replace the `raise NotImplementedError` "
                           "with your code, then run this cell again.", quiet, hints)
        except Exception as exc:  # the learner's bug: show it, not our traceback
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return _report(name, False, f"❌ {where}: your function raised {last}\nHint: {_first_hint(hint)}",
                           quiet, hints)
        diff = compare(got, case.expected)
        if diff:
            reason = (diagnose(got, case) if diagnose else None) or _first_hint(hint)
            return _report(name, False, f"❌ {where}: {diff}\nHint: {reason}", quiet, hints)
    return _report(name, True, f"✅ {name}: all {len(cases)} cases pass.", quiet, hints)


def fresh_seeds(n: int) -> list[int]:
    """``n`` consecutive seeds for a diagnosis checker, offset by the course seed: every ``COURSE_SEED``
    grades other cases, and consecutive seeds walk through every cause of a generator that picks
    ``cause = CAUSES[seed % len(CAUSES)]``."""
    validate.positive_int("n", n, why="it is how many fresh cases the checker draws")
    base = 1000 * (course_seed() + 1)
    return list(range(base, base + n))


def check_diagnosis(name: str, fn: Callable, make_case: Callable[[int], tuple[object, Diagnosis]], *,
                    seeds: Sequence[int], evidence_ok: Callable[[object, Diagnosis], bool] | None = None,
                    misconceptions: dict[tuple[str, str], str] | None = None,
                    hint: str | Hints = "", quiet: bool = False) -> CheckResult:
    """Grade a diagnosis function on freshly generated broken artefacts.

    ``make_case(seed)`` returns ``(artefact, truth)``; the learner's ``fn(artefact)`` must return a
    ``Diagnosis`` whose ``cause`` equals ``truth.cause`` and whose ``evidence`` passes
    ``evidence_ok(got_evidence, truth)`` (default: equal to ``truth.evidence``). ``seeds`` should
    cover every cause of the generator, so the learner's logic, not a memorised answer, is graded.
    ``misconceptions[(given, true)]`` names the look-alike a wrong cause confuses.
    """
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"{name}: seeds={seeds!r:.60} must be a non-empty list of ints — each seed draws "
                         "one fresh case, and no case would pass any answer — leave seeds out (the checker's "
                         "default) or pass e.g. seeds=[1, 2, 3].")
    if not callable(fn):  # run_check sees the wrapper below, not the learner's function
        raise ValueError(f"{name}: expected your function, got {type(fn).__name__} — the checker calls "
                         "it on fresh cases — pass the function itself, without calling it.")
    evidence_ok = evidence_ok or (lambda got, truth: got == truth.evidence)
    cases = [Case((seed,), None, label=f"fresh case, seed {seed}") for seed in seeds]

    def run_one(seed):
        artefact, truth = make_case(seed)
        return fn(artefact), truth

    def compare(got, _expected):
        answer, truth = got
        if not isinstance(answer, Diagnosis):
            return (f"expected a Diagnosis(cause=..., evidence=...), got {type(answer).__name__} — "
                    "return Diagnosis(cause, evidence)")
        if answer.cause != truth.cause:
            known = (misconceptions or {}).get((answer.cause, truth.cause))
            return f"cause {answer.cause!r} is not what broke this run" + (f": {known}" if known else "")
        if not evidence_ok(answer.evidence, truth):
            return f"right cause ({truth.cause!r}), but the evidence {answer.evidence!r} does not show it"
        return None

    return run_check(name, run_one, cases, compare=compare, hint=hint, quiet=quiet)


def _report(name: str, passed: bool, message: str, quiet: bool, hints: Hints | None = None) -> CheckResult:
    if not passed and not message.startswith("⏳"):  # an unfinished stub is not a try
        _FAILURES[name] = _FAILURES.get(name, 0) + 1
    if not quiet:
        print(message)
    return CheckResult(name, passed, message, hints)
