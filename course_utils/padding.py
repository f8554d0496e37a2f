"""Lesson 03 (padding, attention masks and packing): layouts, leak measurements, collates, checkers.

Three ways to put several examples into one tensor, and what each lets a real token attend to:

- **right padding** (``collate_padded(..., "right")``, training): pads come *after* every real
  token, so a causal mask alone already hides them from real tokens;
- **left padding** (``collate_left``, batched generation): pads come *before* the prompt, so only
  the ``attention_mask`` hides them;
- **packing** (``collate_packed``, padding-free training): examples follow each other in one row,
  so only restarting ``position_ids`` (from which transformers infers a block-diagonal mask) or an
  explicit block-diagonal mask (``block_causal_mask``) keeps them apart.

``padded_drift`` / ``packed_drift`` measure the leak as the max |Δlogit| of real tokens against each
example run alone; ``allowed_attention`` returns the mask transformers really builds, and
``plot_attention_layouts`` draws it. ``padding_explorer`` (built on ``padding_frame``) puts the layout,
``attention_mask``, ``position_ids`` and ``use_cache`` of one forward call on sliders and measures each
setting. ``greedy_continuations`` shows what a right-padded batched ``generate`` continues from.
Exercises: ``padding_incident`` generates broken batches and
generations for the diagnosis exercise (``check_padding_diagnosis``); ``check_block_mask`` grades the
fix exercise (a 4-D mask built from ``position_ids``). Reference answers: ``answers/lesson03.py``.
"""

from __future__ import annotations

import math
import random

import torch

from . import validate
from .checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check
from .data import IGNORE_INDEX, collate_right

SIDES = ("right", "left")


# ------------------------------------------------------------------------------------------------
# Collates: the three layouts
# ------------------------------------------------------------------------------------------------

def _check_examples(examples, need_labels: bool = True) -> None:
    if not isinstance(examples, (list, tuple)) or not examples:
        raise ValueError("examples must be a non-empty list of tokenize_chat() outputs — a batch needs at "
                         "least one example — pass e.g. [tokenize_chat(tok, m) for m in convs].")
    for e in examples:
        if not isinstance(e, dict) or "input_ids" not in e or (need_labels and "labels" not in e):
            raise ValueError("each example must be a dict with 'input_ids' and 'labels' (as tokenize_chat "
                             "returns) — the collate pads both — tokenize the conversations first.")
        if len(e["input_ids"]) == 0:
            raise ValueError("an example has no tokens — it would be all padding, and its row would have "
                             "nothing to attend to — drop empty examples before collating.")


def collate_padded(examples: list[dict], pad_token_id: int, side: str = "right") -> dict:
    """Pad tokenized examples on ``side`` into ``input_ids``, ``attention_mask``, ``labels`` tensors.

    Pads get label ``-100`` on either side: the collate knows where each example ends, so the labels
    never depend on the attention mask. ``side="right"`` is the foundation's ``data.collate_right``.
    """
    if side not in SIDES:
        raise ValueError(f"side={side!r} is not 'right' or 'left' — those are the two padding layouts — "
                         "pass side='right' for training or side='left' for generation.")
    _check_examples(examples)
    if side == "right":
        return collate_right(examples, pad_token_id)
    width = max(len(e["input_ids"]) for e in examples)
    batch = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        pad = width - len(e["input_ids"])
        batch["input_ids"].append([pad_token_id] * pad + list(e["input_ids"]))
        batch["attention_mask"].append([0] * pad + [1] * len(e["input_ids"]))
        batch["labels"].append([IGNORE_INDEX] * pad + list(e["labels"]))
    return {k: torch.tensor(v) for k, v in batch.items()}


def collate_left(prompts: list[list[int]], pad_token_id: int) -> dict:
    """Left-pad prompt token lists for batched generation: ``input_ids`` and ``attention_mask``.

    Every prompt then ends in the last column, which is where ``generate`` appends the next token.
    """
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(len(p) for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists — generate() "
                         "continues each one — pass e.g. [tok(p)['input_ids'] for p in texts].")
    width = max(len(p) for p in prompts)
    ids = [[pad_token_id] * (width - len(p)) + list(p) for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def collate_packed(examples: list[dict]) -> dict:
    """Pack examples into one row: ``input_ids``, ``labels``, ``position_ids``, each of shape [1, total].

    ``position_ids`` restart at 0 for every example: that reset is how transformers (and flash
    attention's varlen kernels) find the boundaries. The first label of every example is ``-100``:
    after the shift inside the loss it would be predicted from the *previous* example's last token.
    No ``attention_mask``: an all-ones one would switch off the block-diagonal inference.
    """
    _check_examples(examples)
    ids, labels, positions = [], [], []
    for e in examples:
        ids += list(e["input_ids"])
        labels += [IGNORE_INDEX] + list(e["labels"])[1:]
        positions += list(range(len(e["input_ids"])))
    return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([positions])}


def block_causal_mask(lengths: list[int]) -> torch.Tensor:
    """An explicit [1, 1, total, total] boolean mask: causal inside each example, nothing across.

    transformers passes a 4D mask through unchanged (``masking_utils._preprocess_mask_arguments``), so
    this keeps packed examples apart even when a cache or an all-ones mask would defeat the inference.
    """
    if not lengths or any(int(n) < 1 for n in lengths):
        raise ValueError(f"lengths={lengths!r} must be positive example lengths — each block is one "
                         "example — pass [len(e['input_ids']) for e in examples].")
    example = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor([int(n) for n in lengths]))
    total = len(example)
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return (causal & (example[:, None] == example[None, :]))[None, None]


def packed_segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each example in a packed row: a new one starts wherever the position is 0."""
    if position_ids.dim() != 2 or position_ids.shape[0] != 1:
        raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}, expected [1, total] — a "
                         "packed batch is one row — pass batch['position_ids'] of a padding-free batch.")
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("position_ids do not start at 0 — without a reset nothing marks where an example "
                         "begins — build them with collate_packed or TRL's padding-free collator.")
    return list(zip(starts, starts[1:] + [position_ids.shape[1]]))


# ------------------------------------------------------------------------------------------------
# Measurements: how much do real tokens' logits move?
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
def alone_logits(model, input_ids) -> torch.Tensor:
    """Logits of one sequence run by itself: no padding, no neighbours, no cache (the reference)."""
    ids = torch.as_tensor(input_ids, device=model.device).reshape(1, -1)
    return model(input_ids=ids, use_cache=False).logits[0].float().cpu()


def _check_logits_of(batch: dict, logits) -> None:
    validate.tensor("logits", logits, ndim=3, integer_dtype=False)
    if logits.shape[:2] != batch["input_ids"].shape:
        raise ValueError(f"logits have shape {tuple(logits.shape)} but the batch "
                         f"{tuple(batch['input_ids'].shape)} — each token's logits are compared with its "
                         "solo run — pass the logits of this batch.")


def _drift_per_token(model, batch: dict, logits, spans) -> list[torch.Tensor]:
    """|Δlogit| of each token in ``spans`` (max over the vocabulary) vs its example run alone.

    ``spans``: ``(row, where)`` per example, ``where`` a boolean mask or a slice of that row.
    """
    drifts = []
    for row, where in spans:
        reference = alone_logits(model, batch["input_ids"][row][where])
        if isinstance(where, torch.Tensor):
            where = where.to(logits.device)
        drifts.append((logits[row][where].float().cpu() - reference).abs().amax(-1))
    return drifts


def _padded_spans(batch: dict) -> list:
    return list(enumerate(batch["attention_mask"].bool()))


def _packed_spans(batch: dict) -> list:
    return [(0, slice(start, end)) for start, end in packed_segments(batch["position_ids"])]


def padded_drift(model, batch: dict, logits: torch.Tensor) -> float:
    """Max |Δlogit| over real tokens (``attention_mask == 1``) of a padded batch vs each row alone.

    ``logits`` come from whatever forward call you want to judge (with or without the mask); the
    batch's ``attention_mask`` is only used here to find the real tokens, on either side.
    """
    validate.batch("batch", batch, need=("input_ids", "attention_mask"))
    _check_logits_of(batch, logits)
    return max(float(d.max()) for d in _drift_per_token(model, batch, logits, _padded_spans(batch)))


def packed_drift(model, batch: dict, logits: torch.Tensor) -> float:
    """Max |Δlogit| over every token of a packed row vs each example alone (segments from position_ids)."""
    validate.batch("batch", batch, need=("input_ids", "position_ids"))
    _check_logits_of(batch, logits)
    return max(float(d.max()) for d in _drift_per_token(model, batch, logits, _packed_spans(batch)))


@torch.no_grad()
def allowed_attention(model, input_ids, attention_mask=None, position_ids=None, *,
                      use_cache: bool = False) -> torch.Tensor:
    """The [batch, query, key] boolean mask transformers builds for this call (True = may attend).

    Calls ``transformers.masking_utils.create_causal_mask`` exactly as the model's forward does:
    without a cache, or (``use_cache=True``, the default call's ``config.use_cache``) with the fresh
    ``DynamicCache`` the forward builds; ``None`` from it means "plain causal" (the kernel's own mask).
    """
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache={use_cache!r} must be True or False — it decides whether the forward "
                         "builds a cache, which changes the mask — pass use_cache=True or use_cache=False.")

    validate.tensor("input_ids", input_ids, ndim=2, integer_dtype=True)
    validate.ids_fit_model(model, input_ids)
    for name, extra in (("attention_mask", attention_mask), ("position_ids", position_ids)):
        if extra is None:
            continue
        validate.tensor(name, extra, integer_dtype=None)
        if extra.ndim == 2 and extra.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(extra.shape)} but input_ids {tuple(input_ids.shape)}"
                             " — "
                             "each token needs its own entry, else the mask would describe another batch — "
                             f"pass the {name} collated with these input_ids.")
        if extra.ndim != 2 and not (name == "attention_mask" and extra.ndim == 4):
            raise ValueError(f"{name} has {extra.ndim} dimensions — a 2-D [batch, seq] tensor (or a 4-D "
                             "[batch, 1, query, key] mask) is what transformers reads — pass the collate's "
                             f"{name}.")
    embeds = model.get_input_embeddings()(input_ids)
    cache = DynamicCache(config=model.config) if use_cache else None
    mask = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=attention_mask,
                              cache=cache, position_ids=position_ids)
    batch, length = input_ids.shape
    if mask is None:
        return torch.ones(length, length, dtype=torch.bool).tril().expand(batch, -1, -1).clone()
    if mask.dtype != torch.bool:  # eager masks are additive floats: 0 where allowed, -inf elsewhere
        mask = mask == 0
    return mask[:, 0].cpu()


# Categories of a (query, key) cell in the pictures
BLOCKED, OWN, PAD, OTHER, PAD_QUERY = 0, 1, 2, 3, 4
CATEGORY_NAMES = ("blocked", "own example", "a pad token", "another example", "pad query (output unused)")


def attention_categories(allowed: torch.Tensor, example_of: torch.Tensor) -> torch.Tensor:
    """Label each allowed (query, key) cell of one row: own example, pad, or another example.

    ``allowed``: [query, key] booleans from ``allowed_attention``; ``example_of``: [length] example
    index of each token, ``-1`` for pads. Real queries that reach a pad or another example leak.
    """
    q_ex, k_ex = example_of[:, None], example_of[None, :]
    cats = torch.full(allowed.shape, BLOCKED)
    cats[allowed & (k_ex == q_ex)] = OWN
    cats[allowed & (k_ex == -1)] = PAD
    cats[allowed & (k_ex != q_ex) & (k_ex != -1)] = OTHER
    cats[(q_ex == -1).expand_as(allowed) & allowed] = PAD_QUERY
    return cats


def leak_counts(cats: torch.Tensor) -> dict:
    """How many (real query, key) cells reach a pad or another example: both should be 0."""
    return {"real->pad": int((cats == PAD).sum()), "real->other example": int((cats == OTHER).sum())}


def plot_attention_layouts(panels: dict):
    """One figure, one heatmap per layout: ``{title: categories}`` from ``attention_categories``."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    colours = ["#ffffff", "#52b788", "#d62828", "#f77f00", "#d9d9d9"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4))
    for ax, (title, cats) in zip(list(axes) if len(panels) > 1 else [axes], panels.items()):
        ax.imshow(cats, cmap=ListedColormap(colours), vmin=0, vmax=len(colours) - 1, interpolation="nearest")
        counts = leak_counts(cats)
        ax.set_title(f"{title}\nreal→pad {counts['real->pad']} · real→other {counts['real->other example']}",
                     fontsize=9)
        ax.set_xlabel("key position (token index)")
        ax.set_ylabel("query position (token index)")
        step = 10 if cats.shape[0] <= 60 else 40  # keep tick labels from overlapping on long packed rows
        ax.set_xticks(range(0, cats.shape[1], step))
        ax.set_yticks(range(0, cats.shape[0], step))
    handles = [Patch(facecolor=c, edgecolor="#999999", label=n) for c, n in zip(colours, CATEGORY_NAMES)]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle("What each query may attend to, as transformers builds the mask (leak cells: 0 expected)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return fig


# ------------------------------------------------------------------------------------------------
# What if: one forward call, four switches (layout, attention_mask, position_ids, cache)
# ------------------------------------------------------------------------------------------------

LAYOUTS = {"right padding": "right", "left padding": "left", "packed row": "packed"}


def _layout_call(examples, pad_token_id: int, layout: str, attention_mask: bool, position_ids: bool):
    """The batch of ``layout`` (for measuring), what the call passes, and the example of each token."""
    if layout == "packed":
        batch = collate_packed(examples)
        lengths = [len(e["input_ids"]) for e in examples]
        example_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]
        mask = torch.ones_like(batch["input_ids"])  # what TRL's "wrapped" packing collator returns
        restart = batch["position_ids"]
    else:
        batch = collate_padded(examples, pad_token_id, layout)
        mask = batch["attention_mask"]
        example_of = torch.where(mask == 1, torch.arange(len(examples))[:, None], -1)
        restart = (mask.cumsum(-1) - 1).clamp(min=0)  # each row's first real token at 0, as generate() counts
    call = {"input_ids": batch["input_ids"]}
    if attention_mask:
        call["attention_mask"] = mask
    if position_ids:
        call["position_ids"] = restart
    return batch, call, example_of


def padding_frame(model, examples, pad_token_id: int, *, layout: str = "left", attention_mask: bool = False,
                  position_ids: bool = False, use_cache: bool = False, same: float = 1e-4, leak: float = 0.1):
    """One forward call of ``examples`` in ``layout`` ("right", "left" or "packed"): ``(text, figure)``.

    ``attention_mask``: pass the collate's mask (all ones for a packed row, as TRL's "wrapped" packing
    does); ``position_ids``: pass positions that restart at 0 where each example begins; ``use_cache``:
    what the forward is called with. The text gives the max |Δlogit| of real tokens vs each example alone,
    per example, and the (real query → pad / other example) cells of the mask transformers built; the
    figure draws |Δlogit| token by token, with ``same`` (round-off) and ``leak`` as lines.
    """
    from .viz import figure

    validate.choice("layout", layout, tuple(LAYOUTS.values()), why="they are the lesson's three layouts")
    for name, flag in (("attention_mask", attention_mask), ("position_ids", position_ids),
                       ("use_cache", use_cache)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False — it switches one argument of the "
                             f"forward call on or off — pass {name}=True or {name}=False.")
    same = validate.number("same", same, positive=True, why="below it two logits count as equal")
    leak = validate.number("leak", leak, positive=True, why="above it a real token saw a neighbour")
    if same >= leak:
        raise ValueError(f"same={same} is not below leak={leak} — a drift cannot be both round-off and a "
                         "leak — pass e.g. same=1e-4, leak=0.1.")
    _check_examples(examples)
    batch, call, example_of = _layout_call(examples, pad_token_id, layout, attention_mask, position_ids)
    call = {k: v.to(model.device) for k, v in call.items()}
    with torch.no_grad():
        logits = model(**call, use_cache=use_cache).logits
    spans = _packed_spans(batch) if layout == "packed" else _padded_spans(batch)
    drifts = _drift_per_token(model, batch, logits, spans)
    allowed = allowed_attention(model, call["input_ids"], call.get("attention_mask"),
                                call.get("position_ids"), use_cache=use_cache)
    cells = {"real->pad": 0, "real->other example": 0}
    for row in range(allowed.shape[0]):
        for key, count in leak_counts(attention_categories(allowed[row], example_of[row])).items():
            cells[key] += count

    worst = max(float(d.max()) for d in drifts)
    verdict = (f"exact (below {same:.0e}: float round-off)" if worst < same else
               f"LEAK (above {leak:g})" if worst > leak else f"between {same:.0e} and {leak:g}")
    name = next(label for label, value in LAYOUTS.items() if value == layout)
    setting = (f"{name} · attention_mask {'passed' if attention_mask else 'not passed'}"
               f"{' (all ones)' if attention_mask and layout == 'packed' else ''} · position_ids "
               f"{'restart per example' if position_ids else 'not passed (0, 1, 2, ...)'}"
               f" · use_cache={use_cache}")
    text = "\n".join([
        setting,
        f"max |Δlogit| of real tokens vs each example alone: {worst:.2e} → {verdict}",
        "by example: " + " · ".join(f"#{i} {float(d.max()):.1e}" for i, d in enumerate(drifts)),
        f"mask transformers built: real→pad {cells['real->pad']} cells, "
        f"real→other example {cells['real->other example']} cells",
    ])

    fig, ax = figure(7, 3.3)
    for i, ((row, where), d) in enumerate(zip(spans, drifts)):
        columns = torch.arange(batch["input_ids"].shape[1])[where]
        ax.plot(columns, d.clamp(min=1e-8), lw=1.2, label=f"example {i}" + ("" if layout == "packed" else
                                                                             f" (row {row})"))
    ax.axhline(same, color="#52b788", ls="--", lw=1, label=f"round-off ({same:.0e})")
    ax.axhline(leak, color="#d62828", ls="--", lw=1, label=f"leak ({leak:g})")
    ax.set_yscale("log")
    top = max(100.0, 3 * worst)
    ax.set_ylim(1e-8, top)
    ax.set_yticks([10.0 ** e for e in range(-8, math.floor(math.log10(top)) + 1, 2)])
    ax.minorticks_off()  # dozens of unlabelled log ticks would only slow each redraw
    ax.set_xlabel("column in the batch row (token index)")
    ax.set_ylabel("max |Δlogit| vs alone\n(0 drawn at 1e-8)")
    ax.set_title(f"{name}, mask {'on' if attention_mask else 'off'}, positions "
                 f"{'reset' if position_ids else 'default'}, cache {'on' if use_cache else 'off'}",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return text, fig


def padding_explorer(model, examples, pad_token_id: int, *, same: float = 1e-4, leak: float = 0.1):
    """What if: layout × ``attention_mask`` × ``position_ids`` × ``use_cache`` sliders → ``padding_frame``.

    Each move is one forward pass of ``examples`` on ``model`` (cached once seen); it starts on left
    padding without a mask, the leak of section 2 (bad arguments fail there, when the control is built).
    """
    from .viz import what_if

    return what_if(
        lambda layout, attention_mask, position_ids, use_cache: padding_frame(
            model, examples, pad_token_id, layout=layout, attention_mask=attention_mask,
            position_ids=position_ids, use_cache=use_cache, same=same, leak=leak),
        {"layout": LAYOUTS,
         "attention_mask": {"not passed": False, "passed": True},
         "position_ids": {"not passed": False, "restart per example": True},
         "use_cache": {"False (as SFTTrainer)": False, "True (config default)": True}},
        start={"layout": "left"},
        descriptions={"attention_mask": "attention_mask (packed: all ones)"})


# ------------------------------------------------------------------------------------------------
# Batched generation
# ------------------------------------------------------------------------------------------------

def _until_stop(tokens: list[int], stop_ids) -> list[int]:
    out = []
    for t in tokens:
        out.append(t)
        if t in stop_ids:
            break
    return out


@torch.no_grad()
def greedy_continuations(model, prompts: list[list[int]], pad_token_id: int, layout: str = "alone", *,
                         max_new_tokens: int = 8, stop_ids=(0,)) -> list[list[int]]:
    """Greedy new tokens for each prompt: ``layout`` "alone" (one at a time), "right" or "left" (one batch).

    Each continuation is cut after its first stop token, so batch-mates that run on do not count.
    """
    validate.choice("layout", layout, ("alone",) + SIDES, why="the three ways to feed prompts to generate() "
                    "compared here")
    validate.positive_int("max_new_tokens", max_new_tokens, why="it is how many tokens generate() adds")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and max(map(len, prompts), default=0) + max_new_tokens > limit:
        raise ValueError(f"prompts plus max_new_tokens={max_new_tokens} exceed the model's {limit} positions"
                         " — "
                         "positions past the limit have no embedding — pass a smaller max_new_tokens.")
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(stop_ids),
                  pad_token_id=pad_token_id)
    if layout == "alone":
        outs = []
        for p in prompts:
            ids = torch.tensor([p], device=model.device)
            new = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)[0, len(p):]
            outs.append(new)
    else:
        if layout == "left":
            batch = collate_left(prompts, pad_token_id)
        else:
            width = max(map(len, prompts))  # the layout generate() warns about: pads after the prompt
            ids = [list(p) + [pad_token_id] * (width - len(p)) for p in prompts]
            mask = [[1] * len(p) + [0] * (width - len(p)) for p in prompts]
            batch = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
        batch = {k: v.to(model.device) for k, v in batch.items()}
        outs = model.generate(**batch, **kwargs)[:, batch["input_ids"].shape[1]:]
    return [_until_stop(o.tolist(), set(stop_ids)) for o in outs]


def differing_tokens(reference: list[list[int]], other: list[list[int]]) -> int:
    """How many generated tokens differ, position by position (a missing token counts as different)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference continuations but {len(other)} others — the "
                         "comparison is prompt by prompt — pass both lists for the same prompts, in order.")
    total = 0
    for ref, out in zip(reference, other):
        width = max(len(ref), len(out))  # a continuation that stopped early differs at every later position
        padded_ref, padded_out = ref + [None] * (width - len(ref)), out + [None] * (width - len(out))
        total += sum(a != b for a, b in zip(padded_ref, padded_out))
    return total


# ------------------------------------------------------------------------------------------------
# Exercise 7.1 (diagnosis): a broken batch or a batched generation, from one of several causes
# ------------------------------------------------------------------------------------------------

INCIDENT_CAUSES = (
    "left_padding_without_mask",        # forward: pads before real tokens, no attention_mask
    "no_leak",                          # forward: right padding, no attention_mask (looks alarming, is exact)
    "packing_without_position_reset",   # forward: one packed row, position_ids 0..T-1
    "packing_with_all_ones_mask",       # forward: reset position_ids plus an all-ones attention_mask
    "packing_with_cache",               # forward: reset position_ids, no mask, default call (use_cache=True)
    "right_padded_generation",          # generate: pads after the prompt, mask passed
    "never_stops",                      # generate: lesson 02's look-alike, left padding is fine
)


def _content(rng: random.Random, n: int, avoid: set) -> list[int]:
    return [t for t in (rng.randrange(10, 500) for _ in range(4 * n)) if t not in avoid][:n]


def padding_incident(seed: int) -> tuple[dict, Diagnosis]:
    """A broken (or look-alike) artefact and its true ``Diagnosis``; ``seed`` picks cause and contents.

    The artefact is what you would have in hand when debugging: ``kind`` ("forward" or "generate"),
    the ``batch`` exactly as passed to the model, the ``call`` keyword arguments (``use_cache``; absent
    means the default, ``model.config.use_cache=True``), ``pad_token_id``, ``stop_ids``, for packed rows
    the ``cu_seq_lens`` the data pipeline knows (where each example starts), and for generation the
    ``generated`` token lists and ``max_new_tokens``. Evidence of the truth: the sorted list of affected
    rows (padding and generation causes), the index of the first token that can see another example
    (packing causes), or ``None`` (nothing leaks).
    """
    seed = validate.integer("seed", seed, minimum=0, why="it picks the generated case")
    rng = random.Random(seed)
    cause = INCIDENT_CAUSES[seed % len(INCIDENT_CAUSES)]
    pad, im_end = rng.sample(range(0, 8), 2)
    avoid = {pad, im_end}
    art: dict = {"pad_token_id": pad, "stop_ids": (pad, im_end), "call": {}, "cu_seq_lens": None}
    if cause.startswith("packing"):
        lengths = [rng.randint(4, 12) for _ in range(rng.randint(2, 4))]
        ids = _content(rng, sum(lengths), avoid)
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        reset = [p for n in lengths for p in range(n)]
        batch = {"input_ids": torch.tensor([ids])}
        if cause == "packing_without_position_reset":
            batch["position_ids"] = torch.arange(len(ids))[None]
            art["call"] = {"use_cache": False}
        elif cause == "packing_with_all_ones_mask":
            batch["position_ids"] = torch.tensor([reset])
            batch["attention_mask"] = torch.ones(1, len(ids), dtype=torch.long)
            art["call"] = {"use_cache": False}
        else:
            batch["position_ids"] = torch.tensor([reset])  # the default call: config.use_cache=True
        art.update(kind="forward", batch=batch, cu_seq_lens=starts + [len(ids)])
        return art, Diagnosis(cause, starts[1])
    rows = rng.randint(3, 5)
    lengths = [rng.randint(3, 9) for _ in range(rows)]
    lengths[rng.randrange(rows)] = 10  # one longest row, so at least one row has no pads
    prompts = [_content(rng, n, avoid) for n in lengths]
    padded_rows = [i for i, n in enumerate(lengths) if n < 10]
    side = "right" if cause in ("no_leak", "right_padded_generation") else "left"
    batch = collate_padded([{"input_ids": p, "labels": p} for p in prompts], pad, side)
    del batch["labels"]
    if cause in ("left_padding_without_mask", "no_leak"):
        del batch["attention_mask"]
        art.update(kind="forward", batch=batch)
        return art, Diagnosis(cause, padded_rows if cause != "no_leak" else None)
    max_new = 8
    art.update(kind="generate", batch=batch, max_new_tokens=max_new)
    if cause == "right_padded_generation":
        first = rng.randrange(10, 500)  # every padded row continues from the pad token: the same first token
        generated = []
        for i in range(rows):
            body = ([first] if i in padded_rows else []) + _content(rng, rng.randint(2, 5), avoid)
            generated.append(body + [im_end])
        art["generated"] = generated
        return art, Diagnosis(cause, padded_rows)
    never = sorted(rng.sample(range(rows), rng.randint(1, rows)))
    art["generated"] = [_content(rng, max_new, avoid) if i in never else
                        _content(rng, rng.randint(1, max_new - 1), avoid) + [im_end] for i in range(rows)]
    return art, Diagnosis(cause, never)


def _evidence_ok(got, truth: Diagnosis) -> bool:
    if truth.evidence is None:
        return got is None or (isinstance(got, (list, tuple, set)) and not got)
    if isinstance(truth.evidence, list):
        try:
            return sorted(int(r) for r in got) == truth.evidence
        except TypeError:
            return False
    return not isinstance(got, bool) and isinstance(got, int) and got == truth.evidence


_INCIDENT_MISCONCEPTIONS = {
    ("left_padding_without_mask", "no_leak"):
        "the pads come AFTER every real token here: a causal mask already hides them (section 2).",
    ("no_leak", "left_padding_without_mask"):
        "pads BEFORE real tokens are visible to them unless attention_mask hides them (section 2).",
    ("right_padded_generation", "never_stops"):
        "the prompts end in the last column (left padding): the batch is fine, the rows never emit a "
        "stop token (lesson 02).",
    ("never_stops", "right_padded_generation"):
        "every row stops; look at the last column of the prompts: generate() reads the first new token "
        "there.",
    ("packing_with_cache", "packing_with_all_ones_mask"):
        "use_cache is off here; what else turns off transformers' inference from position_ids?",
    ("packing_with_all_ones_mask", "packing_with_cache"):
        "there is no attention_mask here; check the call's use_cache (absent = the config's True).",
    ("packing_with_cache", "packing_without_position_reset"):
        "position_ids never restart at 0: nothing marks where an example begins.",
    ("packing_with_all_ones_mask", "packing_without_position_reset"):
        "position_ids never restart at 0: nothing marks where an example begins.",
}


def check_padding_diagnosis(fn, seeds=None):
    """Checker for exercise 7.1: ``fn(artefact) -> Diagnosis(cause, evidence)`` on fresh incidents.

    ``seeds`` default to two rounds through every cause, offset by the course seed.
    """
    if seeds is None:
        seeds = fresh_seeds(2 * len(INCIDENT_CAUSES))
    return check_diagnosis(
        "padding_incident", fn, padding_incident, seeds=seeds, evidence_ok=_evidence_ok,
        misconceptions=_INCIDENT_MISCONCEPTIONS,
        hint=Hints(question="Which tensor tells you where each example (or each prompt) begins, and what "
                            "was passed with it: a mask, reset positions, a cache?",
                   pointer="Sections 2 and 3 list the forward calls that leak; section 1 shows where "
                           "generate() reads its first new token. Look at artefact['batch'], "
                           "artefact['call'] and, for generations, whether each row contains a stop id.",
                   answer="generate: a pad in the last prompt column -> right_padded_generation (rows "
                          "with a pad), else rows without a stop id -> never_stops. Forward, one packed row: "
                          "position_ids without a reset -> packing_without_position_reset; an attention_mask "
                          "-> packing_with_all_ones_mask; else packing_with_cache (evidence cu_seq_lens[1]). "
                          "Padded rows: pads at the start -> left_padding_without_mask (rows with pads), "
                          "at the end -> no_leak (None)."))


# ------------------------------------------------------------------------------------------------
# Exercise 7.2 (fix): a 4-D mask from position_ids, safe with a cache or an all-ones mask
# ------------------------------------------------------------------------------------------------

def _block_cases() -> list[Case]:
    from .exercises.answers.lesson03 import block_mask_from_position_ids as reference

    rng = random.Random(306)
    rows = []
    for lengths in ([3, 4, 2], [6], [1, 1, 5, 2]):
        rows.append([p for n in lengths for p in range(n)])
    cases = [Case((torch.tensor([r]),), reference(torch.tensor([r])),
                  label=f"one packed row, {len(r)} tokens", tag="one_row") for r in rows]
    two = []
    for _ in range(2):  # two packed rows of one width; TRL pads position_ids with 0 (a one-token "example")
        lengths = [rng.randint(1, 5) for _ in range(rng.randint(2, 3))]
        two.append([p for n in lengths for p in range(n)])
    width = max(map(len, two))
    pos = torch.tensor([r + [0] * (width - len(r)) for r in two])
    cases.append(Case((pos,), reference(pos), label="two packed rows, padded with position 0",
                      tag="two_rows"))
    return cases


def _compare_mask(got, expected) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"expected a torch.Tensor, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)} ([batch, 1, query, key]), got {tuple(got.shape)}"
    if got.dtype != torch.bool:
        return f"expected a boolean mask (True = may attend), got dtype {got.dtype}"
    if not torch.equal(got, expected):
        diff = (got != expected).nonzero()[0].tolist()
        return f"first wrong cell [batch, head, query, key] = {diff}: got {bool(got[tuple(diff)])}"
    return None


def _diagnose_mask(got, case: Case):
    if not isinstance(got, torch.Tensor):
        return None
    want = case.expected
    if got.shape == want.shape[:1] + want.shape[2:] or got.shape == want.shape[2:]:
        return ("transformers passes only a 4-D mask through unchanged: add the head dimension, "
                "[batch, 1, T, T].")
    if got.shape != want.shape or got.dtype != torch.bool:
        return None
    length = want.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    if torch.equal(got, causal.expand_as(want)):
        return ("that is the plain causal mask: every example sees the ones before it — cut it where "
                "position_ids restart.")
    if torch.equal(got, ~want):
        return "True must mean 'may attend' (you returned the blocked cells)."
    same = want | (want.transpose(-1, -2))
    if torch.equal(got, same):
        return "inside an example a token may see only itself and earlier tokens: AND with the causal mask."
    if bool((got & ~causal).any()):
        return "a query sees a later key: keep the causal part (keys no later than the query)."
    return ("the block boundaries are off: a new example starts exactly where position_ids is 0 (that token "
            "belongs to the NEW example).")


def check_block_mask(fn):
    """Checker for exercise 7.2: ``fn(position_ids [B, T]) -> bool mask [B, 1, T, T]`` (True = may attend)."""
    return run_check("block_mask_from_position_ids", fn, _block_cases(), compare=_compare_mask,
                     diagnose=_diagnose_mask,
                     hint=Hints(
                         question="For a query at position i of a row, which keys belong to its own example "
                                  "and come no later than i?",
                         pointer="position_ids restart at 0 where an example begins (section 3's "
                                 "packed_segments); block_causal_mask builds the same picture from lengths.",
                         answer="example = (position_ids == 0).cumsum(-1); mask = (example[:, :, None] == "
                                "example[:, None, :]) & causal (tril); return mask[:, None]."))


# Every public function above checks its arguments by their conventional names (model, tokenizer,
# batch, steps, ...) before it runs: one what/why/fix message for the slips learners make most.
validate.check_module_arguments(globals())
