"""Execute solution notebooks in place (storing their outputs), time them, refresh the exercises.

    python -m tools.run_solutions                                  # every solution notebook
    python -m tools.run_solutions solutions/01_accumulation.ipynb  # one
    python -m tools.run_solutions --no-save --timings INSTRUCTORS.md   # measure, write the table

Solution notebooks are committed *with* outputs, so a learner can read the results without
running anything; this is how those outputs are made. Each run is offline and seeded, and the
wall time is printed for the README's lesson table.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError

from tools import ROOT, notebook_runner
from tools.make_exercises import main as make_exercises

# The generated table sits between these lines (INSTRUCTORS.md): never typed by hand.
TABLE_BEGIN = "<!-- timings:begin (python -m tools.run_solutions --no-save --timings FILE) -->"
TABLE_END = "<!-- timings:end -->"


# A tqdm bar's stored plain text, e.g. "SFTTrainer:  52%|#####1    | 31/60 [00:02<00:01, 15.19step/s]"
BAR_TEXT = re.compile(r"^[^\n]*:\s*\d+%\|[^\n]*\|\s*\d+/\d+")


def drop_bar_snapshots(nb) -> int:
    """Drop the plain-text fallback of every progress-bar widget ``nb`` stores; return how many. That text is
    the bar when it was first drawn ("52% 31/60"): JupyterLab draws the widget's final state instead, but a
    renderer without widgets (GitHub, nbviewer) would show a run stopped half-way."""
    dropped = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            widget = "application/vnd.jupyter.widget-view+json" in data
            if widget and BAR_TEXT.match(data.get("text/plain", "")):
                del data["text/plain"]
                dropped += 1
    return dropped


def execute(path: Path, timeout: int = 600, save: bool = True) -> float:
    """Run one notebook top to bottom in a fresh kernel, save it with outputs (unless not ``save``; progress
    bars without their half-way text, ``drop_bar_snapshots``); return seconds (kernel start to last cell: a
    learner's time)."""
    nb, seconds = notebook_runner.execute(path, timeout=timeout)
    if save:
        drop_bar_snapshots(nb)
        nbformat.write(nb, path)
    return seconds


def machine() -> str:
    """One line naming where the times were measured: CPU, cores, torch threads, load, date."""
    cpu = platform.processor() or platform.machine()
    try:
        names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = names[0].strip() if names else cpu
    except OSError:
        pass
    load = f", load average {os.getloadavg()[0]:.1f} at the start" if hasattr(os, "getloadavg") else ""
    return (f"{cpu}, {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
            f"{load}, Python {platform.python_version()}, {datetime.date.today().isoformat()}")


def timings_table(times: dict[str, tuple[float, str]], where: str) -> str:
    """The Markdown table of measured wall times (kernel start included), with where they were measured.

    ``times``: ``{notebook: (seconds, note)}``; the note says when a run stopped at an error.
    """
    rows = [f"| `{name}` | {seconds:.1f} | {note} |" for name, (seconds, note) in times.items()]
    total = sum(seconds for seconds, _ in times.values())
    return "\n".join([f"Measured on: {where}.", "", "| notebook | run time (s) | note |", "|---|---|---|",
                      *rows, f"| **total** | **{total:.0f}** | |"])


def write_table(text: str, table: str) -> str:
    """``text`` with the part between the timing markers replaced by ``table``."""
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise ValueError(f"no timing markers in the file — the table goes between {TABLE_BEGIN!r} and "
                         f"{TABLE_END!r} — add both lines where the table belongs.")
    head, rest = text.split(TABLE_BEGIN, 1)
    return f"{head}{TABLE_BEGIN}\n{table}\n{TABLE_END}{rest.split(TABLE_END, 1)[1]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Execute solution notebooks in place.")
    parser.add_argument("paths", nargs="*", help="solution notebooks (default: all)")
    parser.add_argument("--no-save", action="store_true", help="only time them; leave the files as they are")
    parser.add_argument("--timings", metavar="FILE", type=Path,
                        help="write the table of times into FILE, between its timing markers")
    args = parser.parse_args(argv)
    paths = [Path(p).resolve() for p in args.paths] or sorted((ROOT / "solutions").glob("*.ipynb"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what every kernel gets: the header says so
    where, times = machine(), {}
    for path in paths:
        start, note = time.perf_counter(), ""
        # exercise copies (notebooks/) are generated from the solutions: timed, never stored with outputs
        save = not args.no_save and path.parent.name != "notebooks"
        try:
            seconds = execute(path, save=save)
        except CellExecutionError as exc:
            if save:
                raise  # never store the outputs of a broken run
            seconds, note = time.perf_counter() - start, f"stopped at an error: {exc.ename}"
        times[f"{path.parent.name}/{path.name}"] = (seconds, note)
        print(f"{path.name}: {seconds:.1f} s {note}".rstrip())
    if args.timings:
        args.timings.write_text(write_table(args.timings.read_text(encoding="utf-8"),
                                            timings_table(times, where)), encoding="utf-8")
        print(f"wrote the table into {args.timings}")
    solutions = [str(p) for p in paths if p.parent.name != "notebooks"]
    return 0 if args.no_save or not solutions else make_exercises(solutions)


if __name__ == "__main__":
    sys.exit(main())
