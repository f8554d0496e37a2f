"""The robustness runner's pieces that need no notebook run: configs, junit parsing, the table."""

import pytest

from tools import robustness
from tools.robustness import (
    Config,
    RunResult,
    failure_summary,
    failures_from_junit,
    first_failure_text,
    parse_configs,
    render_markdown,
)

QWEN, LLAMA = Config("tiny-qwen", 0, 1), Config("tiny-llama", 1, 2)


def _record(name, value, threshold, higher=True):
    margin = value - threshold if higher else threshold - value
    return {"name": name, "value": value, "threshold": threshold, "higher_is_better": higher,
            "margin": margin, "passed": margin >= 0}


FAKE = [
    RunResult("00_tour.ipynb", QWEN, True, 11.2),
    RunResult("00_tour.ipynb", LLAMA, True, 12.8),
    RunResult("02_eos.ipynb", QWEN, True, 24.0, outcomes=[_record("stop rate", 0.97, 0.9)]),
    RunResult("02_eos.ipynb", LLAMA, False, 25.0,
              failures=[("Cell 14", "AssertionError: every fixed setup stops")],
              outcomes=[_record("stop rate", 0.45, 0.9), _record("stop rate", 0.5, 0.9)]),
]


def test_the_full_matrix_is_two_models_three_seeds_two_thread_counts():
    configs = robustness.matrix()
    assert len(configs) == 12 == len(set(configs))
    assert {c.model for c in configs} == {"tiny-qwen", "tiny-llama"}
    assert {c.seed for c in configs} == {0, 1, 2} and {c.threads for c in configs} == {1, 2}


def test_ci_preset_and_explicit_configs():
    assert parse_configs("shipped") == [Config("tiny-llama", 0, 1), Config("tiny-qwen", 1, 2)]
    assert parse_configs("tiny-qwen:2:1, tiny-llama:0:2") == [Config("tiny-qwen", 2, 1),
                                                              Config("tiny-llama", 0, 2)]
    assert Config("tiny-llama", 1, 2).env() == {"COURSE_MODEL": "tiny-llama", "COURSE_SEED": "1",
                                                "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}


@pytest.mark.parametrize("spec", ["tiny-qwen:0", "tiny-qwen:a:1", "tiny-qwen:0:0", "full"])
def test_bad_configs_give_what_why_fix(spec):
    with pytest.raises(ValueError, match="MODEL:SEED:THREADS"):
        parse_configs(spec)


def test_notebook_prefixes_select_solution_notebooks():
    chosen = robustness.select_notebooks(["00", "03"])
    assert [p.name[:2] for p in chosen] == ["00", "03"] and all(p.parent.name == "solutions" for p in chosen)
    assert len(robustness.select_notebooks()) >= 8
    with pytest.raises(ValueError, match="must name a solution notebook"):
        robustness.select_notebooks(["99"])


def test_markdown_table_has_pass_fail_failures_and_margins():
    text = render_markdown(FAKE, "header line")
    assert "header line" in text
    assert "**1 of 2 configurations pass for all 2 notebooks.**" in text
    assert "| notebook | tiny-qwen s0 t1 | tiny-llama s1 t2 |" in text
    assert "| 00_tour.ipynb | pass 11 s | pass 13 s |" in text
    assert "| 02_eos.ipynb | pass 24 s | **FAIL** (1) |" in text
    assert "- 02_eos.ipynb · tiny-llama s1 t2 · Cell 14: `AssertionError: every fixed setup stops`" in text
    # every outcome: value / threshold (margin), a repeated name kept apart, the worst margin last
    assert "| stop rate | value ≥ threshold | 0.97 / 0.9 (+0.07) | 0.45 / 0.9 (-0.45) | -0.45 |" in text
    assert "| stop rate #2 | value ≥ threshold | — | 0.5 / 0.9 (-0.4) | -0.4 |" in text
    assert "00_tour.ipynb" not in text.split("## Outcome claims")[1], "no claims, no section"


def test_the_failure_summary_names_each_failed_cell_and_nothing_that_passed():
    assert failure_summary(FAKE) == ("FAIL 02_eos.ipynb · tiny-llama s1 t2 · Cell 14: "
                                     "AssertionError: every fixed setup stops")
    assert failure_summary(FAKE[:3]) == ""
    crashed = RunResult("06_nan.ipynb", QWEN, False, 900.0)  # killed before nbval reported a cell
    assert failure_summary([crashed]) == "FAIL 06_nan.ipynb · tiny-qwen s0 t1 · (run): (no message)"
    cascade = RunResult("06_nan.ipynb", QWEN, False, 40.0,
                        failures=[("Cell 2", "RuntimeError: the cause"), ("Cell 3", "NameError: x"),
                                  ("Cell 4", "NameError: y")])
    assert failure_summary([cascade]) == ("FAIL 06_nan.ipynb · tiny-qwen s0 t1 · Cell 2 (+2 more cells): "
                                          "RuntimeError: the cause")
    cascade.detail = "----> 3 x = f()\nRuntimeError: the cause"  # the first cell's traceback tail, indented
    assert failure_summary([cascade]).splitlines()[1:] == ["    ----> 3 x = f()",
                                                          "    RuntimeError: the cause"]


def test_markdown_without_outcomes_says_so():
    text = render_markdown(FAKE[:2])
    assert "**2 of 2 configurations pass" in text and "No notebook reported an outcome claim." in text
    assert "## Failures" not in text


def test_failures_are_read_from_nbvals_junit_report(tmp_path):
    report = tmp_path / "r.xml"
    # as pytest 9 + nbval 0.11 write it: ESC escaped as "#x1B", the traceback in the element text
    report.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="02.ipynb" name="Cell 3" time="1.0"/>'
        '<testcase classname="02.ipynb" name="Cell 14"><failure message="#x1B[91mNotebook cell">'
        "#x1B[31mAssertionError#x1B[39m                 Traceback (most recent call last)\n"
        "#x1B[32m----&gt; #x1B[39m assert fix_rate &gt;= 0.9\n\n"
        "#x1B[31mAssertionError#x1B[39m: every fixed setup stops\n</failure></testcase>"
        '<testcase classname="02.ipynb" name="Cell 20"><error message="boom">'
        "TypeError: unsupported operand</error></testcase></testsuite></testsuites>")
    assert failures_from_junit(report) == [("Cell 14", "AssertionError: every fixed setup stops"),
                                           ("Cell 20", "TypeError: unsupported operand")]
    assert first_failure_text(report).splitlines() == [  # the first failure's traceback, colour codes gone
        "AssertionError                 Traceback (most recent call last)", "---->  assert fix_rate >= 0.9",
        "AssertionError: every fixed setup stops"]


def test_main_rejects_mixed_selection(capsys):
    with pytest.raises(SystemExit):
        robustness.main(["--configs", "shipped", "--seeds", "0"])
    assert "--configs replaces" in capsys.readouterr().err


def test_run_one_collects_failing_cells_and_outcomes_from_a_real_kernel(tmp_path):
    """End to end on a three-cell notebook: the env reaches the kernel, outcomes and failures come back."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import os\nfrom course_utils.outcomes import report_outcome\n"
                                  "assert os.environ['COURSE_SEED'] == '2'\n"
                                  "assert os.environ['OMP_NUM_THREADS'] == '1'"),
        nbformat.v4.new_code_cell("ok = report_outcome('margin claim', 0.7, 0.5)\nassert ok, 'holds'"),
        nbformat.v4.new_code_cell("assert report_outcome('bad claim', 0.2, 0.5), 'the claim fails'"),
    ]
    path = tmp_path / "toy.ipynb"
    nbformat.write(nb, path)
    result = robustness.run_one(path, Config("tiny-llama", 2, 1), tmp_path, timeout=300)
    assert not result.passed
    assert result.failures == [("Cell 2", "AssertionError: the claim fails")]
    assert result.detail.splitlines()[-1] == "AssertionError: the claim fails"
    keys = ("name", "passed", "model", "seed", "threads", "lesson")
    seen = [tuple(o[k] for k in keys) for o in result.outcomes]
    assert seen == [("margin claim", True, "tiny-llama", 2, 1, "toy.ipynb"),
                    ("bad claim", False, "tiny-llama", 2, 1, "toy.ipynb")]


def test_thread_budget_never_runs_more_threads_than_jobs(monkeypatch):
    """Two 1-thread runs share 2 slots; a 2-thread run goes alone (oversubscription is slow)."""
    import threading
    import time

    running, peak, lock = [0], [0], threading.Lock()

    def fake_run_one(nb, config, workdir, timeout):
        with lock:
            running[0] += min(config.threads, 2)  # a 3-thread run takes every slot
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= min(config.threads, 2)
        return RunResult(nb.name, config, True, 0.05)

    monkeypatch.setattr(robustness, "run_one", fake_run_one)
    notebooks = robustness.select_notebooks(["00", "01", "02"])
    results = robustness.run_matrix(notebooks, [QWEN, LLAMA, Config("tiny-qwen", 0, 3)], jobs=2,
                                    progress=lambda line: None)
    assert peak[0] == 2 and len(results) == 9
    assert [(r.notebook[:2], r.config) for r in results][:3] == [("00", QWEN), ("01", QWEN), ("02", QWEN)]


def test_a_model_directory_makes_a_flat_report_name():
    from pathlib import Path

    from tools.robustness import run_stem

    stem = run_stem(Path("solutions/02_eos_never_stops.ipynb"), Config("/work/third model/model", 0, 1))
    assert "/" not in stem and " " not in stem and stem.startswith("02_eos_never_stops-")
    # the table's column: the folder's name, not this machine's path
    assert Config("/work/main/build/heldout-neox", 1, 2).label == "heldout-neox s1 t2"
    assert Config("tiny-qwen", 0, 1).label == "tiny-qwen s0 t1"
    with pytest.raises(ValueError, match="names one column twice"):  # two folders of one name would merge
        parse_configs("/a/model:0:1,/b/model:0:1")


def test_results_round_trip_and_update_keeps_the_other_notebooks(tmp_path):
    from tools.robustness import load_results, merge_results, save_results

    old = [RunResult(r.notebook, r.config, r.passed, r.seconds, r.failures, r.outcomes, "aaaaaaa")
           for r in FAKE]
    save_results(old, tmp_path / "R.json")
    assert load_results(tmp_path / "R.json") == old, "what --update reads back is what the matrix wrote"
    rerun = [RunResult("02_eos.ipynb", LLAMA, True, 20.0, outcomes=[_record("stop rate", 0.95, 0.9)],
                       commit="bbbbbbb")]
    merged = merge_results(old, rerun)
    assert [(r.notebook, r.config) for r in merged] == [(r.notebook, r.config) for r in old], "order kept"
    assert merged[3] is rerun[0] and merged[:3] == old[:3], "only the re-run cell changes"
    header = robustness._header(["--update", "--notebooks", "02"], merged)
    assert "Commits aaaaaaa (notebooks 00, 02); bbbbbbb (notebooks 02)" in header, "each run's commit named"
    assert "**2 of 2 configurations pass" in render_markdown(merged, header)


def test_update_needs_a_previous_matrix_and_named_notebooks(tmp_path):
    from tools.robustness import load_results

    with pytest.raises(ValueError, match="run the full matrix once"):
        load_results(tmp_path / "missing.json")
    with pytest.raises(SystemExit):
        robustness.main(["--update"])
