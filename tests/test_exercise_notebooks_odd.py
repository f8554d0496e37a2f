"""The other half of the exercise notebooks (see test_exercise_notebooks.py): Run All with the stubs,
then the give-away probe. A second file so that pytest-xdist can run the two halves side by side."""

import pytest
from test_exercise_notebooks import EXERCISES, run_all_and_probe


@pytest.mark.parametrize("path", EXERCISES[1::2], ids=lambda p: p.name)
def test_exercise_notebook_survives_run_all_and_gives_nothing_away(path):
    run_all_and_probe(path)
