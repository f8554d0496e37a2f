"""The doctor's catalogue and CI formats (issue 49): every id a check can report is catalogued with its why,
fix and lesson; docs/doctor_checks.md is current; ``--ignore`` and ``--format`` work and reject bad input."""

import ast
import json
from pathlib import Path

import pytest

from course_utils.doctor.__main__ import main
from course_utils.doctor.catalogue import CHECKS, NEEDS, table
from course_utils.doctor.formats import formatted
from course_utils.doctor.report import LESSONS, Finding, Report

ROOT = Path(__file__).resolve().parents[1]


def reported_ids() -> set[str]:
    """Every check id written in the code: ``Finding(severity, ID, ...)``, ``guarded(ID, ...)``,
    ``could_not_check(ID, ...)`` and ``Verdict(ID, ...)`` with a literal id."""
    positions = {"Finding": 1, "guarded": 0, "could_not_check": 0, "Verdict": 0}
    found = set()
    for path in [*(ROOT / "course_utils" / "doctor").glob("*.py"), ROOT / "course_utils" / "run_rules.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                at = positions.get(name)
                if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant) \
                        and isinstance(node.args[at].value, str):
                    found.add(node.args[at].value)
    return found


def test_every_reported_id_is_in_the_catalogue_and_nothing_else():
    ids = reported_ids()
    assert len(ids) > 50, ids
    assert ids - set(CHECKS) == set(), f"checks missing from catalogue.py: {sorted(ids - set(CHECKS))}"
    assert set(CHECKS) - ids == set(), f"catalogued ids nothing reports: {sorted(set(CHECKS) - ids)}"


def test_each_entry_has_a_why_a_fix_and_a_lesson():
    for check in CHECKS.values():
        assert check.needs in NEEDS and check.lesson in LESSONS, check
        assert len(check.why) > 20 and len(check.fix) > 10, check


def test_the_catalogue_page_is_current():
    page = (ROOT / "docs" / "doctor_checks.md").read_text(encoding="utf-8")
    assert page == table("markdown").rstrip("\n") + "\n", (
        "docs/doctor_checks.md is stale: regenerate it with "
        "python -m course_utils.doctor --list-checks --format markdown > docs/doctor_checks.md")


def test_list_checks_in_each_format(capsys):
    assert main(["--list-checks"]) == 0
    out = capsys.readouterr().out
    assert all(check in out for check in CHECKS)
    assert main(["--list-checks", "--format", "json"]) == 0
    assert {c["id"] for c in json.loads(capsys.readouterr().out)} == set(CHECKS)
    assert main(["--list-checks", "--format", "sarif"]) == 2


@pytest.mark.parametrize("argv, says", [
    (["--run", "x", "--ignore", "run-clip"], "did you mean 'run-clipping'"),
    (["--ignore", "run-clipping"], "nothing to check"),
])
def test_bad_ignore_and_nothing_to_check_are_bad_input(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


REPORT = Report([Finding("error", "sharegpt-roles", "3 rows use | pipes", "row ids [1]", "map roles", "04"),
                 Finding("warning", "duplicate-rows", "2 copies", "groups [[1, 2]]", "deduplicate", "08"),
                 Finding("info", "data-only", "only data", "no model", "add --model", "08")])


def test_sarif_is_2_1_0_with_a_rule_per_check_and_levels():
    log = json.loads(formatted(REPORT, "sarif", "train.jsonl"))
    assert log["version"] == "2.1.0" and "sarif-2.1.0" in log["$schema"]
    run = log["runs"][0]
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert [r["level"] for r in run["results"]] == ["error", "warning", "note"]
    for result in run["results"]:
        assert rules[result["ruleIndex"]] == result["ruleId"]
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.jsonl"
    assert run["tool"]["driver"]["rules"][rules.index("sharegpt-roles")]["help"]["text"] == \
        CHECKS["sharegpt-roles"].fix


def test_markdown_is_a_table_that_escapes_pipes():
    text = formatted(REPORT, "markdown")
    assert text.startswith("**SFT doctor:** 1 error(s)") and "exit status 1" in text
    assert "3 rows use \\| pipes" in text and text.count("\n| ") == 4


def test_sarif_points_at_the_first_quoted_rows_line_and_a_runs_state_file(tmp_path, capsys):
    """Issue 49: a data finding quoting row ids gets region.startLine (a row's id is its line - 1 in
    --data FILE); --run findings point at the trainer_state.json the autopsy read, not the directory."""
    rows = [{"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "gpt", "content": f"A{i}"}]}
            for i in range(4)]
    data = tmp_path / "d.jsonl"
    data.write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))  # a blank first line
    run = tmp_path / "run" / "checkpoint-4"
    run.mkdir(parents=True)
    log = [{"step": s, "loss": float("nan"), "grad_norm": 1.0, "learning_rate": 1e-5} for s in range(1, 5)]
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": log}))
    assert main(["--data", str(data), "--run", str(tmp_path / "run"), "--format", "sarif"]) == 1
    results = {r["ruleId"]: r["locations"][0]["physicalLocation"]
               for r in json.loads(capsys.readouterr().out)["runs"][0]["results"]}
    assert results["sharegpt-roles"] == {"artifactLocation": {"uri": str(data)}, "region": {"startLine": 2}}
    assert results["run-nonfinite"] == {"artifactLocation": {"uri": str(run / "trainer_state.json")}}
