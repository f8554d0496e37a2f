"""Lesson 07 (token-weighted accumulation): gradient oracles, the Trainer probe, the DDP launcher, checkers.

Accumulating K micro-batches by averaging each micro-batch's *mean* loss weights a token of micro-batch
i by ``1/(K·nᵢ)``; one big batch weighs every token ``1/N`` (N = supervised tokens of the whole step).
The two agree only when every nᵢ is the same. This module measures that on the course model:

- ``accumulated_grad`` / ``full_batch_grad``: the step's gradient, flattened, under either scheme and
  for the one big batch (the oracle), plus ``relative_error`` to compare them;
- ``uneven_micro_batches`` / ``equal_count_micro_batches``: deterministic micro-batches whose
  supervised-token counts differ a lot, or not at all;
- ``trainer_step_grad``: the gradient TRL's ``SFTTrainer`` (transformers' ``Trainer`` loop) hands
  to its optimizer at the accumulation boundary, with today's ``num_items_in_batch`` or without it;
- ``run_ddp_grad``: launches ``course_utils.ddp_grad`` under ``torchrun`` (two CPU processes, gloo)
  and reads back the data-parallel gradient under a per-rank mean and under a global token count;
- ``token_weights`` / ``plot_token_weights``: the weight one token gets under each scheme, drawn;
- ``train_and_track`` / ``prediction_kl`` / ``param_distance``: two training runs compared on a held-out
  loss, in what they predict, and in weights;
- ``cite_source``: quote the lines of the installed library that implement the fix;
- ``accumulation_trace`` / ``check_trace_diagnosis``: exercise 7.1, diagnose an unseen accumulation trace;
- ``check_sequence_weighted``: exercise 7.2, per-sequence averaging across micro-batches (references in
  ``answers/lesson07.py``).

Used by lesson 07 (``solutions/07_token_weighted.ipynb``) and its worker ``course_utils/ddp_grad.py``.
The loss pieces come from ``course_utils.training`` (``token_losses``, ``micro_batch_loss``) and the token
count from ``course_utils.losses.count_supervised``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from . import validate
from .checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check
from .data import IGNORE_INDEX, collate_right, make_messages, tokenize_chat
from .losses import count_supervised, model_logits
from .training import micro_batch_loss, token_losses

SCHEMES = ("mean", "token")


def _check_scheme(scheme: str) -> None:
    validate.choice("scheme", scheme, SCHEMES, why="'mean' averages each micro-batch's mean loss, 'token' "
                    "divides the summed loss by the step's token count")


def _check_micro_batches(micro_batches) -> None:
    if isinstance(micro_batches, (list, tuple)) and not micro_batches:
        raise ValueError("micro_batches must be a non-empty list of batches — one accumulation step is a "
                         "list "
                         "of them — build them with data.make_batches() or uneven_micro_batches().")
    validate.batches("micro_batches", micro_batches)


# ------------------------------------------------------------------------------------------------
# Data: micro-batches whose supervised-token counts differ (or not)
# ------------------------------------------------------------------------------------------------

def multi_turn_conversations(n: int, seed: int = 0, max_turns: int = 6) -> list[list[dict]]:
    """``n`` chats of 1..``max_turns`` question/answer turns: the assistant says 5 to ~50 tokens.

    Real SFT data has answers from a word to pages; the toy tasks alone vary only 5-8 tokens, so
    the lesson stacks turns to get realistic spread in supervised tokens per example.
    """
    validate.positive_int("n", n, why="it is the number of chats")
    validate.positive_int("max_turns", max_turns, why="it is the most question/answer pairs per chat")
    rng = random.Random(seed)
    pool = iter(make_messages("mixed", n * max_turns, seed=seed))
    return [sum((next(pool) for _ in range(rng.randint(1, max_turns))), []) for _ in range(n)]


def uneven_micro_batches(tokenizer, k: int = 4, batch_size: int = 2, seed: int = 0) -> list[dict]:
    """``k`` micro-batches of ``batch_size`` chats, sorted by answer length: short ones first.

    Sorting is what ``group_by_length``-style samplers do on purpose (less padding), and it makes the
    per-micro-batch token counts as uneven as a real step can get.
    """
    examples = [tokenize_chat(tokenizer, c) for c in multi_turn_conversations(k * batch_size, seed)]
    examples.sort(key=lambda e: sum(label != IGNORE_INDEX for label in e["labels"]))
    return [collate_right(examples[i: i + batch_size], tokenizer.pad_token_id)
            for i in range(0, len(examples), batch_size)]


def equal_count_micro_batches(tokenizer, k: int = 4, batch_size: int = 2, seed: int = 0) -> list[dict]:
    """``k`` micro-batches with the *same* supervised-token count each, but different prompt lengths.

    Chats are grouped by their number of supervised tokens, so only the padding and the prompts
    differ between micro-batches: the case where the per-micro-batch mean is exact.
    """
    by_count: dict[int, list] = {}
    convs = make_messages("mixed", 400, seed=seed, context_words=8, long_tail=True)
    for conv in convs:
        e = tokenize_chat(tokenizer, conv)
        by_count.setdefault(sum(label != IGNORE_INDEX for label in e["labels"]), []).append(e)
    count, group = max(by_count.items(), key=lambda kv: len(kv[1]))
    if len(group) < k * batch_size:
        raise ValueError(f"only {len(group)} chats share a token count — need k*batch_size = "
                         f"{k * batch_size} — pass smaller k or batch_size.")
    return [collate_right(group[i * batch_size: (i + 1) * batch_size], tokenizer.pad_token_id)
            for i in range(k)]


def merge_micro_batches(micro_batches: list[dict], pad_token_id: int = 0) -> dict:
    """The one big batch that the micro-batches pretend to be: every row, right-padded to one width.

    Real tokens are those with ``attention_mask == 1``, wherever they sit, so left-padded micro-batches
    merge correctly too (the pads are dropped, never the real tokens).
    """
    _check_micro_batches(micro_batches)
    validate.integer("pad_token_id", pad_token_id, minimum=0, why="it is a token id")
    rows = []
    for b in micro_batches:
        mask = b.get("attention_mask", torch.ones_like(b["input_ids"])).bool()
        for ids, labels, real in zip(b["input_ids"], b["labels"], mask):
            if not real.any():
                raise ValueError("a row of a micro-batch has no real token (attention_mask all 0) — it would "
                                 "be all padding in the big batch — drop empty rows before merging.")
            rows.append({"input_ids": ids[real].tolist(), "labels": labels[real].tolist()})
    return collate_right(rows, pad_token_id)


# ------------------------------------------------------------------------------------------------
# Gradients: the oracle, the two accumulation schemes, and how far apart they are
# ------------------------------------------------------------------------------------------------

def flat_grad(model) -> torch.Tensor:
    """All parameter gradients as one float64 CPU vector (zeros where a parameter got none)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    return torch.cat([g.detach().flatten().double().cpu() for g in grads])


def full_batch_grad(model, micro_batches: list[dict], pad_token_id: int = 0) -> torch.Tensor:
    """The oracle: the gradient of the mean loss over every supervised token of the merged big batch.

    Leaves ``.grad`` cleared (set to None), as it found nothing worth keeping there.
    """
    big = merge_micro_batches(micro_batches, pad_token_id)
    model.zero_grad(set_to_none=True)
    summed, n_tokens = token_losses(model, big)
    (summed / n_tokens).backward()
    grad = flat_grad(model)
    model.zero_grad(set_to_none=True)
    return grad


def accumulated_grad(model, micro_batches: list[dict], scheme: str = "token") -> torch.Tensor:
    """The step's gradient after one ``.backward()`` per micro-batch, under ``scheme``.

    ``"mean"``: each micro-batch's own mean loss divided by K (the classic loop, and transformers
    before v4.46); ``"token"``: each summed loss divided by the step's total supervised tokens.
    Both come from ``train.micro_batch_loss``, the loss the course's training loop uses. Clears
    ``.grad`` before and after, so the returned vector is this step's gradient alone.
    """
    _check_scheme(scheme)
    _check_micro_batches(micro_batches)
    step_tokens = sum(count_supervised(b) for b in micro_batches)
    model.zero_grad(set_to_none=True)
    for batch in micro_batches:
        summed, n_tokens = token_losses(model, batch)
        micro_batch_loss(summed, n_tokens, normalise=scheme, accum_steps=len(micro_batches),
                         divide_by_accum=True, step_tokens=step_tokens).backward()  # .grad adds up
    grad = flat_grad(model)
    model.zero_grad(set_to_none=True)
    return grad


def relative_error(grad: torch.Tensor, reference: torch.Tensor) -> float:
    """‖grad − reference‖ / ‖reference‖: 1e-7 is float noise, 1e-2 is a different gradient."""
    validate.tensor("grad", grad)
    validate.tensor("reference", reference)
    if grad.shape != reference.shape:
        raise ValueError(f"gradients of shapes {tuple(grad.shape)} and {tuple(reference.shape)} — they "
                         "must come from the same model — flatten both with flat_grad().")
    norm = reference.double().norm()
    if not torch.isfinite(norm) or norm == 0:
        raise ValueError(f"the reference gradient's norm is {float(norm)} — a relative error needs a finite, "
                         "non-zero reference (a zero one means no token carried loss) — compare against a "
                         "step with supervised tokens, or use the absolute difference.")
    return float((grad.double() - reference.double()).norm() / norm)


def token_weights(n_tokens: list[int], scheme: str) -> list[float]:
    """Reference for exercise 1: the weight one token of micro-batch i gets in the step's loss.

    ``"mean"``: ``1/(K·nᵢ)``; ``"token"``: ``1/N`` with ``N = Σ nᵢ``. Either way the weights of all
    tokens sum to 1 — they differ in *which* tokens get the weight.
    """
    _check_scheme(scheme)
    validate.non_empty("n_tokens", n_tokens, what="positive ints (one supervised-token count per "
                       "micro-batch)", fix="pass e.g. [12, 40, 7].")
    for n in n_tokens:
        validate.positive_int("each n_tokens entry", n, why="a micro-batch's weight is 1/n, so it needs "
                              "positive ints")
    k, total = len(n_tokens), sum(n_tokens)
    return [1 / (k * n) if scheme == "mean" else 1 / total for n in n_tokens]


def plot_token_weights(n_tokens: list[int], ax=None):
    """Per-token weight along the step under both schemes, with the big batch's 1/N as a line."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4))
    starts = [sum(n_tokens[:i]) for i in range(len(n_tokens))]
    for scheme, colour in (("mean", "#d62828"), ("token", "#2a9d8f")):
        xs, ys = [], []
        for start, n, w in zip(starts, n_tokens, token_weights(n_tokens, scheme)):
            xs += [start, start + n]
            ys += [w, w]
        label = ("per-micro-batch mean ÷ K: 1/(K·nᵢ)" if scheme == "mean"
                 else "sum ÷ step tokens: 1/N")
        ax.plot(xs, ys, color=colour, lw=2.2 if scheme == "mean" else 1.4, label=label)
    ax.axhline(1 / sum(n_tokens), color="k", ls="--", lw=1, label=f"one big batch: 1/N = 1/{sum(n_tokens)}")
    for start, n in zip(starts, n_tokens):
        ax.axvline(start, color="grey", lw=0.5)
        ax.text(start + n / 2, ax.get_ylim()[1] * 0.97, f"n={n}", ha="center", va="top", fontsize=8)
    ax.set_xlabel("supervised token of the step (micro-batches side by side)")
    ax.set_ylabel("weight in the step's loss (1/token)")
    ax.set_title("Per-token weight: a short micro-batch's tokens count more under the per-micro-batch mean")
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    return ax


def train_and_track(model, micro_batches: list[dict], eval_batch: dict, **train_kwargs) -> list[dict]:
    """``train.train`` plus, after every step, the token-weighted loss on ``eval_batch`` (``eval_loss``).

    The training loop's own logged loss depends on how it averages micro-batches, so two runs are
    compared on a held-out batch scored the same way for both.
    """
    curve = []

    def on_step(step, trained):
        with torch.no_grad():
            summed, n_tokens = token_losses(trained, eval_batch)
        curve.append(float(summed) / n_tokens)

    from .training import train

    records = train(model, micro_batches, on_step=on_step, **train_kwargs)
    return [{**r, "eval_loss": e} for r, e in zip(records, curve)]


def param_distance(model_a, model_b) -> float:
    """‖θ_a − θ_b‖ over all parameters: how far apart two training runs ended."""
    return float(torch.cat([(a.detach() - b.detach()).flatten().double()
                            for a, b in zip(model_a.parameters(), model_b.parameters())]).norm())


def prediction_kl(model_a, model_b, eval_batch: dict) -> float:
    """Mean KL(p_a ‖ p_b) over the supervised next-token positions of ``eval_batch``, in nats.

    How differently two runs *predict*, which is what a learner cares about. A weight distance
    (``param_distance``) can mislead here: AdamW divides each step by √v, so on a parameter whose
    true gradient is ~0 float round-off alone flips the update's sign, and it moves by ~lr per
    step — weights the predictions do not depend on (on a Phi-style model, reordering a batch's rows
    moved the weights as far as a real fix's residue, while the KL stayed at round-off level).
    """
    validate.batch("eval_batch", eval_batch, need=("input_ids", "labels"))
    mask = eval_batch["labels"][:, 1:] != IGNORE_INDEX
    if not bool(mask.any()):
        raise ValueError("eval_batch has no supervised token (every label is -100) — the KL is averaged "
                         "over the positions that carry loss — pass a batch from make_batches(...).")
    with torch.no_grad():
        log_p = [model_logits(m, eval_batch)[:, :-1].double().log_softmax(-1) for m in (model_a, model_b)]
    per_position = (log_p[0].exp() * (log_p[0] - log_p[1])).sum(-1)
    return float(per_position[mask].mean())


def cite_source(obj, *needles: str) -> list[str]:
    """Print (and return) ``file:line: code`` for each line of ``obj``'s source containing a needle.

    Lets a lesson quote the installed library rather than a blog post; a needle that is missing
    raises, so the lesson notices when a new version changes the mechanism.
    """
    import inspect

    lines, start = inspect.getsourcelines(obj)
    path = Path(inspect.getsourcefile(obj))
    short = "/".join(path.parts[path.parts.index("site-packages") + 1:]) if "site-packages" in path.parts \
        else path.name
    found = []
    for needle in needles:
        hits = [f"{short}:{start + i}: {line.strip()}" for i, line in enumerate(lines) if needle in line]
        if not hits:
            raise ValueError(f"{needle!r} is not in {obj.__qualname__} ({short}) — the installed version "
                             "changed this code — read the function and update the lesson's citation.")
        found.append(hits[0])
        print(hits[0])
    return found


# ------------------------------------------------------------------------------------------------
# What if: another number of micro-batches, another order of the chats
# ------------------------------------------------------------------------------------------------

ORDERS = ("sorted by answer length", "as drawn")


def accumulation_explorer(model, tokenizer, seed: int = 0, n_chats: int = 8):
    """What if the same ``n_chats`` chats were split into K micro-batches, sorted by length or not?

    Each frame measures one optimizer step's gradient under both schemes against the big batch's
    (three forward/backward passes over ``n_chats`` chats: a fraction of a second on the course model)
    and draws the per-token weights. K = 1 is exact for both; the per-micro-batch mean drifts as K
    grows and as sorting makes the counts uneven; the token-weighted sum stays exact.
    """
    from .viz import figure, what_if

    validate.positive_int("n_chats", n_chats, why="it is the size of the step's big batch")
    examples = [tokenize_chat(tokenizer, c) for c in multi_turn_conversations(n_chats, seed)]
    by_length = sorted(examples, key=lambda e: sum(label != IGNORE_INDEX for label in e["labels"]))
    ks = [k for k in range(1, n_chats + 1) if n_chats % k == 0]

    def frame(k, order):
        rows = by_length if order == ORDERS[0] else examples
        size = n_chats // k
        micro = [collate_right(rows[i: i + size], tokenizer.pad_token_id) for i in range(0, n_chats, size)]
        counts = [count_supervised(b) for b in micro]
        full = full_batch_grad(model, micro, tokenizer.pad_token_id)
        errors = {scheme: relative_error(accumulated_grad(model, micro, scheme), full) for scheme in SCHEMES}
        fig, ax = figure(8, 3.4)
        plot_token_weights(counts, ax=ax)
        ax.set_title(f"per-token weight, K = {k} micro-batches of {size} chats, {order}")
        return (f"supervised tokens per micro-batch: {counts}\n"
                f"gradient vs the big batch of {n_chats} (relative error): per-micro-batch mean ÷ K "
                f"{errors['mean']:.1e}, token-weighted {errors['token']:.1e}"), fig

    return what_if(frame, {"k": ks, "order": list(ORDERS)}, start={"k": ks[len(ks) // 2]},
                   descriptions={"k": "K (micro-batches)", "order": "chats"}, width="520px")


# ------------------------------------------------------------------------------------------------
# transformers / TRL: the gradient the Trainer hands its optimizer
# ------------------------------------------------------------------------------------------------

def trainer_step_grad(dataset, *, per_device_train_batch_size: int, gradient_accumulation_steps: int,
                      count_items: bool = True, bf16: bool = False, seed: int = 0) -> dict:
    """Run one optimizer step of TRL's ``SFTTrainer`` on a fresh course model; return its gradient.

    A ``TrainerCallback.on_pre_optimizer_step`` copies ``.grad`` right before ``optimizer.step()``:
    that is exactly the accumulated gradient (clipping is off with ``max_grad_norm=0``, so nothing
    touched it). ``count_items=False`` makes ``Trainer._get_num_items_in_batch`` return ``None``,
    which restores the pre-v4.46 path: each micro-batch's mean loss, divided by the number of
    accumulation steps in ``Trainer.training_step``. ``bf16=True`` restores ``SFTConfig``'s own default
    (CPU autocast in bfloat16, ~1e-2 gradient noise), which ``make_sft_trainer`` turns off.
    Returns ``{"grad", "num_items", "micro_batches"}``: the count the Trainer passed to
    ``compute_loss`` (or None) and the micro-batches exactly as the Trainer fed them to the model.
    """
    from transformers import TrainerCallback
    from trl import SFTTrainer

    from .model import load_course_model
    from .training import make_sft_trainer

    model, tokenizer = load_course_model()
    captured: dict = {"micro_batches": []}

    class GradAtBoundary(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            captured["grad"] = flat_grad(model)

    class Trainer(SFTTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            captured["micro_batches"].append({k: inputs[k].detach().clone()
                                              for k in ("input_ids", "labels", "attention_mask")})
            return super().training_step(model, inputs, num_items_in_batch)

        def _get_num_items_in_batch(self, batch_samples, device):
            count = super()._get_num_items_in_batch(batch_samples, device) if count_items else None
            captured["num_items"] = count
            return count

    trainer = make_sft_trainer(model, tokenizer, dataset, trainer_cls=Trainer, max_steps=1,
                               per_device_train_batch_size=per_device_train_batch_size,
                               gradient_accumulation_steps=gradient_accumulation_steps,
                               assistant_only_loss=True, learning_rate=1e-3, optim="sgd",
                               max_grad_norm=0.0, weight_decay=0.0, bf16=bf16, seed=seed)
    trainer.add_callback(GradAtBoundary())
    trainer.train()
    num_items = captured.get("num_items")
    return {"grad": captured["grad"], "num_items": None if num_items is None else int(num_items),
            "micro_batches": captured["micro_batches"]}


# ------------------------------------------------------------------------------------------------
# Two processes: launch the torchrun worker and read what it measured
# ------------------------------------------------------------------------------------------------

def run_ddp_grad(nproc: int = 2, seed: int = 0, batch_size: int = 2, timeout: float = 180) -> dict:
    """Run ``course_utils.ddp_grad`` under ``torchrun --nproc_per_node=nproc`` (gloo, CPU); load its result.

    The worker gives rank r micro-batch r of ``uneven_micro_batches(tok, k=nproc, ...)`` and returns
    the gradient DDP ends up with under a per-rank mean and under a global token count
    (``all_reduce``). ``sys.executable -m torch.distributed.run`` is torchrun with this kernel's
    Python, so the workers see the same packages; ``--standalone`` picks a free port.
    """
    # validate everything before launching anything: a bad argument must not cost two torchrun launches
    validate.positive_int("nproc", nproc, why="it is the number of processes torchrun starts")
    validate.integer("seed", seed, minimum=0, why="it picks the micro-batches")
    validate.positive_int("batch_size", batch_size, why="each rank needs at least one chat")
    validate.number("timeout", timeout, positive=True, why="it bounds how long torchrun may run")
    out = Path(tempfile.mkdtemp(prefix="sft-lab-07-ddp-")) / "grads.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "course_utils.ddp_grad", "--out", str(out), "--seed", str(seed),
           "--batch-size", str(batch_size)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    for attempt in (1, 2):  # a rank can die in gloo's teardown on a busy machine: one retry, announced
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=Path(__file__).resolve().parent.parent)
        if proc.returncode == 0 and out.exists():
            return torch.load(out)
        if attempt == 1:
            print(f"torchrun exited with {proc.returncode}; retrying once", file=sys.stderr)
    raise RuntimeError(f"torchrun exited with {proc.returncode} — the worker's gradients are missing — "
                       f"read its output below:\n{(proc.stdout + proc.stderr)[-3000:]}")


# ------------------------------------------------------------------------------------------------
# Exercise 7.1 (diagnosis): an accumulation trace from one of several causes
# ------------------------------------------------------------------------------------------------

TRACE_CAUSES = (
    "per_micro_batch_mean",     # each micro-batch's mean ÷ K with unequal token counts (this lesson)
    "per_rank_mean",            # each rank's own mean, DDP averages the ranks (section 8.2)
    "missing_division_by_k",    # lesson 01's look-alike: means summed over K micro-batches, no ÷ K
    "empty_micro_batch",        # lesson 05's look-alike: a micro-batch with no supervised token, 0/0
    "token_weighted",           # healthy: summed loss ÷ the step's (global) token count
)


def accumulation_trace(seed: int) -> tuple[dict, Diagnosis]:
    """A debug trace of one optimizer step and its true ``Diagnosis``; ``seed`` picks cause and numbers.

    The trace is what a ``print`` in the training loop would show: ``world_size``, ``accum_steps`` and one
    row per ``.backward()`` call with ``rank``, ``micro_step``, ``n_tokens`` (supervised tokens of that
    micro-batch), ``summed_loss`` (its summed cross-entropy) and ``backward_loss`` (the number that was
    back-propagated). DDP averages the ranks' gradients. Evidence of the truth: ``micro_step`` or ``rank``
    whose tokens weigh the most (``per_micro_batch_mean``, ``per_rank_mean``), the ``micro_step`` that
    gave NaN (``empty_micro_batch``), the factor by which the step is too large (``missing_division_by_k``)
    or ``None`` (``token_weighted``).
    """
    seed = validate.integer("seed", seed, minimum=0, why="it picks the generated case")
    rng = random.Random(seed)
    cause = TRACE_CAUSES[seed % len(TRACE_CAUSES)]
    many_ranks = cause == "per_rank_mean" or (cause == "token_weighted" and rng.random() < 0.5)
    world = rng.randint(2, 4) if many_ranks else 1
    k = 1 if cause == "per_rank_mean" else rng.randint(2, 5)
    slots = [(r, m) for r in range(world) for m in range(k)]
    if cause == "missing_division_by_k":
        same = rng.randint(8, 60)
        counts = [same] * len(slots)  # equal counts: the ONLY fault is the missing ÷ K
    else:
        counts = rng.sample(range(5, 90), len(slots))  # distinct, so one micro-batch is clearly the smallest
    if cause == "empty_micro_batch":
        counts[rng.randrange(len(counts))] = 0
    total = sum(counts)
    rows = []
    for (rank, micro), n in zip(slots, counts):
        summed = round(n * rng.uniform(1.5, 4.0), 4)
        if cause == "token_weighted":
            backward = summed / total * world  # × world undoes DDP's average
        elif cause == "missing_division_by_k":
            backward = summed / n
        elif cause == "empty_micro_batch":
            backward = summed / n / k if n else float("nan")
        else:  # per_micro_batch_mean, per_rank_mean
            backward = summed / n / k
        rows.append({"rank": rank, "micro_step": micro, "n_tokens": n, "summed_loss": summed,
                     "backward_loss": backward})
    trace = {"world_size": world, "accum_steps": k, "rows": rows}
    smallest = min(rows, key=lambda r: r["n_tokens"])
    evidence = {"per_micro_batch_mean": smallest["micro_step"], "per_rank_mean": smallest["rank"],
                "missing_division_by_k": k, "token_weighted": None,
                "empty_micro_batch": smallest["micro_step"]}[cause]
    return trace, Diagnosis(cause, evidence)


def _trace_evidence_ok(got, truth: Diagnosis) -> bool:
    if truth.evidence is None:
        return got is None
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    return abs(got - truth.evidence) < 1e-6


_TRACE_MISCONCEPTIONS = {
    ("per_micro_batch_mean", "missing_division_by_k"):
        "the token counts are all equal here, so the per-micro-batch mean would be exact; add up the weights "
        "(backward_loss / summed_loss) times the tokens: the step counts K times.",
    ("missing_division_by_k", "per_micro_batch_mean"):
        "the weights add up to 1 here (no missing ÷ K); compare the weight of one token across "
        "micro-batches.",
    ("per_micro_batch_mean", "per_rank_mean"):
        "there is one micro-batch per rank and world_size > 1: DDP averages the ranks' means.",
    ("per_rank_mean", "per_micro_batch_mean"):
        "world_size is 1: there are no ranks to average, only micro-batches.",
    ("per_micro_batch_mean", "token_weighted"):
        "every token has the same weight 1/N (DDP's average included): this step is the big batch.",
    ("per_rank_mean", "token_weighted"):
        "the ranks multiplied by world_size and divided by the GLOBAL count: after DDP's average every "
        "token weighs 1/N.",
}


def check_trace_diagnosis(fn, seeds=None):
    """Checker for exercise 7.1: ``fn(trace) -> Diagnosis(cause, evidence)`` on fresh traces of each cause."""
    if seeds is None:
        seeds = fresh_seeds(3 * len(TRACE_CAUSES))
    return check_diagnosis(
        "accumulation_trace", fn, accumulation_trace, seeds=seeds, evidence_ok=_trace_evidence_ok,
        misconceptions=_TRACE_MISCONCEPTIONS,
        hint=Hints(question="What weight does ONE token of each row get in the step's gradient, once DDP has "
                            "averaged the ranks? Is it the same for every row, and do the weights add up "
                            "to 1?",
                   pointer="A row's per-token weight is backward_loss / summed_loss, divided by world_size "
                           "(DDP's average); section 4 gives the weights each scheme should produce.",
                   answer="w = backward_loss / summed_loss / world_size; NaN -> empty_micro_batch (that "
                          "micro_step); all w equal and Σ w·n = K -> missing_division_by_k (evidence K); "
                          "all w "
                          "equal and Σ w·n = 1 -> token_weighted (None); unequal w -> per_rank_mean if "
                          "world_size > 1 (the rank with fewest tokens) else per_micro_batch_mean (the "
                          "micro_step with fewest tokens)."))


# ------------------------------------------------------------------------------------------------
# Exercise 7.2 (fix): per-sequence averaging across micro-batches
# ------------------------------------------------------------------------------------------------

_HIDDEN: dict = {}


def _hidden_setup():
    """The course model and hidden steps with micro-batches of different sizes (built once per kernel)."""
    if not _HIDDEN:
        from .model import load_course_model

        model, tok = load_course_model(device="cpu")
        steps, labels = [], []
        for seed, sizes in ((101, (1, 3)), (102, (2, 2, 1)), (103, (3, 1, 2))):
            examples = [tokenize_chat(tok, c) for c in multi_turn_conversations(sum(sizes), seed)]
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            steps.append([collate_right(examples[s: s + n], tok.pad_token_id) for s, n in zip(starts, sizes)])
            labels.append(f"micro-batches of {list(sizes)} chats")
        # lesson 05's case: a row with no supervised token (truncated away) inside a micro-batch
        last = steps[-1][2]
        steps[-1][2] = {**last, "labels": torch.cat([torch.full_like(last["labels"][:1], IGNORE_INDEX),
                                                     last["labels"][1:]])}
        labels[-1] += ", one chat with no supervised token"
        _HIDDEN.update(model=model, tok=tok, steps=steps, labels=labels)
    return _HIDDEN


def _grad_compare(got, expected) -> str | None:
    if isinstance(got, str):
        return got
    if not isinstance(got, torch.Tensor):
        return f"expected the step's gradient, got {type(got).__name__}"
    if not torch.isfinite(got).all():
        return "the gradient has NaN/inf entries"
    err = relative_error(got, expected)
    if err < 1e-4:
        return None
    return f"relative gradient error {err:.2e} vs the per-sequence objective (want < 1e-4)"


def check_sequence_weighted(fn):
    """Checker for exercise 7.2: after ``fn(model, micro_batches)``, ``.grad`` must be the gradient of the
    mean over the step's sequences (those with a supervised token) of each sequence's mean token loss."""
    from .exercises.answers.lesson07 import accumulate_sequence_weighted as reference

    hidden = _hidden_setup()
    model = hidden["model"]

    def grad_of(accumulate, micro_batches):
        model.zero_grad(set_to_none=True)
        accumulate(model, micro_batches)
        if all(p.grad is None for p in model.parameters()):
            return "no parameter has a .grad: call .backward() on each micro-batch's loss"
        grad = flat_grad(model)
        model.zero_grad(set_to_none=True)
        return grad

    if "expected" not in hidden:  # the reference gradients, once per kernel like the steps themselves
        hidden["expected"] = [grad_of(reference, mbs) for mbs in hidden["steps"]]
    cases = [Case((mbs,), expected, label=label, tag="step")
             for mbs, expected, label in zip(hidden["steps"], hidden["expected"], hidden["labels"])]

    def diagnose(got, case: Case):
        if not isinstance(got, torch.Tensor):
            return None
        if not torch.isfinite(got).all():
            return ("a sequence with no supervised token gave 0/0 = NaN: leave it out (it has no mean), "
                    "and do not count it among the sequences.")
        mbs = case.args[0]
        if relative_error(got, accumulated_grad(model, mbs, "token")) < 1e-4:
            return ("that is per-token averaging (summed loss ÷ the step's tokens): long answers dominate. "
                    "Average each sequence over its own tokens first.")

        def per_micro_batch(m, batches):  # each micro-batch's mean over its sequences, ÷ K
            for b in batches:
                reference(m, [b], _scale=1 / len(batches))
        if relative_error(got, grad_of(per_micro_batch, mbs)) < 1e-4:
            return ("that averages sequences inside each micro-batch, then ÷ K: a sequence in a small "
                    "micro-batch counts more. Divide by the number of sequences of the whole step.")
        ratio = float(got.norm() / case.expected.norm())
        if relative_error(got / ratio, case.expected) < 1e-4:
            return (f"right direction, {ratio:.3g}x the size: check what you divide by — the sequences of "
                    f"the "
                    "whole step that have at least one supervised token.")
        return None

    return run_check("accumulate_sequence_weighted", lambda mbs: grad_of(fn, mbs), cases,
                     compare=_grad_compare, diagnose=diagnose,
                     hint=Hints(question="Under per-sequence averaging, what weight does one token of a "
                                         "sequence "
                                         "with n supervised tokens get, in a step of S sequences?",
                                pointer="The per-token loss comes from F.cross_entropy(..., "
                                        "reduction='none') on "
                                        "the shifted logits and labels (section 4's picture; lesson 05 "
                                        "for the "
                                        "sequence with no target).",
                                answer="S = rows with a supervised token over ALL micro-batches; for each "
                                       "micro-batch: per-row summed CE / per-row count, keep rows with "
                                       "count > 0, (their sum / S).backward()."))


# Every public function above checks its arguments by their conventional names (model, tokenizer,
# batch, steps, ...) before it runs: one what/why/fix message for the slips learners make most.
validate.check_module_arguments(globals())
