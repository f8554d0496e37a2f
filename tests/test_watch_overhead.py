"""tools/watch_overhead.py, the benchmark of SFTWatch's cost per step: maintainer tooling, so its tests live
apart from the watch's unit tests (which also run against the installed wheel, where tools/ is absent)."""

import re

import pytest

from tools import watch_overhead


@pytest.mark.slow
def test_the_overhead_benchmark_runs_and_prints(capsys):
    """It prints step times with and without the watch: a benchmark, not a gate."""
    assert watch_overhead.main(["--runs", "1", "--steps", "6", "--warmup", "2"]) == 0
    printed = capsys.readouterr().out
    for clock in ("cpu", "wall", "own"):
        for arm in watch_overhead.ARMS:
            row = rf"^{clock}\s+{re.escape(arm)}(\s+[\d.]+){{4}}$"
            assert re.search(row, printed, re.M), printed


def test_the_overhead_benchmark_refuses_a_run_with_nothing_to_time():
    with pytest.raises(SystemExit) as caught:
        watch_overhead.main(["--steps", "3", "--warmup", "5"])
    assert caught.value.code == 2
