"""Tests for course_utils.capstone (lesson 08): planted failures are all found (the checker's answers and
hints: test_checkers.py)."""

import pytest

from course_utils.capstone import FAILURES, broken_setup
from course_utils.doctor import diagnose


def test_every_planted_failure_is_found_by_its_check():
    setup = broken_setup(7, planted=list(FAILURES))
    report = diagnose(str(setup.model_dir), setup.data_path, setup.config_path)
    assert setup.expected_checks <= report.checks() and report.exit_code == 1


def test_the_seed_draws_the_failures_and_bad_names_are_refused():
    drawn = {tuple(broken_setup(seed).planted) for seed in range(4)}
    assert len(drawn) > 1, "different seeds plant different failures"
    with pytest.raises(ValueError, match="unknown failure"):
        broken_setup(0, planted=["nan_everywhere"])
    with pytest.raises(ValueError, match="must be an int"):
        broken_setup("0")
