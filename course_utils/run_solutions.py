"""Execute solution notebooks in place (storing their outputs), time them, refresh the exercises.

    python -m course_utils.run_solutions                                  # every solution notebook
    python -m course_utils.run_solutions solutions/01_accumulation.ipynb  # one

Solution notebooks are committed *with* outputs, so a learner can read the results without
running anything; this is how those outputs are made. Each run is offline and seeded, and the
wall time is printed for the README's lesson table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from .make_exercises import ROOT
from .make_exercises import main as make_exercises


def execute(path: Path, timeout: int = 600) -> float:
    """Run one notebook top to bottom in a fresh kernel, save it with outputs; return seconds."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the Makefile: threads only slow a tiny model
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    # record_timing=False: no per-cell timestamps in the metadata, so a re-run only changes outputs.
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    nbformat.write(nb, path)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Execute solution notebooks in place.")
    parser.add_argument("paths", nargs="*", help="solution notebooks (default: all)")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths] or sorted((ROOT / "solutions").glob("*.ipynb"))
    for path in paths:
        seconds = execute(path)
        print(f"{path.name}: {seconds:.1f} s")
    return make_exercises([str(p) for p in paths])


if __name__ == "__main__":
    sys.exit(main())
