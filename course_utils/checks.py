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

What a learner's function can reach while it runs is kept free of the answer (issue 43): the checkers grade
in a second process (``grader_process``), forked before any seed or case exists — it draws the cases (fresh
on every run: ``os.urandom`` via ``random.SystemRandom``; an instructor may set ``COURSE_CHECK_SEED`` for a
reproducible demo, and every run still mixes causes), keeps their truths, and this process sees only what
the learner's function is called with; no keyword fixes or narrows the cases. Answers are normalised to
plain built-in values (tensors, and stand-ins for anything else) before a plain ``==`` in the grader, so an
object whose ``__eq__`` always says yes fails, and so does one whose fields are computed when read; and the
returned ``CheckResult`` holds no hint text — ``hint()`` reads it from a private registry. Where fork is
missing (not Linux), and for a ready list of cases, the grading runs here with the truths sealed
(``pickle`` bytes, not objects): out of the frames the answer walks, not out of a determined learner's reach.
``tests/test_grader_process.py`` tries the shortcuts; no grader stops a learner who rewrites the checker.

A checker never raises on a wrong answer: it prints why and returns a falsy ``CheckResult``, so an
exercise notebook survives Restart & Run All with unfinished exercises. Solution notebooks mark
their checker cells ``# NBVAL_CHECK_OUTPUT``, so a solution that stops passing fails the tests.

Reference answers live in ``course_utils/answers/``, which no lesson notebook imports: the
learner's copy never holds the answer (``tests/test_giveaway.py`` enforces it).
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import grader_process, validate


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


class _Shown(str):
    """A hint's text, returned for code to use; Jupyter shows it once (the print), not again as ``Out[]``."""

    def _ipython_display_(self) -> None:
        pass


@dataclass
class CheckResult:
    """Truthy when every case passed; ``message`` is what the learner was told.

    ``hint()`` prints the next hint level each time it is called: question → pointer → answer. The hints
    are not stored on the result (``vars(result)`` holds no answer): ``hint()`` fetches them by name.
    """

    name: str
    passed: bool
    message: str
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
        hints = _HINTS.get(self.name)
        if hints is None:
            text = "No hints for this exercise: read the checker's message above."
        else:
            levels = hints.levels()
            names = ("question", "pointer", "answer")
            i = min(self._level, len(levels) - 1)
            failed = failed_checks(self.name)
            if i == len(levels) - 1 and not self.passed and failed < ANSWER_AFTER_FAILURES:
                text = (f"Hint {i}/{len(levels)} ({names[i - 1]}): {levels[i - 1]}\n"
                        f"The answer opens after {ANSWER_AFTER_FAILURES} failed checks of this exercise "
                        f"(so far: {failed}) — try once more with the pointer above, then ask again.")
                print(text)
                return _Shown(levels[i - 1])
            self._level += 1
            more = " (call .hint() again for more)" if i < len(levels) - 1 else ""
            text = f"Hint {i + 1}/{len(levels)} ({names[i]}): {levels[i]}{more}"
        print(text)
        return _Shown(text)


# Each checker's hints, by checker name: kept here, not on the CheckResult a learner holds.
_HINTS: dict[str, Hints] = {}


def register_hints(name: str, hints: Hints) -> None:
    """Keep ``hints`` for the checker ``name``: ``CheckResult.hint()`` reads them from here, so the result a
    learner holds carries no hint text (``run_check`` and ``check_diagnosis`` call this themselves)."""
    validate.non_empty_string("name", name, why="hints are looked up by the checker's name")
    if not isinstance(hints, Hints):
        raise ValueError(f"hints is a {type(hints).__name__}, not a Hints — hint() shows its levels — pass "
                         "Hints(question, pointer, answer).")
    _HINTS[name] = hints


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

    # a NaN tolerance passes nothing, an infinite one everything, a negative one is torch's ValueError
    validate.number("rtol", rtol, minimum=0, why="it is the relative tolerance of a numeric match",
                    example=1e-4)
    validate.number("atol", atol, minimum=0, why="it is the absolute tolerance of a numeric match",
                    example=1e-6)
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
        try:
            got = plain(got)  # a plain value: an object whose __eq__ always says yes does not pass
        except NotPlain as exc:
            return str(exc)
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
    try:
        got = plain(got)
    except NotPlain as exc:
        return str(exc)
    return None if got == expected else f"expected {expected!r}, got {got!r}"


class NotPlain(ValueError):
    """An answer the checker cannot turn into plain built-in values (see ``plain``)."""


def plain(value, _depth: int = 0):
    """``value`` as plain built-in values (str, int, float, bool, None, and tuples, lists, frozensets and
    dicts of them), so that ``==`` is Python's own and an object whose ``__eq__`` always says yes cannot
    pass. A one-element tensor or numpy scalar becomes its number (``.item()``); anything else raises
    ``NotPlain`` naming what was given."""
    if _depth > 20:
        raise NotPlain("the answer nests more than 20 levels deep")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # the base method: a subclass's own __eq__ and __str__ are dropped
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, (list, tuple)):
        items = [plain(v, _depth + 1) for v in list.__iter__(value)] if isinstance(value, list) else \
            [plain(v, _depth + 1) for v in tuple.__iter__(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, (set, frozenset)):
        return frozenset(plain(v, _depth + 1) for v in value)
    if isinstance(value, dict):
        return {plain(k, _depth + 1): plain(v, _depth + 1) for k, v in dict.items(value)}
    item = getattr(type(value), "item", None)  # torch / numpy scalars (the type's method, not an attribute)
    if callable(item) and getattr(value, "ndim", None) in (0, 1) and getattr(value, "size", None) is not None:
        try:
            return plain(value.item(), _depth + 1)
        except (ValueError, RuntimeError, TypeError):
            pass
    raise NotPlain(f"a {type(value).__name__} is not a plain value: return a str, a number, None, or a "
                   "list/tuple/dict of them")


def _seal(value) -> bytes | object:
    """``value`` serialised: while the learner's function runs, the expected value exists as bytes only, so no
    frame it walks to and no object ``gc`` lists holds it. Values pickle cannot take stay as they are."""
    try:
        return _Sealed(pickle.dumps(value))
    except Exception:  # noqa: BLE001 — an expected value pickle refuses is kept as is, the check still works
        return value


class _Sealed(bytes):
    """A serialised expected value (``_seal``); ``_open`` turns it back."""

    __slots__ = ()


def _open(value):
    return pickle.loads(value) if isinstance(value, _Sealed) else value


def _first_hint(hint: str | Hints) -> str:
    """What a wrong answer without a diagnosis is told: the question level, never the answer."""
    if isinstance(hint, Hints):
        return f"{hint.question} (more: call .hint() on the result)"
    return hint


NOT_IMPLEMENTED = ("⏳ not implemented yet: replace the `raise NotImplementedError` with your code, then run "
                   "this cell again.")


def _graded(name: str, grader, call, quiet: bool) -> CheckResult:
    """The verdict of ``grader`` (``grader_process.start``) with the learner's side run by ``call``."""
    try:
        passed, message = grader.serve(call)
    except grader_process.GraderStopped as stopped:
        return _report(name, False, f"⚠️ {name}: the checker's grading process stopped: {stopped}. That is "
                       "the checker's failure, not your answer's: run the cell again (restart the kernel if "
                       "it repeats).", quiet)
    return _report(name, passed, message, quiet)


def run_check(name: str, fn: Callable, cases: Sequence[Case] | Callable[[], Sequence[Case]], *,
              compare: Callable[[object, object], str | None] = close,
              diagnose: Callable[[object, Case], str | None] | None = None,
              hint: str | Hints = "", quiet: bool = False,
              out_of_reach: Sequence[Callable] = (), answer_types: tuple = ()) -> CheckResult:
    """Call ``fn`` on every case; report the first failure with a targeted hint.

    ``cases``: a function of no arguments that builds them (the checkers' way): it runs in a second process
    forked before it (``grader_process``), which keeps the expected values, sends this process only each
    case's arguments, receives ``fn``'s answer as plain values, tensors and stand-ins (plus the classes in
    ``answer_types``, e.g. ``(LoraConfig,)``), and compares — no frame ``fn`` can walk to and no object
    ``gc`` lists here holds an expected value. A ready list of ``Case``s is graded in this process instead,
    sealed (``_seal``), for cases that hide nothing (expected ``None``, graded by ``compare`` on disk).

    ``out_of_reach``: the course helpers that are this exercise's finished answer (and its reference in
    ``answers/``); an answer that calls one fails with a message saying why (``grader_process.call_answer``).
    ``diagnose(got, case)`` may return a sentence naming the misconception behind a wrong answer;
    ``hint`` (a ``Hints`` with levels, or a plain sentence) is the general advice shown when no
    diagnosis matches — its first level only.
    """
    _check_checker_args(name, hint, quiet, out_of_reach)
    validate.function("compare", compare)
    if diagnose is not None:
        validate.function("diagnose", diagnose)
    if not callable(fn):
        raise ValueError(f"{name}: expected your function, got {type(fn).__name__} — the checker calls "
                         "it on its own inputs — pass the function itself, without calling it.")
    factory = callable(cases) and not isinstance(cases, Sequence)
    if not factory:
        _check_cases(name, cases)
    if isinstance(hint, Hints):
        register_hints(name, hint)
    grader = grader_process.start(functools.partial(_check_program, name, cases, compare, diagnose, hint),
                                  answer_types, same_process=not factory)
    del cases, compare, diagnose  # this process keeps nothing that holds or builds an expected value
    return _graded(name, grader,
                   lambda args, kwargs: grader_process.call_answer(fn, args, kwargs, out_of_reach), quiet)


def _check_cases(name: str, cases) -> list[Case]:
    if isinstance(cases, (str, bytes)) or not isinstance(cases, Sequence) or not cases or not all(
            isinstance(c, Case) for c in cases):
        raise ValueError(f"{name}: no cases to check ({cases!r:.60}) — a checker that runs nothing would "
                         "pass any function — give it at least one Case, or a function that builds them.")
    return list(cases)


def _check_program(name, cases, compare, diagnose, hint):
    """``run_check``'s grading (a ``grader_process`` program): builds the cases, yields each one's arguments,
    compares each answer with its expected value; the first wrong case ends it."""
    if callable(cases) and not isinstance(cases, Sequence):
        cases = cases()
    # the expected values as bytes only while an answer is awaited (what is left of them in this process)
    cases = [Case(c.args, _seal(c.expected), c.kwargs, c.label, c.tag) for c in _check_cases(name, cases)]
    total = len(cases)
    for i in range(1, total + 1):
        case = cases[i - 1]
        where = f"case {i}/{total}" + (f" ({case.label})" if case.label else "")
        kind, got = yield case.args, case.kwargs
        del case
        if kind == "not_implemented":
            return False, NOT_IMPLEMENTED
        if kind == "used":
            return False, f"❌ {where}: {got}"
        if kind == "raised":
            return False, f"❌ {where}: your function raised {got}\nHint: {_first_hint(hint)}"
        case = cases[i - 1]
        opened = Case(case.args, _open(case.expected), case.kwargs, case.label, case.tag)
        diff = compare(got, opened.expected)
        if diff:
            reason = (diagnose(got, opened) if diagnose else None) or _first_hint(hint)
            return False, f"❌ {where}: {diff}\nHint: {reason}"
        del opened, got
    return True, f"✅ {name}: all {total} cases pass."


# An instructor's reproducible demo: with COURSE_CHECK_SEED set, every checker run draws the same cases.
CHECK_SEED_ENV = "COURSE_CHECK_SEED"


def fresh_random() -> random.Random:
    """The source of a checker run's cases: the operating system's randomness (a fresh draw each run, so a
    memo of earlier runs' messages is useless), or ``COURSE_CHECK_SEED``'s stream for a demo."""
    seed = os.environ.get(CHECK_SEED_ENV)
    if seed is None or not seed.strip():
        return random.SystemRandom()
    if not seed.strip().isdigit():
        raise ValueError(f"{CHECK_SEED_ENV}={seed!r} must be a non-negative integer — it seeds the checkers' "
                         f"cases for a reproducible demo — set e.g. {CHECK_SEED_ENV}=7, or unset it.")
    return random.Random(f"course-check-{int(seed)}")


def fresh_seeds(n: int) -> list[int]:
    """``n`` consecutive seeds from a base drawn fresh for this run (``fresh_random``), a multiple of
    2520 (divisible by 1…10), so consecutive seeds walk through the causes in their listed order for a
    generator that picks ``cause = CAUSES[seed % len(CAUSES)]`` (``n`` a multiple of the number of causes:
    each cause equally often): every run mixes causes and a constant answer fails, whatever the draw.
    ``check_diagnosis`` calls the learner's function on them in a shuffled order."""
    validate.positive_int("n", n, why="it is how many fresh cases the checker draws")
    base = 2520 * fresh_random().randrange(400, 800_000)
    return list(range(base, base + n))


# How telling a wrong case is, most telling first: the report names the most telling one, so a learner meets
# the misconception behind the answer (a wrong cause the exercise knows as a look-alike) before a near-miss.
_BROKEN, _KNOWN_LOOK_ALIKE, _WRONG_CAUSE, _WRONG_EVIDENCE = range(4)


def _plain_answer(answer) -> tuple[str, object] | tuple[int, str]:
    """``(cause, evidence)`` of the learner's ``Diagnosis`` as plain values (``plain``), or ``(_BROKEN,
    why)``. Read before any truth is opened: a ``Diagnosis`` subclass whose fields are computed when read
    finds no truth in the frames above it."""
    if not isinstance(answer, Diagnosis):
        return _BROKEN, (f"expected a Diagnosis(cause=..., evidence=...), got {type(answer).__name__} — "
                         "return Diagnosis(cause, evidence)")
    try:
        cause, evidence = plain(answer.cause), plain(answer.evidence)
    except NotPlain as exc:
        return _BROKEN, f"{exc} (cause: one of the exercise's names; evidence: a number, a str, a list)"
    except Exception as exc:  # noqa: BLE001 — a field that raises when read is the learner's bug
        return _BROKEN, f"reading your Diagnosis raised {type(exc).__name__}: {exc}"
    if type(cause) is not str:
        return _BROKEN, f"the cause must be one of the exercise's names (a str), got {cause!r:.80}"
    return cause, evidence


def _grade(answer: tuple, truth: Diagnosis, evidence_ok, misconceptions) -> tuple[int, str] | None:
    """What is wrong with ``answer`` (``_plain_answer``'s result) against ``truth`` (how telling, and the
    sentence), or None. Only Python's own ``==`` compares plain values."""
    if type(answer[0]) is int:
        return answer  # broken: (_BROKEN, why)
    cause, evidence = answer
    if cause != truth.cause:
        known = (misconceptions or {}).get((cause, truth.cause))
        if known:
            return _KNOWN_LOOK_ALIKE, f"cause {cause!r} is not what broke this run: {known}"
        return _WRONG_CAUSE, f"cause {cause!r} is not what broke this run"
    if not evidence_ok(evidence, truth):
        shown = f"{evidence!r:.120}"
        return _WRONG_EVIDENCE, f"right cause ({truth.cause!r}), but the evidence {shown} does not show it"
    return None


def check_diagnosis(name: str, fn: Callable, make_case: Callable[[int], tuple[object, Diagnosis]], *,
                    seeds: int | Callable[[], Sequence[int]],
                    evidence_ok: Callable[[object, Diagnosis], bool] | None = None,
                    misconceptions: dict[tuple[str, str], str] | None = None,
                    hint: str | Hints = "", quiet: bool = False,
                    out_of_reach: Sequence[Callable] = ()) -> CheckResult:
    """Grade a diagnosis function on freshly generated broken artefacts (``out_of_reach``: as in
    ``run_check``).

    ``make_case(seed)`` returns ``(artefact, truth)``; the learner's ``fn(artefact)`` must return a
    ``Diagnosis`` whose ``cause`` equals ``truth.cause`` and whose ``evidence`` passes
    ``evidence_ok(got_evidence, truth)`` (default: equal to ``truth.evidence``; the evidence it is given is
    already plain, see ``plain``). ``seeds``: how many (``fresh_seeds(seeds)``), or a function of no arguments
    that draws them (e.g. ``lambda: fresh_seeds(12)``); they must cover more than one cause, so the learner's
    logic, not a memorised answer, is graded.

    The seeds are drawn, the cases made and graded in a second process forked before any of them exists
    (``grader_process``): this process receives each artefact and sends back ``fn``'s answer as plain values
    (``_plain_answer``), so no frame ``fn`` walks to and no object ``gc`` lists here holds a seed, a truth or
    what made them. ``fn`` answers every case, in a shuffled order (its n-th call says nothing about the n-th
    cause); the report names the most telling wrong case (a crash, then a known look-alike, then a wrong
    cause, then wrong evidence; ties in the order of the seeds), so a wrong answer is told the same
    misconception whatever the draw and the shuffle. ``misconceptions[(given, true)]`` names the look-alike
    a wrong cause confuses.
    """
    _check_checker_args(name, hint, quiet, out_of_reach)
    validate.function("make_case", make_case)
    if evidence_ok is not None:
        validate.function("evidence_ok", evidence_ok)
    if misconceptions is not None and not isinstance(misconceptions, dict):
        raise TypeError(f"{name}: misconceptions={misconceptions!r:.60} must be a dict {{(given, true): "
                        "sentence}} — the report looks a wrong cause up in it — pass a dict, or None.")
    if isinstance(seeds, bool) or not (isinstance(seeds, int) or (callable(seeds) and not isinstance(
            seeds, Sequence))):
        raise ValueError(f"{name}: seeds={seeds!r:.60} must be a count or a function that draws them — the "
                         "seeds are drawn in the grading process, where the answer cannot read them and draw "
                         "the truths again — pass seeds=12, or seeds=lambda: fresh_seeds(12).")
    if isinstance(seeds, int) and seeds < 2:
        raise ValueError(f"{name}: seeds={seeds} draws one case or none — a pass needs cases of two or more "
                         "causes, so no answer could ever pass — pass at least the number of causes "
                         "(e.g. 3 * len(CAUSES)).")
    if not callable(fn):
        raise ValueError(f"{name}: expected your function, got {type(fn).__name__} — the checker calls "
                         "it on fresh cases — pass the function itself, without calling it.")
    if isinstance(hint, Hints):
        register_hints(name, hint)
    grader = grader_process.start(functools.partial(_diagnosis_program, name, make_case, seeds,
                                                    evidence_ok or _same_evidence, misconceptions, hint))
    del make_case, seeds, evidence_ok, misconceptions  # nothing here can draw a case again
    return _graded(name, grader, lambda args, kwargs: grader_process.call_answer(
        fn, args, kwargs, out_of_reach, prepare=_plain_answer), quiet)


def _same_evidence(got, truth: Diagnosis) -> bool:
    return got == plain(truth.evidence)


def _drawn_seeds(name: str, seeds) -> list[int]:
    drawn = fresh_seeds(seeds) if isinstance(seeds, int) else seeds()
    if isinstance(drawn, (str, bytes)) or not isinstance(drawn, Sequence) or not drawn or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in drawn):
        raise ValueError(f"{name}: seeds() drew {drawn!r:.60}, not a non-empty list of ints — each seed "
                         "draws one fresh case, and no case would pass any answer — return e.g. "
                         "fresh_seeds(n).")
    if len(drawn) < 2:
        raise ValueError(f"{name}: seeds() drew {list(drawn)}: it draws one case — a pass needs cases of two "
                         "or more causes, so no answer could ever pass — draw at least the number of causes "
                         "(e.g. fresh_seeds(3 * len(CAUSES))).")
    return list(drawn)


def _diagnosis_program(name, make_case, seeds, evidence_ok, misconceptions, hint):
    """``check_diagnosis``'s grading (a ``grader_process`` program): draws the seeds, yields each artefact in
    a shuffled order, grades each answer (plain values) against its truth, returns the report."""
    drawn = _drawn_seeds(name, seeds)
    total = len(drawn)
    order = list(range(total))
    fresh_random().shuffle(order)
    verdicts: dict[int, tuple[int, str]] = {}  # case index -> (how telling, what was wrong): wrong cases only
    causes: set[str] = set()  # the causes graded so far: a pass needs two or more
    for i in order:
        artefact, sealed = _drawn(make_case, drawn[i])
        kind, answer = yield (artefact,), {}
        del artefact
        if kind == "not_implemented":
            return False, NOT_IMPLEMENTED
        if kind != "returned":
            verdicts[i] = _BROKEN, (f"your function raised {answer}" if kind == "raised" else answer)
            continue
        truth = _open(sealed)
        causes.add(truth.cause)
        wrong = _grade(_received(answer), truth, evidence_ok, misconceptions)
        del answer, truth  # the learner's answer and the truth, gone before the next call
        if wrong:
            verdicts[i] = wrong
    if not verdicts and len(causes) < 2:  # a narrowed draw (a patched seed source): a constant would pass
        return False, (f"❌ {name}: every case drawn had the same cause, so this run proves nothing — the "
                       "checker's cases were narrowed; run it again as the lesson gives it.")
    if not verdicts:
        return True, f"✅ {name}: all {total} cases pass."
    first = min(verdicts, key=lambda i: (verdicts[i][0], i))
    return False, (f"❌ case {first + 1}/{total} (a fresh case; {len(verdicts)} of {total} wrong): "
                   f"{verdicts[first][1]}\nHint: {_first_hint(hint)}")


def _received(answer) -> tuple:
    """``_plain_answer``'s result as it arrived in the grader, checked again: plain values, a str cause."""
    try:
        answer = plain(answer)
    except NotPlain as exc:
        return _BROKEN, str(exc)
    if not (type(answer) is tuple and len(answer) == 2 and type(answer[0]) in (str, int)):
        return _BROKEN, "the answer did not arrive as a Diagnosis(cause, evidence)"
    return answer


def _drawn(make_case, seed):
    """The artefact, and its truth sealed: returns before the learner's function is called, so the truth
    is no local of any frame that function can walk to."""
    drawn = make_case(seed)
    if not (isinstance(drawn, tuple) and len(drawn) == 2 and isinstance(drawn[1], Diagnosis)):
        raise ValueError(f"make_case({seed}) returned {type(drawn).__name__}, not (artefact, Diagnosis) — "
                         "the checker hands the artefact to the answer and grades it against the truth — "
                         "return (artefact, Diagnosis(cause, evidence)).")
    artefact, truth = drawn
    return artefact, _seal(truth)


def _check_checker_args(name, hint, quiet, out_of_reach) -> None:
    """What ``run_check`` and ``check_diagnosis`` share: a name to report and count failures under, a hint
    (a sentence or ``Hints``), the quiet switch and the helpers out of reach."""
    validate.non_empty_string("name", name, why="the report and the failure count use it")
    if not isinstance(hint, (str, Hints)):
        raise TypeError(f"hint={hint!r:.60} is a {type(hint).__name__} — a failed check shows it as advice — "
                        "pass a sentence, or Hints(question, pointer, answer).")
    validate.flag("quiet", quiet, why="it switches the printed report off")
    if isinstance(out_of_reach, (str, bytes)) or not isinstance(out_of_reach, (list, tuple)) or not all(
            callable(f) for f in out_of_reach):
        raise TypeError(f"out_of_reach={out_of_reach!r:.60} must be a tuple of functions — an answer that "
                        "calls one fails — pass the course helpers that are the exercise's finished form, "
                        "or ().")


def _report(name: str, passed: bool, message: str, quiet: bool) -> CheckResult:
    if not passed and not message.startswith(("⏳", "⚠️")):  # a stub, or the checker's own failure: no try
        _FAILURES[name] = _FAILURES.get(name, 0) + 1
    if not quiet:
        print(message)
    return CheckResult(name, passed, message)
