"""Lesson 07 (token-weighted accumulation): gradient oracles, the Trainer probe, the DDP launcher.

Accumulating K micro-batches by averaging each micro-batch's *mean* loss weights a token of micro-batch
i by ``1/(K·nᵢ)``; one big batch weighs every token ``1/N`` (N = supervised tokens of the whole step).
The two agree only when every nᵢ is the same. This module measures that on the course model:

- ``accumulated_grad`` / ``full_batch_grad``: the step's gradient, flattened, under either scheme and
  for the one big batch (the oracle), plus ``relative_error`` to compare them;
- ``uneven_micro_batches`` / ``equal_count_micro_batches``: deterministic micro-batches whose
  supervised-token counts differ a lot, or not at all;
- ``trainer_step_grad``: the gradient TRL's ``SFTTrainer`` (transformers' ``Trainer`` loop) hands
  to its optimizer at the accumulation boundary, with today's ``num_items_in_batch`` or without it
  (hooked out, or because the model class says ``accepts_loss_kwargs = False``);
- ``loss_count_ignored``: which classes a ``config.json`` names that make the Trainer skip the count;
- ``run_ddp_grad``: launches ``course_utils.ddp_grad`` under ``torchrun`` (two CPU processes, gloo)
  and reads back the data-parallel gradient under a per-rank mean and under a global token count;
- ``token_weights`` / ``plot_token_weights``: the weight one token gets under each scheme, drawn;
- ``train_and_track`` / ``prediction_kl`` / ``param_distance``: two training runs compared on a held-out
  loss, in what they predict, and in weights;
- ``cite_source``: quote the lines of the installed library that implement the fix;
- ``accumulation_explorer``: the lesson's "what if" over K and the order of the chats.

Used by lesson 07 (``solutions/07_token_weighted.ipynb``) and its worker ``course_utils/ddp_grad.py``.
The exercises (an accumulation trace to diagnose, per-sequence averaging to write) and their checkers are
in ``course_utils.exercises.lesson07``. The loss pieces come from ``course_utils.training``
(``token_losses``, ``micro_batch_loss``) and the token count from ``course_utils.losses.count_supervised``.
"""

from __future__ import annotations

import inspect
import os
import random
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from . import internals, validate
from .data import collate_right, graded, make_messages, n_graded, tokenize_chat
from .losses import count_supervised, model_logits
from .model import load_course_model
from .training import make_sft_trainer, micro_batch_loss, token_losses, train
from .viz import figure, what_if

# Imported where used, with the measured reason: matplotlib.pyplot (~0.4 s) by plot_token_weights, as the
# torchrun workers import this module and draw nothing; trl / transformers' Trainer (~8 s) by
# trainer_step_grad alone.

SCHEMES = ("mean", "token")
MAX_PROCESSES = 8  # run_ddp_grad: each rank is a process with its own course model; the lesson needs 2


_SCHEME_WHY = ("'mean' averages each micro-batch's mean loss, 'token' divides the summed loss by the step's "
               "token count")


def _check_micro_batches(micro_batches) -> None:
    if isinstance(micro_batches, (list, tuple)) and not micro_batches:
        raise ValueError("micro_batches must be a non-empty list of batches — one accumulation step is a "
                         "list of them — build them with data.make_batches() or uneven_micro_batches().")
    validate.batches("micro_batches", micro_batches)


def _check_step(model, micro_batches) -> None:
    """A model and one optimizer step's micro-batches that fit it, with at least one supervised token."""
    validate.model("model", model)
    _check_micro_batches(micro_batches)
    for i, batch in enumerate(micro_batches):
        validate.ids_fit_model(model, batch["input_ids"], name=f"micro_batches[{i}]['input_ids']")
    if sum(count_supervised(b) for b in micro_batches) == 0:
        raise ValueError("no micro-batch has a supervised token (every label is -100) — the step has no "
                         "loss, so its gradient is 0/0 or zero, nothing to compare — pass micro-batches "
                         "with assistant tokens (uneven_micro_batches(), make_batches()).")


def _check_counts(n_tokens) -> None:
    validate.non_empty("n_tokens", n_tokens, what="positive ints (one supervised-token count per "
                       "micro-batch)", fix="pass e.g. [12, 40, 7].")
    for n in n_tokens:
        validate.positive_int("each n_tokens entry", n, why="a micro-batch's weight is 1/n, so it needs "
                              "positive ints")


# what a True/False switch of this module does (validate.flag says it when the value is not a bool)
_FLAG_WHY = "it switches a behaviour on or off, and any non-empty value would count as True"


# ------------------------------------------------------------------------------------------------
# Data: micro-batches whose supervised-token counts differ (or not)
# ------------------------------------------------------------------------------------------------

def multi_turn_conversations(n: int, seed: int = 0, max_turns: int = 6) -> list[list[dict]]:
    """``n`` chats of 1..``max_turns`` question/answer turns: the assistant says 5 to ~50 tokens.

    Real SFT data has answers from a word to pages; the toy tasks alone vary only 5-8 tokens, so
    the lesson stacks turns to get realistic spread in supervised tokens per example.
    """
    validate.positive_int("n", n, why="it is the number of chats")
    validate.seed("seed", seed)
    validate.positive_int("max_turns", max_turns, why="it is the most question/answer pairs per chat")
    return _multi_turn_conversations(n, seed, max_turns)


def _multi_turn_conversations(n: int, seed: int = 0, max_turns: int = 6) -> list[list[dict]]:
    rng = random.Random(seed)
    pool = iter(make_messages("mixed", n * max_turns, seed=seed))
    return [sum((next(pool) for _ in range(rng.randint(1, max_turns))), []) for _ in range(n)]


def _check_split(tokenizer, k, batch_size, seed) -> None:
    validate.tokenizer("tokenizer", tokenizer)
    validate.positive_int("k", k, why="it is the number of micro-batches of the step")
    validate.positive_int("batch_size", batch_size, why="it is the chats per micro-batch")
    validate.seed("seed", seed)


def uneven_micro_batches(tokenizer, k: int = 4, batch_size: int = 2, seed: int = 0) -> list[dict]:
    """``k`` micro-batches of ``batch_size`` chats, sorted by answer length: short ones first.

    Sorting is what ``group_by_length``-style samplers do on purpose (less padding), and it makes the
    per-micro-batch token counts as uneven as a real step can get.
    """
    _check_split(tokenizer, k, batch_size, seed)
    examples = [tokenize_chat(tokenizer, c) for c in _multi_turn_conversations(k * batch_size, seed)]
    examples.sort(key=lambda e: n_graded(e["labels"]))
    return [collate_right(examples[i: i + batch_size], tokenizer.pad_token_id)
            for i in range(0, len(examples), batch_size)]


def equal_count_micro_batches(tokenizer, k: int = 4, batch_size: int = 2, seed: int = 0) -> list[dict]:
    """``k`` micro-batches with the *same* supervised-token count each, but different prompt lengths.

    Chats are grouped by their number of supervised tokens, so only the padding and the prompts
    differ between micro-batches: the case where the per-micro-batch mean is exact. Every micro-batch
    has a different width (padded length): guaranteed, or a ``ValueError``.
    """
    _check_split(tokenizer, k, batch_size, seed)
    by_count: dict[int, list] = {}
    convs = make_messages("mixed", 400, seed=seed, context_words=8, long_tail=True)
    for conv in convs:
        e = tokenize_chat(tokenizer, conv)
        by_count.setdefault(n_graded(e["labels"]), []).append(e)
    count, group = max(by_count.items(), key=lambda kv: len(kv[1]))
    chunks, widths, chunk = [], set(), []
    for e in group:  # in order; a full micro-batch whose width is taken drops its longest chat and fills on
        chunk.append(e)
        if len(chunk) < batch_size:
            continue
        width = max(len(x["input_ids"]) for x in chunk)
        if width in widths:
            chunk.remove(max(chunk, key=lambda x: len(x["input_ids"])))
            continue
        chunks.append(chunk)
        widths.add(width)
        chunk = []
        if len(chunks) == k:
            return [collate_right(c, tokenizer.pad_token_id) for c in chunks]
    raise ValueError(f"only {len(group)} chats share a token count, too few to fill k = {k} micro-batches of "
                     f"{batch_size} with {k} different widths — pass smaller k or batch_size.")


def merge_micro_batches(micro_batches: list[dict], pad_token_id: int = 0) -> dict:
    """The one big batch that the micro-batches pretend to be: every row, right-padded to one width.

    Real tokens are those with ``attention_mask == 1``, wherever they sit, so left-padded micro-batches
    merge correctly too (the pads are dropped, never the real tokens).
    """
    _check_micro_batches(micro_batches)
    # only ids at hand: an id no vocabulary holds is refused (full_batch_grad checks the model's)
    validate.vocab_id("pad_token_id", pad_token_id, why="it is the token id written at the padded positions")
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
    validate.model("model", model)
    return _flat_grad(model)


def _flat_grad(model) -> torch.Tensor:
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    return torch.cat([g.detach().flatten().double().cpu() for g in grads])


def full_batch_grad(model, micro_batches: list[dict], pad_token_id: int = 0) -> torch.Tensor:
    """The oracle: the gradient of the mean loss over every supervised token of the merged big batch.

    Leaves ``.grad`` cleared (set to None), as it found nothing worth keeping there.
    """
    _check_step(model, micro_batches)
    validate.vocab_id("pad_token_id", pad_token_id, vocab_size=model.get_input_embeddings().num_embeddings,
                      owner="the model", why="it is the token id written at the padded positions")
    big = merge_micro_batches(micro_batches, pad_token_id)
    model.zero_grad(set_to_none=True)
    summed, n_tokens = token_losses(model, big)
    (summed / n_tokens).backward()
    grad = _flat_grad(model)
    model.zero_grad(set_to_none=True)
    return grad


def accumulated_grad(model, micro_batches: list[dict], scheme: str = "token") -> torch.Tensor:
    """The step's gradient after one ``.backward()`` per micro-batch, under ``scheme``.

    ``"mean"``: each micro-batch's own mean loss divided by K (the classic loop, and transformers
    before v4.46); ``"token"``: each summed loss divided by the step's total supervised tokens.
    Both come from ``training.micro_batch_loss``, the loss the course's training loop uses. Clears
    ``.grad`` before and after, so the returned vector is this step's gradient alone.
    """
    validate.choice("scheme", scheme, SCHEMES, why=_SCHEME_WHY)
    _check_step(model, micro_batches)
    return _accumulated_grad(model, micro_batches, scheme)


def _accumulated_grad(model, micro_batches: list[dict], scheme: str) -> torch.Tensor:
    step_tokens = sum(count_supervised(b) for b in micro_batches)
    model.zero_grad(set_to_none=True)
    for batch in micro_batches:
        summed, n_tokens = token_losses(model, batch)
        micro_batch_loss(summed, n_tokens, normalise=scheme, accum_steps=len(micro_batches),
                         divide_by_accum=True, step_tokens=step_tokens).backward()  # .grad adds up
    grad = _flat_grad(model)
    model.zero_grad(set_to_none=True)
    return grad


def relative_error(grad: torch.Tensor, reference: torch.Tensor) -> float:
    """‖grad − reference‖ / ‖reference‖: 1e-7 is float noise, 1e-2 is a different gradient."""
    validate.tensor("grad", grad)
    validate.tensor("reference", reference)
    if grad.shape != reference.shape:
        raise ValueError(f"gradients of shapes {tuple(grad.shape)} and {tuple(reference.shape)} — they "
                         "must come from the same model — flatten both with flat_grad().")
    if not bool(torch.isfinite(grad).all()):
        raise ValueError("grad holds NaN or inf — its distance to any reference would be NaN, not a "
                         "measurement — find the micro-batch that produced it (lesson 05: 0/0 on one "
                         "without a supervised token).")
    norm = reference.double().norm()
    if not torch.isfinite(norm) or norm == 0:
        raise ValueError(f"the reference gradient's norm is {float(norm)} — a relative error needs a finite, "
                         "non-zero reference (a zero one means no token carried loss) — compare against a "
                         "step with supervised tokens, or use the absolute difference.")
    return _relative_error(grad, reference)


def _relative_error(grad: torch.Tensor, reference: torch.Tensor) -> float:
    return float((grad.double() - reference.double()).norm() / reference.double().norm())


def token_weights(n_tokens: list[int], scheme: str) -> list[float]:
    """The weight one token of micro-batch i gets in the step's loss, for each micro-batch.

    ``"mean"``: ``1/(K·nᵢ)``; ``"token"``: ``1/N`` with ``N = Σ nᵢ``. Either way the weights of all
    tokens sum to 1 — they differ in *which* tokens get the weight.
    """
    validate.choice("scheme", scheme, SCHEMES, why=_SCHEME_WHY)
    _check_counts(n_tokens)
    k, total = len(n_tokens), sum(n_tokens)
    return [1 / (k * n) if scheme == "mean" else 1 / total for n in n_tokens]


def plot_token_weights(n_tokens: list[int], ax=None):
    """Per-token weight along the step under both schemes, with the big batch's 1/N as a line."""
    _check_counts(n_tokens)
    if ax is not None and not callable(getattr(ax, "axhline", None)):
        raise TypeError(f"ax must be matplotlib Axes, got {type(ax).__name__} — the weights are drawn on "
                        "it — pass ax=None (a new figure) or an Axes from plt.subplots().")
    if ax is None:
        import matplotlib.pyplot as plt  # see the note on imports at the top

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


# train()'s settings a tracked run may change (train_and_track passes model, micro-batches and on_step)
_TRAIN_SETTINGS = tuple(p for p in inspect.signature(train).parameters if p not in ("model", "micro_batches",
                                                                                     "on_step"))


def _check_eval_batch(model, eval_batch) -> None:
    validate.batch("eval_batch", eval_batch, need=("input_ids", "labels"))
    validate.ids_fit_model(model, eval_batch["input_ids"], name="eval_batch['input_ids']")
    if count_supervised(eval_batch) == 0:
        raise ValueError("eval_batch has no supervised token (every label is -100) — the held-out loss is "
                         "averaged over the positions that carry loss — pass a batch from make_batches(...).")


def train_and_track(model, micro_batches: list[dict], eval_batch: dict, **train_kwargs) -> list[dict]:
    """``training.train`` plus, after every step, the token-weighted loss on ``eval_batch`` (``eval_loss``).

    The training loop's own logged loss depends on how it averages micro-batches, so two runs are
    compared on a held-out batch scored the same way for both. ``train_kwargs``: ``train``'s settings
    (``steps`` is required).
    """
    validate.model("model", model)
    _check_eval_batch(model, eval_batch)
    for name in train_kwargs:
        validate.key("a setting of train_and_track", name, _TRAIN_SETTINGS, where="train()'s settings")
    if "steps" not in train_kwargs:
        raise ValueError("train_and_track needs steps=... — it is the number of optimizer steps of the run "
                         "— pass e.g. steps=8 (and accum_steps=K).")
    curve = []

    def on_step(step, trained):
        with torch.no_grad():
            summed, n_tokens = token_losses(trained, eval_batch)
        curve.append(float(summed) / n_tokens)

    records = train(model, micro_batches, on_step=on_step, **train_kwargs)  # train checks the rest
    return [{**r, "eval_loss": e} for r, e in zip(records, curve)]


def _check_same_architecture(model_a, model_b) -> None:
    validate.model("model_a", model_a)
    validate.model("model_b", model_b)
    shapes_a = [p.shape for p in model_a.parameters()]
    shapes_b = [p.shape for p in model_b.parameters()]
    if shapes_a != shapes_b:
        raise ValueError(f"the models' parameters differ ({len(shapes_a)} vs {len(shapes_b)} tensors, or "
                         "their shapes) — two runs compare only when they train copies of one model — pass "
                         "copy.deepcopy(model) trained two ways.")


def param_distance(model_a, model_b) -> float:
    """‖θ_a − θ_b‖ over all parameters: how far apart two training runs ended."""
    _check_same_architecture(model_a, model_b)
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
    _check_same_architecture(model_a, model_b)
    _check_eval_batch(model_a, eval_batch)
    mask = graded(eval_batch["labels"])  # the positions whose next token carries loss
    with torch.no_grad():
        log_p = [model_logits(m, eval_batch)[:, :-1].double().log_softmax(-1) for m in (model_a, model_b)]
    per_position = (log_p[0].exp() * (log_p[0] - log_p[1])).sum(-1)
    return float(per_position[mask].mean())


def cite_source(obj, *needles: str) -> list[str]:
    """Print (and return) ``file:line: code`` for each line of ``obj``'s source containing a needle.

    Lets a lesson quote the installed library rather than a blog post; a needle that is missing
    raises, so the lesson notices when a new version changes the mechanism.
    """
    if not (inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj)):
        raise TypeError(f"obj must be a Python function or class, got {type(obj).__name__} — its source is "
                        "read from the installed file — pass e.g. Trainer.training_step (not a call of it).")
    validate.strings("needles", needles)
    blank = next((n for n in needles if not n.strip()), None)
    if blank is not None:
        raise ValueError(f"needles holds {blank!r} — every line contains it, so the citation would be the "
                         "first line whatever the code says — pass the code to quote, e.g. "
                         "'num_items_in_batch'.")
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
    validate.model("model", model)
    validate.tokenizer("tokenizer", tokenizer)
    validate.model_and_tokenizer(model, tokenizer)
    validate.seed("seed", seed)
    validate.positive_int("n_chats", n_chats, why="it is the size of the step's big batch")
    examples = [tokenize_chat(tokenizer, c) for c in _multi_turn_conversations(n_chats, seed)]
    by_length = sorted(examples, key=lambda e: n_graded(e["labels"]))
    ks = [k for k in range(1, n_chats + 1) if n_chats % k == 0]

    def frame(k, order):
        rows = by_length if order == ORDERS[0] else examples
        size = n_chats // k
        micro = [collate_right(rows[i: i + size], tokenizer.pad_token_id) for i in range(0, n_chats, size)]
        counts = [count_supervised(b) for b in micro]
        full = full_batch_grad(model, micro, tokenizer.pad_token_id)
        errors = {scheme: _relative_error(_accumulated_grad(model, micro, scheme), full)
                  for scheme in SCHEMES}
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
                      count_items: bool = True, bf16: bool = False, accepts_loss_kwargs: bool = True,
                      tell_trainer: bool = False, seed: int = 0, name_or_path=None) -> dict:
    """Run one optimizer step of TRL's ``SFTTrainer`` on a fresh course model; return its gradient.

    A ``TrainerCallback.on_pre_optimizer_step`` copies ``.grad`` right before ``optimizer.step()``:
    that is exactly the accumulated gradient (clipping is off with ``max_grad_norm=0``, so nothing
    touched it). ``count_items=False`` makes ``Trainer._get_num_items_in_batch`` return ``None``
    (``internals.count_items_hook``),
    which restores the pre-v4.46 path: each micro-batch's mean loss, divided by the number of
    accumulation steps in ``Trainer.training_step``. ``bf16=True`` restores ``SFTConfig``'s own default
    (CPU autocast in bfloat16, ~1e-2 gradient noise), which ``make_sft_trainer`` turns off.
    ``accepts_loss_kwargs=False`` sets that flag on the model, as ``Gemma4ForConditionalGeneration`` and the
    Qwen2.5-VL / Qwen3-VL classes declare it (``loss_count_ignored`` lists them): the ``Trainer`` then never
    counts the step's tokens, so the same per-micro-batch-mean path runs with no hook at all.
    ``tell_trainer=True`` is the fix for such a class: ``trainer.model_accepts_loss_kwargs = True`` once the
    trainer is built. ``SFTTrainer.compute_loss`` computes the loss itself and never hands the count to the
    model's ``forward``, so the class's flag only stops the count (not so with a ``compute_loss_func`` or
    label smoothing, which call the model's own loss). ``name_or_path``: the
    course model to load (``COURSE_MODEL`` when None; ``tools.claims`` passes each shipped model).
    Returns ``{"grad", "num_items", "micro_batches"}``: the count the Trainer passed to
    ``compute_loss`` (or None) and the micro-batches exactly as the Trainer fed them to the model.
    """
    validate.positive_int("per_device_train_batch_size", per_device_train_batch_size,
                          why="it is the chats per micro-batch")
    validate.positive_int("gradient_accumulation_steps", gradient_accumulation_steps,
                          why="it is the micro-batches per optimizer step")
    validate.flag("count_items", count_items, why=_FLAG_WHY)
    validate.flag("bf16", bf16, why=_FLAG_WHY)
    validate.flag("accepts_loss_kwargs", accepts_loss_kwargs, why=_FLAG_WHY)
    validate.flag("tell_trainer", tell_trainer, why=_FLAG_WHY)
    validate.seed("seed", seed)
    if not hasattr(dataset, "column_names") or not hasattr(dataset, "__len__"):
        raise TypeError(f"dataset must be a datasets.Dataset, got {type(dataset).__name__} — SFTTrainer "
                        "maps and tokenizes it — pass Dataset.from_dict({'messages': "
                        "multi_turn_conversations(8)}).")
    if "messages" not in dataset.column_names:
        raise ValueError(f"dataset has columns {dataset.column_names}, no 'messages' — assistant_only_loss "
                         "needs conversations — pass Dataset.from_dict({'messages': [...]}).")
    rows = per_device_train_batch_size * gradient_accumulation_steps
    if len(dataset) < rows:
        raise ValueError(f"the dataset has {len(dataset)} rows but one optimizer step of "
                         f"{per_device_train_batch_size} × {gradient_accumulation_steps} needs {rows} — a "
                         "shorter step is another gradient than the one asked for — pass more rows.")

    from transformers import TrainerCallback  # see the note on imports at the top
    from trl import SFTTrainer

    model, tokenizer = load_course_model(name_or_path)
    if not accepts_loss_kwargs:  # Trainer.__init__ reads the model's flag before anything else
        model.accepts_loss_kwargs = False
    captured: dict = {"micro_batches": []}

    class GradAtBoundary(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            captured["grad"] = _flat_grad(model)

    class Recording(SFTTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            captured["micro_batches"].append({k: inputs[k].detach().clone()
                                              for k in ("input_ids", "labels", "attention_mask")})
            return super().training_step(model, inputs, num_items_in_batch)

    # the step-global token count lives in the Trainer's private code: internals is the one adapter to it
    trainer_cls = internals.count_items_hook(Recording, lambda n: captured.update(num_items=n),
                                             count=count_items)
    trainer = make_sft_trainer(model, tokenizer, dataset, trainer_cls=trainer_cls, max_steps=1,
                               per_device_train_batch_size=per_device_train_batch_size,
                               gradient_accumulation_steps=gradient_accumulation_steps,
                               assistant_only_loss=True, learning_rate=1e-3, optim="sgd",
                               max_grad_norm=0.0, weight_decay=0.0, bf16=bf16, seed=seed)
    if tell_trainer:  # the fix: Trainer.__init__ copied the class's flag; SFTTrainer's loss needs the count
        trainer.model_accepts_loss_kwargs = True
    trainer.add_callback(GradAtBoundary())
    trainer.train()
    num_items = captured.get("num_items")
    return {"grad": captured["grad"], "num_items": None if num_items is None else int(num_items),
            "micro_batches": captured["micro_batches"]}


def loss_count_ignored(config: dict, *, gradient_accumulation_steps: int = 1,
                       world_size: int = 1) -> list[str]:
    """The model classes a ``config.json`` names whose ``accepts_loss_kwargs`` is False, when that matters.

    ``Trainer.__init__`` reads the class's ``accepts_loss_kwargs`` (or, without one, looks for ``**kwargs``
    in its ``forward``). When it is False the Trainer never counts the step's supervised tokens
    (``num_items_in_batch`` stays None): TRL divides each micro-batch by its *own* count and the Trainer
    divides by K — lesson 07's per-micro-batch mean, whatever ``SFTTrainer`` promises. That matters only
    with ``gradient_accumulation_steps > 1`` or more than one process; with neither this returns ``[]``.
    The classes are the ones in ``config["architectures"]`` plus the one ``AutoModelForCausalLM`` loads for
    ``config["model_type"]`` (e.g. ``Gemma4ForConditionalGeneration`` for ``gemma4``), read from the
    installed transformers — not from a list kept here. Returns their names, sorted; ``[]`` when every
    class counts the tokens (Qwen2, Llama, Qwen3 ...). The doctor reports a non-empty answer.
    """
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (config.json, loaded), got {type(config).__name__} — the "
                        "architectures it names decide the flag — pass json.load(open('config.json')) or "
                        "model.config.to_dict().")
    if not config.get("architectures") and not config.get("model_type"):
        raise ValueError(f"config names no model class (keys: {sorted(config, key=str)[:8]}) — the flag is "
                         "read from the classes its 'architectures' and 'model_type' name, so there is "
                         "nothing to judge — pass a model's config.json (json.load(open('config.json'))) or "
                         "model.config.to_dict().")
    validate.positive_int("gradient_accumulation_steps", gradient_accumulation_steps,
                          why="it is the micro-batches per optimizer step")
    validate.positive_int("world_size", world_size, why="it is the number of training processes")
    if gradient_accumulation_steps == 1 and world_size == 1:
        return []  # one micro-batch, one process: its own count IS the step's count
    import transformers  # see the note on imports at the top
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = list(config.get("architectures") or [])
    auto_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type"))
    names += [auto_name] if auto_name else []
    blind, known = set(), 0
    for name in names:
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        known += cls is not None
        if cls is not None and not _accepts_loss_kwargs(cls):
            blind.add(name)
    if not known:  # [] would say "every class counts the tokens" of classes nobody looked at
        raise ValueError(f"config names no class the installed transformers {transformers.__version__} has "
                         f"(architectures {config.get('architectures')}, model_type "
                         f"{config.get('model_type')!r}) — the flag is read from the class, so it cannot be "
                         "judged — check the spelling, upgrade transformers, or for a remote-code model read "
                         "its class's accepts_loss_kwargs yourself.")
    return sorted(blind)


def _accepts_loss_kwargs(cls) -> bool:
    """What ``Trainer.__init__`` decides for a model of class ``cls`` (transformers 5.24, trainer.py:517)."""
    if hasattr(cls, "accepts_loss_kwargs"):
        return bool(cls.accepts_loss_kwargs)
    params = inspect.signature(cls.forward).parameters.values()
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)


# ------------------------------------------------------------------------------------------------
# Two processes: launch the torchrun worker and read what it measured
# ------------------------------------------------------------------------------------------------

def _worker_pythonpath() -> str:
    """PYTHONPATH for the torchrun workers: they must import *this* ``course_utils`` — the checkout's, or
    the one installed from a wheel — whatever the kernel's working directory. The folder that holds the
    package goes first unless it is a site-packages folder (already on every interpreter's path, and it
    must not go before the standard library)."""
    here = Path(__file__).resolve().parent.parent
    site_dirs = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    paths = [] if here in site_dirs else [str(here)]
    return os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def run_ddp_grad(nproc: int = 2, seed: int = 0, batch_size: int = 2, timeout: float = 180,
                 skip_timeout: float = 0.5) -> dict:
    """Run ``course_utils.ddp_grad`` under ``torchrun --nproc_per_node=nproc`` (gloo, CPU); load its result.

    The worker gives rank r micro-batch r of ``uneven_micro_batches(tok, k=nproc, ...)`` and returns
    the gradient DDP ends up with under a per-rank mean and under a global token count
    (``all_reduce``); then, with rank 1's micro-batch empty, what each rank met when rank 1 skipped it
    (``"skip"``: seconds waited, the error once ``skip_timeout`` ran out) and the gradient and
    collectives when it ran with a zero loss instead (``"zero_loss"``, ``"zero_loss_collectives"``).
    ``sys.executable -m torch.distributed.run`` is torchrun with this kernel's Python, so the workers
    see the same packages; ``--standalone`` picks a free port. The workers run the module
    ``course_utils.ddp_grad`` in a temporary folder, so a checkout and an installed wheel work alike.
    """
    # validate everything before launching anything: a bad argument must not cost two torchrun launches
    validate.positive_int("nproc", nproc, why="it is the number of processes torchrun starts")
    if nproc > MAX_PROCESSES:
        raise ValueError(f"nproc={nproc} is more than {MAX_PROCESSES} — each rank is a process that loads "
                         "its own course model, and the lesson's point needs only 2 — pass nproc=2 (or up "
                         f"to {MAX_PROCESSES}).")
    validate.seed("seed", seed)
    validate.positive_int("batch_size", batch_size, why="each rank needs at least one chat")
    validate.number("timeout", timeout, positive=True, why="it bounds how long torchrun may run")
    validate.number("skip_timeout", skip_timeout, positive=True,
                    why="it is how long the rank with data waits for the rank that skipped its micro-batch")
    if nproc < 2:
        raise ValueError(f"nproc={nproc}: one process has no peer to wait for — the worker's empty-rank part "
                         "needs a rank 1 — pass nproc=2.")
    work = Path(tempfile.mkdtemp(prefix="sft-lab-07-ddp-"))
    out = work / "grads.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "course_utils.ddp_grad", "--out", str(out), "--seed", str(seed),
           "--batch-size", str(batch_size), "--skip-timeout", str(skip_timeout)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": _worker_pythonpath()}
    for attempt in (1, 2):  # a rank can die in gloo's teardown on a busy machine: one retry, announced
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=work)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"torchrun ran past timeout={timeout} s — {nproc} processes start, build the "
                               "course model and exchange gradients, which takes tens of seconds on a busy "
                               "CPU — pass a larger timeout (the default: 180).") from None
        if proc.returncode == 0 and out.exists():
            return torch.load(out)
        if attempt == 1:
            print(f"torchrun exited with {proc.returncode}; retrying once", file=sys.stderr)
    raise RuntimeError(f"torchrun exited with {proc.returncode} — the worker's gradients are missing — "
                       f"read its output below:\n{(proc.stdout + proc.stderr)[-3000:]}")
