"""Predictions that count: write down what you expect *before* the measurement shows it.

Used by every lesson. Predicting first is what turns a demonstration into a test of your own model of
the failure; a prediction written after the answer is on screen teaches nothing, so it is not counted::

    predict("grad-norm ratio at K = 8", 8.0)   # your prediction: a number   (its own cell, first)
    ...                                         # the measurement cell:
    reveal("grad-norm ratio at K = 8", ratio, right=lambda guess: abs(guess - ratio) < 0.1 * ratio)
    ...
    tally()                                     # the lesson's last cell: how many you got right

After a Run All every measurement is already on screen, so a prediction written then is not counted; the
messages say how to count one: ``forget(name)``, then the predict cell and the measurement cell again (or a
kernel restart and the lesson cell by cell).

The record lives in this process only (one kernel = one lesson); nothing is written to disk.
Solution notebooks carry recorded predictions; the exercise copies have ``None`` until you write one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import validate


@dataclass
class _Entry:
    guess: object = None
    made_before: bool = False   # the guess was recorded before the measurement was revealed
    measured: object = None
    right: bool | None = None   # None until revealed, or when no guess was recorded in time


_ENTRIES: dict[str, _Entry] = {}


def predict(name: str, guess) -> None:
    """Record your guess for the measurement called ``name``; run this cell before the measurement.

    ``guess=None`` records nothing (the exercise copy's placeholder): write a value, then run the cell.
    A guess recorded after ``reveal`` showed the answer is kept but not counted in ``tally()``.
    """
    validate.non_empty_string("name", name, why="it ties your guess to the measurement that reveals it")
    if guess is None:
        print(f"⏳ no prediction for {name!r} yet: replace None with your guess, then run this cell.")
        return
    entry = _ENTRIES.setdefault(name, _Entry())
    entry.guess = guess
    if entry.right is not None or entry.measured is not None:
        print(f"noted {guess!r} for {name!r} — after the measurement was shown (a Run All shows every one), "
              "so it is not counted. To predict first: Kernel ▸ Restart, then run the lesson cell by cell; "
              f"or run `from course_utils.predictions import forget; forget({name!r})`, this cell, then the "
              "measurement cell again.")
        return
    entry.made_before = True
    print(f"recorded your prediction for {name!r}: {guess!r}")


def reveal(name: str, measured, *, right: Callable[[object], bool] | None = None) -> bool | None:
    """Show ``measured`` beside your guess for ``name`` and count whether the guess was right.

    ``right(guess) -> bool`` says what counts as right (a tolerance, a direction, a range); without it a
    guess is right when it equals ``measured``. Returns True/False, or None when no guess was recorded.
    """
    validate.non_empty_string("name", name, why="it ties the measurement to your guess")
    if right is not None:
        validate.function("right", right)  # reveal calls right(guess): e.g. right=lambda guess: guess > 1
    entry = _ENTRIES.setdefault(name, _Entry())
    entry.measured = measured
    if not entry.made_before:
        entry.right = None
        print(f"measured {name}: {_show(measured)} — no prediction was recorded before this cell ran "
              "(predicting first is the point: write yours in its predict cell, run `from course_utils."
              f"predictions import forget; forget({name!r})` and that cell, then this one; or Restart and "
              "run the lesson cell by cell).")
        return None
    entry.right = bool(right(entry.guess)) if right is not None else entry.guess == measured
    verdict = "✅ right" if entry.right else "❌ not this time — read on for why"
    print(f"you predicted {_show(entry.guess)}; measured {_show(measured)}: {verdict}")
    return entry.right


def tally() -> dict[str, int]:
    """Print and return how many predictions were right, wrong and not made before their measurement."""
    revealed = [e for e in _ENTRIES.values() if e.measured is not None]
    counts = {"right": sum(e.right is True for e in revealed),
              "wrong": sum(e.right is False for e in revealed),
              "not made": sum(e.right is None for e in revealed)}
    made = counts["right"] + counts["wrong"]
    if not revealed:
        print("No measurement revealed yet in this kernel: run the lesson cell by cell, predicting first.")
    else:
        print(f"Your predictions this lesson: {counts['right']} right of {made} made"
              f" ({counts['not made']} measurement(s) shown without a prediction first).")
    return counts


def forget(name: str | None = None) -> None:
    """Clear the recorded prediction ``name`` (or every one, with no name): after a Run All showed a
    measurement, ``forget(name)`` lets a prediction written now count once the measurement cell runs again."""
    if name is None:
        _ENTRIES.clear()
        return
    validate.non_empty_string("name", name, why="it names the prediction to clear")
    _ENTRIES.pop(name, None)


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return repr(value)
