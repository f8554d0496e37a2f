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
- ``train_and_track`` / ``param_distance``: two training runs compared on a held-out loss and in weights;
- ``cite_source``: quote the lines of the installed library that implement the fix;
- ``check_token_weights`` / ``check_accumulate_token_weighted``: the lesson's exercise checkers.

Used by lesson 07 (``solutions/07_token_weighted.ipynb``) and its worker ``course_utils/ddp_grad.py``.
The loss pieces come from ``course_utils.train`` (``token_losses``, ``micro_batch_loss``).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .checks import Case, run_check
from .data import IGNORE_INDEX, collate_right, make_messages, tokenize_chat
from .train import micro_batch_loss, token_losses

SCHEMES = ("mean", "token")


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r} is not one of {SCHEMES} — 'mean' averages each micro-batch's "
                         "mean loss, 'token' divides the summed loss by the step's token count — pass one.")


def _check_micro_batches(micro_batches) -> None:
    if not isinstance(micro_batches, (list, tuple)) or not micro_batches or not all(
            isinstance(b, dict) and "labels" in b and "input_ids" in b for b in micro_batches):
        raise ValueError("micro_batches must be a non-empty list of batches (dicts with input_ids, labels, "
                         "attention_mask) — one accumulation step is a list of them — build them with "
                         "data.make_batches() or uneven_micro_batches().")


# ------------------------------------------------------------------------------------------------
# Data: micro-batches whose supervised-token counts differ (or not)
# ------------------------------------------------------------------------------------------------

def count_supervised(batch: dict) -> int:
    """Tokens of ``batch`` that carry loss: labels after the one-token shift that are not -100."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def multi_turn_conversations(n: int, seed: int = 0, max_turns: int = 6) -> list[list[dict]]:
    """``n`` chats of 1..``max_turns`` question/answer turns: the assistant says 5 to ~50 tokens.

    Real SFT data has answers from a word to pages; the toy tasks alone vary only 5-8 tokens, so
    the lesson stacks turns to get realistic spread in supervised tokens per example.
    """
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns={max_turns!r} must be a positive integer — it is the most "
                         "question/answer pairs per chat — pass e.g. max_turns=6.")
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
    """The one big batch that the micro-batches pretend to be: every row, right-padded to one width."""
    _check_micro_batches(micro_batches)
    rows = []
    for b in micro_batches:
        mask = b.get("attention_mask", torch.ones_like(b["input_ids"]))
        for ids, labels, m in zip(b["input_ids"], b["labels"], mask):
            n = int(m.sum())  # right padding: the real tokens are the first n
            rows.append({"input_ids": ids[:n].tolist(), "labels": labels[:n].tolist()})
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
    if grad.shape != reference.shape:
        raise ValueError(f"gradients of shapes {tuple(grad.shape)} and {tuple(reference.shape)} — they "
                         "must come from the same model — flatten both with flat_grad().")
    return float((grad.double() - reference.double()).norm() / reference.double().norm())


def token_weights(n_tokens: list[int], scheme: str) -> list[float]:
    """Reference for exercise 1: the weight one token of micro-batch i gets in the step's loss.

    ``"mean"``: ``1/(K·nᵢ)``; ``"token"``: ``1/N`` with ``N = Σ nᵢ``. Either way the weights of all
    tokens sum to 1 — they differ in *which* tokens get the weight.
    """
    _check_scheme(scheme)
    if not n_tokens or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in n_tokens):
        raise ValueError(f"n_tokens={n_tokens!r} must be a non-empty list of positive ints — one "
                         "supervised-token count per micro-batch — e.g. [12, 40, 7].")
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

    from .train import train

    records = train(model, micro_batches, on_step=on_step, **train_kwargs)
    return [{**r, "eval_loss": e} for r, e in zip(records, curve)]


def param_distance(model_a, model_b) -> float:
    """‖θ_a − θ_b‖ over all parameters: how far apart two training runs ended."""
    return float(torch.cat([(a.detach() - b.detach()).flatten().double()
                            for a, b in zip(model_a.parameters(), model_b.parameters())]).norm())


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
    from .train import make_sft_trainer

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
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r} must be a positive integer — it is the number of processes "
                         "torchrun starts — pass e.g. nproc=2.")
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
# Exercise 1: the weight of one token
# ------------------------------------------------------------------------------------------------

def _weight_cases() -> list[Case]:
    cases = []
    for counts in ([10, 10], [3, 30], [7, 1, 12, 40], [100]):
        for scheme in SCHEMES:
            cases.append(Case((counts, scheme), token_weights(counts, scheme), label=f"{counts}, {scheme!r}"))
    return cases


def _diagnose_weights(got, case: Case):
    counts, scheme = case.args
    k, total = len(counts), sum(counts)
    if not isinstance(got, (list, tuple)) or len(got) != k:
        return "return one weight per micro-batch (a list as long as n_tokens)."
    guesses = {
        "per-micro-batch mean without ÷K: 1/nᵢ — the K micro-batches then count K times.":
            [1 / n for n in counts],
        "that is the per-micro-batch mean ÷ K; the 'token' scheme gives every token 1/N, N = sum(n_tokens).":
            [1 / (k * n) for n in counts],
        "that is the token scheme (1/N); 'mean' divides each micro-batch's mean by K: 1/(K·nᵢ).":
            [1 / total] * k,
        "1/K is a micro-batch's share; one token of it gets 1/(K·nᵢ) ('mean') or 1/N ('token').":
            [1 / k] * k,
    }
    for hint, guess in guesses.items():
        if all(abs(g - e) < 1e-9 for g, e in zip(got, guess)):
            return hint
    return None


def check_token_weights(fn) -> object:
    """Checker for exercise 1: ``fn(n_tokens, scheme) -> [weight of one token of micro-batch i]``."""
    return run_check("token_weights", fn, _weight_cases(), diagnose=_diagnose_weights,
                     hint="scheme 'mean': a token of micro-batch i weighs 1/(K·nᵢ); scheme 'token': 1/N "
                          "for every token, with N = sum(n_tokens).")


# ------------------------------------------------------------------------------------------------
# Exercise 2: token-weighted accumulation, checked against the full-batch gradient
# ------------------------------------------------------------------------------------------------

_HIDDEN: dict = {}


def _hidden_setup():
    """The course model and hidden variable-length steps (built once per kernel)."""
    if not _HIDDEN:
        from .model import load_course_model

        model, tok = load_course_model(device="cpu")
        steps = [uneven_micro_batches(tok, k=k, batch_size=b, seed=100 + k)
                 for k, b in ((2, 2), (3, 1), (4, 2))]
        empty = uneven_micro_batches(tok, k=3, batch_size=1, seed=7)
        # lesson 05's case: a micro-batch whose every label is -100
        empty[1] = {**empty[1], "labels": torch.full_like(empty[1]["labels"], IGNORE_INDEX)}
        steps.append(empty)
        _HIDDEN.update(model=model, tok=tok, steps=steps, labels=[
            "2 micro-batches x 2 chats", "3 micro-batches x 1 chat", "4 micro-batches x 2 chats",
            "a micro-batch with no supervised token"])
    return _HIDDEN


def _grad_compare(got, expected) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"expected the step's gradient, got {type(got).__name__}"
    if not torch.isfinite(got).all():
        return "the gradient has NaN/inf entries"
    err = relative_error(got, expected)
    if err < 1e-4:
        return None
    return f"relative gradient error {err:.2e} vs the full-batch gradient (want < 1e-4)"


def check_accumulate_token_weighted(fn) -> object:
    """Checker for exercise 2: ``fn(model, micro_batches)`` must leave the big batch's gradient in ``.grad``.

    Each hidden step is compared, as a whole gradient, with ``full_batch_grad`` of the merged step.
    """
    hidden = _hidden_setup()
    model, tok = hidden["model"], hidden["tok"]

    def learner_grad(micro_batches):
        model.zero_grad(set_to_none=True)
        fn(model, micro_batches)
        if all(p.grad is None for p in model.parameters()):
            return "no gradient"
        grad = flat_grad(model)
        model.zero_grad(set_to_none=True)
        return grad

    cases = [Case((mbs,), full_batch_grad(model, mbs, tok.pad_token_id), label=label)
             for mbs, label in zip(hidden["steps"], hidden["labels"])]

    def diagnose(got, case: Case):
        if isinstance(got, str):
            return "no parameter has a .grad: call .backward() on each micro-batch's loss."
        if not torch.isfinite(got).all():
            return ("a micro-batch with no supervised token gave NaN: its own mean is 0/0 (lesson 05). "
                    "Divide the *summed* loss by the step's total count and the empty micro-batch adds 0.")
        mbs = case.args[0]
        k = len(mbs)
        mean_grad = accumulated_grad(model, mbs, "mean")
        if relative_error(got, mean_grad) < 1e-4:
            return ("that is the per-micro-batch mean ÷ K: each token weighs 1/(K·nᵢ). Divide each "
                    "micro-batch's *summed* loss by the total supervised tokens of all micro-batches.")
        if relative_error(got, k * mean_grad) < 1e-4:
            return "that is the sum of per-micro-batch means: no token weighting and K times too large."
        ratio = float(got.norm() / case.expected.norm())
        n_total = sum(count_supervised(b) for b in mbs)
        if relative_error(got / ratio, case.expected) < 1e-4:
            if abs(ratio - n_total) / n_total < 1e-3:
                return "right direction, N times too large: divide the summed loss by N, the step's tokens."
            return (f"right direction, {ratio:.3g}x the size: the weights are right up to a constant — "
                    "check what you divide by (the supervised tokens of ALL micro-batches, after the shift).")
        return None

    return run_check("accumulate_token_weighted", learner_grad, cases, compare=_grad_compare,
                     diagnose=diagnose,
                     hint="count N = supervised tokens over all micro-batches first (count_supervised), "
                          "then for each micro-batch: summed, _ = token_losses(model, batch); "
                          "(summed / N).backward().")
