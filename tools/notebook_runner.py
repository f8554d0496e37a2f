"""The one way the project runs a notebook: every tool and test that executes one comes through here.

Two modes, both in a fresh kernel with the course's settings (``course_env``):

- ``execute``: run the cells (nbclient) and keep the outputs — the solutions' stored outputs
  (``run_solutions``), the exercise copies' first Run All (``tests/test_exercise_notebooks.py``);
- ``nbval``: run it under pytest's nbval, comparing each cell with its stored output — the
  robustness matrix, the per-lesson report, ``make test``'s command line (``NBVAL_ARGS``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from course_utils import COURSE_DEFAULTS
from tools import ROOT

# What `make test` passes too: lax (only cells tagged nbval-check-output compare their output: a tag, so
# the learner never reads a test-harness marker), the current interpreter, the sanitizer for numbers that
# move between machines, no pytest cache files.
NBVAL_ARGS = ("--nbval-lax", "--nbval-current-env", "--nbval-sanitize-with",
              str(ROOT / "tests" / "nbval_sanitize.cfg"), "-p", "no:cacheprovider", "-q")


def course_env(**overrides: str) -> dict[str, str]:
    """This process's environment with the course's defaults where unset, one torch thread (a 0.5 M
    parameter model gains nothing from more; two on a busy 2-core machine were 10-30x slower), and
    ``overrides`` on top."""
    env = {**COURSE_DEFAULTS, "OMP_NUM_THREADS": "1", **os.environ}
    return {**env, **overrides}


def execute(notebook, *, timeout: int = 600, env: dict[str, str] | None = None,
            where: Path | None = None) -> tuple[object, float]:
    """Run every cell of ``notebook`` (a path, or an nbformat node run in place) in a fresh kernel
    whose working directory is ``where`` (default: the notebook's folder, else the repository);
    return ``(the notebook with outputs, seconds)``. Raises nbclient's ``CellExecutionError`` on an error.

    ``record_timing=False``: no per-cell timestamps, so a re-run only changes outputs.
    ``shutdown_kernel="immediate"``: the kernel is killed once the cells ran, as nbval does; a graceful
    shutdown spends ~1.3 s per notebook tearing down the libraries, checking nothing.
    """
    path = Path(notebook) if isinstance(notebook, (str, Path)) else None
    nb = nbformat.read(path, as_version=4) if path else notebook
    where = str(where or (path.parent if path else ROOT))
    start = time.perf_counter()
    # env= reaches jupyter_client's start_kernel: the kernel's environment, this process's untouched
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   shutdown_kernel="immediate", resources={"metadata": {"path": where}}
                   ).execute(env=course_env(**(env or {})))
    return nb, time.perf_counter() - start


def nbval(notebook: Path, *, env: dict[str, str] | None = None, timeout: int = 900, cell_timeout: int = 300,
          extra: tuple[str, ...] = ()) -> tuple[int, str, float]:
    """Run ``notebook`` under nbval in a subprocess; return ``(exit code, its output, seconds)``, with
    exit code -1 when it ran over ``timeout`` seconds."""
    target = notebook.relative_to(ROOT) if notebook.is_relative_to(ROOT) else notebook
    command = [sys.executable, "-m", "pytest", str(target), *NBVAL_ARGS,
               f"--nbval-cell-timeout={cell_timeout}", *extra]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, env=course_env(**(env or {})), capture_output=True,
                              text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout} s", time.perf_counter() - start
