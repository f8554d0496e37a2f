"""The course's final self-test: unseen broken (and healthy) runs from every lesson, mixed, graded.

Each lesson's reference module (``answers/lessonNN.py``) draws one case with ``self_test_case(seed)``: what a
practitioner sees (a log excerpt, a rendering with its loss mask, generations), the true cause, and the causes
to choose from. ``draw_quiz()`` draws a quiz *fresh on every run* (``checks.fresh_seeds``' source: the
operating system's randomness, or ``COURSE_CHECK_SEED`` for an instructor's demo), so two learners — or one
learner twice — never answer the same cases, and a memo of an earlier run scores nothing.

A learner answers question by question (``quiz.ask(n)``, then ``quiz.answer(n, "b")``): a right answer is
confirmed, a wrong one is told why the *chosen* cause does not fit and which section to re-read
(``answers/self_test_bank.py``) — never which cause does. The first answer to each question counts; answering
again after the feedback changes nothing (a replay does not score). ``check_self_test(quiz.given, quiz)``
scores the answers given; ``reveal_score(quiz)`` compares the score with the learner's prediction once every
question is answered. The grader draws each case again from its lesson to know its truth: the truth never
sits in the notebook, on the quiz or on its questions, and the first answers are recorded apart from the
quiz (``_DRAWN`` says what that does and does not stop).

A new lesson contributes by giving its ``answers/lessonNN.py`` a ``SELF_TEST_CAUSES`` dict and a
``self_test_case(seed)``, and its tells to ``answers/self_test_bank.py``.
"""

from __future__ import annotations

import importlib
import pkgutil
import traceback
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import validate
from ..checks import CheckResult, Hints, _report, fresh_random, register_hints
from . import answers as _answers_package

PASS_SHARE = 0.8  # the check passes at 80 % right


def _contributing() -> tuple[str, ...]:
    """The lessons whose reference module draws self-test cases, in course order (lesson 08, the capstone,
    combines the others and draws none)."""
    found = []
    for info in pkgutil.iter_modules(_answers_package.__path__):
        if info.name.startswith("lesson") and info.name[6:].isdigit():
            module = importlib.import_module(f"course_utils.exercises.answers.lesson{info.name[6:]}")
            if callable(getattr(module, "self_test_case", None)):
                found.append(info.name[6:])
    return tuple(sorted(found))


LESSONS = _contributing()


@dataclass(frozen=True)
class Question:
    """One quiz item as the learner sees it: what a practitioner sees and the causes to choose from. It holds
    nothing the truth can be drawn from: its case's seed stays with the grader (``_DRAWN``)."""

    number: int
    lesson: str
    text: str
    choices: tuple[str, ...]

    def __str__(self) -> str:
        options = "\n".join(f"   ({chr(97 + i)}) {c}" for i, c in enumerate(self.choices))
        head = f"── Question {self.number} (lesson {self.lesson}'s family) ──"
        return f"{head}\n{self.text}\n What is going on?\n{options}"


def _draw_case(lesson: str) -> Callable[[int], tuple[str, str, tuple[str, ...]]] | None:
    try:
        module = importlib.import_module(f"course_utils.exercises.answers.lesson{lesson}")
    except ModuleNotFoundError:
        return None
    make = getattr(module, "self_test_case", None)
    if make is None:
        return None

    def draw(seed: int):  # library deprecation warnings silenced: a quiz shows the artefact, not the noise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return make(seed)
    return draw


def available_lessons() -> list[str]:
    """The lessons that contribute questions (those whose reference module draws self-test cases)."""
    return [lesson for lesson in LESSONS if _draw_case(lesson) is not None]


class Quiz(list):
    """The drawn questions (a list of ``Question``, numbered from 1). The learner's first answers are recorded
    by the grader, apart from the quiz (``_DRAWN``): no attribute of the quiz holds or resets them."""

    __hash__ = object.__hash__  # one drawn quiz is one object (a key of _DRAWN), whatever it holds

    def __init__(self, questions):
        questions = [] if isinstance(questions, (str, bytes)) else list(questions)
        if not questions or not all(isinstance(q, Question) for q in questions):
            raise ValueError(f"a quiz needs a non-empty list of Questions, got {questions!r:.60} — it is "
                             "graded question by question — draw one with draw_quiz().")
        super().__init__(questions)

    def question(self, number: int) -> Question:
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= len(self):
            raise ValueError(f"question number {number!r} is not in this quiz — its questions are numbered "
                             f"1 to {len(self)} — pass one of those.")
        return self[number - 1]

    def ask(self, number: int) -> None:
        """Print question ``number``: the artefact and the causes to choose from."""
        print(self.question(number))

    def answer(self, number: int, given) -> bool | None:
        """Record your answer to question ``number`` (the letter or the text of a choice) and print the
        verdict: right, or why the cause you chose does not fit and where to look. The first answer counts;
        ``None`` (not answered yet) and an answer that is not a choice are not recorded."""
        self.question(number)
        verdict, right = _verdict(self, number, given)
        print(verdict)
        return right

    def given(self, question: Question):
        """The first answer recorded for ``question`` (what ``check_self_test(quiz.given, quiz)`` scores)."""
        if not any(question is q for q in self):
            raise ValueError(f"{question!r:.60} is not a question of this quiz — given() looks up the answer "
                             "recorded for one of them — pass e.g. quiz[0], or a number to quiz.answer().")
        first = _first_answers(self).get(question.number)
        return None if first is None else first[0]

    def answered(self) -> int:
        return len(_first_answers(self))

    def score(self) -> int:
        """How many first answers were right."""
        return sum(right for _, right in _first_answers(self).values())


@dataclass
class _Record:
    """What the grader keeps of one drawn quiz: its questions as drawn, each case's seed (the truth is drawn
    again from its lesson with it) and the first valid answer to each question."""

    questions: tuple[Question, ...]
    seeds: tuple[int, ...]
    first: dict[int, tuple[str, bool]] = field(default_factory=dict)  # number -> (first answer, right?)


# The quizzes draw_quiz returned, each with its record: only those are graded (no hand-built one). Keyed
# weakly by the quiz object, so a record goes with its quiz.
#
# What this stops: the truth read off what the learner holds (a Question or a Quiz has no seed, token or
# truth: `_draw_case(q.lesson)(q._seed)` has nothing to work with); a second scored answer after the
# feedback (the first answers are not on the quiz, so clearing or replacing its attributes resets nothing);
# probing the verdict letter by letter (`_verdict` is the one function that reads a truth, and it records
# the answer it was given before it says anything, whoever calls it).
# What it does not stop: Python hides nothing from code in the same process. Reading this module's private
# state (`_DRAWN`, or the same objects through gc.get_objects() or a frame's locals) gives the seeds, and
# every case can be drawn again from them; the demo seed (COURSE_CHECK_SEED) reproduces the solution copy's
# quiz, whose letters are in it. The self-test is the learner's own calibration, not a credential: the aim
# is that an honest learner is scored on the first answers given, and that no public or obvious call scores
# for them.
_DRAWN: weakref.WeakKeyDictionary[Quiz, _Record] = weakref.WeakKeyDictionary()


def _record(quiz: Quiz) -> _Record:
    record = _DRAWN.get(quiz) if isinstance(quiz, Quiz) else None
    if record is None:
        raise ValueError("this quiz was not drawn by draw_quiz() — the grader keeps what it drew to know "
                         "each truth — answer the quiz draw_quiz() returned (quiz = draw_quiz()).")
    return record


def _first_answers(quiz: Quiz) -> dict[int, tuple[str, bool]]:
    """A copy of the first answers recorded for ``quiz`` (none for a quiz draw_quiz() did not return)."""
    record = _DRAWN.get(quiz)
    return {} if record is None else dict(record.first)


def draw_quiz(per_lesson: int = 2) -> Quiz:
    """``per_lesson`` questions from every contributing lesson, drawn fresh for this run, shuffled, numbered
    from 1. Each lesson's generator draws from millions of cases, healthy runs and look-alikes among them."""
    validate.positive_int("per_lesson", per_lesson, why="it is how many questions each lesson contributes")
    draws = fresh_random()
    drawn = []
    for lesson in available_lessons():
        make = _draw_case(lesson)
        for _ in range(per_lesson):
            case_seed = draws.randrange(10**6, 2**31)
            text, _, choices = make(case_seed)  # the truth is not kept: drawn again to grade
            drawn.append((lesson, text, tuple(choices), case_seed))
    draws.shuffle(drawn)
    questions = tuple(Question(i, lesson, text, choices)
                      for i, (lesson, text, choices, _) in enumerate(drawn, 1))
    quiz = Quiz(questions)
    _DRAWN[quiz] = _Record(questions, tuple(seed for *_, seed in drawn))
    return quiz


def _as_choice(answer, question: Question) -> str | None:
    """A learner may answer with the cause's text or its letter (``"b"``); anything else is None."""
    if type(answer) is not str:  # a plain str only: an object equal to everything is no choice
        return None
    text = answer.strip()
    if len(text) == 1 and text.isalpha():
        i = ord(text.lower()) - 97
        return question.choices[i] if 0 <= i < len(question.choices) else None
    return text if text in question.choices else None


def _tell(question: Question, chosen: str) -> str:
    """Why ``chosen`` does not fit: what you would see if it were the cause, and where to look."""
    from .answers import self_test_bank

    module = importlib.import_module(f"course_utils.exercises.answers.lesson{question.lesson}")
    code = {phrase: name for name, phrase in module.SELF_TEST_CAUSES.items()}.get(chosen)
    tell = self_test_bank.TELLS.get(question.lesson, {}).get(code)
    where = self_test_bank.SECTIONS.get(question.lesson, f"lesson {question.lesson}'s Diagnose section")
    seen = f"if it were, you would see {tell}" if tell else "it does not fit what the artefact shows"
    return f"{seen}. Look again with {where}."


def _verdict(quiz: Quiz, number: int, given) -> tuple[str, bool | None]:
    """What the learner is told about ``given`` for question ``number`` of ``quiz``, and whether it was right
    (None: not an answer). The first valid answer is recorded here, on every call path, before anything is
    told: a later answer, by any caller, gets the first one's result (no free oracle)."""
    record = _record(quiz)
    quiz.question(number)  # a number the quiz has
    question = record.questions[number - 1]  # as drawn, whatever the list holds now
    n = question.number
    if given is None:
        return f"⏳ Q{n}: not answered yet — put the letter you pick in place of None.", None
    choice = _as_choice(given, question)
    if choice is None:
        letters = f"(a)–({chr(96 + len(question.choices))})"
        return (f"⚠️ Q{n}: {given!r:.60} is not one of the choices {letters} — answer with a letter or a "
                "choice's text; nothing was recorded.", None)
    first = record.first.get(n)
    if first is None:  # the first answer: drawn again from its lesson, judged, recorded
        first = record.first[n] = (choice, choice == _draw_case(question.lesson)(record.seeds[n - 1])[1])
    if first[0] != choice:
        return (f"Q{n} was answered already ({'right' if first[1] else 'wrong'}): the first answer counts — "
                "draw_quiz() draws a fresh quiz to try again.", first[1])
    if first[1]:
        return f"✅ Q{n}: right.", True
    return f"❌ Q{n}: not {choice!r} — {_tell(question, choice)}", False


def check_self_test(answer_for: Callable, quiz: list[Question], quiet: bool = False) -> CheckResult:
    """Grade ``answer_for(question) -> cause`` (the letter or text of one of its choices) on every question of
    ``quiz``: ``check_self_test(quiz.given, quiz)`` scores the answers given with ``quiz.answer``.

    Prints each verdict — for a wrong answer why the chosen cause does not fit and where to look, never the
    right cause — then the score; the check passes at 80 % or more. On a ``Quiz`` the first answer to each
    question counts, so a second run with answers changed after the feedback scores the same.
    """
    validate.function("answer_for", answer_for)
    record = _DRAWN.get(quiz) if isinstance(quiz, Quiz) else None
    if record is None or tuple(quiz) != record.questions:
        raise ValueError("quiz must be a whole quiz draw_quiz() returned (a slice or a hand-picked list "
                         "would grade on questions you chose) — the grader draws each case again from its "
                         "lesson to know its truth — pass quiz=draw_quiz().")
    register_hints("self_test", HINTS)
    lines, right, unanswered = [], 0, 0
    for question in record.questions:
        try:
            given = answer_for(question)
        except NotImplementedError:
            return _report("self_test", False, "⏳ not implemented yet: replace the "
                           "`raise NotImplementedError` with your answers, then run this cell again.", quiet)
        except Exception as exc:  # the learner's bug: report it with its message (a KeyError names its key)
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            lines.append(f"⚠️ Q{question.number}: your function raised {last} — nothing recorded.")
            unanswered += 1
            continue
        verdict, ok = _verdict(quiz, question.number, given)  # records a first answer
        if ok is None:
            unanswered += 1
            if given is None:  # counted below, not listed: an untouched quiz is one line, not twenty-two
                continue
        lines.append(verdict)
        right += bool(ok)
    share = right / len(quiz)
    passed = share >= PASS_SHARE
    verdict = "✅ self_test" if passed else "❌ self_test"
    missing = f"; {unanswered} not answered: quiz.answer(n, letter) records one" if unanswered else ""
    wrong = [line for line in lines if not line.startswith("✅")]
    message = "\n".join(wrong) + ("\n" if wrong else "") + (
        f"{verdict}: {right} of {len(quiz)} right ({share:.0%}; 80 % passes{missing}).")
    return _report("self_test", passed, message, quiet)


def reveal_score(quiz: Quiz, name: str = "self-test score") -> None:
    """Compare the score with the prediction ``name`` — once every question is answered, not before (a Run All
    would otherwise reveal a score of 0 before the first answer)."""
    from ..predictions import reveal

    if not isinstance(quiz, Quiz):
        raise ValueError(f"quiz is a {type(quiz).__name__} — the score is counted on the quiz draw_quiz() "
                         "returned — pass it.")
    if quiz.answered() < len(quiz):
        print(f"⏳ {quiz.answered()} of {len(quiz)} questions answered: your score is compared with your "
              "prediction once you have answered every one.")
        return
    score = quiz.score()
    reveal(name, score, right=lambda guess: abs(guess - score) <= 2)


HINTS = Hints(
    question="For a wrong answer: what would you measure to tell its two most likely causes apart?",
    pointer="CHEATSHEET.md has the first check for each symptom; the section named beside the answer "
            "shows it.",
    answer="Re-read the question's artefact with the lesson's own first check (its 'Diagnose' section).",
)
