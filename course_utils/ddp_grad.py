"""Lesson 07's torchrun worker: one data-parallel step, per-rank mean vs a global token count.

    torchrun --standalone --nproc_per_node=2 -m course_utils.ddp_grad --out /tmp/grads.pt

Each rank loads the course model, takes micro-batch ``rank`` of
``token_weighting.uneven_micro_batches(tok, k=world_size)`` (so the ranks hold very different numbers of
supervised tokens), wraps the model in ``DistributedDataParallel`` (gloo, CPU) and runs two backward
passes on the same parameters:

- ``"rank_mean"``: each rank's own mean loss. DDP *averages* gradients over ranks, so a token on rank r
  weighs ``1/(W·n_r)`` — the per-micro-batch mean again, across processes.
- ``"global_count"``: the summed loss divided by the step's token count summed over ranks with
  ``all_reduce``, times W to undo DDP's average. This is what transformers does with
  ``average_tokens_across_devices=True`` (``Trainer._get_num_items_in_batch`` gathers the counts,
  ``compute_loss`` multiplies by ``num_processes``).
- ``"global_count_no_world"``: the summed loss divided by the same global count, *without* the × W — what a
  custom ``compute_loss`` does that "normalises by ``num_items_in_batch`` yourself" (lesson 01) when the
  Trainer has gathered the count over the ranks: DDP's average then makes the step W times too small.

Then the empty micro-batch of lesson 05 on one rank (rank 1's labels all ``-100``), two ways:

- ``"skip"``: the guard that is safe in one process — no forward, no backward on the empty rank. Run on a
  separate gloo group with a short ``--skip-timeout``: the rank with data enters DDP's collectives (its
  forward broadcasts buffers, its backward all-reduces gradients) and waits for a partner that never
  comes, until the group's timeout (30 minutes by default) raises. Recorded per rank: seconds waited,
  the error.
- ``"zero_loss"``: the multi-process-safe guard — every rank runs forward and backward, the empty one
  with a loss of exactly 0 (summed loss / the global count ``clamp(min=1)``). Recorded: the collectives
  each rank launched (a counting DDP comm hook) and the gradient, which equals rank 0's data alone.

Rank 0 writes ``{"rank_mean", "global_count", "global_count_no_world", "n_tokens", "world_size", "seed",
"batch_size", "skip", "zero_loss", "zero_loss_collectives", "skip_timeout"}`` with ``torch.save``; lesson 07's
notebook compares the gradients with the single-process full-batch gradient. Launch it
from Python with ``token_weighting.run_ddp_grad()``: it runs this file as a module, so it works from a
checkout and from an installed wheel alike.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers.utils import logging as hf_logging

from .data import all_masked
from .losses import count_supervised
from .model import load_course_model
from .token_weighting import flat_grad, uneven_micro_batches
from .training import token_losses


def _count(minimum: int):
    """An argparse type: an int >= ``minimum``, refused with what / why / fix."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {minimum} — it picks the data "
                                             f"each rank trains on — pass e.g. {max(minimum, 1)}.")
        return value
    return parse


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds in (0, 60]."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 60] — it is how long "
                                         "the rank with data waits for the rank that skipped — pass e.g. 2.")
    return value


def _counting_allreduce(counter: dict):
    """A DDP comm hook doing what DDP's default does (all-reduce, then average), counting its launches."""
    def hook(group, bucket):
        counter["all_reduce"] += 1
        world = dist.get_world_size(group)
        buffer = bucket.buffer().div_(world)
        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])
    return hook


def _skip_empty(model, batch, rank: int, timeout: float) -> dict:
    """Rank 1 skips its empty micro-batch (no forward, no backward); rank 0 trains on its data under DDP on a
    group with a short timeout. Returns this rank's seconds waited and the error it met (None if none)."""
    dist.barrier()  # both ranks arrive together, so only the skip can make the group wait
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, init_sync=False)
    start, error, stage = time.perf_counter(), None, None
    if rank != 1:  # rank 1 holds the empty micro-batch and skips it
        try:
            stage = "forward"  # DDP broadcasts the module's buffers (broadcast_buffers=True, the default)
            summed, n = token_losses(ddp, batch)
            stage = "backward"  # DDP all-reduces the gradient buckets
            (summed / n).backward()
            stage = None
        except Exception as exc:  # gloo gives up after `timeout`: what would otherwise be a hang
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    waited = time.perf_counter() - start
    del ddp
    model.zero_grad(set_to_none=True)
    dist.barrier()
    return {"waited_s": waited, "error": error, "stuck_in": stage, "skipped": rank == 1}


def _zero_loss(model, batch, rank: int) -> tuple[torch.Tensor, int]:
    """Rank 1's micro-batch is empty and runs anyway, with a loss of exactly 0 (sum / clamped global
    count); every rank launches the same collectives. Returns the gradient and the all-reduces launched."""
    if rank == 1:
        batch = all_masked(batch)
    counter = {"all_reduce": 0}
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(dist.group.WORLD, _counting_allreduce(counter))
    n_global = torch.tensor(float(count_supervised(batch)))
    dist.all_reduce(n_global, op=dist.ReduceOp.SUM)
    summed, _ = token_losses(ddp, batch)  # 0 on the empty rank, with a graph: the same collectives run
    (summed / n_global.clamp(min=1) * dist.get_world_size()).backward()
    grad = flat_grad(model)
    del ddp
    return grad, counter["all_reduce"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where rank 0 writes the gradients (torch.save)")
    parser.add_argument("--seed", type=_count(0), default=0)
    parser.add_argument("--batch-size", type=_count(1), default=2)
    parser.add_argument("--skip-timeout", type=_seconds, default=0.5,
                        help="seconds the rank with data waits for the rank that skipped "
                             "(a default group: 30 min)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("RANK is not set — this script is one process of a torchrun job — launch it with "
                         "`torchrun --standalone --nproc_per_node=2 -m course_utils.ddp_grad --out FILE`.")
    if not Path(args.out).resolve().parent.is_dir():
        raise SystemExit(f"--out {args.out}: its folder does not exist — rank 0 writes the gradients there "
                         "once every rank has run — pass a path in an existing folder.")

    hf_logging.disable_progress_bar()
    dist.init_process_group("gloo")  # gloo: the CPU backend
    rank, world = dist.get_rank(), dist.get_world_size()
    model, tok = load_course_model(device="cpu")
    batch = uneven_micro_batches(tok, k=world, batch_size=args.batch_size, seed=args.seed)[rank]
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # all-reduces (averages) grads in backward

    results = {}
    # 1) Each rank's own mean: what a plain DDP loop does.
    summed, n_local = token_losses(ddp, batch)
    (summed / n_local).backward()
    results["rank_mean"] = flat_grad(model)
    model.zero_grad(set_to_none=True)

    # 2) A global count: every rank learns N = Σ n_r before its backward.
    n_global = torch.tensor(float(count_supervised(batch)))
    dist.all_reduce(n_global, op=dist.ReduceOp.SUM)
    summed, _ = token_losses(ddp, batch)
    (summed / n_global * world).backward()  # × world: DDP divides the summed gradients by world
    results["global_count"] = flat_grad(model)
    model.zero_grad(set_to_none=True)

    # 3) The same global count without × world: a custom compute_loss dividing by num_items_in_batch alone.
    summed, _ = token_losses(ddp, batch)
    (summed / n_global).backward()
    results["global_count_no_world"] = flat_grad(model)

    counts = [None] * world
    dist.all_gather_object(counts, n_local)
    # Tear down in order: DDP's reducer holds the process group, and destroying the group under a live
    # reducer can abort a rank at exit ("terminate called without an active exception"), seen once in CI.
    del ddp
    model.zero_grad(set_to_none=True)

    # 4) Lesson 05's empty micro-batch on rank 1: skipped (a wait), then run with a zero loss (safe).
    skip = _skip_empty(model, batch, rank, args.skip_timeout)
    zero_grad, launched = _zero_loss(model, batch, rank)
    skips, launches = [None] * world, [None] * world
    dist.all_gather_object(skips, skip)
    dist.all_gather_object(launches, launched)
    if rank == 0:
        torch.save({**results, "n_tokens": counts, "world_size": world, "seed": args.seed,
                    "batch_size": args.batch_size, "skip": skips, "skip_timeout": args.skip_timeout,
                    "zero_loss": zero_grad, "zero_loss_collectives": launches}, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
