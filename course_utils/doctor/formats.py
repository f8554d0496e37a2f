"""The doctor's report for people and for CI: ``--format text|markdown|json|sarif``.

``text`` is ``Report.__str__`` (the terminal table), ``json`` ``Report.to_json`` (``--json`` is its short
name); ``markdown`` a table for a pull-request comment or a job summary (``>> $GITHUB_STEP_SUMMARY``);
``sarif`` SARIF 2.1.0, which code-scanning services turn into annotations on the file checked: each finding
a result whose ``ruleId`` is the check's catalogue id, its level error / warning / note, located at the data
file (or the run's trainer_state.json), and each rule carrying the catalogue's why and fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .catalogue import CHECKS
from .report import LESSONS, SEVERITIES, Report

FORMATS = ("text", "markdown", "json", "sarif")
SARIF_LEVELS = {"error": "error", "could-not-check": "warning", "warning": "warning", "info": "note"}
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def formatted(report: Report, fmt: str = "text", artifact=None) -> str:
    """``report`` in ``fmt`` (one of ``FORMATS``); ``artifact``: the file the findings are about (SARIF; or
    ``{"data": path, "run": path}``)."""
    if fmt == "json":
        return report.to_json()
    if fmt == "markdown":
        return markdown_table(report)
    if fmt == "sarif":
        return sarif(report, artifact)
    return str(report)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(report: Report) -> str:
    counts = {s: sum(f.severity == s for f in report) for s in SEVERITIES}
    head = (f"**SFT doctor:** {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} "
            f"info"
            + (f", {counts['could-not-check']} check(s) could not run" if counts["could-not-check"] else "")
            + f" — exit status {report.exit_code}")
    if not report:
        return head + "\n"
    lines = [head, "", "| severity | check | what | evidence | fix | lesson |", "|---|---|---|---|---|---|"]
    lines += [f"| {f.severity} | `{f.check}` | {_cell(f.what)} | {_cell(f.evidence)} | {_cell(f.fix)} | "
              f"{_cell(LESSONS.get(f.lesson, f.lesson))} |" for f in report]
    return "\n".join(lines) + "\n"


def sarif(report: Report, artifact=None) -> str:
    """``artifact``: the file the findings are about, or ``{"data": path, "run": path}`` (a run's findings at
    its trainer_state.json, the others at the data file). A finding that quotes row ids of a JSONL file
    (``--data FILE``: a row's id is its line - 1) points at the first one's line (``region.startLine``)."""
    used = sorted({f.check for f in report})
    rules = [{"id": check, "shortDescription": {"text": CHECKS[check].why if check in CHECKS else check},
              "help": {"text": CHECKS[check].fix if check in CHECKS else ""},
              "properties": {"lesson": CHECKS[check].lesson if check in CHECKS else ""}} for check in used]
    where = artifact if isinstance(artifact, dict) else {"data": artifact, "run": artifact}
    results = []
    for f in report:
        result = {"ruleId": f.check, "ruleIndex": used.index(f.check), "level": SARIF_LEVELS[f.severity],
                  "message": {"text": f"{f.what}. Evidence: {f.evidence}. Fix: {f.fix}"}}
        run = f.check in CHECKS and CHECKS[f.check].needs == "run"
        uri = where.get("run" if run else "data") or where.get("data") or where.get("run")
        if uri:
            location = {"artifactLocation": {"uri": str(uri)}}
            first = re.search(r"row ids\)?:? \[\[?(\d+)", f.evidence)
            if first and not run and Path(uri).is_file():
                location["region"] = {"startLine": int(first.group(1)) + 1}
            result["locations"] = [{"physicalLocation": location}]
        results.append(result)
    log = {"$schema": SARIF_SCHEMA, "version": "2.1.0",
           "runs": [{"tool": {"driver": {"name": "sft-doctor", "rules": rules}},
                     "results": results}]}
    return json.dumps(log, indent=2)
