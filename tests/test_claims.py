"""The claims table re-measures itself: a verdict that moves fails here, naming the claim.

``test_committed_verdicts_hold`` runs every claim of ``tools.claims`` on the current
``COURSE_MODEL`` (~15 s of CPU) and compares with CLAIMS.json; the other tests check that the
comparison names the claim and that the committed table and the registry agree.
"""

from __future__ import annotations

import json

import pytest

from course_utils.model import SHIPPED_MODELS, course_model_name
from tools import claims


@pytest.fixture(scope="module")
def measured():
    return claims.run_all()


@pytest.mark.slow  # runs every claim (~15 s of CPU): `make test-slow` and CI
def test_committed_verdicts_hold(measured):
    expected = claims.committed_verdicts(course_model_name())
    if expected is None:
        pytest.skip(f"CLAIMS.json has no verdicts for {course_model_name()} (not a shipped model)")
    errors = [
        f"claim {r['number']} ({r['key']}) could not run: {r['numbers']}"
        for r in measured
        if r["verdict"] == "error"
    ]
    assert not errors, "\n".join(errors)
    changes = claims.verdict_changes(measured, expected)
    assert not changes, "\n".join(changes)


@pytest.mark.slow  # runs every claim (~15 s of CPU): `make test-slow` and CI
def test_every_claim_states_condition_and_numbers(measured):
    for row in measured:
        assert row["condition"], f"claim {row['number']} ({row['key']}) states no condition"
        assert row["numbers"], f"claim {row['number']} ({row['key']}) reports no measured number"
        assert row["lesson"], f"claim {row['number']} ({row['key']}) names no lesson"


@pytest.mark.slow  # runs every claim (~15 s of CPU): `make test-slow` and CI
def test_a_changed_verdict_fails_naming_the_claim(measured):
    row = next(r for r in measured if r["key"] == "one_empty_batch_nan_for_good")
    committed = {r["key"]: r["verdict"] for r in measured}
    committed[row["key"]] = "true"  # as if an older torch had let one empty batch poison the weights
    changes = claims.verdict_changes(measured, committed)
    assert len(changes) == 1
    assert "claim 2 (one_empty_batch_nan_for_good" in changes[0]
    assert "committed 'true', measured 'depends'" in changes[0]
    assert "lesson 05" in changes[0]


def test_a_claim_missing_from_the_table_is_reported():
    rows = [
        {"number": 99, "key": "new_claim", "claim": "x", "verdict": "true", "numbers": {}, "lesson": "00"}
    ]
    (message,) = claims.verdict_changes(rows, {})
    assert "claim 99 (new_claim) is not in the committed table" in message


def test_a_claim_that_raises_becomes_an_error_row():
    def broken(ctx):
        raise RuntimeError("library moved")

    row = claims.run_claim(claims.Claim(98, "broken", "text", "00", broken), ctx=None)
    assert row["verdict"] == "error" and "library moved" in row["numbers"]["error"]
    (message,) = claims.verdict_changes([row], {"broken": "true"})
    assert "claim 98 (broken" in message and "measured 'error'" in message


def test_an_unknown_verdict_is_rejected():
    row = claims.run_claim(
        claims.Claim(97, "odd", "text", "00", lambda ctx: claims.Result("maybe", {"x": 1}, "c")), ctx=None
    )
    assert row["verdict"] == "error" and "maybe" in row["numbers"]["error"]


def test_committed_table_covers_every_claim_on_both_shipped_models():
    data = json.loads(claims.TABLE_JSON.read_text())
    keys = {c.key for c in claims.CLAIMS}
    assert len(keys) == len(claims.CLAIMS), "two claims share a key"
    assert len({c.number for c in claims.CLAIMS}) == len(claims.CLAIMS), "two claims share a number"
    for name in SHIPPED_MODELS:
        assert set(data["verdicts"][name]) == keys, f"CLAIMS.json's {name} table differs from the registry"
        assert "error" not in data["verdicts"][name].values(), f"a claim could not run on {name}"
    md = claims.TABLE_MD.read_text()
    assert md == claims.render_markdown(data), "CLAIMS.md is stale: run `python -m tools.claims`"
