"""The checkers' second process (issue 43, ``course_utils.grader_process``): no truth in the learner's.

Five adversarial answers, each tried on ``check_diagnosis`` and ``run_check`` (toy checkers with fresh cases,
and lesson checkers): (1) a frame walk up the whole stack that opens every local it can reach (pickled bytes
included) looking for a ``Diagnosis``, a ``Case`` or a sealed expected value; (2) a redraw, calling every
case- or seed-making function reachable from a frame on every int and list of ints reachable there; (3) a
``gc`` scan for truths (new ``Diagnosis`` objects, sealed bytes in suspended generators, ``Case`` objects);
(4) an object equal to everything; (5) a memo of an earlier run. Each must fail where the grader is forked,
and (1)-(3) must *succeed* against the same checker graded in one process — so the adversaries are not
blind, and the second process is what stops them. Then the plumbing: a child that dies or hangs is reported
(no hang, no zombie), a raising answer and an unfinished stub read as before, an answer's class never runs
in the grader, and what a case prints or logs never reaches the learner.
"""

from __future__ import annotations

import functools
import gc
import inspect
import logging
import os
import pickle
import re
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import stub

from course_utils import checks, grader_process
from course_utils.checks import Case, Diagnosis, check_diagnosis, fresh_random, fresh_seeds, run_check
from course_utils.exercises import lesson01, lesson02, lesson03, lesson05, lesson07, lesson13
from course_utils.exercises.answers import lesson01 as answers01
from course_utils.exercises.answers import lesson02 as answers02
from course_utils.exercises.answers import lesson03 as answers03
from course_utils.exercises.answers import lesson05 as answers05
from course_utils.exercises.answers import lesson07 as answers07
from course_utils.exercises.answers import lesson13 as answers13

CAUSES = ("dropped", "shifted", "healthy")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # gc lists torch's deprecated aliases


# ---- toy checkers: fresh cases on every run, a rule the reference knows and the adversaries do not ---------

def toy_case(seed: int):
    """A diagnosis case: the artefact is a number whose remainder by 7 (not 3) tells the cause."""
    cause = CAUSES[seed % len(CAUSES)]
    value = 7 * (seed * 1_000_003 % 99_991) + CAUSES.index(cause)
    return {"value": value}, Diagnosis(cause, value // 7)


def toy_reference(artefact) -> Diagnosis:
    return Diagnosis(CAUSES[artefact["value"] % 7], artefact["value"] // 7)


def toy_diagnosis(fn, **kwargs):
    return check_diagnosis("toy_diagnosis", fn, toy_case, seeds=lambda: fresh_seeds(3 * len(CAUSES)),
                           quiet=True, **kwargs)


def toy_check_cases() -> list[Case]:
    rng = fresh_random()
    drawn = [rng.randrange(10**9) for _ in range(5)]
    return [Case((x,), (x * x + 3) % 1009, label="a fresh number") for x in drawn]


def toy_reference_of_squares(x):
    return (x * x + 3) % 1009


def toy_run_check(fn, *, same_process: bool = False):
    cases = toy_check_cases() if same_process else toy_check_cases  # a ready list is graded in this process
    return run_check("toy_run_check", fn, cases, quiet=True)


def in_one_process(monkeypatch):
    """The grader as it runs where fork is unavailable: in this process."""
    monkeypatch.setattr(grader_process, "available", lambda: False)


# ---- the adversaries ---------------------------------------------------------------------------------------

def _inner(value):
    """What one step of a walk reaches from ``value``: containers, attributes, closures, partials, generator
    frames (read without calling properties)."""
    if isinstance(value, dict):
        return [*value.keys(), *value.values()][:400]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)[:400]
    if isinstance(value, functools.partial):
        return [value.func, *value.args, *value.keywords.values()]
    if inspect.isgenerator(value) and value.gi_frame is not None:
        return list(value.gi_frame.f_locals.values())
    if inspect.isfunction(value):
        return [c.cell_contents for c in (value.__closure__ or ()) if _filled(c)]
    if isinstance(value, (str, bytes, int, float, type)) or inspect.ismodule(value):
        return []
    try:
        return list(object.__getattribute__(value, "__dict__").values())
    except (AttributeError, TypeError):
        return []


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 — an empty cell raises
        return True
    except ValueError:
        return False


def _reachable(roots, depth: int = 3):
    seen, frontier, out = set(), list(roots), []
    for _ in range(depth + 1):
        following = []
        for value in frontier:
            if id(value) in seen:
                continue
            seen.add(id(value))
            out.append(value)
            following += _inner(value)
        frontier = following
    return out


def _opened(value):
    """``value``, or what its pickled bytes hold."""
    if isinstance(value, bytes):
        try:
            return pickle.loads(value)
        except Exception:  # noqa: BLE001 — not a pickle
            return None
    return value


def _frame_values():
    """Everything reachable from every local of every frame up the stack (the adversary's own excluded)."""
    roots, frame = [], inspect.currentframe().f_back.f_back
    while frame is not None:
        roots += list(frame.f_locals.values())
        frame = frame.f_back
    return _reachable(roots)


class Adversary:
    """A learner's answer that looks for the truth instead of reading the artefact; ``found`` lists what it
    found (empty when the grader is forked)."""

    def __init__(self, look):
        self.look, self.found = look, []
        self.before = {id(o) for o in gc.get_objects() if isinstance(o, Diagnosis)}
        self.__name__ = look.__name__

    def __call__(self, *args):
        truth = self.look(self, args)
        if truth is not None:
            self.found.append(truth)
        if isinstance(truth, Diagnosis):
            return Diagnosis(truth.cause, truth.evidence)
        return truth if truth is not None else Diagnosis("?")


def frame_walk(self, args):
    """(1) Every frame up the stack, every local and what it holds, pickled bytes opened."""
    for value in map(_opened, _frame_values()):
        if isinstance(value, Diagnosis):
            return value
        if isinstance(value, Case) and value.args == args:
            return _opened(value.expected)
    return None


def _maker(value) -> bool:
    """A function that could make a case or draw seeds: a partial, or one of the course's or this file's own
    named so (not pytest's machinery or another test, not the adversary itself)."""
    if isinstance(value, Adversary) or not callable(value):
        return False
    function = value.func if isinstance(value, functools.partial) else value  # a partial: the program's own
    name, module = getattr(function, "__name__", ""), str(getattr(function, "__module__", ""))
    ours = module.startswith("course_utils") or module == __name__ and not name.startswith("test_")
    return ours and (isinstance(value, functools.partial) or bool(re.search(r"case|seed|draw|program", name)))


def redraw(self, args):
    """(2) Every case- or seed-making function reachable from a frame, called on every int and list found."""
    values = _frame_values()
    makers = [v for v in values if _maker(v)]
    numbers = {v for v in values if type(v) is int}
    numbers |= {n for v in values if isinstance(v, (list, tuple, range)) for n in v if type(n) is int}
    for make in makers:
        for call in [make] + [functools.partial(make, n) for n in list(numbers)[:200]]:
            try:
                made = call()
            except Exception:  # noqa: BLE001 — not this maker's signature
                continue
            for item in made if isinstance(made, list) else [made]:
                if isinstance(item, tuple) and len(item) == 2 and item[0] == args[0]:
                    return item[1]
                if isinstance(item, Case) and item.args == args:
                    return _opened(item.expected)
    return None


def gc_scan(self, args):
    """(3) Every live object: a new Diagnosis, a Case of this call, sealed bytes in a suspended generator."""
    for obj in gc.get_objects():
        if isinstance(obj, Diagnosis) and id(obj) not in self.before:
            return obj
        if isinstance(obj, Case) and obj.args == args:
            return _opened(obj.expected)
        if inspect.isgenerator(obj) and obj.gi_frame is not None:
            for value in map(_opened, _reachable(obj.gi_frame.f_locals.values(), depth=2)):
                if isinstance(value, Diagnosis) or (isinstance(value, Case) and value.args == args):
                    return value if isinstance(value, Diagnosis) else _opened(value.expected)
    return None


class AlwaysEqual:
    """Equal to everything."""

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def always_equal(self, args):
    """(4) An object whose __eq__ always says yes (as the cause, or as the whole answer)."""
    return Diagnosis(AlwaysEqual(), AlwaysEqual()) if isinstance(args[0], dict) else AlwaysEqual()


LOOKS = [frame_walk, redraw, gc_scan, always_equal]


# ---- (1)-(4): each fails the forked grader; (1)-(3) beat the same checker graded in one process ------------

@pytest.mark.parametrize("look", LOOKS, ids=lambda f: f.__name__)
def test_no_adversary_passes_the_forked_diagnosis_checker(look):
    cheat = Adversary(look)
    result = toy_diagnosis(cheat)
    assert not result, f"{look.__doc__} passes"
    assert look is always_equal or not cheat.found, f"{look.__name__} found a truth here: {cheat.found[:3]}"


@pytest.mark.parametrize("look", LOOKS, ids=lambda f: f.__name__)
def test_no_adversary_passes_the_forked_run_check(look):
    cheat = Adversary(look)
    assert not toy_run_check(cheat), f"{look.__doc__} passes"
    assert look is always_equal or not cheat.found, f"{look.__name__} found a truth here: {cheat.found[:3]}"


@pytest.mark.parametrize("look", [frame_walk, redraw, gc_scan], ids=lambda f: f.__name__)
def test_the_adversaries_are_not_blind_they_beat_one_process_grading(look, monkeypatch):
    """The same adversaries pass the same checkers graded in this process (where fork is missing, and for a
    ready list of cases): what stops them above is the second process, not their own weakness. (A ready list
    holds no seed to redraw from: the redraw is tried on the diagnosis grader only.)"""
    if look is not redraw:
        assert toy_run_check(Adversary(look), same_process=True), f"{look.__name__} cannot read a ready list"
    in_one_process(monkeypatch)
    assert toy_diagnosis(Adversary(look)), f"{look.__name__} cannot read the one-process diagnosis grader"


def test_the_references_pass_both_ways(monkeypatch):
    assert toy_diagnosis(toy_reference) and toy_run_check(toy_reference_of_squares)
    assert toy_run_check(toy_reference_of_squares, same_process=True)
    in_one_process(monkeypatch)
    assert toy_diagnosis(toy_reference)


def test_a_memo_of_an_earlier_run_fails():
    """(5) The reference's answers of one run, replayed in the next: every run draws new cases."""
    memo: dict = {}

    def recording(artefact):
        memo[artefact["value"]] = answer = toy_reference(artefact)
        return answer

    def replaying(artefact):
        """Answers from the memo only."""
        return memo.get(artefact["value"], Diagnosis("healthy"))

    assert toy_diagnosis(recording) and not toy_diagnosis(replaying)
    squares: dict = {}
    assert toy_run_check(lambda x: squares.setdefault(x, toy_reference_of_squares(x)))
    assert not toy_run_check(lambda x: squares.get(x, 0))


def test_an_instructors_seed_repeats_the_cases_and_still_mixes_causes(monkeypatch):
    seen: list[list] = [[], []]
    monkeypatch.setenv(checks.CHECK_SEED_ENV, "7")
    for run in seen:
        assert toy_diagnosis(lambda a, run=run: run.append(a["value"]) or toy_reference(a))
    assert sorted(seen[0]) == sorted(seen[1]), "COURSE_CHECK_SEED makes a run reproducible"
    for cause in CAUSES:
        assert not toy_diagnosis(lambda a, cause=cause: Diagnosis(cause, a["value"] // 7)), cause


# ---- the lessons' checkers: their references pass, the adversaries fail ------------------------------------

LESSON_CHECKERS = [  # (checker, reference): three diagnosis checkers, three run_check ones
    (lesson01.check_diagnose_run, answers01.diagnose_run),
    (lesson05.check_diagnose_log, answers05.diagnose_log),
    (lesson07.check_trace_diagnosis, answers07.diagnose_accumulation_trace),
    (lesson02.check_collate_keep_eos, answers02.collate_keep_eos),
    (lesson03.check_block_mask, answers03.block_mask_from_position_ids),
    (lesson13.check_read_adapter, answers13.adapted_per_group),
]
IDS = [f"{check.__module__.rsplit('.', 1)[1]}.{check.__name__}" for check, _ in LESSON_CHECKERS]


@pytest.mark.parametrize("check, reference", LESSON_CHECKERS, ids=IDS)
def test_the_lessons_references_still_pass(check, reference, capsys):
    result = check(reference)
    assert result, result.message


@pytest.mark.parametrize("look", LOOKS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("check, reference", LESSON_CHECKERS, ids=IDS)
def test_no_adversary_passes_a_lessons_checker(check, reference, look, capsys):
    cheat = Adversary(look)
    assert not check(cheat), f"{look.__doc__} passes {check.__name__}"
    assert look is always_equal or not cheat.found, f"{look.__name__} found {cheat.found[:2]}"


# ---- the plumbing ------------------------------------------------------------------------------------------

def test_a_raising_answer_and_a_stub_read_as_before():
    for check in (toy_diagnosis, toy_run_check):
        unfinished = check(stub)
        assert not unfinished and unfinished.message == checks.NOT_IMPLEMENTED
        assert "your function raised ZeroDivisionError: division by zero" in check(lambda a: 1 / 0).message
    ready = toy_run_check(lambda x: 1 / 0, same_process=True).message
    assert toy_run_check(lambda x: 1 / 0).message == ready, "the same message, forked or not"


@pytest.mark.parametrize("answer", [
    AlwaysEqual(), type("Loud", (str,), {"__eq__": lambda s, o: True, "__hash__": str.__hash__})("x"),
    (i for i in range(3)), lambda: 1, [1, AlwaysEqual()], {"k": torch.nn.Parameter(torch.ones(2))},
    torch.ones(2, requires_grad=True) * 2, 3.5, None,
], ids=["always_equal", "str_subclass", "generator", "function", "list", "parameter", "non_leaf", "float",
        "none"])
def test_an_answer_reads_the_same_in_the_grader_as_here(answer):
    """The stand-ins and the normalised values give the messages the comparison gives in this process."""
    cases = [Case((1,), 2), Case((2,), torch.ones(2))]
    here = run_check("same", lambda x: answer, cases, quiet=True).message
    forked = run_check("same", lambda x: answer, lambda: cases, quiet=True).message
    assert forked == here


def test_an_answers_class_never_runs_in_the_grader(tmp_path):
    """An answer whose pickle would call code (``__reduce__``) arrives as a stand-in: the grader rebuilds only
    built-ins, tensors and the classes the checker names."""
    marker = tmp_path / "ran"

    class Trojan:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    class TrojanInt(int):
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    for answer in (Trojan(), [TrojanInt(5)], {"x": Trojan()}):
        assert not run_check("trojan", lambda x, answer=answer: answer, lambda: [Case((1,), 5)], quiet=True)
    assert not marker.exists(), "the answer's code ran in the grading process"
    assert not toy_diagnosis(lambda a: Diagnosis(Trojan(), TrojanInt(1))) and not marker.exists()


def _dies(seed):
    os._exit(3)


def test_a_child_that_dies_is_reported_not_waited_for(capsys):
    start = time.monotonic()
    result = check_diagnosis("dies", toy_reference, _dies, seeds=6)
    assert time.monotonic() - start < 10
    assert not result and result.message.startswith("⚠️ dies: the checker's grading process stopped")
    assert "exit code 3" in result.message and "⚠️" in capsys.readouterr().out
    assert checks.failed_checks("dies") == 0, "the checker's failure is not the learner's try"


def test_a_silent_child_is_stopped_and_reaped(monkeypatch, tmp_path):
    pid_file = tmp_path / "pid"

    def hangs(seed):
        pid_file.write_text(str(os.getpid()))
        time.sleep(600)

    monkeypatch.setattr(grader_process, "SILENCE_LIMIT_S", 1.0)
    start = time.monotonic()
    result = check_diagnosis("hangs", toy_reference, hangs, seeds=6, quiet=True)
    assert time.monotonic() - start < 10 and not result and "silent for 1 s" in result.message
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists(), "the stopped child is reaped (no zombie)"


def test_an_error_of_the_checker_is_raised_here_with_its_message():
    with pytest.raises(ValueError, match=r"make_case\(\d+\) returned int") as info:
        check_diagnosis("broken", toy_reference, lambda seed: 3, seeds=6)
    assert any("grading process" in note for note in getattr(info.value, "__notes__", []))
    with pytest.raises(ValueError, match="no cases to check"):
        run_check("broken", toy_reference_of_squares, lambda: [])


def _chatty_case(seed):
    print("SECRET from the grader")
    print("SECRET on stderr", file=sys.stderr)
    logging.getLogger("transformers").warning("SECRET logged")
    warnings.warn("SECRET warned", stacklevel=1)
    os.write(2, b"SECRET at the fd\n")
    return toy_case(seed)


def test_what_a_case_prints_never_reaches_the_learner(capfd):
    assert check_diagnosis("chatty", toy_reference, _chatty_case, seeds=6)
    assert "SECRET" not in "".join(capfd.readouterr())


def test_a_checker_call_costs_milliseconds_not_seconds():
    """The fork, the pipe and the pickles of a six-case checker: well under a second (measured ~10-25 ms)."""
    toy_diagnosis(toy_reference)
    start = time.perf_counter()
    for _ in range(3):
        assert toy_diagnosis(toy_reference)
    assert (time.perf_counter() - start) / 3 < 0.5


def test_the_fork_warning_of_python_3_12_is_the_one_silenced():
    text = "This process (pid=4242) is multi-threaded, use of fork() may lead to deadlocks in the child."
    assert re.match(grader_process.FORK_WARNING, text)


def test_the_graders_functions_refuse_what_they_cannot_run():
    for call, says in [(lambda: grader_process.start(None), "program must be a function"),
                       (lambda: grader_process.start(lambda: iter(()), answer_types="x"), "answer_types='x'"),
                       (lambda: grader_process.start(lambda: iter(()), same_process="no"),
                        "same_process='no'"),
                       (lambda: grader_process.call_answer(None, (), {}), "fn must be a function"),
                       (lambda: grader_process.call_answer(len, [], {}), "must be a tuple and a dict"),
                       (lambda: run_check("c", len, lambda: [], answer_types=[3]), "answer_types=\\[3\\]")]:
        with pytest.raises((TypeError, ValueError), match=says) as info:
            call()
        assert " — " in str(info.value)
