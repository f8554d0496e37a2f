"""How fast the SFT doctor checks a practitioner's dataset, and in how much memory (issue 31, item 5).

    python -m tools.doctor_benchmark                 # 1k, 10k, 100k rows; sampled and --all
    python -m tools.doctor_benchmark --rows 1000 10000 --all-up-to 10000
    python -m tools.doctor_benchmark --start      # issue 49: cold start on 50 rows; --all on 4,000 vs TRL
    python -m tools.doctor_benchmark --start --peer "trainproof check {data}"   # and a peer tool, cold

Writes JSONL files of chats of realistic length (a system prompt, a user turn with context and an
answer: ~300-700 tokens each on the course tokenizer), then runs ``python -m course_utils.doctor`` on each
in a fresh process, once with the default sample (2,000 rows) and once with ``--all`` (every row; only
up to ``--all-up-to`` rows), and prints wall time, rows checked per second and the process's peak
resident memory. ``--start`` (issue 49) times instead, in one run: the cold command on a 50-row case (the
data checks alone, ``--data``, and the whole set-up, ``--model --data``), each ``--peer`` command on the
same file (``{data}``: its path), and ``--all`` on 4,000 rows against TRL's own preparation of the same rows
(a fresh process that builds the ``SFTTrainer`` — import, model, tokenizer, ``_prepare_dataset`` — and
stops before the first step, what ``trl sft`` spends before training). A benchmark, not a test: the
figures depend on the machine (the README quotes them with the machine they came from).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import ROOT

WORDS = ("the model reads every token of the prompt and learns to answer what was asked with care and "
         "without repeating the question a training run can fail in many quiet ways").split()


def write_rows(path: Path, n: int, seed: int = 0) -> None:
    """``n`` chats of realistic length (lengths drawn per row), one JSON object per line."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n):
            context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 400)))
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 250)))
            row = {"messages": [{"role": "system", "content": "You are a careful assistant."},
                                {"role": "user", "content": f"Question {i}: {context}"},
                                {"role": "assistant", "content": answer}]}
            handle.write(json.dumps(row) + "\n")


# The doctor's own process reports its peak resident memory as it exits (ru_maxrss: KB on Linux), from an
# exit handler: after a whole set-up the command ends in os._exit, which runs those handlers only
WRAPPER = ("import atexit, resource, runpy, sys\n"
           "atexit.register(lambda: print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
           "file=sys.stderr, flush=True))\n"
           "runpy.run_module('course_utils.doctor', run_name='__main__')")


def run_doctor(data: Path, config: Path, every_row: bool) -> dict:
    """One doctor process on ``data``: wall seconds, its peak resident memory (MB), its exit status."""
    command = [sys.executable, "-c", WRAPPER, "--model", "tiny-qwen", "--data", str(data),
               "--config", str(config), "--json", *(["--all"] if every_row else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"the doctor exited {done.returncode}: {done.stderr[-800:]}")
    peak_kb = int(done.stderr.rsplit("PEAK_KB", 1)[1].split()[0])
    return {"seconds": seconds, "peak_mb": peak_kb / 1024, "exit": done.returncode}


# TRL's own preparation of the rows, as `trl sft` does it before its first step, in a fresh process
TRL_PREPARES = """
import json, sys
from datasets import load_dataset
from trl import SFTConfig, SFTTrainer
from course_utils import load_course_model, use_course_defaults
use_course_defaults()
model, tokenizer = load_course_model()
config = {**json.load(open(sys.argv[2])), "output_dir": sys.argv[3], "report_to": "none", "use_cpu": True,
          "bf16": False}
rows = load_dataset("json", data_files=sys.argv[1])["train"]
SFTTrainer(model, args=SFTConfig(**config), train_dataset=rows, processing_class=tokenizer)
"""


def timed(command: list[str], repeat: int = 1, any_exit: bool = False, **env_changes: str) -> float:
    """The fastest of ``repeat`` wall times of ``command`` in a fresh process (exit 0 or 1 expected; a peer
    tool, ``any_exit``, may exit with its own codes: a finding is not a failure of the timing)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **env_changes}
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
        best = min(best, time.perf_counter() - start)
        if done.returncode not in (0, 1) and not any_exit:
            raise SystemExit(f"{command[:4]}... exited {done.returncode}: {done.stderr[-800:]}")
    return best


START_TARGET = 1.5  # issue 49: the data checks' cold start, at most this many times the fastest peer's


def start_benchmark(tmp: Path, config: Path, peers: list[str], repeat: int) -> None:
    """Issue 49's figures, in one run on one machine: cold starts on 50 rows, --all on 4,000 vs TRL."""
    import shlex

    small, large = tmp / "rows_50.jsonl", tmp / "rows_4000.jsonl"
    write_rows(small, 50)
    write_rows(large, 4000)
    doctor = [sys.executable, "-m", "course_utils.doctor"]
    rows = [("doctor --data (data checks, no model)", timed([*doctor, "--data", str(small)], repeat)),
            ("doctor --model --data (whole set-up)",
             timed([*doctor, "--model", "tiny-qwen", "--data", str(small), "--config", str(config)], repeat))]
    rows += [(f"peer: {peer}", timed(shlex.split(peer.format(data=small)), repeat, any_exit=True))
             for peer in peers]
    print(f"cold start on 50 rows (best of {repeat}):")
    for name, seconds in rows:
        print(f"  {name:<48} {seconds:>6.2f} s")
    if peers:
        fastest = min(seconds for name, seconds in rows if name.startswith("peer"))
        ratio = rows[0][1] / fastest
        print(f"  doctor --data / fastest peer: {ratio:.2f}x — target <= {START_TARGET}x: "
              f"{'PASS' if ratio <= START_TARGET else 'FAIL'}")
    else:
        print(f"  no --peer given: the cold-start target (<= {START_TARGET}x the fastest peer) is not "
              "checked")
    every = timed([*doctor, "--model", "tiny-qwen", "--data", str(large), "--config", str(config), "--all"])
    # datasets' cache of TRL's rows in the run's temporary folder: in the user's cache each run left ~100 MB
    trl = timed([sys.executable, "-c", TRL_PREPARES, str(large), str(config), str(tmp / "trl-out")],
                HF_DATASETS_CACHE=str(tmp / "hf-datasets"))
    print(f"4,000 rows: doctor --all {every:.1f} s, TRL's own preparation {trl:.1f} s "
          f"(doctor / TRL = {every / trl:.2f}x) — target <= 1x: {'PASS' if every <= trl else 'FAIL'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.doctor_benchmark",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--all-up-to", type=int, default=100_000, help="largest file also checked with --all")
    parser.add_argument("--start", action="store_true", help="issue 49: cold start (50 rows) and --all on "
                        "4,000 rows against TRL's own preparation, instead of the table by size")
    parser.add_argument("--peer", action="append", default=[], help="with --start: a peer tool's command to "
                        "time cold on the same 50 rows, {data} standing for the file (repeatable)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="with --start: cold runs per command (the fastest is kept)")
    args = parser.parse_args(argv)
    if args.start:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "config.json"
            config.write_text(json.dumps({"assistant_only_loss": True, "eos_token": "<|im_end|>",
                                          "learning_rate": 2e-5, "max_length": 1024}))
            start_benchmark(Path(tmp), config, args.peer, args.repeat)
        return 0
    print(f"{'rows':>8} {'mode':>14} {'seconds':>8} {'rows/s':>8} {'peak MB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps({"assistant_only_loss": True, "eos_token": "<|im_end|>",
                                      "learning_rate": 2e-5, "max_length": 1024}))
        for n in args.rows:
            data = Path(tmp) / f"rows_{n}.jsonl"
            write_rows(data, n)
            for every_row in (False, True):
                if every_row and n > args.all_up_to:
                    continue
                result = run_doctor(data, config, every_row)
                checked = n if every_row else min(n, 2000)
                mode = "--all" if every_row else f"sample {checked}"
                print(f"{n:>8} {mode:>14} {result['seconds']:>8.1f} {n / result['seconds']:>8.0f} "
                      f"{result['peak_mb']:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
