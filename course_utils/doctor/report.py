"""What the doctor reports: ``Finding`` (one result of a check), ``Report`` (the findings, most severe
first, as a table, HTML or JSON), the exit codes, and ``guarded`` — the guard that turns a check that
crashes into a "could-not-check" finding instead of a traceback.
"""

from __future__ import annotations

import contextvars
import html
import json
import math
from dataclasses import asdict, dataclass

from .. import validate

# What this file offers users (re-exported by ``course_utils.doctor``); its other names serve the package
__all__ = ["EXIT_CODES", "LESSONS", "SEVERITIES", "Finding", "Report"]

SEVERITIES = ("error", "could-not-check", "warning", "info")
EXIT_CODES = {"clean": 0, "error": 1, "bad-input": 2, "could-not-check": 3}
LESSONS = {
    "01": "01 · Accumulation & clipping", "02": "02 · The model never stops",
    "03": "03 · Padding & packing", "04": "04 · Chat templates",
    "05": "05 · Truncation & the NaN micro-batch", "06": "06 · NaN detective (QLoRA)",
    "07": "07 · Token-weighted accumulation", "08": "08 · Capstone: the SFT doctor",
    "09": "09 · Thinking & tool-call templates", "10": "10 · The fix that did not ship",
    "12": "12 · Packing on new architectures", "13": "13 · What LoRA actually trains",
}


# Rows the data holds while the checks run on a sample of them (None: every row is checked)
SAMPLED: contextvars.ContextVar[int | None] = contextvars.ContextVar("doctor_sampled", default=None)


@dataclass


class Finding:
    """One result of a check: ``severity`` is "error", "could-not-check" (the check failed to run: the
    finding says why), "warning" or "info"."""

    severity: str
    check: str
    what: str
    evidence: str
    fix: str
    lesson: str = ""

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity={self.severity!r} is not one of {SEVERITIES} — the report sorts "
                             "and gates on these — use one of them.")
        validate.non_empty_string("check", self.check, why="it names the check in the report and its JSON")
        validate.non_empty_string("what", self.what, why="it is the finding's one-line summary")


class Report(list):
    """The doctor's findings, most severe first; prints as a table, renders as HTML in a notebook."""

    def __init__(self, findings=()):
        findings = list(findings)
        stray = next((f for f in findings if not isinstance(f, Finding)), None)
        if stray is not None:
            raise TypeError(f"a Report holds Findings, got {stray!r:.40} ({type(stray).__name__}) — it "
                            "counts their severities and prints their fields — pass diagnose()'s report, or "
                            "Finding(...) objects.")
        super().__init__(findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self if f.severity == "error"]

    @property
    def exit_code(self) -> int:
        """1 if an error was found, else 3 if a check could not run, else 0 (2 is bad input: no report)."""
        if self.errors:
            return EXIT_CODES["error"]
        if any(f.severity == "could-not-check" for f in self):
            return EXIT_CODES["could-not-check"]
        return EXIT_CODES["clean"]

    def checks(self, severity: str | None = None) -> set[str]:
        """The names of the checks that reported (at ``severity`` if given)."""
        if severity is not None:
            validate.choice("severity", severity, SEVERITIES, why="a finding has one of these severities")
        return {f.check for f in self if severity is None or f.severity == severity}

    def to_json(self) -> str:
        counts = {s: sum(f.severity == s for f in self) for s in SEVERITIES}
        return json.dumps({"findings": [asdict(f) for f in self], "counts": counts,
                           "exit_code": self.exit_code}, indent=2)

    def __str__(self) -> str:
        if not self:
            return "SFT doctor: no findings."
        unchecked = sum(f.severity == "could-not-check" for f in self)
        lines = [f"SFT doctor: {len(self.errors)} error(s), "
                 + (f"{unchecked} check(s) could not run, " if unchecked else "")
                 + f"{sum(f.severity == 'warning' for f in self)} warning(s), "
                 f"{sum(f.severity == 'info' for f in self)} info", ""]
        width = max(len(f.check) for f in self)
        for f in self:
            label = "UNCHECKED" if f.severity == "could-not-check" else f.severity.upper()
            lines.append(f"{label:<{8 + bool(unchecked) * 2}}{f.check:<{width + 2}}{f.what}")
            pad = " " * (8 + bool(unchecked) * 2 + width + 2)
            lines.append(f"{pad}evidence: {f.evidence}")
            lines.append(f"{pad}fix:      {f.fix}")
            if f.lesson:
                lines.append(f"{pad}lesson:   {LESSONS.get(f.lesson, f.lesson)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = {"error": "#c62828", "could-not-check": "#6a1b9a", "warning": "#ef6c00", "info": "#1565c0"}
        rows = "".join(
            f"<tr><td style='color:{colour[f.severity]};font-weight:bold'>{f.severity}</td>"
            f"<td><code>{html.escape(f.check)}</code></td><td>{html.escape(f.what)}</td>"
            f"<td>{html.escape(f.evidence)}</td><td>{html.escape(f.fix)}</td>"
            f"<td>{html.escape(LESSONS.get(f.lesson, f.lesson))}</td></tr>" for f in self)
        head = "".join(f"<th style='text-align:left'>{h}</th>"
                       for h in ("severity", "check", "what", "evidence", "fix", "lesson"))
        return f"<table><tr>{head}</tr>{rows or '<tr><td colspan=6>no findings</td></tr>'}</table>"


def share_of(k: int, n: int) -> str:
    """"k of n rows (share)"; when the rows are a sample of the data (``SAMPLED``), with the 95 % Wilson
    interval of the share in all the rows — a rate from 2,000 sampled rows is not the rate of a million."""
    text = f"{k} of {n} rows ({k / n:.1%})"
    total = SAMPLED.get()
    if total is None or n == 0:
        return text
    z, p = 1.96, k / n
    centre, spread = (p + z * z / (2 * n)), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = (centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n)
    return f"{text} (sampled; in all {total:,} rows: {max(low, 0):.1%}..{min(high, 1):.1%}, 95 % interval)"


def guarded(check: str, run, *args) -> list[Finding]:
    """``run(*args)``'s findings; an exception it was not written for becomes a "could-not-check" finding
    naming ``check`` and why (exit status 3), so one check's bug neither hides the others nor ends in a
    traceback."""
    try:
        return run(*args)
    except Exception as exc:  # noqa: BLE001 — any failure of a check is reported, the others still run
        return could_not_check(check, exc)


def could_not_check(check: str, exc: Exception) -> list[Finding]:
    return [Finding("could-not-check", check, f"the {check} check could not run on this set-up",
                    f"{type(exc).__name__}: {str(exc)[:200]}",
                    "the other checks ran; check this one by hand, and report the set-up as a doctor bug "
                    "(exit status 3 until then)")]
