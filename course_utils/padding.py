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
``plot_attention_layouts`` draws it. The ``check_*`` functions are the lesson's exercise checkers.
"""

from __future__ import annotations

import contextlib
import logging
import random

import torch

from .checks import Case, run_check
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


def padded_drift(model, batch: dict, logits: torch.Tensor) -> float:
    """Max |Δlogit| over real tokens (``attention_mask == 1``) of a padded batch vs each row alone.

    ``logits`` come from whatever forward call you want to judge (with or without the mask); the
    batch's ``attention_mask`` is only used here to find the real tokens, on either side.
    """
    worst = 0.0
    for row, mask in enumerate(batch["attention_mask"].bool()):
        reference = alone_logits(model, batch["input_ids"][row][mask])
        worst = max(worst, float((logits[row][mask.to(logits.device)].float().cpu() - reference).abs().max()))
    return worst


def packed_drift(model, batch: dict, logits: torch.Tensor) -> float:
    """Max |Δlogit| over every token of a packed row vs each example alone (segments from position_ids)."""
    worst = 0.0
    for start, end in packed_segments(batch["position_ids"]):
        reference = alone_logits(model, batch["input_ids"][0, start:end])
        worst = max(worst, float((logits[0, start:end].float().cpu() - reference).abs().max()))
    return worst


@torch.no_grad()
def allowed_attention(model, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
    """The [batch, query, key] boolean mask transformers builds for this call (True = may attend).

    Calls ``transformers.masking_utils.create_causal_mask`` exactly as the model's forward does
    without a cache; ``None`` from it means "plain causal" (the attention kernel's own causal mask).
    """
    from transformers.masking_utils import create_causal_mask

    embeds = model.get_input_embeddings()(input_ids)
    mask = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=attention_mask,
                              cache=None, position_ids=position_ids)
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
# Batched generation
# ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def captured_transformers_warnings():
    """Collect transformers' log warnings in a list instead of printing them to stderr."""
    from transformers.utils import logging as hf_logging

    messages: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler, root = _Keep(level=logging.WARNING), hf_logging.get_logger()
    hf_logging.disable_default_handler()
    root.addHandler(handler)
    try:
        yield messages
    finally:
        root.removeHandler(handler)
        hf_logging.enable_default_handler()


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
    if layout not in ("alone",) + SIDES:
        raise ValueError(f"layout={layout!r} is not 'alone', 'right' or 'left' — the three ways to feed "
                         "prompts to generate() compared here — pass one of them.")
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
# Exercise checkers
# ------------------------------------------------------------------------------------------------

def _random_examples(rng: random.Random, n: int, lo: int = 2, hi: int = 9, lm: bool = False) -> list[dict]:
    """Hidden tokenized examples: a prompt with label -100, then an answer that carries loss.

    ``lm=True``: plain language modelling, every label is the token itself (no prompt mask), so only
    the packing collate can put the -100 on each example's first token.
    """
    examples = []
    for _ in range(n):
        length = rng.randint(lo, hi)
        ids = [rng.randrange(3, 500) for _ in range(length)]
        prompt = 0 if lm else rng.randint(1, length - 1)
        examples.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:],
                         "attention_mask": [1] * length})
    return examples


def _exact(got, expected) -> str | None:
    """Dicts of integer tensors must match exactly: same keys, shapes, dtype family and values."""
    if not isinstance(got, dict):
        return f"expected a dict of tensors with keys {sorted(expected)}, got {type(got).__name__}"
    if set(got) != set(expected):
        return f"expected keys {sorted(expected)}, got {sorted(got)}"
    for key, want in expected.items():
        have = got[key]
        if not isinstance(have, torch.Tensor):
            return f"[{key!r}]: expected a torch.Tensor, got {type(have).__name__}"
        if have.shape != want.shape:
            return f"[{key!r}]: expected shape {tuple(want.shape)}, got {tuple(have.shape)}"
        if have.is_floating_point() or not torch.equal(have.long(), want):
            return f"[{key!r}]: values differ, expected\n{want.tolist()}\ngot\n{have.tolist()}"
    return None


def _right_cases() -> list[Case]:
    rng = random.Random(303)
    cases = [Case((ex, pad), collate_padded(ex, pad, "right"), label=label)
             for ex, pad, label in ((_random_examples(rng, 3), 0, "3 examples, pad 0"),
                                    (_random_examples(rng, 4), 7, "4 examples, pad 7"))]
    same = _random_examples(rng, 2, 5, 5)
    cases.append(Case((same, 0), collate_padded(same, 0, "right"), label="equal lengths: no padding"))
    return cases


def _diagnose_right(got, case: Case):
    if not isinstance(got, dict) or "labels" not in got or not isinstance(got.get("labels"), torch.Tensor):
        return None
    examples, pad = case.args
    want = case.expected
    if got["labels"].shape == want["labels"].shape:
        pads = want["attention_mask"] == 0
        if pads.any() and (got["labels"][pads] == pad).all():
            return ("padded positions got label pad_token_id: those pads would be trained. "
                    "Pad labels with -100.")
        if torch.equal(got["labels"], torch.where(pads, IGNORE_INDEX, want["input_ids"])):
            return ("you rebuilt labels from input_ids, so the prompt's -100 is lost: copy each example's "
                    "own labels and pad them with -100.")
        left = collate_padded(examples, pad, "left")
        if torch.equal(got["labels"], left["labels"]):
            return ("you padded on the left; a training collate pads on the right "
                    "(pads after the real tokens).")
    mask = got.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.shape == want["attention_mask"].shape \
            and bool((mask == 1).all()):
        return "attention_mask must be 0 on the pads (1 only on real tokens)."
    return None


def check_collate_right(fn):
    """Checker: ``fn(examples, pad_token_id)`` right-pads ``input_ids``/``attention_mask``/``labels``."""
    return run_check("collate_right_with_labels", fn, _right_cases(), compare=_exact,
                     diagnose=_diagnose_right,
                     hint="pad every row to the longest: input_ids with pad_token_id, attention_mask with 0, "
                          "labels with -100 (keep each example's own labels); return long tensors.")


def _left_cases() -> list[Case]:
    rng = random.Random(304)
    cases = []
    for n, pad in ((3, 0), (4, 5)):
        prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(2, 8))] for _ in range(n)]
        cases.append(Case((prompts, pad), collate_left(prompts, pad), label=f"{n} prompts, pad {pad}"))
    prompts = [[11, 12, 13, 14, 15], [21, 22]]
    cases.append(Case((prompts, 0), collate_left(prompts, 0), label="one long, one short prompt"))
    return cases


def _diagnose_left(got, case: Case):
    if not isinstance(got, dict) or not isinstance(got.get("input_ids"), torch.Tensor):
        return None
    prompts, pad = case.args
    width = max(map(len, prompts))
    right = torch.tensor([list(p) + [pad] * (width - len(p)) for p in prompts])
    if got["input_ids"].shape == right.shape and torch.equal(got["input_ids"].long(), right):
        return ("you padded on the right: generate() appends after the LAST column, which is a pad for the "
                "short prompts. Put the pads first.")
    mask = got.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.shape == case.expected["attention_mask"].shape \
            and bool((mask == 1).all()):
        return "attention_mask must be 0 on the pads, else the prompt attends to them."
    return None


def check_collate_left(fn):
    """Checker: ``fn(prompts, pad_token_id)`` left-pads prompts into ``input_ids`` and ``attention_mask``."""
    return run_check("collate_left_for_generation", fn, _left_cases(), compare=_exact,
                     diagnose=_diagnose_left,
                     hint="pad every prompt on the LEFT to the longest: input_ids with pad_token_id, "
                          "attention_mask 0 on pads and 1 on the prompt; return only those two keys.")


def _packed_cases() -> list[Case]:
    rng = random.Random(305)
    cases = [Case((ex,), collate_packed(ex), label=label)
             for ex, label in ((_random_examples(rng, 3), "3 chat examples"),
                               (_random_examples(rng, 4, 2, 5, lm=True), "4 examples, labels = input_ids"))]
    one = _random_examples(rng, 1)
    cases.append(Case((one,), collate_packed(one), label="a single example"))
    return cases


def _diagnose_packed(got, case: Case):
    if not isinstance(got, dict):
        return None
    if "attention_mask" in got:
        return ("drop the attention_mask: with an all-ones mask transformers no longer infers the "
                "block-diagonal mask from position_ids (masking_utils only does so when attention_mask "
                "is None).")
    want = case.expected
    pos, labels = got.get("position_ids"), got.get("labels")
    if isinstance(pos, torch.Tensor) and pos.shape == want["position_ids"].shape[1:]:
        return "keep the batch dimension: every tensor should have shape [1, total_tokens]."
    if isinstance(pos, torch.Tensor) and pos.shape == want["position_ids"].shape \
            and torch.equal(pos.long(), torch.arange(pos.shape[1])[None]):
        return ("position_ids must restart at 0 for every example: the reset is what marks a boundary, so "
                "without it every example attends to the ones before it.")
    if isinstance(labels, torch.Tensor) and labels.shape == want["labels"].shape:
        joined = torch.tensor([sum((list(e["labels"]) for e in case.args[0]), [])])
        if torch.equal(labels.long(), joined):
            return ("set the FIRST label of every example to -100: after the shift it would be predicted "
                    "from the previous example's last token (TRL does labels[position_ids == 0] = -100).")
    return None


def check_collate_packed(fn):
    """Checker: ``fn(examples)`` packs into one row with reset ``position_ids`` and -100 at boundaries."""
    return run_check("collate_packed", fn, _packed_cases(), compare=_exact, diagnose=_diagnose_packed,
                     hint="concatenate input_ids and labels into one row [1, total]; position_ids restart at "
                          "0 for each example; the first label of each example is -100; no attention_mask.")
