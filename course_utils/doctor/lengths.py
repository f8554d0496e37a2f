"""The doctor's checks of lengths (lessons 03 and 05): rows whose graded tokens ``max_length`` cuts, answers
that lose their stop token, rows that packing splits apart, and packing without example boundaries —
with the odds that a micro-batch or an optimizer step has no graded token at all.
"""

from __future__ import annotations

import functools
import math

from .. import validate
from ..data import graded_positions
from . import trl_view
from .report import Finding, share_of

# What this file offers users (re-exported by ``course_utils.doctor``); its other names serve the package
__all__ = ["empty_batch_probability"]

RISK_SLACK = 8  # rows whose first graded token is this close to max_length go through TRL's own truncation
ERROR_SHARE = 0.01  # fully truncated rows: an error from 1 % of the data, a warning below


def empty_batch_probability(n_rows: int, n_empty: int, batch_size: int) -> float:
    """P(a micro-batch of ``batch_size`` rows drawn without replacement has no graded row)."""
    validate.positive_int("n_rows", n_rows, why="it counts the rows a micro-batch is drawn from")
    validate.integer("n_empty", n_empty, minimum=0, why="it counts the rows without a graded token")
    validate.positive_int("batch_size", batch_size, why="it counts the rows of a micro-batch")
    if n_empty > n_rows:
        raise ValueError(f"n_empty={n_empty} is more than n_rows={n_rows} — the rows without a graded token "
                         "are some of the rows — pass n_empty <= n_rows.")
    if batch_size > n_rows:
        return float(n_empty == n_rows)
    return math.prod((n_empty - i) / (n_rows - i) for i in range(batch_size))


def truncation_findings(prepared, tokenizer, args, chat_template, completion_only_loss,
                         num_processes: int = 1, dropped: list | None = None) -> list[Finding]:
    """Rows whose every graded token is cut at max_length, what TRL does with them, and the odds that a
    micro-batch (a hand-written loop's NaN) or a whole optimizer step (SFTTrainer's 0.0) has none.
    ``dropped``: ``dropped_rows`` of ``prepared`` when the shards that prepared it computed them already."""
    if prepared is None or args.max_length is None:
        return []
    if args.packing and args.packing_strategy in ("wrapped", "bfd_split"):
        return _packed_apart_findings(prepared, args)  # these strategies cut no token
    max_length, batch = args.max_length, args.per_device_train_batch_size
    graded = trl_view.graded_bounds(prepared)  # row -> (first, last) graded position, or None
    first = {r: pos[0] for r, pos in graded.items() if pos}
    findings = _answer_cut_findings(graded, args)
    prompts = sorted(first.values())
    median_prompt = prompts[len(prompts) // 2] if prompts else 0
    if prompts and median_prompt >= max_length:
        findings.append(Finding(
            "error", "max-length-below-prompts",
            f"max_length={max_length} is below most prompts (median {median_prompt} tokens)",
            f"{sum(p >= max_length for p in prompts)} of {len(prompts)} prompts are at least max_length "
            f"tokens long; the longest answer starts at token {prompts[-1]}",
            f"raise max_length above {median_prompt} (the longest needs {prompts[-1] + 1}), or shorten the "
            "prompts", "05"))
    if dropped is None:
        dropped = dropped_rows(prepared, tokenizer, args, chat_template, completion_only_loss, first)
    if not dropped:
        return findings
    n = len(first)
    share = len(dropped) / n
    # what one optimizer step draws: SFTTrainer's loss divides by the graded tokens of all its micro-batches
    # on all processes (num_items_in_batch), so only a step without any graded token logs 0.0
    step_rows = batch * args.gradient_accumulation_steps * num_processes
    step_words = (f"{args.gradient_accumulation_steps} micro-batches of {batch} rows on {num_processes} "
                  f"process{'es' if num_processes > 1 else ''}")
    if args.packing:
        packed = trl_view.prepare(tokenizer, _token_columns(prepared), args, chat_template,
                                  completion_only_loss)
        empty_rows = sum(not graded_positions(lab) for lab in packed["labels"])
        p_step = empty_batch_probability(len(packed), empty_rows, step_rows)
        path = (f"packing={args.packing_strategy}: TRL keeps them, and {empty_rows} of {len(packed)} packed "
                "rows have no graded token; SFTTrainer divides by the graded tokens of the whole optimizer "
                f"step ({step_words}: num_items_in_batch), so such a row adds nothing and the logged loss is "
                f"the mean of the rest; a step with no graded token at all (p={p_step:.3g}) updates nothing "
                "and logs 0.0 at logging_steps=1 (at the default 10 it only pulls the window's mean down)")
    else:
        p_micro = empty_batch_probability(n, len(dropped), batch)
        path = (f"SFTTrainer drops them ('Dropping fully masked examples'): it trains on {n - len(dropped)} "
                f"rows, not the ones you think; a loop without that filter meets a micro-batch of {batch} "
                f"with no graded token with p={p_micro:.3g} (~{p_micro * n / batch:.2g} per epoch), and a "
                "per-micro-batch mean over it logs NaN (0/0; its gradients are zero with F.cross_entropy's "
                "ignore_index, NaN for a per-token loss at every position then masked): guard it with "
                "sum / count.clamp(min=1), not a skip, when it runs on several processes")
    severity = "error" if share >= ERROR_SHARE else "warning"
    findings.append(Finding(
        severity, "fully-truncated",
        f"{share_of(len(dropped), n)} lose every graded token at max_length={max_length}",
        f"row ids {dropped[:8]}; {path}",
        # the first number is the one that also keeps every answer's end (a smaller one leaves answers
        # without their stop token: answer-truncated); lesson 08 reads it. No truncation_mode='keep_end':
        # TRL 1.16 deprecates it, ignores it under packing, and it cuts the BOS and the system prompt
        f"max_length >= {max(pos[1] for pos in graded.values() if pos) + 1} keeps every answer whole "
        f"(>= {max(first.values()) + 1} keeps a graded token in every row); or drop or shorten the long "
        "prompts", "05"))
    return findings


def dropped_rows(prepared, tokenizer, args, chat_template, completion_only_loss, first=None) -> list[int]:
    """Ids of the rows that TRL's truncation at ``max_length`` leaves without a graded token and its filter
    drops ('Dropping fully masked examples'), sorted. TRL truncates and filters row by row: its own
    preparation on the rows that can lose every target (the first graded token near or past max_length;
    every row under keep_end) drops what it would drop in all — and the rows of several shards drop the
    union of what each drops (``shard_dropped_rows``). ``first``: each graded row's first graded position,
    when the caller has it."""
    if first is None:
        first = {r: pos[0] for r, pos in trl_view.graded_bounds(prepared).items() if pos}
    tokenized = _token_columns(prepared)
    ids = list(tokenized["_doctor_row"])  # a list: a datasets Column read one id at a time costs ~0.5 ms each
    near = args.max_length - RISK_SLACK
    keep_start = args.truncation_mode == "keep_start"
    at_risk = [i for i, r in enumerate(ids) if not keep_start or first.get(r, 0) >= near]
    kept = set(trl_view.prepare(tokenizer, tokenized.select(at_risk), args, chat_template,
                                completion_only_loss, packing=False)["_doctor_row"]) if at_risk else set()
    risky = {ids[i] for i in at_risk}
    return sorted(r for r in first if r in risky and r not in kept)


def shard_dropped_rows(tokenizer, args, chat_template, completion_only_loss):
    """``dropped_rows`` for each shard of TRL's preparation to run as it prepares its rows
    (``trl_view.Preparation``'s ``then``): on many rows TRL's truncation of those at risk then runs on every
    core, not after the join on one (~0.6 s of 4,000 chats at max_length 1024). None where the truncation
    check does not ask for them (no max_length; packing that cuts no token)."""
    if args.max_length is None or (args.packing and args.packing_strategy in ("wrapped", "bfd_split")):
        return None
    return functools.partial(dropped_rows, tokenizer=tokenizer, args=args, chat_template=chat_template,
                             completion_only_loss=completion_only_loss)


def _token_columns(prepared):
    return prepared.remove_columns([c for c in prepared.column_names if c not in
                                    ("input_ids", "labels", "_doctor_row")])


def _answer_cut_findings(graded: dict, args) -> list[Finding]:
    """Rows that keep part of their answer but lose its end — and with it the end-of-turn / eos token —
    at max_length (``keep_start``): the model is taught answers that do not stop (lesson 02). ``graded``:
    ``trl_view.graded_bounds``."""
    if args.truncation_mode != "keep_start":
        return []
    cut = sorted(r for r, pos in graded.items() if pos and pos[0] < args.max_length <= pos[1])
    if not cut:
        return []
    return [Finding("warning", "answer-truncated",
                    f"{share_of(len(cut), len(graded))} lose the end of their answer at "
                    f"max_length={args.max_length}",
                    f"row ids {cut[:8]}: their last graded token (the end of turn) lies past max_length, so "
                    "these rows teach the answer without its stop token",
                    f"max_length >= {max(graded[r][1] for r in cut) + 1} keeps every answer's end; or "
                    "shorten the long rows", "05")]


def _packed_apart_findings(prepared, args) -> list[Finding]:
    """``wrapped`` and ``bfd_split`` packing keep every token (TRL truncates nothing), but a row longer than
    ``max_length`` is split across packed rows: the part of its answer past the cut trains without the
    start of its prompt."""
    max_length = args.max_length
    # a graded token at or past max_length: the row is longer than max_length, and packing cuts it there
    apart = [r for r, pos in trl_view.graded_bounds(prepared).items() if pos and pos[1] >= max_length]
    if not apart:
        return []
    beside = " (and, wrapped, beside other examples)" if args.packing_strategy == "wrapped" else ""
    return [Finding("warning", "answers-packed-apart",
                    f"{share_of(len(apart), len(prepared))} are longer than max_length={max_length}: "
                    f"packing_strategy={args.packing_strategy!r} splits them, answer apart from prompt",
                    f"row ids {apart[:8]}; no token is lost (TRL does not truncate under this packing), but "
                    f"graded tokens past the cut are trained without the start of their prompt{beside}",
                    f"max_length >= {trl_view.longest_row(prepared)} keeps every row whole; or "
                    "shorten the long rows", "05")]


def packing_findings(prepared, tokenizer, args, chat_template, completion_only_loss) -> list[Finding]:
    """Packing without per-example boundaries lets attention cross examples (lesson 03)."""
    if not args.packing or prepared is None or args.max_length is None:
        return []
    padding_free = args.padding_free or args.packing_strategy in ("bfd", "bfd_split")
    if args.packing_strategy != "wrapped" or padding_free:
        return []
    extra = [c for c in prepared.column_names if c not in ("input_ids", "labels")]
    tokenized = prepared.remove_columns(extra)
    packed = trl_view.prepare(tokenizer, tokenized, args, chat_template, completion_only_loss)
    return [Finding("warning", "packing-no-boundaries",
                    "packing_strategy='wrapped' without padding_free: examples attend to each other",
                    f"TRL packs {len(prepared)} rows into {len(packed)} rows of {args.max_length} tokens "
                    f"(~{len(prepared) / max(len(packed), 1):.1f} examples per row) with an all-ones "
                    "attention mask and no position_ids reset",
                    # not padding_free=True with 'wrapped': TRL warns against that combination
                    "use packing_strategy='bfd' (padding-free, per-example boundaries kept; it truncates "
                    "rows longer than max_length), or 'bfd_split' (splits them instead)",
                    "03")]
