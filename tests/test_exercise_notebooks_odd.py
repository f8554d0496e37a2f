"""The other half of the exercise notebooks (see test_exercise_notebooks.py): Run All with the stubs,
then the give-away probe. A second file so that pytest-xdist can run the two halves side by side."""

import pytest
from conftest import BROWSER_EXERCISE, browser_missing
from test_exercise_notebooks import EXERCISES, run_all_and_probe, run_all_params

# Lesson 01's copy goes through the same checks in tests/test_browser.py, in a real browser, where one runs.
ODD = [p for p in EXERCISES[1::2] if browser_missing() or p.name != BROWSER_EXERCISE]


@pytest.mark.parametrize("path", run_all_params(ODD))
def test_exercise_notebook_survives_run_all_and_gives_nothing_away(path):
    run_all_and_probe(path)
