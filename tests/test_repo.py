"""Repository-level promises: one source for exercises, one package list, lint, the CI entry."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import nbformat
import pytest

from tools import make_exercises
from tools.make_exercises import BEGIN, END, STUB, strip_solutions

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def test_exercise_notebooks_are_in_sync_with_solutions():
    assert make_exercises.main(["--check"]) == 0, "run: python -m tools.make_exercises"


def test_strip_solutions_keeps_indentation_and_code_around():
    source = f"def f(x):\n    '''doc'''\n    {BEGIN}\n    return 2 * x\n    {END}\n\nprint(f)"
    assert strip_solutions(source) == f"def f(x):\n    '''doc'''\n    {STUB}\n\nprint(f)"
    with pytest.raises(ValueError, match="unbalanced"):
        strip_solutions(f"{BEGIN}\nx = 1\n")


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_each_solution_has_exercise_and_is_executed(solution):
    exercise = ROOT / "notebooks" / solution.name
    assert exercise.exists()
    nb = nbformat.read(solution, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code if c.source.strip()), "solutions ship with outputs"
    # an exercise: a fenced solution, or (the self-test) answer lines the exercise copy blanks
    answers = re.compile(r"^\s*quiz\.answer\(\d+,.*# your answer", re.MULTILINE)
    assert any(BEGIN in c.source or answers.search(c.source) for c in code), "every lesson has an exercise"
    stripped = nbformat.read(exercise, as_version=4)
    assert not any(BEGIN in c.source or c.get("outputs") for c in stripped.cells if c.cell_type == "code")
    assert nb.metadata.kernelspec.name == "python3"


def _names(requirements):
    return sorted(re.split(r"[ ;]", r.strip())[0].lower() for r in requirements)


def test_environment_yml_lists_the_same_packages_as_pyproject():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:") + 1
    pip = [line.strip()[2:] for line in lines[start:] if line.strip().startswith("- ")]
    pip = [p for p in pip if not p.startswith("--")]  # pip options (the CPU wheel index), not packages
    assert "-e ." in pip, "conda users install the course package too"
    assert _names([p for p in pip if p != "-e ."]) == _names(pyproject)


def test_torch_is_pinned_exactly():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in deps, "an unpinned torch pulls a multi-GB CUDA build"


def test_ci_runs_the_readme_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme


def test_ruff_is_clean():
    folders = ["course_utils", "tests", "solutions", "tools"]
    out = subprocess.run([sys.executable, "-m", "ruff", "check", *folders], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def test_make_lab_serves_jupyterlab(tmp_path):
    """`make lab` starts a server that serves notebooks/ and solutions/ and opens notebooks/ first."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "IPYTHONDIR": str(tmp_path / "ipy")}
    args = "--no-browser --ServerApp.token= --ServerApp.ip=127.0.0.1"
    # -o install: the venv is set up already; a test never re-runs pip
    server = subprocess.Popen(["make", "-s", "-o", "install", "lab", f"PORT={port}", f"LAB_ARGS={args}",
                               f"VENV={Path(sys.executable).parent.parent}"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline, status = time.monotonic() + 90, None
        while time.monotonic() < deadline and status is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2) as response:
                    status = response.status
            except OSError:
                time.sleep(1)
        assert status == 200, "JupyterLab did not answer on its port within 90 s"
        for folder in ("notebooks", "solutions"):  # solutions/ was "outside root" when notebooks/ was it
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/{folder}", timeout=5) as r:
                assert b"00_tour.ipynb" in r.read(), f"the server shows {folder}/"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            assert response.url.endswith("/lab/tree/notebooks"), f"opens the exercises, not {response.url}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_every_lesson_stores_a_plot_and_a_what_if_control():
    """Issue 16: each solution notebook shows at least one matplotlib figure and one "what if" control
    (viz.what_if, whose stored plain text starts with "[what if:")."""
    import json

    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        if path.name == "11_self_test.ipynb":
            continue  # the self-test shows other lessons' artefacts as text: no failure of its own to plot
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        outputs = [o for c in cells for o in c.get("outputs", [])]
        plain = ["".join(o.get("data", {}).get("text/plain", "")) for o in outputs]
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} stores no plot"
        assert any(p.startswith("[what if:") for p in plain), f"{path.name} stores no what-if control"


def test_no_stored_progress_bar_shows_a_run_stopped_half_way():
    """Issue 43: a renderer without widgets (GitHub, nbviewer) shows a bar's plain text, the bar as first
    drawn ("52% 31/60"), which reads as a crash; tools.run_solutions drops it (JupyterLab draws the final
    state)."""
    import nbformat

    from tools.run_solutions import drop_bar_snapshots

    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        assert drop_bar_snapshots(nbformat.read(path, as_version=4)) == 0, (
            f"{path.name} stores a progress bar's half-way text: python -m tools.run_solutions {path}")
