"""The robustness matrix: every solution notebook on both shipped models, three seeds, 1 and 2 threads.

    python -m tools.robustness                  # full matrix (12 configs) -> ROBUSTNESS.md
    python -m tools.robustness --configs shipped   # a reduced matrix on the shipped models (2 configs)
    python -m tools.robustness --models tiny-llama --seeds 0 --threads 1 --notebooks 00 03
    python -m tools.robustness --configs tiny-qwen:1:2,tiny-llama:0:1 --out /tmp/r.md
    python -m tools.robustness --configs /path/to/another/model:0:1   # any COURSE_MODEL
    python -m tools.robustness --update --notebooks 01   # re-run one lesson into ROBUSTNESS.md

A lesson's claim must hold on any CPU, thread count, seed and small model (issue 12). Each
notebook × configuration runs in its own process under nbval, exactly as ``make test`` runs it
(the committed notebooks are never written), with ``COURSE_MODEL``, ``COURSE_SEED`` and
``OMP_NUM_THREADS`` set (two runs at a time, but never more threads than ``--jobs`` in all), and
``COURSE_OUTCOMES`` pointing at a file where the notebook's
``report_outcome`` calls append each outcome claim (value, threshold, margin). The table of
pass/fail and margins is built from those files, never typed: the full matrix writes it to
ROBUSTNESS.md (a subset writes only where ``--out`` says), and every run's result to ROBUSTNESS.json
beside it, so that ``--update`` can re-run the lessons a change touched (every configuration of the
table) and rewrite the table with the other lessons' results kept, each row naming the commit it ran
at. Exits 1 if any run fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.model import SHIPPED_MODELS
from course_utils.outcomes import read_outcomes
from tools import ROOT
from tools.notebook_runner import nbval

SEEDS = (0, 1, 2)
THREADS = (1, 2)
# A reduced matrix on the shipped models: the second model at seed 0; the first at seed 1 with 2 threads.
# (CI's own, `make robustness-ci`, swaps the second for a held-out model built there: issue 46.)
PRESETS = {"shipped": (("tiny-llama", 0, 1), ("tiny-qwen", 1, 2))}
DEFAULT_OUT = ROOT / "ROBUSTNESS.md"
RESULTS = ".json"  # ROBUSTNESS.md's results, machine-readable, beside it: what --update merges into


@dataclass(frozen=True)
class Config:
    """One machine-independent setting a notebook must pass under."""

    model: str
    seed: int
    threads: int

    @property
    def label(self) -> str:
        # a model built into a folder (CI's held-out one) is named by the folder, not by this machine's path
        name = Path(self.model).name if "/" in self.model else self.model
        return f"{name} s{self.seed} t{self.threads}"

    def env(self) -> dict:
        return {"COURSE_MODEL": self.model, "COURSE_SEED": str(self.seed),
                "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}


@dataclass
class RunResult:
    """What one notebook did under one configuration."""

    notebook: str
    config: Config
    passed: bool
    seconds: float
    failures: list[tuple[str, str]] = field(default_factory=list)  # (cell, last error line)
    outcomes: list[dict] = field(default_factory=list)             # report_outcome's JSON lines
    commit: str = ""                                               # the commit the run ran at
    detail: str = ""  # a failed run: the tail of its first failing cell's traceback (or of nbval's log)


def save_results(results: list[RunResult], path: Path) -> None:
    """Every run's result as JSON (what ``--update`` reads back)."""
    rows = [{**dataclasses.asdict(r), "config": dataclasses.asdict(r.config)} for r in results]
    Path(path).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def load_results(path: Path) -> list[RunResult]:
    """The results ``save_results`` wrote; a what/why/fix error when there are none to update."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist — --update merges new runs into the last full matrix's "
                         "results — run the full matrix once (make robustness) first.")
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [RunResult(**{**row, "config": Config(**row["config"]),
                         "failures": [tuple(f) for f in row["failures"]]}) for row in rows]


def merge_results(old: list[RunResult], new: list[RunResult]) -> list[RunResult]:
    """``old`` with every (notebook, configuration) that ``new`` re-ran replaced, in the old order."""
    fresh = {(r.notebook, r.config): r for r in new}
    merged = [fresh.pop((r.notebook, r.config), r) for r in old]
    return merged + list(fresh.values())


# ---------------------------------------------------------------------------------------------
# Choosing what to run
# ---------------------------------------------------------------------------------------------

def parse_configs(spec: str) -> list[Config]:
    """``"shipped"`` or ``"MODEL:SEED:THREADS,..."`` -> configurations (what/why/fix error otherwise)."""
    if spec in PRESETS:
        return [Config(*c) for c in PRESETS[spec]]
    configs = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError(
                f"--configs item {item!r} is not MODEL:SEED:THREADS — each configuration needs all "
                f"three — write e.g. tiny-llama:0:1,tiny-qwen:1:2, or a preset: {sorted(PRESETS)}."
            )
        configs.append(Config(parts[0], int(parts[1]), int(parts[2])))
    labels = [c.label for c in configs]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(
            f"--configs {spec!r} names one column twice ({twice}) — "
            "the table keys each configuration by its label, and a model folder is labelled by its last name "
            "— give each configuration another seed or thread count, or its model folder another name."
        )
    return configs


def matrix(models=None, seeds=None, threads=None) -> list[Config]:
    """The product of models × seeds × threads (each defaulting to the full course matrix)."""
    return [Config(m, s, t) for m, s, t in itertools.product(
        models or list(SHIPPED_MODELS), seeds or SEEDS, threads or THREADS)]


def select_notebooks(prefixes=None, root: Path = ROOT) -> list[Path]:
    """Solution notebooks whose file name starts with one of ``prefixes`` (all when empty)."""
    paths = sorted((root / "solutions").glob("*.ipynb"))
    if not prefixes:
        return paths
    chosen = [p for p in paths if any(p.name.startswith(prefix) for prefix in prefixes)]
    if len(chosen) < len(prefixes) or not chosen:
        raise ValueError(
            f"--notebooks {' '.join(prefixes)} matched {[p.name for p in chosen]} — each prefix must "
            f"name a solution notebook — use e.g. 00 03, from {[p.name[:2] for p in paths]}."
        )
    return chosen


# ---------------------------------------------------------------------------------------------
# Running one notebook under one configuration
# ---------------------------------------------------------------------------------------------

# Colour codes in tracebacks; pytest's junit writer escapes ESC as the text "#x1B".
_ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*[A-Za-z]")


def _last_error_line(text: str) -> str:
    """The line a reader needs from a cell's traceback: ``AssertionError: <the claim>``."""
    lines = [line.strip() for line in _ANSI.sub("", text or "").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b(?!\s+Traceback)", line)]
    return (errors or lines or ["(no message)"])[-1][:300]


def _tail(text: str, lines: int = 15) -> str:
    kept = [line.rstrip() for line in _ANSI.sub("", text or "").splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def first_failure_text(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of the first failed nbval item's traceback in a junit XML report: the
    cause, where the cells after it often fail only because it did ("" when nothing failed)."""
    for case in ET.parse(path).getroot().iter("testcase"):
        for problem in list(case.findall("failure")) + list(case.findall("error")):
            return _tail(problem.text or problem.get("message", ""), lines)
    return ""


def failures_from_junit(path: Path) -> list[tuple[str, str]]:
    """(cell, error line) for every failed or errored nbval item of a junit XML report."""
    failures = []
    for case in ET.parse(path).getroot().iter("testcase"):
        for problem in list(case.findall("failure")) + list(case.findall("error")):
            # the element text holds the whole traceback; the message attribute is cut short
            failures.append((case.get("name", "?"),
                             _last_error_line(problem.text or problem.get("message", ""))))
    return failures


def run_stem(notebook: Path, config: Config) -> str:
    """A file name for one run's reports: a model given as a directory (``/x/model``) becomes ``_x_model``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{notebook.stem}-{config.model}-s{config.seed}-t{config.threads}")


def run_one(notebook: Path, config: Config, workdir: Path, timeout: int = 900) -> RunResult:
    """Run ``notebook`` under nbval with ``config``'s environment; collect failures and outcomes."""
    stem = run_stem(notebook, config)
    junit, outcomes = workdir / f"{stem}.xml", workdir / f"{stem}.jsonl"
    env = {**config.env(), "COURSE_OUTCOMES": str(outcomes), "COURSE_NOTEBOOK": notebook.name}
    returncode, log, seconds = nbval(notebook, env=env, timeout=timeout, extra=(f"--junitxml={junit}",))
    failures = failures_from_junit(junit) if junit.exists() else []
    detail = first_failure_text(junit) if failures else ""
    if returncode != 0 and not failures:  # crashed before reporting cells (or timed out)
        failures, detail = [("(run)", _last_error_line(log))], _tail(log)
    return RunResult(notebook.name, config, returncode == 0, seconds, failures, read_outcomes(outcomes),
                     detail=detail)


class _ThreadBudget:
    """At most ``total`` torch threads running at once, so a 2-thread run never shares 2 cores.

    Oversubscribed, a tiny model's run spends its time in thread hand-offs: lesson 00 with 2
    threads beside another run took 200 s instead of ~40 s on a busy 2-core machine (measured).
    """

    def __init__(self, total: int):
        self.total, self.free = total, total
        self.condition = threading.Condition()

    @contextmanager
    def hold(self, threads: int):
        need = min(threads, self.total)
        with self.condition:
            self.condition.wait_for(lambda: self.free >= need)
            self.free -= need
        try:
            yield
        finally:
            with self.condition:
                self.free += need
                self.condition.notify_all()


def run_matrix(notebooks: list[Path], configs: list[Config], jobs: int = 2, timeout: int = 900,
               progress=print) -> list[RunResult]:
    """Every notebook × configuration, ``jobs`` processes (and ``jobs`` threads) at a time.

    Results come back in a stable order (configuration, then notebook).
    """
    tasks = [(nb, c) for c in configs for nb in notebooks]
    budget = _ThreadBudget(jobs)

    def task(nb: Path, config: Config, workdir: Path) -> RunResult:
        with budget.hold(config.threads):
            return run_one(nb, config, workdir, timeout)

    results = {}
    with tempfile.TemporaryDirectory(prefix="robustness-") as tmp, ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(task, nb, c, Path(tmp)): i for i, (nb, c) in enumerate(tasks)}
        for done, future in enumerate(as_completed(futures), 1):
            result = results[futures[future]] = future.result()
            verdict = "pass" if result.passed else f"FAIL ({len(result.failures)} cells)"
            progress(f"[{done}/{len(tasks)}] {result.notebook} · {result.config.label}: {verdict} "
                     f"({result.seconds:.0f} s)")
    return [results[i] for i in range(len(tasks))]


# ---------------------------------------------------------------------------------------------
# The table (markdown, also printed)
# ---------------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{x:.3g}" if x == x else "nan"


def _claims(results: list[RunResult]) -> dict[str, dict[str, dict[str, dict]]]:
    """notebook -> claim name -> config label -> record (repeated names get #2, #3 in one run)."""
    table: dict = {}
    for result in results:
        seen: dict[str, int] = {}
        for record in result.outcomes:
            seen[record["name"]] = seen.get(record["name"], 0) + 1
            name = record["name"] + (f" #{seen[record['name']]}" if seen[record["name"]] > 1 else "")
            table.setdefault(result.notebook, {}).setdefault(name, {})[result.config.label] = record
    return table


def render_markdown(results: list[RunResult], header: str = "") -> str:
    """Lesson × configuration pass/fail, the failing cells, and every outcome claim with its margin."""
    notebooks = list(dict.fromkeys(r.notebook for r in results))
    labels = list(dict.fromkeys(r.config.label for r in results))
    by_key = {(r.notebook, r.config.label): r for r in results}
    configs_passing = sum(all(by_key[(nb, label)].passed for nb in notebooks if (nb, label) in by_key)
                          for label in labels)
    lines = ["# Robustness matrix", "", header.strip(), "",
             f"**{configs_passing} of {len(labels)} configurations pass for all {len(notebooks)} "
             f"notebooks.** Columns: model · COURSE_SEED (s) · OMP_NUM_THREADS (t); cells: result "
             "and wall time of the notebook's nbval run.", "",
             "| notebook | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for nb in notebooks:
        cells = []
        for label in labels:
            r = by_key.get((nb, label))
            cells.append("—" if r is None else
                         f"pass {r.seconds:.0f} s" if r.passed else f"**FAIL** ({len(r.failures)})")
        lines.append(f"| {nb} | " + " | ".join(cells) + " |")
    failed = [r for r in results if not r.passed]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            for cell, message in r.failures:
                lines.append(f"- {r.notebook} · {r.config.label} · {cell}: `{message}`")
    claims = _claims(results)
    lines += ["", "## Outcome claims", "",
              "Each cell: measured value / threshold (margin; negative = the claim failed). Margins come "
              "from `report_outcome` in the notebook; exact claims are plain asserts and appear only "
              "as pass/fail above."]
    if not claims:
        lines += ["", "No notebook reported an outcome claim."]
    for nb, named in claims.items():
        lines += ["", f"### {nb}", "", "| claim | pass if | " + " | ".join(labels) + " | smallest margin |",
                  "|---|---|" + "---|" * (len(labels) + 1)]
        for name, per_config in named.items():
            side = "≥" if next(iter(per_config.values()))["higher_is_better"] else "≤"
            cells = [(f"{_fmt(rec['value'])} / {_fmt(rec['threshold'])} ({rec['margin']:+.3g})"
                      if (rec := per_config.get(label)) else "—") for label in labels]
            margins = [rec["margin"] for rec in per_config.values()]
            smallest = min(margins, key=lambda m: (m == m, m))  # a NaN margin is the worst
            lines.append(f"| {name} | value {side} threshold | " + " | ".join(cells)
                         + f" | {smallest:+.3g} |")
    return "\n".join(lines) + "\n"


def failure_summary(results: list[RunResult]) -> str:
    """One line per failed run, its first failing cell (the cause; the cells after it often fail only
    because it did): printed last, so that the tail of a CI log, which may be all a reviewer is shown,
    names what failed and not only the outcome tables of the runs that passed."""
    lines = []
    for r in results:
        if not r.passed:
            cell, message = (r.failures or [("(run)", "(no message)")])[0]
            more = f" (+{len(r.failures) - 1} more cells)" if len(r.failures) > 1 else ""
            lines.append(f"FAIL {r.notebook} · {r.config.label} · {cell}{more}: {message}")
            lines += [f"    {line}" for line in r.detail.splitlines()]
    return "\n".join(lines)


def _header(argv: list[str], results: list[RunResult]) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    command = " ".join(["python -m tools.robustness", *argv])
    total = sum(r.seconds for r in results)
    by_commit: dict[str, list[str]] = {}
    for r in results:
        names = by_commit.setdefault(r.commit or "unknown", [])
        if r.notebook[:2] not in names:
            names.append(r.notebook[:2])
    commits = ("Commit " + next(iter(by_commit)) if len(by_commit) == 1 else
               "Commits " + "; ".join(f"{c} (notebooks {', '.join(n)})" for c, n in by_commit.items()))
    return (f"Generated by `{command}` (see `make robustness`) — do not edit by hand. {commits}, "
            f"{datetime.date.today().isoformat()}, {cpu}, {os.cpu_count()} CPUs; "
            f"{total / 60:.1f} min of notebook runs in all.")


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "unknown"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(SHIPPED_MODELS), help="default: both")
    parser.add_argument("--seeds", nargs="+", type=int, help=f"default: {' '.join(map(str, SEEDS))}")
    parser.add_argument("--threads", nargs="+", type=int, help=f"default: {' '.join(map(str, THREADS))}")
    parser.add_argument("--configs", help=f"a preset ({', '.join(PRESETS)}) or MODEL:SEED:THREADS,... "
                        "instead of --models/--seeds/--threads; MODEL may be any COURSE_MODEL value, "
                        "e.g. a saved model's directory")
    parser.add_argument("--notebooks", nargs="+", help="file-name prefixes, e.g. 00 03 (default: all)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="processes, and torch threads in all, at a time (default 2)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per notebook run")
    parser.add_argument("--out", type=Path, help="markdown file to write (default: ROBUSTNESS.md for the "
                        "full matrix, none for a subset)")
    parser.add_argument("--update", action="store_true",
                        help="re-run --notebooks under every configuration of ROBUSTNESS.json (or --configs) "
                        "and rewrite ROBUSTNESS.md with the other notebooks' last results kept")
    args = parser.parse_args(argv)
    try:
        if args.jobs < 1:
            raise ValueError(f"--jobs {args.jobs} runs nothing — it is how many processes run at once — "
                             "pass 1 or more (2 on a 2-core machine).")
        if args.configs and (args.models or args.seeds or args.threads):
            raise ValueError("--configs replaces --models/--seeds/--threads — they would contradict — "
                             "give one or the other.")
        out = args.out or DEFAULT_OUT
        previous = None
        if args.update:
            if not args.notebooks:
                raise ValueError("--update re-runs only the notebooks a change touched — without "
                                 "--notebooks it would be the full matrix — name them: --notebooks 01 07.")
            previous = load_results(Path(out).with_suffix(RESULTS))
        if args.configs:
            configs = parse_configs(args.configs)
        elif previous is not None and not (args.models or args.seeds or args.threads):
            configs = list(dict.fromkeys(r.config for r in previous))  # the table's own columns
        else:
            configs = matrix(args.models, args.seeds, args.threads)
        notebooks = select_notebooks(args.notebooks)
    except ValueError as exc:
        parser.error(str(exc))
    full = not (args.configs or args.models or args.seeds or args.threads or args.notebooks)
    if not (full or args.update or args.out):
        out = None  # a subset only prints its table, unless told where to write it
    print(f"{len(notebooks)} notebooks × {len(configs)} configurations, {args.jobs} at a time", flush=True)
    results = run_matrix(notebooks, configs, jobs=args.jobs, timeout=args.timeout,
                         progress=lambda line: print(line, flush=True))
    commit = _commit()
    for r in results:
        r.commit = commit
    table = merge_results(previous, results) if previous is not None else results
    text = render_markdown(table, _header(argv, table))
    print("\n" + text)
    if out is not None:
        Path(out).write_text(text, encoding="utf-8")
        save_results(table, Path(out).with_suffix(RESULTS))
        print(f"wrote {out} and {Path(out).with_suffix(RESULTS).name}")
    if summary := failure_summary(results):
        print("\n" + summary, flush=True)
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
