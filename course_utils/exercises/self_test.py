"""The course's final self-test: unseen broken (and healthy) runs from every lesson, mixed, graded.

Each lesson's reference module (``answers/lessonNN.py``) draws one case with ``self_test_case(seed)``: what a
practitioner sees (a log excerpt, a rendering with its loss mask, generations), the true cause, and the causes
to choose from. This module shuffles them into a quiz the notebook shows *without* the truth, and grades a
learner's answers by drawing each case again from its lesson — so the truth never sits in the notebook.
"""

from __future__ import annotations

import importlib
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from .. import validate
from ..checks import CheckResult, Hints, _report

# Lessons whose reference module draws self-test cases (lesson 08 is the capstone: it combines the others).
LESSONS = ("01", "02", "03", "04", "05", "06", "07", "09", "10")
SEED = 20261203  # one quiz for everyone, drawn from seeds no lesson's checker uses


@dataclass(frozen=True)
class Question:
    """One quiz item as the learner sees it: what a practitioner sees and the causes to choose from."""

    number: int
    lesson: str
    text: str
    choices: tuple[str, ...]
    _seed: int

    def __str__(self) -> str:
        options = "\n".join(f"   ({chr(97 + i)}) {c}" for i, c in enumerate(self.choices))
        return f"── Question {self.number} ──\n{self.text}\n What is going on?\n{options}"


def _quietly(make: Callable) -> Callable:
    """``make`` with library deprecation warnings silenced: a quiz shows the artefact, not the noise."""
    def draw(seed: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return make(seed)
    return draw


def _draw_case(lesson: str) -> Callable[[int], tuple[str, str, tuple[str, ...]]] | None:
    try:
        module = importlib.import_module(f"course_utils.exercises.answers.lesson{lesson}")
    except ModuleNotFoundError:
        return None
    make = getattr(module, "self_test_case", None)
    return None if make is None else _quietly(make)


def available_lessons() -> list[str]:
    """The lessons that contribute questions (those whose reference module draws self-test cases)."""
    return [lesson for lesson in LESSONS if _draw_case(lesson) is not None]


def draw_quiz(per_lesson: int = 2, seed: int = SEED) -> list[Question]:
    """``per_lesson`` questions from every contributing lesson, shuffled, numbered from 1."""
    validate.positive_int("per_lesson", per_lesson, why="it is how many questions each lesson contributes")
    validate.seed("seed", seed)
    rng = random.Random(seed)
    drawn = []
    for lesson in available_lessons():
        make = _draw_case(lesson)
        for k in range(per_lesson):
            case_seed = seed * 100 + int(lesson) * 10 + k
            text, _truth, choices = make(case_seed)
            drawn.append((lesson, text, tuple(choices), case_seed))
    rng.shuffle(drawn)
    return [Question(i, lesson, text, choices, s) for i, (lesson, text, choices, s) in enumerate(drawn, 1)]


def _truth(question: Question) -> str:
    return _draw_case(question.lesson)(question._seed)[1]


def _as_choice(answer, question: Question) -> str | None:
    """A learner may answer with the cause's text or its letter (``"b"``)."""
    if isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip().isalpha():
        i = ord(answer.strip().lower()) - 97
        return question.choices[i] if 0 <= i < len(question.choices) else None
    return answer if answer in question.choices else None


def check_self_test(answer_for: Callable, quiz: list[Question], quiet: bool = False) -> CheckResult:
    """Grade ``answer_for(question) -> cause`` (the text or letter of one of its choices) on every question.

    Prints each verdict, the right cause of a wrong answer and the lesson to revisit, then the score.
    The check passes at 80 % or more.
    """
    validate.function("answer_for", answer_for)
    if not isinstance(quiz, list) or not quiz or not all(isinstance(q, Question) for q in quiz):
        raise ValueError("quiz must be the list draw_quiz() returned — the grader draws each case again "
                         "from its lesson to know its truth — pass quiz=draw_quiz().")
    lines, right = [], 0
    for question in quiz:
        try:
            given = answer_for(question)
        except NotImplementedError:
            return _report("self_test", False, "⏳ not implemented yet: replace the "
                           "`raise NotImplementedError` with your answers, then run this cell again.", quiet)
        except Exception as exc:  # the learner's bug: report it, do not raise
            given = f"(your function raised {type(exc).__name__})"
        choice, truth = _as_choice(given, question), _truth(question)
        if choice == truth:
            right += 1
            lines.append(f"✅ Q{question.number}: {truth}")
        else:
            lines.append(f"❌ Q{question.number}: you said {given!r}; it was {truth!r} — revisit lesson "
                         f"{question.lesson}")
    share = right / len(quiz)
    verdict = "✅ self_test" if share >= 0.8 else "❌ self_test"
    message = "\n".join(lines) + f"\n{verdict}: {right} of {len(quiz)} right ({share:.0%}; 80 % passes)."
    return _report("self_test", share >= 0.8, message, quiet, HINTS)


HINTS = Hints(
    question="For a wrong answer: what would you measure to tell its two most likely causes apart?",
    pointer="CHEATSHEET.md has the first check for each symptom; the lesson named beside the answer "
            "shows it.",
    answer="Re-read the question's artefact with the lesson's own first check (its 'Diagnose' section).",
)
