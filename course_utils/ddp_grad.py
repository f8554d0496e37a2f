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

Rank 0 writes ``{"rank_mean", "global_count", "n_tokens", "world_size", "seed", "batch_size"}`` with
``torch.save``; lesson 07's notebook compares both with the single-process full-batch gradient. Launch it
from Python with ``token_weighting.run_ddp_grad()``: it runs this file as a module, so it works from a
checkout and from an installed wheel alike.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from transformers.utils import logging as hf_logging

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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where rank 0 writes the gradients (torch.save)")
    parser.add_argument("--seed", type=_count(0), default=0)
    parser.add_argument("--batch-size", type=_count(1), default=2)
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

    counts = [None] * world
    dist.all_gather_object(counts, n_local)
    if rank == 0:
        torch.save({**results, "n_tokens": counts, "world_size": world, "seed": args.seed,
                    "batch_size": args.batch_size}, args.out)
    # Tear down in order: DDP's reducer holds the process group, and destroying the group under a live
    # reducer can abort a rank at exit ("terminate called without an active exception"), seen once in CI.
    del ddp
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
