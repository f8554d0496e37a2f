"""Outcome claims with their margins: what a trained model did, beside the threshold it had to meet.

Used by every lesson that asserts an *outcome* (the model stops, the run diverges, the clip fires)
rather than an exact mechanism. A notebook writes

    ok = report_outcome("fixed arm stops", stop_rate_fixed, threshold, higher_is_better=True)
    assert ok, "with <|im_end|> graded the model stops"

and, when ``$COURSE_OUTCOMES`` names a file (``make robustness`` sets it), one JSON line is appended
with the value, the threshold and the margin, so the robustness table shows how close each claim
came to failing on every model, seed and thread count — produced, never typed.
"""

from __future__ import annotations

import json
import math
import os


def report_outcome(name: str, value: float, threshold: float, *, higher_is_better: bool = True,
                   lesson: str | None = None) -> bool:
    """True when ``value`` meets ``threshold`` (>= if ``higher_is_better``, else <=).

    Prints one line (``name: value vs threshold, margin``) and, where ``$COURSE_OUTCOMES`` is set,
    appends the measurement there. The margin is signed: positive means the claim held.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name={name!r} must be a non-empty string — it labels the claim in the table — "
                         "pass e.g. 'fixed arm stop rate'.")
    for arg, x in (("value", value), ("threshold", threshold)):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{arg}={x!r} must be a number — an outcome is measured — pass a float.")
    value, threshold = float(value), float(threshold)
    margin = value - threshold if higher_is_better else threshold - value
    ok = math.isfinite(value) and margin >= 0
    side = ">=" if higher_is_better else "<="
    print(f"[outcome] {name}: {value:.4g} (needs {side} {threshold:.4g}; margin {margin:+.3g})")
    path = os.environ.get("COURSE_OUTCOMES")
    if path:
        row = {"notebook": lesson or os.environ.get("COURSE_NOTEBOOK", ""), "name": name, "value": value,
               "threshold": threshold, "higher_is_better": higher_is_better, "margin": margin, "ok": ok,
               "model": os.environ.get("COURSE_MODEL", "tiny-qwen"),
               "seed": os.environ.get("COURSE_SEED", "0"), "threads": os.environ.get("OMP_NUM_THREADS", "")}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    return ok
