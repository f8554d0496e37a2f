"""Lesson 12 (packing on new architectures): tiny offline models of today's families, the batches real
collators pack, the position ids a model really uses, and the two-sample probe that proves a set-up clean.

Lesson 03's rule — restarted ``position_ids``, no ``attention_mask``, no cache — keeps packed examples apart
on a standard decoder, because transformers' ``create_causal_mask`` infers the block-diagonal mask from
those positions. It is a rule about *that code path*, not about packing: a model whose mask builder never
receives the positions (gpt-oss, OPT, MPT…), that rewrites them first (Qwen2.5-VL's mRoPE turns 2-D
positions into 3 rows and drops the text row), or whose linear-attention / Mamba layers mix tokens outside
attention (a causal conv1d, a recurrent state), leaks across packed samples whatever the positions say.

- ``tiny_model(model_type, attn_implementation)`` builds a random model of a family offline, in a fraction
  of a second (the leak is a property of architecture + attention implementation + collator, not of
  trained weights: lesson 12 proves it on the course model's own weights);
- ``in_qwen2_5_vl(model)`` copies a Qwen2 causal LM's weights into a Qwen2.5-VL model (identical alone);
- ``pack(features, collator)`` runs a real collator (``COLLATORS``) on token-id features;
- ``positions_seen(model, batch)`` records the positions the rotary embedding and the mask builder receive;
- ``packing_leak(model, collator)`` is the two-sample probe as a function for your own model (the doctor
  calls it); ``trl_packing_raises(model)`` predicts whether TRL's packing path fails at the first step.

The exercises (the probe for an unseen architecture, verdicts on fresh set-ups) are graded in
``course_utils.exercises.lesson12``.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import torch

from . import validate

# Tiny configs (2 layers, hidden 64) of the families the lesson measures. Only what each family needs beyond
# the shared keys: experts for the MoE models, layer types for the hybrids (one linear/Mamba/conv layer and
# one attention layer, so both mechanisms are present).
_SHARED = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
               initializer_range=0.1,  # logits of a few units, like a trained model's
               bos_token_id=None, eos_token_id=None, pad_token_id=None)  # the families' own ids lie past 256
_LINEAR_HEADS = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                     linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"])
_MAMBA = dict(mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=16)
ARCHITECTURES = {
    "qwen2": {}, "qwen3": {}, "llama": {}, "mistral": {}, "olmo2": {},
    "opt": dict(ffn_dim=128, word_embed_proj_dim=64),
    "mpt": dict(d_model=64, n_heads=4, n_layers=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),  # YaRN wants 4k tokens
    "afmoe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_dense_layers=1),
    "qwen3_next": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, **_LINEAR_HEADS),
    "qwen3_5_text": dict(_LINEAR_HEADS),
    "lfm2": dict(layer_types=["conv", "full_attention"], full_attn_idxs=[1]),
    "bamba": dict(attn_layer_indices=[1], **_MAMBA),
    "falcon_h1": dict(mamba_d_ssm=128, **_MAMBA),
    "granitemoehybrid": dict(num_local_experts=4, num_experts_per_tok=2, layer_types=["mamba", "attention"],
                             shared_intermediate_size=64, **_MAMBA),
}
# Families whose linear-attention / Mamba / conv layers mix tokens outside attention (and take cu_seqlens /
# seq_idx only in their CUDA kernels). The list documents the tiny configs; the probe decides, not the list.
HYBRIDS = ("qwen3_next", "qwen3_5_text", "lfm2", "bamba", "falcon_h1", "granitemoehybrid")
ATTENTION = ("eager", "sdpa")


def tiny_model(model_type: str, attn_implementation: str = "sdpa", *, seed: int = 0):
    """A randomly initialised 2-layer model of ``model_type`` (one of ``ARCHITECTURES``), in eval mode.

    Built offline from a config alone (nothing is downloaded), in well under a second. Raises the library's
    own ``ValueError`` when the family does not support ``attn_implementation`` (gpt-oss and MPT have no
    SDPA path in transformers 5.24: they run eager off the GPU kernels).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    validate.choice("model_type", model_type, tuple(ARCHITECTURES),
                    why="each needs a tiny config the module knows how to build offline")
    validate.choice("attn_implementation", attn_implementation, ATTENTION,
                    why="the CPU attention implementations (flash kernels need a GPU)")
    validate.seed("seed", seed)
    config = AutoConfig.for_model(model_type, **{**_SHARED, **ARCHITECTURES[model_type]})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.eval()


def fits_qwen2_5_vl(model) -> bool:
    """Whether ``model``'s weights copy one to one into Qwen2.5-VL's language model (``in_qwen2_5_vl``): a
    Qwen2 decoder, or a Llama without attention or MLP biases. A GPT-NeoX (another attention and MLP layout)
    does not: lesson 12 then runs on the shipped tiny-qwen, and says so."""
    config = validate.model("model", model).config
    kind = getattr(config, "model_type", type(model).__name__)
    biased = getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False)
    return kind == "qwen2" or (kind == "llama" and not biased)


def in_qwen2_5_vl(model):
    """The weights of a Qwen2 or Llama causal LM (either course model) inside a Qwen2.5-VL model.

    Qwen2.5-VL's language model is a Qwen2 decoder with multimodal rotary positions (mRoPE): a Llama's
    weights fit it with zero q/k/v biases. On one sequence the logits are identical (lesson 12 measures it);
    what changes is only how the model reads ``position_ids``. The vision tower (one block) is never used.
    """
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    if not fits_qwen2_5_vl(model):
        kind = getattr(model.config, "model_type", type(model).__name__)
        raise ValueError(f"model is a {kind} model — Qwen2.5-VL's language model is a Qwen2 decoder, so only "
                         "Qwen2 weights (or a bias-free Llama's) copy one to one — pass a course model "
                         "(COURSE_MODEL=tiny-qwen or tiny-llama) or a Qwen2ForCausalLM.")
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    half = head_dim // 2  # rotary frequencies per head, split into mRoPE's t/h/w sections
    section = [half // 4, (half - half // 4) // 2]
    section.append(half - sum(section))
    names = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "hidden_act",
             "tie_word_embeddings")
    text = {k: getattr(config, k) for k in names}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"],
                               "mrope_section": section}
    # Qwen's own special ids (151643…) lie outside the course vocabulary: carry the model's instead
    specials = dict(bos_token_id=None, eos_token_id=config.eos_token_id,
                    pad_token_id=getattr(config, "pad_token_id", None))
    text.update(specials)
    unused = config.vocab_size - 1  # the image/video markers never occur in text rows
    vl_config = AutoConfig.for_model(
        "qwen2_5_vl", text_config=text, tie_word_embeddings=config.tie_word_embeddings,
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=config.hidden_size, fullatt_block_indexes=[0]),
        image_token_id=unused, video_token_id=unused - 1, vision_start_token_id=unused - 2,
        **specials)
    vl = Qwen2_5_VLForConditionalGeneration(vl_config)
    language = vl.model.language_model
    missing, unexpected = language.load_state_dict(model.model.state_dict(), strict=False)
    if unexpected or any(not k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")) for k in missing):
        raise ValueError(f"the weights do not fit Qwen2.5-VL's language model (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}) — only a Qwen2 or bias-free Llama decoder maps one "
                         f"to one — pass a course model.")
    with torch.no_grad():
        for name in missing:  # a Llama has no q/k/v biases: zero ones leave every projection unchanged
            language.get_parameter(name).zero_()
        vl.lm_head.weight.copy_(model.lm_head.weight)
    vl.config.use_cache = model.config.use_cache
    return vl.to(model.device).eval()


# ------------------------------------------------------------------------------------------------
# Batches: what real collators hand the model
# ------------------------------------------------------------------------------------------------

COLLATORS = {
    # transformers' DataCollatorWithFlattening() with its defaults: one row, restarted position_ids only
    "flattening": "transformers DataCollatorWithFlattening(): position_ids only",
    # TRL 1.16's padding-free collator (SFTConfig(packing=True) / padding_free=True): boundary metadata too
    "trl": "TRL padding-free collator: position_ids + cu_seq_lens_* + seq_idx",
    # no packing: every sample in its own right-padded row with its attention mask (the healthy control)
    "padded": "no packing: right-padded rows + attention_mask",
}


def two_samples(vocab_size: int, lengths=(37, 29), *, seed: int = 0) -> list[dict]:
    """Two token-id samples ``[{"input_ids": [...]}, ...]`` of ``lengths``, drawn from ids 5..vocab_size-5.

    Random ids are enough: whether sample B sees sample A is decided by the network's wiring, not by text.
    """
    vocab_size = validate.integer("vocab_size", vocab_size, minimum=16, why="the ids are drawn below it")
    if not isinstance(lengths, (list, tuple)) or len(lengths) != 2:
        raise ValueError(f"lengths={lengths!r} must be two lengths — the probe packs sample A, then sample B "
                         f"— pass e.g. lengths=(37, 29).")
    lengths = [validate.integer("lengths item", n, minimum=2, why="a sample needs a next-token prediction")
               for n in lengths]
    gen = torch.Generator().manual_seed(validate.seed("seed", seed))
    return [{"input_ids": torch.randint(5, vocab_size - 5, (n,), generator=gen).tolist()} for n in lengths]


def pack(features: list[dict], collator: str = "trl") -> dict:
    """The batch ``collator`` (a key of ``COLLATORS``) builds from ``features`` (dicts with ``input_ids``)."""
    validate.choice("collator", collator, tuple(COLLATORS), why="the lesson's three ways to batch samples")
    if not isinstance(features, (list, tuple)) or len(features) < 2 or not all(
            isinstance(f, dict) and "input_ids" in f for f in features):
        raise ValueError("features must be a list of at least two dicts with 'input_ids' — packing puts "
                         "several samples in one row — pass e.g. two_samples(model.config.vocab_size).")
    rows = [{"input_ids": validate.token_ids(f"features[{i}]['input_ids']", f["input_ids"])}
            for i, f in enumerate(features)]
    if collator == "flattening":
        from transformers import DataCollatorWithFlattening

        batch = DataCollatorWithFlattening()(rows)
    elif collator == "trl":
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    else:
        width = max(len(r["input_ids"]) for r in rows)
        pads = [width - len(r["input_ids"]) for r in rows]
        batch = {"input_ids": torch.tensor([r["input_ids"] + [0] * n for r, n in zip(rows, pads)]),
                 "attention_mask": torch.tensor([[1] * (width - n) + [0] * n for n in pads])}
    batch.pop("labels", None)  # the probe compares logits; labels would only add a loss
    return batch


def with_position_rows(batch: dict, rows: int) -> dict:
    """``batch`` with its 2-D ``position_ids`` turned into ``rows`` rows, as multimodal-RoPE models take them.

    3 rows: the temporal/height/width rows that ``get_rope_index`` returns for text (all three equal the text
    positions); 4 rows: the text row first, then those three (the layout Qwen3-VL expands 2-D positions to).
    """
    validate.choice("rows", rows, (3, 4), why="mRoPE takes 3 rows (t, h, w) or 4 (a text row, then t, h, w)")
    validate.batch("batch", batch, need=("input_ids", "position_ids"))
    pos = batch["position_ids"]
    if pos.dim() != 2:
        raise ValueError(f"batch['position_ids'] has {pos.dim()} dimensions, expected 2 — the rows are built "
                         f"from a collator's [batch, length] positions — pass the collator's batch "
                         f"unchanged.")
    return {**batch, "position_ids": pos[None].expand(rows, -1, -1).clone()}


# ------------------------------------------------------------------------------------------------
# What the model really uses: the positions its rotary embedding and its mask builder receive
# ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _recording_mask_positions(model, seen: list):
    """Wrap the mask builders the model's modelling module calls, recording the ``position_ids`` they get.

    transformers' modelling files import ``create_causal_mask`` (and its sliding-window twin) by name, so the
    wrapper goes on that module's attribute and is removed on exit, whatever happens inside.
    """
    modules = {sys.modules[type(m).__module__] for m in model.modules()
               if type(m).__module__.startswith("transformers.models.")}
    patched = []
    for module in modules:
        for name in ("create_causal_mask", "create_sliding_window_causal_mask"):
            original = getattr(module, name, None)
            if original is None:
                continue

            def wrapper(*args, _original=original, **kwargs):
                seen.append(kwargs.get("position_ids"))
                return _original(*args, **kwargs)

            setattr(module, name, wrapper)
            patched.append((module, name, original))
    try:
        yield
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


def positions_seen(model, batch: dict) -> dict:
    """Run ``model(**batch, use_cache=False)`` once and return what it used for positions:

    ``{"passed": the batch's position_ids, "rotary": what the (text) rotary embedding received, "mask": what
    the causal-mask builder received (None: it built no packed mask from positions), "mask_called": whether a
    mask builder ran at all, "logits": the output}``. The rotary row count says how the model read the
    positions (1 = text, 3 = mRoPE's t/h/w rows); the mask entry says whether the boundaries reached
    attention.
    """
    validate.model("model", model)
    if not isinstance(batch, dict) or not isinstance(batch.get("input_ids"), torch.Tensor):
        raise ValueError("batch must be a dict with an 'input_ids' tensor — it is passed to the model as "
                         "model(**batch) — pass a collator's output, e.g. pack(two_samples(V), "
                         "'flattening').")
    rotary, masks = [], []
    hooks = [m.register_forward_pre_hook(lambda mod, args, kwargs: rotary.append(
                 args[1] if len(args) > 1 else kwargs.get("position_ids")), with_kwargs=True)
             for name, m in model.named_modules()
             if type(m).__name__.endswith("RotaryEmbedding") and "visual" not in name]
    try:
        with _recording_mask_positions(model, masks), torch.no_grad():
            logits = model(**_on(model, batch), use_cache=False).logits.float().cpu()
    finally:
        for hook in hooks:
            hook.remove()
    mask = next((p for p in masks if p is not None), None)
    return {"passed": batch.get("position_ids"), "rotary": rotary[0].cpu() if rotary else None,
            "mask": None if mask is None else mask.cpu(), "mask_called": bool(masks), "logits": logits}


def _on(model, batch: dict) -> dict:
    return {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ------------------------------------------------------------------------------------------------
# The probe: sample B packed after sample A, against B alone
# ------------------------------------------------------------------------------------------------

# A drift below ROUND_OFF x the logit scale is float32 round-off (measured: ~3e-7 relative on SDPA); a leak
# moves logits by a sizeable fraction of the scale (the smallest measured, a conv layer that sees 2 tokens of
# the previous sample, ~5e-4 of it). The verdict threshold sits between the two, 300x above round-off.
ROUND_OFF = 1e-4


@dataclass
class PackingLeak:
    """The two-sample probe's result: ``max_delta`` (max |Δlogit| of sample B packed vs B alone),
    ``argmax_agreement`` (share of B's positions whose next-token argmax is unchanged), ``positions`` (what
    the mask builder received: None = no packed mask was built from positions), ``raised`` (the error the
    packed forward raised, or None), ``threshold`` (the leak threshold used: ROUND_OFF x the logit scale) and
    ``verdict``: "clean", "leaks" or "raises"."""

    max_delta: float | None
    argmax_agreement: float | None
    positions: torch.Tensor | None
    raised: str | None
    threshold: float
    verdict: str


def packing_leak(model, collator: str = "trl", *, features: list[dict] | None = None,
                 position_rows: int | None = None) -> PackingLeak:
    """The two-sample probe on ``model``: pack sample A then B with ``collator``, compare B with B alone.

    For your own model, before training: build it from its config (random weights are enough — the leak is a
    property of the architecture, the attention implementation and the collator) and call
    ``packing_leak(model, "trl")`` (what ``SFTTrainer(packing=True)`` feeds it) or ``"flattening"``
    (``DataCollatorWithFlattening()``). ``features``: two samples (default ``two_samples``);
    ``position_rows``: 3 or 4 to pass mRoPE-shaped positions. The call is ``use_cache=False``, as SFTTrainer
    makes it.
    """
    validate.model("model", model)
    validate.choice("collator", collator, tuple(COLLATORS), why="the lesson's three ways to batch samples")
    if features is None:
        features = two_samples(model.config.get_text_config().vocab_size)
    batch = pack(features, collator)
    validate.ids_fit_model(model, batch["input_ids"])
    if position_rows is not None:
        if collator == "padded":
            raise ValueError("position_rows is for packed batches — a padded batch has no position_ids to "
                             "reshape — pass collator='flattening' or 'trl'.")
        batch = with_position_rows(batch, position_rows)
    return _probe(model, batch, [len(f["input_ids"]) for f in features], collator)


@torch.no_grad()
def _probe(model, batch: dict, lengths: list[int], collator: str) -> PackingLeak:
    a, b = lengths[0], lengths[1]
    ids = batch["input_ids"]
    alone = model(input_ids=ids[-1:, :b].to(model.device) if collator == "padded" else
                  ids[:, a:a + b].to(model.device), use_cache=False).logits[0].float().cpu()
    threshold = ROUND_OFF * max(1.0, float(alone.abs().max()))
    try:
        seen = positions_seen(model, batch)
        logits = seen.pop("logits")
    except (ValueError, RuntimeError) as error:  # the library's refusal is a result, not a crash
        return PackingLeak(None, None, None, f"{type(error).__name__}: {error}", threshold, "raises")
    got = logits[1, :b] if collator == "padded" else logits[0, a:a + b]
    delta = float((got - alone).abs().max())
    agree = float((got.argmax(-1) == alone.argmax(-1)).float().mean())
    return PackingLeak(delta, agree, seen["mask"], None, threshold, "leaks" if delta > threshold else "clean")


def trl_packing_raises(model) -> str | None:
    """Does ``SFTTrainer(packing=True)`` (or ``padding_free=True``) fail at its first step on this machine?

    TRL's padding-free batch carries boundary metadata (``cu_seq_lens_*``, ``seq_idx``); transformers 5.24's
    linear-attention / Mamba layers refuse it without their CUDA kernels (``causal-conv1d``, ``fla``,
    ``mamba-ssm``) instead of ignoring it. Returns the error the first packed forward raises, or None. The
    answer depends on the machine: the same model with the kernels installed (a GPU) trains.
    """
    return packing_leak(model, "trl").raised


# ------------------------------------------------------------------------------------------------
# What if: one architecture, attention implementation and collator at a time
# ------------------------------------------------------------------------------------------------

def packing_frame(model_type: str, attn_implementation: str, collator: str):
    """``(text, figure)``: the probe on a tiny ``model_type`` model, B's |Δlogit| token by token."""
    from .viz import figure

    validate.choice("model_type", model_type, tuple(ARCHITECTURES), why="the families tiny_model can build")
    validate.choice("attn_implementation", attn_implementation, ATTENTION,
                    why="the CPU attention implementations")
    validate.choice("collator", collator, tuple(COLLATORS), why="the lesson's three ways to batch samples")
    try:
        model = tiny_model(model_type, attn_implementation)
    except ValueError as error:  # a valid family without this implementation (gpt-oss, MPT: no SDPA)
        return f"{model_type} · {attn_implementation}: cannot be built — {str(error)[:120]}"
    features = two_samples(model.config.vocab_size)
    batch = pack(features, collator)
    result = _probe(model, batch, [len(f["input_ids"]) for f in features], collator)
    text = (f"{model_type} · {attn_implementation} · {COLLATORS[collator]}\n"
            + (f"raises: {result.raised[:160]}" if result.raised else
               f"max |Δlogit| of B vs B alone {result.max_delta:.2e} (threshold {result.threshold:.1e}) → "
               f"{result.verdict}; argmax unchanged on {result.argmax_agreement:.0%} of B"))
    if result.raised:
        return text
    a, b = (len(f["input_ids"]) for f in features)
    with torch.no_grad():
        alone = model(input_ids=batch["input_ids"][-1:, :b] if collator == "padded" else
                      batch["input_ids"][:, a:a + b], use_cache=False).logits[0]
        logits = model(**batch, use_cache=False).logits
        got = logits[1, :b] if collator == "padded" else logits[0, a:a + b]
    fig, ax = figure(6.5, 3.0)
    ax.plot(range(b), (got - alone).abs().amax(-1).clamp(min=1e-9), marker=".", lw=1)
    ax.axhline(result.threshold, color="#d62828", ls="--", lw=1, label="leak threshold")
    ax.set_yscale("log")
    ax.set_ylim(1e-9, 100)
    ax.set_xlabel("position in sample B (token index)")
    ax.set_ylabel("max |Δlogit| vs B alone")
    ax.set_title(f"{model_type}, {attn_implementation}, {collator}", fontsize=10)
    ax.legend(fontsize=8)
    return text, fig


def packing_explorer():
    """What if: architecture × attention implementation × collator → the probe, redrawn (one tiny model
    each)."""
    from .viz import what_if

    return what_if(packing_frame, {"model_type": list(ARCHITECTURES), "attn_implementation": list(ATTENTION),
                                   "collator": {v.split(":")[0]: k for k, v in COLLATORS.items()}},
                   start={"model_type": "gpt_oss", "attn_implementation": "eager", "collator": "flattening"})


def tiny_vl_model(model_type: str = "qwen2_5_vl", *, seed: int = 0):
    """A random 2-layer ``qwen2_5_vl`` or ``qwen3_vl`` model (a 1-block vision tower), in eval mode, offline.

    Both read multimodal rotary positions: Qwen2.5-VL expands 2-D ``position_ids`` to 3 rows (t, h, w),
    Qwen3-VL to 4 (a text row first). Which rows reach the mask builder decides whether packing is clean.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText

    validate.choice("model_type", model_type, ("qwen2_5_vl", "qwen3_vl"),
                    why="the two multimodal-RoPE families the lesson measures")
    validate.seed("seed", seed)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    if model_type == "qwen3_vl":
        rope["mrope_interleaved"] = True
        vision["deepstack_visual_indexes"] = []
    else:
        vision["fullatt_block_indexes"] = [0]
    text = {k: v for k, v in _SHARED.items() if k != "initializer_range"}
    config = AutoConfig.for_model(model_type, text_config=dict(text, rope_parameters=rope),
                                  vision_config=vision,
                                  image_token_id=250, video_token_id=251, vision_start_token_id=252,
                                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config.text_config.initializer_range = config.initializer_range = _SHARED["initializer_range"]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    return model.eval()


# ------------------------------------------------------------------------------------------------
# Showing the measurements: B's drift token by token, and the family table
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
def drift_by_token(model, call: dict, b_ids) -> torch.Tensor:
    """|Δlogit| (max over the vocabulary) of each token of sample ``b_ids``, the *last* sample of the packed
    row in ``call``, against ``b_ids`` run alone; the call is made with ``use_cache=False``."""
    validate.model("model", model)
    b = torch.as_tensor(validate.token_ids("b_ids", b_ids)).reshape(1, -1)
    if not isinstance(call, dict) or not isinstance(call.get("input_ids"), torch.Tensor):
        raise ValueError("call must be the dict of tensors passed to the model (input_ids, position_ids…) — "
                         "the helper runs model(**call, use_cache=False) — pass e.g. {'input_ids': ids, "
                         "'position_ids': pos}.")
    validate.ids_fit_model(model, b, name="b_ids")
    row = call["input_ids"].reshape(-1, call["input_ids"].shape[-1])[0]
    if b.shape[1] > row.shape[0]:
        raise ValueError(f"b_ids has {b.shape[1]} tokens but the packed row {row.shape[0]} — "
                         "B is the last sample of the row — pass the ids of the row's last sample.")
    if row[-b.shape[1]:].tolist() != b[0].tolist():
        raise ValueError(f"b_ids {b[0].tolist()[:6]} are not the last {b.shape[1]} tokens of the packed row "
                         f"(it ends {row[-b.shape[1]:].tolist()[:6]}) — the drift compares the row's last "
                         "sample with itself run alone, and other ids would measure two different texts — "
                         "pass the ids of the sample packed last (pack(features, ...) puts features[-1] "
                         "there).")
    packed = model(**_on(model, call), use_cache=False).logits[0, -b.shape[1]:].float().cpu()
    alone = model(input_ids=b.to(model.device), use_cache=False).logits[0].float().cpu()
    return (packed - alone).abs().amax(-1)


def plot_drift_by_token(curves: dict, threshold: float):
    """One line per ``{name: drift_by_token(...)}``, on a log axis, with the leak ``threshold`` drawn."""
    # Deferred: pyplot picks a backend when imported (in a notebook: inline, which shows the figure)
    import matplotlib.pyplot as plt

    if not isinstance(curves, dict) or not curves:
        raise ValueError("curves must be a non-empty dict {name: drift_by_token(...)} — one line each — pass "
                         "e.g. {'course model': drift_by_token(model, call, b_ids)}.")
    threshold = validate.number("threshold", threshold, positive=True, why="above it B saw sample A")
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, values in curves.items():
        ax.plot(torch.as_tensor(values).clamp(min=1e-9), marker=".", lw=1, label=name)
    ax.axhline(threshold, color="#d62828", ls="--", lw=1, label=f"leak threshold ({threshold:.0e})")
    ax.set_yscale("log")
    ax.set_ylim(1e-9, 100)
    ax.set_xlabel("position in sample B (token index)")
    ax.set_ylabel("max |Δlogit| vs B alone\n(0 drawn at 1e-9)")
    ax.set_title("Sample B packed after sample A, against B alone", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def leak_table_text(table: dict, threshold: float = 1e-3) -> str:
    """``{(family, attn, collator): max |Δlogit| or an error message}`` as rows of family × attention, one
    column per collator ("ok", "LEAK" above ``threshold``, "raises" for an error)."""
    threshold = validate.number("threshold", threshold, minimum=0, why="a drift above it is a leak (0: any "
                                "drift)", fix="pass e.g. threshold=1e-3")
    if not isinstance(table, dict) or not table or not all(isinstance(k, tuple) and len(k) == 3
                                                           for k in table):
        raise ValueError("table must map (family, attention, collator) to a drift or an error message — one "
                         "cell each — build it as section 5 does.")
    collators = list(dict.fromkeys(k[2] for k in table))
    lines = [f"{'family':17} {'attn':6} " + " ".join(f"{c:>16}" for c in collators)]
    for family, attn in dict.fromkeys(k[:2] for k in table):
        cells = []
        for c in collators:
            value = table.get((family, attn, c))
            cells.append("—" if value is None else "raises" if isinstance(value, str) else
                         f"{value:.1e} {'LEAK' if value > threshold else 'ok'}")
        lines.append(f"{family:17} {attn:6} " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)
