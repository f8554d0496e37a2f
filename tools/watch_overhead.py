"""How much ``SFTWatch`` slows a training step: the course model, with and without the watch.

    OMP_NUM_THREADS=1 python -m tools.watch_overhead                  # 5 runs of 30 steps per arm
    OMP_NUM_THREADS=1 python -m tools.watch_overhead --runs 9 --steps 60

A benchmark that prints, not a gate: time depends on the machine and on what else it runs. Each run is
a real ``make_sft_trainer`` run (batch 8, fp32); a callback notes the time at every step's end, the
first ``--warmup`` steps are dropped, and a run's figure is its median step time, in the process's CPU
time (``cpu``, ``time.process_time``: a neighbour's load moves it less; run with one thread) and in
wall-clock time (``wall``). The arms take turns, each round in a rotated order, so that a busy
neighbour or the process's own history slows all of them alike; the table shows the min and the median
over runs, and the ratio to the run without the watch. A third figure hardly depends on the
neighbours: ``own``, the CPU time spent inside the watch's hooks and callbacks per step, as a share of
the cpu step without it (it leaves out the cost of PyTorch calling a hook at all).
The figures are quoted in ``course_utils/watch.py``'s docstring.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from transformers import TrainerCallback

from course_utils import load_course_model, make_chat_dataset, make_sft_trainer
from course_utils.quiet import quiet_libraries
from course_utils.watch import SFTWatch

ARMS = {"no watch": None, "SFTWatch()": {}, "SFTWatch(locate=False)": {"locate": False}}


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


class StepClock(TrainerCallback):
    """Every clock at every step's end: the differences are the step times, callbacks included."""

    def __init__(self, clocks: dict):
        self.clocks = clocks
        self.ends: dict[str, list[float]] = {name: [] for name in clocks}

    def on_step_end(self, args, state, control, **kwargs):
        for name, clock in self.clocks.items():
            self.ends[name].append(clock())


def timed(function, spent: list):
    def wrapper(*args, **kwargs):
        start = time.thread_time()  # CPU time of this thread: a neighbour's load does not count
        try:
            return function(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - start
    return wrapper


def timed_watch(**kwargs) -> tuple[SFTWatch, list]:
    """An SFTWatch whose every hook and per-step callback adds its CPU time to ``spent[0]``."""
    watch, spent = SFTWatch(**kwargs), [0.0]
    for name in ("_count_graded", "_output_hook", "_gradients_hook", "on_step_begin", "on_pre_optimizer_step",
                 "on_optimizer_step", "on_step_end", "on_substep_end", "on_log"):
        setattr(watch, name, timed(getattr(watch, name), spent))
    for name in ("_forward_hook", "_order_hook"):  # factories of per-module / per-parameter hooks
        factory = getattr(watch, name)
        setattr(watch, name, lambda key, factory=factory: timed(factory(key), spent))
    return watch, spent


def step_time(watch_kwargs: dict | None, steps: int, warmup: int) -> dict[str, float]:
    """Median seconds per optimizer step of one course-model run, per clock (first ``warmup`` dropped),
    and ``own``: the median seconds per step spent inside the watch."""
    model, tok = load_course_model()
    trainer = make_sft_trainer(model, tok, make_chat_dataset(n=8 * steps), max_steps=steps, progress=False)
    watch, spent = timed_watch(**watch_kwargs) if watch_kwargs is not None else (None, [0.0])
    clock = StepClock({**CLOCKS, "own": lambda: spent[0]})
    trainer.add_callback(clock)  # before the watch: a step's end is stamped after the watch's work
    if watch is not None:
        trainer.add_callback(watch)
    trainer.train()
    return {name: statistics.median(b - a for a, b in zip(ends[warmup:], ends[warmup + 1:]))
            for name, ends in clock.ends.items()}


def measure(runs: int = 5, steps: int = 30, warmup: int = 5) -> dict[str, dict[str, list[float]]]:
    """Median step time of each run, per clock and arm: {clock: {arm: [seconds, ...]}}."""
    results = {name: {arm: [] for arm in ARMS} for name in (*CLOCKS, "own")}
    arms = list(ARMS.items())
    for run in range(runs):
        for arm, kwargs in arms[run % len(arms):] + arms[:run % len(arms)]:  # no arm always goes first
            gc.collect()  # the previous run's trainer goes now, not during this one
            for name, seconds in step_time(kwargs, steps, warmup).items():
                results[name][arm].append(seconds)
    return results


def table(results: dict[str, dict[str, list[float]]]) -> str:
    lines = [f"{'clock':<6}{'arm':<24}{'min ms':>9}{'median ms':>11}{'min ratio':>11}{'median ratio':>14}"]
    for name, arms in results.items():
        base = results["cpu" if name == "own" else name]["no watch"]  # own: a share of the plain step
        base_min, base_median = min(base), statistics.median(base)
        for arm, times in arms.items():
            low, mid = min(times), statistics.median(times)
            lines.append(f"{name:<6}{arm:<24}{low * 1e3:>9.2f}{mid * 1e3:>11.2f}{low / base_min:>11.3f}"
                         f"{mid / base_median:>14.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per arm (default 5)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="first steps not timed (default 5)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < args.warmup + 2 or args.warmup < 0:
        parser.error("need --runs >= 1 and --steps >= --warmup + 2: a median needs at least one timed step")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {args.runs} runs x {args.steps} "
          f"steps per arm, first {args.warmup} not timed")
    with quiet_libraries():
        results = measure(args.runs, args.steps, args.warmup)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
