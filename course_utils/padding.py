"""Lesson 03 (padding, attention masks and packing): layouts, leak measurements, collates, mask pictures.

Three ways to put several examples into one tensor, and what each lets a real token attend to:

- **right padding** (``collate_padded(..., "right")``, training): pads come *after* every real
  token, so a causal mask alone already hides them from real tokens;
- **left padding** (``collate_left``, batched generation): pads come *before* the prompt, so only
  the ``attention_mask`` hides them;
- **packing** (``collate_packed``, padding-free training): examples follow each other in one row,
  so only restarting ``position_ids`` (from which transformers infers a block-diagonal mask) or an
  explicit block-diagonal mask (``block_causal_mask``) keeps them apart.

``padded_drift`` / ``packed_drift`` measure the leak as the max |Δlogit| of real tokens against each
example run alone; ``allowed_attention`` returns the mask transformers really builds, ``layout_attention``
classifies it for one row of each layout, and ``plot_attention_layouts`` draws it. ``padding_explorer``
(built on ``padding_frame``) puts the layout,
``attention_mask``, ``position_ids`` and ``use_cache`` of one forward call on sliders and measures each
setting. ``greedy_continuations`` shows what a right-padded batched ``generate`` continues from.
The exercises (the incident diagnosis and the block-mask fix) are graded in
``course_utils.exercises.lesson03``.
"""

from __future__ import annotations

import math

import torch

from . import validate
from .data import IGNORE_INDEX, collate_right
from .viz import figure, what_if

SIDES = ("right", "left")


# ------------------------------------------------------------------------------------------------
# Collates: the three layouts
# ------------------------------------------------------------------------------------------------

def _examples(examples, need_labels: bool = True) -> list[dict]:
    """The examples as lists of ints, checked: each a dict with ``input_ids`` (and ``labels`` of the same
    length), at least one token."""
    if isinstance(examples, dict):
        raise TypeError("examples is one dict, not a list of examples — a collate builds the tensors from "
                        "several tokenize_chat() outputs (a batch that is already collated needs none) — "
                        "pass a list, e.g. [tokenize_chat(tok, m) for m in convs].")
    if not isinstance(examples, (list, tuple)) or not examples:
        raise ValueError("examples must be a non-empty list of tokenize_chat() outputs — a batch needs at "
                         "least one example — pass e.g. [tokenize_chat(tok, m) for m in convs].")
    out = []
    for i, e in enumerate(examples):
        if not isinstance(e, dict) or "input_ids" not in e or (need_labels and "labels" not in e):
            raise ValueError(f"examples[{i}] is not a dict with 'input_ids' and 'labels' (as tokenize_chat "
                             "returns) — the collate pads both — tokenize the conversations first.")
        ids = validate.token_ids(f"examples[{i}]['input_ids']", e["input_ids"])
        if not ids:
            raise ValueError(f"examples[{i}] has no tokens — it would be all padding, and its row would have "
                             "nothing to attend to — drop empty examples before collating.")
        row = {"input_ids": ids}
        if need_labels:
            row["labels"] = validate.token_ids(f"examples[{i}]['labels']", e["labels"], labels=True)
            if len(row["labels"]) != len(ids):
                raise ValueError(f"examples[{i}] has {len(ids)} input_ids but {len(row['labels'])} labels — "
                                 "each label belongs to one token, so the collate would misalign them — "
                                 "cut ids and labels with the same slice (or tokenize again).")
        out.append(row)
    return out


def _pad_id(pad_token_id) -> int:
    # only ids at hand: an id no vocabulary holds is refused (the helpers with a model check its vocabulary)
    return validate.vocab_id("pad_token_id", pad_token_id,
                             why="it fills the padding positions (a tokenizer without a pad token has "
                                 "pad_token_id None: set tok.pad_token first)")


def _prompts(prompts) -> list[list[int]]:
    """Prompts for generate(): a non-empty list of non-empty token-id lists."""
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        raise TypeError("prompts is one prompt (a list of ids), not a list of prompts — each row of the "
                        "batch is one prompt — wrap it: [prompt].")
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists — generate() "
                         "continues each one — pass e.g. [tok(p)['input_ids'] for p in texts].")
    out = [validate.token_ids(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
    if not all(out):
        raise ValueError(f"prompts[{[len(p) for p in out].index(0)}] is empty — generate() needs at least "
                         "one token to continue from — drop empty prompts.")
    return out


def collate_padded(examples: list[dict], pad_token_id: int, side: str = "right") -> dict:
    """Pad tokenized examples on ``side`` into ``input_ids``, ``attention_mask``, ``labels`` tensors.

    Pads get label ``-100`` on either side: the collate knows where each example ends, so the labels
    never depend on the attention mask. ``side="right"`` is the foundation's ``data.collate_right``.
    """
    validate.choice("side", side, SIDES, why="those are the two padding layouts: 'right' for training, "
                    "'left' for generation")
    examples, pad_token_id = _examples(examples), _pad_id(pad_token_id)
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


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The ``position_ids`` of a padded batch as ``generate()`` counts them: each row's first real token at 0,
    counting only real tokens (pads get 0 here, 1 in generate(): no real token sees a pad, so either is
    exact).

    A rotary model (Llama, Qwen, Mistral, NeoX) does not need them: its attention scores depend on position
    *differences*, which left padding does not change. A model with learned absolute positions that reads its
    positions from the column (GPT-2) does: without them every left-padded token is read at a shifted
    position (lesson 03 measures both kinds)."""
    validate.tensor("attention_mask", attention_mask, ndim=2, integer_dtype=True)
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask holds values other than 0 and 1 — it marks pads (0) and real tokens "
                         "(1), and positions count the real ones — pass the mask collate_padded returned.")
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def tiny_absolute_position_model(vocab_size: int, *, seed: int = 0):
    """A randomly initialised one-layer GPT-2 (learned absolute position embeddings, ``wpe``) over
    ``vocab_size`` tokens, in eval mode: the other kind of position encoding, beside a rotary course model,
    so that lesson 03 measures both. Built offline from a config, in well under a second."""
    from transformers import GPT2Config, GPT2LMHeadModel

    validate.positive_int("vocab_size", vocab_size, why="the model's embedding needs a row per token id")
    validate.seed("seed", seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=1, n_head=2, n_positions=256,
                        initializer_range=0.1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=None, eos_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model.eval()


@torch.no_grad()
def left_padding_drifts(model, examples: list[dict], pad_token_id: int) -> dict[str, float]:
    """What decides whether left padding with the mask alone is exact: max |Δlogit| of the real tokens vs each
    example alone, left-padded with the mask (``"mask only"``) and with the positions ``generate()`` builds
    (``"mask + position_ids"``); and the largest change of the first example's logits when every position is
    shifted by 5 (``"positions shifted"``): 0 to round-off on a rotary model, not on learned absolute ones."""
    validate.model("model", model)
    if isinstance(examples, list):  # token-id samples without labels are enough: only logits are compared
        examples = [{"labels": e["input_ids"], **e} if isinstance(e, dict) and "input_ids" in e else e
                    for e in examples]
    batch = collate_padded(examples, pad_token_id, "left")
    _check_model_ids(model, batch["input_ids"])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    row = torch.tensor([examples[0]["input_ids"]])
    shifted = model(input_ids=row, position_ids=torch.arange(5, 5 + row.shape[1])[None]).logits
    return {"mask only": padded_drift(model, batch, model(input_ids=ids, attention_mask=mask).logits),
            "mask + position_ids": padded_drift(model, batch, model(
                input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits),
            "positions shifted": float((model(input_ids=row).logits - shifted).abs().max())}


def collate_left(prompts: list[list[int]], pad_token_id: int) -> dict:
    """Left-pad prompt token lists for batched generation: ``input_ids`` and ``attention_mask``.

    Every prompt then ends in the last column, which is where ``generate`` appends the next token.
    """
    prompts, pad_token_id = _prompts(prompts), _pad_id(pad_token_id)
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
    examples = _examples(examples)
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
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    validate.non_empty("lengths", lengths, what="example lengths",
                       fix="pass [len(e['input_ids']) for e in examples].")
    lengths = [validate.positive_int("lengths item", n, why="each block is one example of that many tokens")
               for n in lengths]
    example = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    total = len(example)
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return (causal & (example[:, None] == example[None, :]))[None, None]


def packed_segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each example in a packed row: a new one starts wherever the position is 0."""
    validate.tensor("position_ids", position_ids, integer_dtype=True)
    if position_ids.dim() != 2 or position_ids.shape[0] != 1:
        raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}, expected [1, total] — a "
                         "packed batch is one row — pass batch['position_ids'] of a padding-free batch.")
    return _packed_segments(position_ids)


def _packed_segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("position_ids do not start at 0 — without a reset nothing marks where an example "
                         "begins — build them with collate_packed or TRL's padding-free collator.")
    return list(zip(starts, starts[1:] + [position_ids.shape[1]]))


# ------------------------------------------------------------------------------------------------
# Measurements: how much do real tokens' logits move?
# ------------------------------------------------------------------------------------------------

def _vocab(model) -> int | None:
    """The ids ``model`` can embed, where it says (a transformers model)."""
    embeddings = getattr(model, "get_input_embeddings", None)
    return embeddings().num_embeddings if callable(embeddings) else None


def _check_model_ids(model, input_ids) -> None:
    """A course model (anything with an input embedding) and ids it can embed."""
    validate.model("model", model)
    if not hasattr(model, "get_input_embeddings"):
        raise TypeError(f"model is a {type(model).__name__} without get_input_embeddings() — the helper runs "
                        "a transformers causal LM on token ids — pass the model from load_course_model().")
    validate.ids_fit_model(model, input_ids)


@torch.no_grad()
def alone_logits(model, input_ids) -> torch.Tensor:
    """Logits of one sequence run by itself: no padding, no neighbours, no cache (the reference)."""
    ids = torch.tensor(validate.token_ids("input_ids", input_ids))
    if not len(ids):
        raise ValueError("input_ids is empty — there is no token to compute logits for — pass one example's "
                         "ids, e.g. examples[0]['input_ids'].")
    _check_model_ids(model, ids)
    return _alone_logits(model, ids)


@torch.no_grad()
def _alone_logits(model, input_ids) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, device=model.device).reshape(1, -1)
    return model(input_ids=ids, use_cache=False).logits[0].float().cpu()


def _check_logits_of(model, batch: dict, logits) -> None:
    validate.tensor("logits", logits, ndim=3, integer_dtype=False)
    if logits.shape[:2] != batch["input_ids"].shape:
        raise ValueError(f"logits have shape {tuple(logits.shape)} but the batch "
                         f"{tuple(batch['input_ids'].shape)} — each token's logits are compared with its "
                         "solo run — pass the logits of this batch.")
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    config = getattr(model, "config", None)
    vocab = getattr(head, "out_features", None) or getattr(config, "vocab_size", None) or _vocab(model)
    if logits.shape[-1] != vocab:
        raise ValueError(f"logits have {logits.shape[-1]} scores per token but the model scores {vocab} "
                         "tokens — each token's scores are compared with the model's scores of the example "
                         "alone — pass model(**batch).logits of this model.")


def _drift_per_token(model, batch: dict, logits, spans) -> list[torch.Tensor]:
    """|Δlogit| of each token in ``spans`` (max over the vocabulary) vs its example run alone.

    ``spans``: ``(row, where)`` per example, ``where`` a boolean mask or a slice of that row.
    """
    drifts = []
    for row, where in spans:
        reference = _alone_logits(model, batch["input_ids"][row][where])
        if isinstance(where, torch.Tensor):
            where = where.to(logits.device)
        drifts.append((logits[row][where].float().cpu() - reference).abs().amax(-1))
    return drifts


def _padded_spans(batch: dict) -> list:
    return list(enumerate(batch["attention_mask"].bool()))


def _packed_spans(batch: dict) -> list:
    return [(0, slice(start, end)) for start, end in _packed_segments(batch["position_ids"])]


def padded_drift(model, batch: dict, logits: torch.Tensor) -> float:
    """Max |Δlogit| over real tokens (``attention_mask == 1``) of a padded batch vs each row alone.

    ``logits`` come from whatever forward call you want to judge (with or without the mask); the
    batch's ``attention_mask`` is only used here to find the real tokens, on either side.
    """
    validate.batch("batch", batch, need=("input_ids", "attention_mask"))
    _check_model_ids(model, batch["input_ids"])
    _check_logits_of(model, batch, logits)
    mask = batch["attention_mask"]
    if not bool(((mask == 0) | (mask == 1)).all()) or int(mask.sum(1).min()) == 0:
        raise ValueError("batch['attention_mask'] must be 0 (pad) or 1 (real token), with a real token in "
                         "every row — it tells the helper which tokens to compare with their solo run — pass "
                         "the mask the collate returned (collate_padded).")
    return max(float(d.max()) for d in _drift_per_token(model, batch, logits, _padded_spans(batch)))


def packed_drift(model, batch: dict, logits: torch.Tensor) -> float:
    """Max |Δlogit| over every token of a packed row vs each example alone (segments from position_ids)."""
    validate.batch("batch", batch, need=("input_ids", "position_ids"))
    packed_segments(batch["position_ids"])  # one row, restarting at 0: refused here otherwise
    _check_model_ids(model, batch["input_ids"])
    _check_logits_of(model, batch, logits)
    return max(float(d.max()) for d in _drift_per_token(model, batch, logits, _packed_spans(batch)))


# The layouts of lesson 03's summary, each judged against every example alone: the fixes, then the leaks
LAYOUT_FIXES = ("right pad + attention_mask", "left pad + attention_mask + position_ids",
                "packed, reset positions, no cache", "packed, explicit 4D mask + position_ids")
LAYOUT_LEAKS = ("left pad, no mask", "packed, all-ones mask")


@torch.no_grad()
def layout_drifts(model, examples: list[dict], pad_id: int) -> dict[str, float]:
    """Max |Δlogit| vs each example alone for the summary's layouts (``LAYOUT_FIXES`` + ``LAYOUT_LEAKS``),
    measured on ``model`` as it is — pass a bfloat16 copy to see what of lesson 03 holds in bf16. The fixes
    pass each token's own position (``positions_from_mask``, restarted ``position_ids``): exact on any
    position encoding, rotary or learned absolute."""
    validate.model("model", model)
    if not isinstance(examples, list) or len(examples) < 2:
        raise ValueError("examples must be a list of at least 2 tokenize_chat() results — padding and "
                         "packing need other rows to sit beside — pass e.g. [tokenize_chat(tok, m) for m in "
                         "chats].")
    validate.vocab_id("pad_id", pad_id, vocab_size=_vocab(model), owner="the model",
                      why="it is the token id that fills the padded positions")
    right, left = collate_padded(examples, pad_id, "right"), collate_padded(examples, pad_id, "left")
    packed = collate_packed(examples)
    ids, pos = packed["input_ids"], packed["position_ids"]
    lengths = [len(e["input_ids"]) for e in examples]
    return {
        "right pad + attention_mask": padded_drift(model, right, model(**right).logits),
        "left pad + attention_mask + position_ids": padded_drift(model, left, model(
            input_ids=left["input_ids"], attention_mask=left["attention_mask"],
            position_ids=positions_from_mask(left["attention_mask"])).logits),
        "packed, reset positions, no cache": packed_drift(model, packed, model(
            input_ids=ids, position_ids=pos, use_cache=False).logits),
        "packed, explicit 4D mask + position_ids": packed_drift(model, packed, model(
            input_ids=ids, position_ids=pos, attention_mask=block_causal_mask(lengths)).logits),
        "left pad, no mask": padded_drift(model, left, model(input_ids=left["input_ids"]).logits),
        "packed, all-ones mask": packed_drift(model, packed, model(
            input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids), use_cache=False).logits),
    }


@torch.no_grad()
def allowed_attention(model, input_ids, attention_mask=None, position_ids=None, *,
                      use_cache: bool = False) -> torch.Tensor:
    """The [batch, query, key] boolean mask transformers builds for this call (True = may attend).

    Calls ``transformers.masking_utils.create_causal_mask`` exactly as the model's forward does:
    without a cache, or (``use_cache=True``, the default call's ``config.use_cache``) with the fresh
    ``DynamicCache`` the forward builds; ``None`` from it means "plain causal" (the kernel's own mask).
    """
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache={use_cache!r} must be True or False — it decides whether the forward "
                         "builds a cache, which changes the mask — pass use_cache=True or use_cache=False.")
    validate.tensor("input_ids", input_ids, ndim=2, integer_dtype=True)
    if input_ids.numel() == 0:
        raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}: no token — there is no mask to "
                         "build — pass a collated batch's input_ids (at least one row and one column).")
    _check_model_ids(model, input_ids)
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
    return _allowed_attention(model, input_ids, attention_mask, position_ids, use_cache)


def materialised_mask_shape(model, input_ids, attention_mask=None, position_ids=None, *,
                            use_cache: bool = False) -> tuple[int, ...] | None:
    """The shape of the mask tensor transformers builds for this call, or ``None`` when it builds none and
    leaves plain causal masking to the attention kernel. On ``sdpa``/``eager`` a padding-free packed row
    (restarted ``position_ids``, no mask, no cache) gets a dense ``[batch, 1, ΣL, ΣL]`` mask: memory
    quadratic in the row's length, which is why TRL documents ``padding_free`` for FlashAttention (whose
    kernel takes the boundaries from ``position_ids`` and needs no mask at all)."""
    allowed_attention(model, input_ids, attention_mask, position_ids, use_cache=use_cache)  # checks the call
    mask = _built_mask(model, input_ids, attention_mask, position_ids, use_cache)
    return None if mask is None else tuple(mask.shape)


@torch.no_grad()
def _built_mask(model, input_ids, attention_mask, position_ids, use_cache: bool):
    # Deferred: transformers' masking utilities take ~1.6 s to import on top of torch (measured with
    # python -X importtime), and the collates above, used without a model, should not pay for it.
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    embeds = model.get_input_embeddings()(input_ids)
    cache = DynamicCache(config=model.config) if use_cache else None
    return create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=attention_mask,
                              cache=cache, position_ids=position_ids)


@torch.no_grad()
def _allowed_attention(model, input_ids, attention_mask, position_ids, use_cache: bool) -> torch.Tensor:
    mask = _built_mask(model, input_ids, attention_mask, position_ids, use_cache)
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
    validate.tensor("allowed", allowed, ndim=2)
    validate.tensor("example_of", example_of, ndim=1, integer_dtype=True)
    if allowed.dtype != torch.bool:
        raise TypeError(f"allowed has dtype {allowed.dtype} — it must be booleans (True = may attend), as "
                        "allowed_attention returns — pass one row of allowed_attention(...), e.g. [0].")
    if allowed.shape != (len(example_of), len(example_of)):
        raise ValueError(f"allowed has shape {tuple(allowed.shape)} but example_of names {len(example_of)} "
                         "tokens — each cell pairs a query and a key of the same row — pass one row of "
                         "allowed_attention(...) and that row's example index per token.")
    if len(example_of) and int(example_of.min()) < -1:
        raise ValueError(f"example_of holds {int(example_of.min())} — it is each token's example index, or "
                         "-1 for a pad — pass e.g. torch.where(attention_mask[row] == 1, 0, -1).")
    return _attention_categories(allowed, example_of)


def _attention_categories(allowed: torch.Tensor, example_of: torch.Tensor) -> torch.Tensor:
    q_ex, k_ex = example_of[:, None], example_of[None, :]
    cats = torch.full(allowed.shape, BLOCKED)
    cats[allowed & (k_ex == q_ex)] = OWN
    cats[allowed & (k_ex == -1)] = PAD
    cats[allowed & (k_ex != q_ex) & (k_ex != -1)] = OTHER
    cats[(q_ex == -1).expand_as(allowed) & allowed] = PAD_QUERY
    return cats


def _check_categories(name: str, cats) -> None:
    validate.tensor(name, cats, ndim=2, integer_dtype=True)
    if cats.shape[0] != cats.shape[1] or not cats.numel():
        raise ValueError(f"{name} has shape {tuple(cats.shape)} — it pairs every query of one row with every "
                         "key of it, a square with at least one cell, or there is nothing to count (0 leaks "
                         "would be no finding) — pass attention_categories(allowed[row], example_of).")
    if cats.numel() and (int(cats.min()) < BLOCKED or int(cats.max()) > PAD_QUERY):
        raise ValueError(f"{name} holds values outside {BLOCKED}..{PAD_QUERY} — they are the categories "
                         "attention_categories returns — pass its result.")


def leak_counts(cats: torch.Tensor) -> dict:
    """How many (real query, key) cells reach a pad or another example: both should be 0."""
    _check_categories("cats", cats)
    return _leak_counts(cats)


def _leak_counts(cats: torch.Tensor) -> dict:
    return {"real->pad": int((cats == PAD).sum()), "real->other example": int((cats == OTHER).sum())}


def layout_attention(model, examples: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The mask transformers builds for one row of each layout, as ``attention_categories``: {title: cats}.

    Without the fix: right and left padding with no ``attention_mask`` (the shortest example's row, the one
    with the most pads) and the packed row with an all-ones mask (TRL's "wrapped" packing); with it
    (titles starting "fixed:"): left padding with its mask, the packed row with restarted ``position_ids``
    only. Lesson 03 draws the first three (``plot_attention_layouts``) and counts the leak cells of all five
    (``leak_counts``).
    """
    examples, pad_token_id = _examples(examples), _pad_id(pad_token_id)
    _check_model_ids(model, torch.tensor([pad_token_id] + [t for e in examples for t in e["input_ids"]]))
    short = min(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    panels = {}
    for title, layout, mask, positions in (
            ("right padding, no attention_mask", "right", False, False),
            ("left padding, no attention_mask", "left", False, False),
            ("packed, all-ones attention_mask", "packed", True, True),
            ("fixed: left padding + attention_mask", "left", True, False),
            ("fixed: packed, position_ids only", "packed", False, True)):
        _, call, example_of = _layout_call(examples, pad_token_id, layout, mask, positions)
        row = 0 if layout == "packed" else short
        owner = example_of[row] if layout == "packed" else torch.where(example_of[row] >= 0, 0, -1)
        allowed = _allowed_attention(model, call["input_ids"], call.get("attention_mask"),
                                     call.get("position_ids"), False)
        panels[title] = _attention_categories(allowed[row], owner)
    return panels


def plot_attention_layouts(panels: dict):
    """One figure, one heatmap per layout: ``{title: categories}`` from ``attention_categories``."""
    # Deferred: pyplot (~0.3 s, measured) picks a backend when imported; only this plot needs it.
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    if not isinstance(panels, dict) or not panels:
        raise TypeError(f"panels must be a non-empty dict {{title: categories}}, got "
                        f"{type(panels).__name__} — one heatmap per entry — pass e.g. "
                        "{'left padding': attention_categories(...)}.")
    for title, cats in panels.items():
        _check_categories(f"panels[{title!r}]", cats)
    colours = ["#ffffff", "#52b788", "#d62828", "#f77f00", "#d9d9d9"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4))
    for ax, (title, cats) in zip(list(axes) if len(panels) > 1 else [axes], panels.items()):
        ax.imshow(cats, cmap=ListedColormap(colours), vmin=0, vmax=len(colours) - 1, interpolation="nearest")
        counts = _leak_counts(cats)
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
        restart = positions_from_mask(mask)  # each row's first real token at 0, as generate() counts
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
    validate.choice("layout", layout, tuple(LAYOUTS.values()), why="they are the lesson's three layouts")
    for name, flag in (("attention_mask", attention_mask), ("position_ids", position_ids),
                       ("use_cache", use_cache)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False — it switches one argument of the "
                             f"forward call on or off — pass {name}=True or {name}=False.")
    examples, pad_token_id, same, leak = _frame_inputs(model, examples, pad_token_id, same, leak)
    return _padding_frame(model, examples, pad_token_id, layout, attention_mask, position_ids, use_cache,
                          same, leak)


def _frame_inputs(model, examples, pad_token_id, same, leak) -> tuple[list[dict], int, float, float]:
    """padding_frame's shared arguments, checked once (the explorer calls the frame for every move)."""
    examples, pad_token_id = _examples(examples), _pad_id(pad_token_id)
    _check_model_ids(model, torch.tensor([pad_token_id] + [t for e in examples for t in e["input_ids"]]))
    same = validate.number("same", same, positive=True, why="below it two logits count as equal")
    leak = validate.number("leak", leak, positive=True, why="above it a real token saw a neighbour")
    if same >= leak:
        raise ValueError(f"same={same} is not below leak={leak} — a drift cannot be both round-off and a "
                         "leak — pass e.g. same=1e-4, leak=0.1.")
    return examples, pad_token_id, same, leak


def _padding_frame(model, examples: list[dict], pad_token_id: int, layout: str, attention_mask: bool,
                   position_ids: bool, use_cache: bool, same: float, leak: float):
    batch, call, example_of = _layout_call(examples, pad_token_id, layout, attention_mask, position_ids)
    call = {k: v.to(model.device) for k, v in call.items()}
    with torch.no_grad():
        logits = model(**call, use_cache=use_cache).logits
    spans = _packed_spans(batch) if layout == "packed" else _padded_spans(batch)
    drifts = _drift_per_token(model, batch, logits, spans)
    allowed = _allowed_attention(model, call["input_ids"], call.get("attention_mask"),
                                 call.get("position_ids"), use_cache)
    cells = {"real->pad": 0, "real->other example": 0}
    for row in range(allowed.shape[0]):
        for key, count in _leak_counts(_attention_categories(allowed[row], example_of[row])).items():
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
    padding without a mask, the leak of section 2.
    """
    examples, pad_token_id, same, leak = _frame_inputs(model, examples, pad_token_id, same, leak)
    return what_if(
        lambda layout, attention_mask, position_ids, use_cache: _padding_frame(
            model, examples, pad_token_id, layout, attention_mask, position_ids, use_cache, same, leak),
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
    prompts, pad_token_id = _prompts(prompts), _pad_id(pad_token_id)
    validate.positive_int("max_new_tokens", max_new_tokens, why="it is how many tokens generate() adds")
    if isinstance(stop_ids, int) or not isinstance(stop_ids, (list, tuple, set)) or not stop_ids:
        raise TypeError(f"stop_ids={stop_ids!r} must be a non-empty list or tuple of token ids — generation "
                        "stops at any of them — pass e.g. stop_ids=(tok.pad_token_id, im_end_id), or (id,) "
                        "for one.")
    stop_ids = validate.token_ids("stop_ids", list(stop_ids))
    _check_model_ids(model, torch.tensor([pad_token_id] + stop_ids + [t for p in prompts for t in p]))
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and max(map(len, prompts)) + max_new_tokens > limit:
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
    reference, other = _continuations("reference", reference), _continuations("other", other)
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference continuations but {len(other)} others — the "
                         "comparison is prompt by prompt — pass both lists for the same prompts, in order.")
    total = 0
    for ref, out in zip(reference, other):
        width = max(len(ref), len(out))  # a continuation that stopped early differs at every later position
        padded_ref, padded_out = ref + [None] * (width - len(ref)), out + [None] * (width - len(out))
        total += sum(a != b for a, b in zip(padded_ref, padded_out))
    return total


def _continuations(name: str, value) -> list[list[int]]:
    """A list of generated token lists, one per prompt (as greedy_continuations returns)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, int) for t in value):
        raise TypeError(f"{name} is one continuation (a list of ids), not a list of them — the comparison is "
                        f"prompt by prompt — wrap it: [{name}], or pass greedy_continuations(...)'s result.")
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be a non-empty list of continuations (token-id lists), got "
                         f"{type(value).__name__ if value else 'an empty one'} — one per prompt — pass "
                         "greedy_continuations(...)'s result.")
    return [validate.token_ids(f"{name}[{i}]", c) for i, c in enumerate(value)]


def sliding_window_drift(sliding_window: int = 4, length: int = 12, seed: int = 0) -> dict[str, float]:
    """Max |Δlogit| of a tiny random sliding-window model (a Mistral config, built offline) called with an
    explicit 4-D mask, against its own default call, for one example longer than the window.

    ``"4-D causal mask, no window"`` is what a block-diagonal mask built for a full-attention model gives it;
    ``"4-D mask with the window"`` cuts keys ``sliding_window`` or more positions back. transformers passes a
    4-D mask through unchanged (``masking_utils._preprocess_mask_arguments``), so the first moves the logits:
    a sliding-window model (Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``) needs its window in the
    mask.
    """
    from transformers import MistralConfig, MistralForCausalLM

    sliding_window = validate.positive_int("sliding_window", sliding_window,
                                           why="it is how many keys a query sees")
    length = validate.positive_int("length", length, why="it is the example's number of tokens")
    if length <= sliding_window:
        raise ValueError(f"length={length} is not above sliding_window={sliding_window} — an example inside "
                         "the window cannot show the window — pass a length above the window.")
    torch.manual_seed(validate.seed("seed", seed))
    config = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2,
                           sliding_window=sliding_window, max_position_embeddings=4 * length,
                           attn_implementation="sdpa")
    model = MistralForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, length))
    query, key = torch.arange(length)[:, None], torch.arange(length)[None, :]
    masks = {"4-D causal mask, no window": key <= query,
             "4-D mask with the window": (key <= query) & (query - key < sliding_window)}
    with torch.no_grad():
        own = model(ids).logits
        return {name: float((model(ids, attention_mask=m[None, None]).logits - own).abs().max())
                for name, m in masks.items()}
