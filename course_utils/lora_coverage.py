"""Lesson 13 (what LoRA actually trains): which parts of an MoE or hybrid model a LoRA config adapts.

The LoRA config every tutorial prints (``q,k,v,o,gate,up,down_proj``, or ``"all-linear"``) trains a
healthy-looking run on the models people fine-tune today while whole parts of the model get no adapter:
transformers 5 stores the routed experts of an MoE as fused 3-D parameters (``experts.gate_up_proj``,
``experts.down_proj``) that ``target_modules`` cannot reach, and the token mixers of hybrids (Gated
DeltaNet, Mamba) have their own Linear names. peft rescues *some* MoE models with a remap keyed by the
model type (``peft/utils/transformers_weight_conversion.py``): it rewrites ``target_modules`` into
``target_parameters``. Which models it rescues depends on the installed peft version, so this module
measures it instead of stating it.

- ``tiny_moe_or_hybrid(model_type)`` / ``tiny_config(model_type)``: a tiny random model of a family,
  offline, in milliseconds (``FAMILIES`` lists the families the lesson measures).
- ``module_groups(model)``: each weight tensor's group — attention, linear mixer (Gated DeltaNet,
  Mamba), router, routed experts, shared experts, dense MLP.
- ``lora_coverage(peft_model)``: the per-group table of a LoRA model — tensors with weights, tensors
  adapted, trainable LoRA parameters. ``frozen_groups(table)``: groups with weights and no adapter.
- ``adapter_coverage(model_or_config, lora_config)``: the same table *before* training, built on a
  meta-device model from a config (no weights loaded), with what peft's remap rewrote and whether peft
  will raise (``"all-linear"`` on Mamba, ``lora_dropout`` with ``target_parameters``).
- ``gradient_by_group(peft_model, input_ids)``: after one backward, which adapted tensors got a non-zero
  gradient — the proof that an adapter is in the computation, not only in the table.
- ``lora_config_as_trl_builds(fields)``: the ``LoraConfig`` that ``trl sft`` builds from
  ``use_peft``/``lora_*`` fields (TRL's ``get_peft_config``: ``lora_dropout`` defaults to 0.05 there).
- ``adapter_layout(adapter_dir)`` and ``drop_tensors(adapter_dir, out_dir, contains)``: what a saved
  adapter holds, and the adapter as a loader that drops some tensors serves it.

The exercises' checkers are in ``course_utils.exercises.lesson13``; reference answers in
``course_utils.exercises.answers.lesson13``.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import shutil
import warnings
from pathlib import Path

import torch

from . import validate

GROUPS = ("attention", "linear_mixer", "router", "routed_experts", "shared_experts", "dense_mlp")
TUTORIAL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EXPERT_PARAMETERS = ["experts.gate_up_proj", "experts.down_proj"]  # the fused 3-D expert weights

_SMALL = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_EXPERTS = dict(num_experts_per_tok=2, moe_intermediate_size=16)
_DELTANET = dict(
    num_hidden_layers=4,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
)
# Tiny configs of the families the lesson measures: each one's own field names for the expert count etc.
FAMILIES = {
    "qwen3_moe": dict(num_experts=4, **_EXPERTS),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(
        num_local_experts=4, num_experts_per_tok=2, layer_types=None
    ),  # None: derived from the depth
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, shared_expert_intermediate_size=24, **_EXPERTS),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "glm4_moe": dict(
        n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, **_EXPERTS
    ),
    "deepseek_v3": dict(
        n_routed_experts=4,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        **_EXPERTS,
    ),
    "qwen3_5_text": dict(_DELTANET),
    "qwen3_5_moe_text": dict(num_experts=4, shared_expert_intermediate_size=24, **_EXPERTS, **_DELTANET),
    "qwen3_next": dict(
        num_experts=4, shared_expert_intermediate_size=24, **_EXPERTS, **_DELTANET, linear_conv_kernel_dim=4
    ),
    "nemotron_h": dict(
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        n_groups=1,
        n_routed_experts=4,
        moe_shared_expert_intermediate_size=16,
        **_EXPERTS,
    ),
}
# the class-name markers of the token mixers that are not softmax attention
_LINEAR_MIXER = re.compile(r"GatedDeltaNet|Mamba|LinearAttention|ShortConv|DeltaNet|Lightning", re.I)


# overrides that count something a model needs at least one of (an expert, a layer, a head, a width)
_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size",
           "moe_intermediate_size", "head_dim", "vocab_size")


def _closest(value, known) -> str:
    """`` (did you mean 'x'?)`` with the closest of ``known``, or nothing when none is close."""
    close = difflib.get_close_matches(str(value), sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def tiny_config(model_type: str, **overrides):
    """A tiny random config of ``model_type`` (one of ``FAMILIES``), built offline; ``overrides`` win. An
    override must be a field of the family's config (``AutoConfig.for_model`` keeps any keyword as an
    attribute nothing reads: a typo would change nothing), and a count (``_COUNTS``) at least 1."""
    from transformers import AutoConfig

    if not isinstance(model_type, str):
        raise TypeError(
            f"model_type must be a string, got {type(model_type).__name__} — it names a family of "
            f"FAMILIES — e.g. 'qwen2_moe'."
        )
    if model_type not in FAMILIES:
        raise ValueError(
            f"no tiny config for model_type {model_type!r} — the lesson measures {sorted(FAMILIES)} — "
            "pick one of those, or build your own with transformers.AutoConfig.for_model(...)."
        )
    if overrides:
        defaults = AutoConfig.for_model(model_type)
        known = {*defaults.to_dict(), *_SMALL, *FAMILIES[model_type]}
        for key, value in overrides.items():
            if key not in known and not hasattr(defaults, key):
                raise ValueError(
                    f"{key}={value!r} is not a field of {type(defaults).__name__}"
                    f"{_closest(key, known)} — the config would keep it as an attribute no "
                    "layer reads, and the model would be built without it — fix the spelling against the "
                    f"config's fields (AutoConfig.for_model({model_type!r}).to_dict())."
                )
            if key in _COUNTS:
                validate.positive_int(key, value, why="a model needs at least one of each")
    return AutoConfig.for_model(model_type, **{**_SMALL, **FAMILIES[model_type], **overrides})


def tiny_moe_or_hybrid(model_type: str, *, seed: int = 0, meta: bool = False, tokenizer=None, **overrides):
    """A tiny random ``AutoModelForCausalLM`` of ``model_type`` (``meta=True``: no memory, no weights).
    ``tokenizer``: size the vocabulary and set pad/eos ids for it (to train on the course's chats)."""
    from transformers import AutoModelForCausalLM

    seed = validate.seed("seed", seed)
    validate.flag("meta", meta, why="it builds the model on the meta device (no weights) or with weights")
    if tokenizer is not None:
        validate.tokenizer("tokenizer", tokenizer)
        overrides = {
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": None,
            **overrides,
        }
    config = tiny_config(model_type, **overrides)
    if meta:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def _is_model(model) -> bool:
    return isinstance(model, torch.nn.Module) and hasattr(model, "config")


def _base_of(model):
    """The transformers model inside a PeftModel (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _clean(name: str) -> str:
    """A tensor or module name as in the model before peft wrapped it."""
    return name.replace(".base_layer", "")


def _counts(name: str, param, owner) -> bool:
    """Is this a weight matrix a LoRA could adapt? Linear weights and the fused 3-D expert tensors;
    not norms, biases (gpt-oss stores 2-D expert biases), embeddings, convolutions."""
    if name.endswith("bias"):
        return False
    if isinstance(owner, torch.nn.Embedding) or isinstance(owner, torch.nn.modules.conv._ConvNd):
        return False
    if isinstance(owner, torch.nn.Linear):
        return param is owner.weight
    return param.dim() >= 2


def _group(path: str, chain: list) -> str | None:
    """The group of a tensor from its module path and its owners' class names (nearest first)."""
    parts = path.split(".")
    if "shared_expert_gate" in parts:
        return "router"  # Qwen's scalar gate in front of the shared expert: a routing weight
    if any(p.startswith("shared_expert") for p in parts):
        return "shared_experts"
    for module in chain:
        name = type(module).__name__
        if "Router" in name or "TopkRouter" in name:
            return "router"
        if name.endswith("Experts") or re.search(r"\.experts\.\d+\.", path):
            return "routed_experts"
        if _LINEAR_MIXER.search(name):
            return "linear_mixer"
        if "Attention" in name:
            return "attention"
        if "MLP" in name or "FeedForward" in name:  # before the MoE test: Glm4MoeMLP is a dense MLP
            return "dense_mlp"
        if "MoE" in name or "Moe" in name:  # a MoE block's own Linear (the router in older layouts)
            return "router" if parts[-2] in ("gate", "router") else None
    return None


def module_groups(model) -> dict[str, str]:
    """``{tensor name: group}`` for every weight matrix of ``model`` that belongs to one of ``GROUPS``
    (embeddings, the head, norms and convolutions are left out). Names are the plain model's, also when
    ``model`` is a PeftModel (its ``base_layer`` wrappers are looked through)."""
    if not _is_model(model):
        raise TypeError(
            f"module_groups needs a transformers model, got {type(model).__name__} — it reads the "
            "module tree — pass AutoModelForCausalLM.from_config(config) or a PeftModel."
        )
    base = _base_of(model)
    modules = dict(base.named_modules())
    groups = {}
    for name, param in base.named_parameters():
        if "lora_" in name or "modules_to_save" in name:
            continue
        owner_path, _, _ = name.rpartition(".")
        chain = []
        path = owner_path
        while True:  # the owning module, then its parents up to the model
            chain.append(modules[path])
            if not path:
                break
            path = path.rpartition(".")[0]
        if not _counts(name, param, chain[0]):
            continue
        group = _group(_clean(name), chain)
        if group:
            groups[_clean(name)] = group
    return groups


def _adapted(peft_model) -> dict[str, int]:
    """``{base tensor name: trainable LoRA parameters on it}`` — read from peft's layers themselves."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for path, module in _base_of(peft_model).named_modules():
        if not isinstance(module, LoraLayer):
            continue
        target = getattr(
            module, "parameter_name", None
        )  # a ParamWrapper (target_parameters) names its tensor
        name = _clean(f"{path}.{target}" if target else f"{path}.weight")
        numel = sum(
            p.numel()
            for key in ("lora_A", "lora_B")
            for p in getattr(module, key).parameters()
            if p.requires_grad
        )
        if numel:
            out[name] = out.get(name, 0) + numel
    return out


def lora_coverage(peft_model) -> dict[str, dict]:
    """The per-group table of a LoRA model: ``{group: {"tensors": weight matrices in the group,
    "adapted": how many carry a trainable LoRA, "lora_params": trainable LoRA parameters}}``, for the groups
    the model has. ``print_trainable_parameters()`` gives one total; this says where it sits."""
    if not hasattr(peft_model, "peft_config"):
        raise TypeError(
            f"lora_coverage needs a PeftModel, got {type(peft_model).__name__} — it reads the LoRA "
            "layers — wrap the model first: peft.get_peft_model(model, LoraConfig(...))."
        )
    groups, adapted = module_groups(peft_model), _adapted(peft_model)
    table = {}
    for group in GROUPS:
        names = [n for n, g in groups.items() if g == group]
        if names:
            table[group] = {
                "tensors": len(names),
                "adapted": sum(n in adapted for n in names),
                "lora_params": sum(adapted.get(n, 0) for n in names),
            }
    return table


_ROW = ("tensors", "adapted", "lora_params")  # a coverage table's row, per group


def _coverage_table(table, reader: str) -> dict:
    """``table`` if it is a coverage table: a non-empty dict of ``{group: {"tensors", "adapted",
    "lora_params"}}`` (an empty one is what adapter_coverage holds when peft refused the config)."""
    if not isinstance(table, dict):
        raise TypeError(
            f"table must be a coverage table (a dict), got {type(table).__name__} — {reader} reads "
            "its rows — pass lora_coverage(peft_model) or adapter_coverage(...)['table']."
        )
    if not table:
        raise ValueError(
            f"table is empty — {reader} reads one row per module group, and an empty table has none (it is "
            "adapter_coverage's table when peft refused the config) — read adapter_coverage(...)['error'] "
            "first, or pass lora_coverage(peft_model)."
        )
    for group, row in table.items():
        if group not in GROUPS or not (isinstance(row, dict) and set(_ROW) <= set(row)):
            raise ValueError(
                f"table[{group!r}] is not a coverage row — each key is one of {list(GROUPS)} and each row "
                "holds 'tensors', 'adapted' and 'lora_params' — pass lora_coverage(peft_model) or "
                "adapter_coverage(...)['table']."
            )
    return table


def frozen_groups(table: dict, *, include_router: bool = False) -> list[str]:
    """The groups of a coverage table that have weights but no adapter, in ``GROUPS`` order. The router is
    left out unless asked for: recipes often keep it frozen on purpose (the load balance it learned)."""
    _coverage_table(table, "frozen_groups")
    validate.flag("include_router", include_router, why="it counts a frozen router as a frozen group")
    return [
        g
        for g in GROUPS
        if g in table
        and table[g]["tensors"]
        and not table[g]["adapted"]
        and (include_router or g != "router")
    ]


def format_table(table: dict) -> str:
    """A coverage table as aligned text (the frozen groups marked)."""
    _coverage_table(table, "format_table")
    lines = [f"{'group':16s} {'adapted':>9s} {'LoRA params':>12s}"]
    for group, row in table.items():
        flag = "  <- no adapter" if row["tensors"] and not row["adapted"] else ""
        lines.append(
            f"{group:16s} {row['adapted']:>4d}/{row['tensors']:<4d} {row['lora_params']:>12,d}{flag}"
        )
    return "\n".join(lines)


def _as_set(value) -> set | str | None:
    """A target list as a set (None for none at all: peft's remap turns None into an empty set)."""
    if value is None or isinstance(value, str):
        return value
    return set(value) or None


def adapter_coverage(model_or_config, lora_config) -> dict:
    """What ``get_peft_model(model, lora_config)`` will adapt, measured before any training.

    ``model_or_config``: a transformers model or a ``PretrainedConfig`` (then a meta-device model is built:
    nothing is downloaded or allocated). Returns ``{"table": per-group table (see ``lora_coverage``),
    "frozen": groups with weights and no adapter, "rewritten": what peft's v4->v5 remap changed in the
    config (``{"target_modules": (before, after), "target_parameters": (before, after)}``, empty when
    nothing), "error": the ``ValueError`` text when peft refuses the config, else None}``. peft itself
    decides, so the answer is the installed peft version's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, PretrainedConfig

    if not isinstance(lora_config, LoraConfig):
        raise TypeError(
            f"lora_config must be a peft.LoraConfig, got {type(lora_config).__name__} — the table is "
            "what peft builds from it — build one, or lora_config_as_trl_builds(fields) for trl sft's."
        )
    if isinstance(model_or_config, PretrainedConfig):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_or_config)
    elif _is_model(model_or_config) and not hasattr(model_or_config, "peft_config"):
        # the same module tree from its config, on the meta device: the caller's model is neither copied nor
        # wrapped (get_peft_model changes the model it is given)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_or_config.config)
    else:
        raise TypeError(
            f"model_or_config must be a transformers model (not yet wrapped by peft) or its config, "
            f"got {type(model_or_config).__name__} — pass AutoConfig.from_pretrained(name) to load "
            "nothing but the config."
        )
    config = copy.deepcopy(lora_config)
    before = {
        "target_modules": _as_set(config.target_modules),
        "target_parameters": _as_set(config.target_parameters),
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # peft's notices are not the table
            peft_model = get_peft_model(model, config)
    except ValueError as exc:
        return {"table": {}, "frozen": [], "rewritten": {}, "error": str(exc)}
    after_config = peft_model.peft_config["default"]
    after = {
        "target_modules": _as_set(after_config.target_modules),
        "target_parameters": _as_set(after_config.target_parameters),
    }
    rewritten = {
        key: (before[key], after[key])
        for key in before
        if before[key] != after[key]
        and not (
            key == "target_modules" and isinstance(before[key], str) and not after.get("target_parameters")
        )
        # target_modules=None: peft fills in its defaults for the model type — no rewrite of a user's list
        and not (key == "target_modules" and before[key] is None and not after.get("target_parameters"))
    }
    table = lora_coverage(peft_model)
    return {
        "table": table,
        "frozen": frozen_groups(table, include_router=True) if table else [],  # a model of no known group
        "rewritten": rewritten,
        "error": None,
    }


def gradient_by_group(peft_model, input_ids: torch.Tensor) -> dict[str, dict]:
    """One forward + backward on ``input_ids`` (the labels are the inputs): ``{group: {"adapted": n,
    "with_grad": adapted tensors whose LoRA got a non-zero gradient}}``. Gradients are zeroed before and
    after, so the model is left as it was."""
    from peft.tuners.lora import LoraLayer

    if not hasattr(peft_model, "peft_config"):
        raise TypeError(
            f"gradient_by_group needs a PeftModel, got {type(peft_model).__name__} — it reads the "
            "LoRA layers' gradients — wrap the model with peft.get_peft_model first."
        )
    validate.tensor("input_ids", input_ids, ndim=2, integer_dtype=True)
    if 0 in input_ids.shape:
        raise ValueError(
            f"input_ids has shape {tuple(input_ids.shape)}: no row or no token — a backward needs a loss "
            "over at least one token — pass e.g. torch.randint(vocab_size, (2, 16))."
        )
    validate.ids_fit_model(peft_model, input_ids)
    groups = module_groups(peft_model)
    peft_model.zero_grad(set_to_none=True)
    peft_model(input_ids=input_ids, labels=input_ids).loss.backward()
    out: dict[str, dict] = {}
    for path, module in _base_of(peft_model).named_modules():
        if not isinstance(module, LoraLayer):
            continue
        target = getattr(module, "parameter_name", None)
        group = groups.get(_clean(f"{path}.{target}" if target else f"{path}.weight"))
        params = [
            p for key in ("lora_A", "lora_B") for p in getattr(module, key).parameters() if p.requires_grad
        ]
        if group is None or not params:
            continue
        row = out.setdefault(group, {"adapted": 0, "with_grad": 0})
        row["adapted"] += 1
        row["with_grad"] += any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params)
    peft_model.zero_grad(set_to_none=True)
    return {g: out[g] for g in GROUPS if g in out}


def weights_by_group(model) -> dict[str, torch.Tensor]:
    """``{tensor name: a detached copy}`` of every grouped weight — take it before training, then compare
    with ``weight_change_by_group`` after merging."""
    groups = module_groups(model)
    return {name: p.detach().clone() for name, p in _base_of(model).named_parameters() if name in groups}


def weight_change_by_group(before: dict, model) -> dict[str, float]:
    """``{group: max |Δweight|}`` between ``before`` (``weights_by_group`` of the untrained model) and
    ``model`` (a merged model, or a PeftModel, which is merged in a copy): what training moved, per group."""
    if not isinstance(before, dict) or not before:
        raise ValueError(
            "before must be weights_by_group(model) taken before training — it is the reference the "
            "change is measured from — call it on the base model first."
        )
    if hasattr(model, "peft_config"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = copy.deepcopy(model).merge_and_unload()
    groups, current = module_groups(model), dict(model.named_parameters())
    change: dict[str, float] = {}
    for name, old in before.items():
        group = groups.get(name)
        if group is None or name not in current:
            continue
        delta = float((current[name].detach() - old).abs().max())
        change[group] = max(change.get(group, 0.0), delta)
    return {g: change[g] for g in GROUPS if g in change}


_PEFT_SWITCHES = ("use_peft", "use_rslora", "use_dora")


def lora_config_as_trl_builds(fields):
    """The ``LoraConfig`` that ``trl sft`` builds from the same settings, or None when ``use_peft`` is off.

    ``fields``: a mapping (the YAML / ``--flag`` values: ``use_peft``, ``lora_r``, ``lora_alpha``,
    ``lora_dropout``, ``lora_target_modules``, ``lora_target_parameters``, ``lora_modules_to_save``,
    ``lora_task_type``, ``use_rslora``, ``use_dora``; other keys, e.g. ``SFTConfig``'s, are ignored) or a
    ``trl.ModelConfig``. It is TRL's own path — ``ModelConfig`` (its defaults: ``lora_dropout=0.05``, not
    peft's 0.0; a one-element target list becomes a string) then ``trl.get_peft_config`` — so what the
    doctor reads is what the trainer gets."""
    from trl import ModelConfig, get_peft_config

    if isinstance(fields, ModelConfig):
        model_args = fields
    elif isinstance(fields, dict) or hasattr(fields, "__dict__"):
        values = dict(fields) if isinstance(fields, dict) else vars(fields)
        known = ModelConfig.__dataclass_fields__
        lora_keys = [k for k in known if k.startswith("lora_") or k in _PEFT_SWITCHES]
        for key in values:
            if isinstance(key, str) and key.startswith("lora_") and key not in known:
                raise ValueError(
                    f"{key!r} is not a trl sft LoRA field{_closest(key, lora_keys)} — trl sft "
                    "would refuse it, and here it would be left out silently — fix the spelling against "
                    f"{lora_keys}."
                )
        wanted = {k: v for k, v in values.items() if k in lora_keys}
        for key in _PEFT_SWITCHES:
            if key in wanted:
                validate.flag(key, wanted[key], why="trl sft reads it as a switch")
        if "lora_r" in wanted:
            validate.positive_int("lora_r", wanted["lora_r"], why="it is the rank of every adapter, and a "
                                  "rank-0 adapter trains nothing", fix="pass e.g. lora_r=16 (TRL's default)")
        if "lora_alpha" in wanted:
            validate.number("lora_alpha", wanted["lora_alpha"], positive=True, why="it scales every "
                            "adapter's update", fix="pass e.g. lora_alpha=32 (TRL's default)")
        if "lora_dropout" in wanted:
            validate.fraction("lora_dropout", wanted["lora_dropout"], why="it is the share of inputs dropped")
        model_args = ModelConfig(**wanted)
    else:
        raise TypeError(
            f"fields must be a dict of trl sft settings or a trl.ModelConfig, got {type(fields).__name__}"
            " — the LoraConfig is built from those fields as trl sft does"
            " — e.g. {'use_peft': True, 'lora_target_modules': ['q_proj', 'v_proj']}."
        )
    return get_peft_config(model_args)


# --- the saved adapter -------------------------------------------------------------------------------------


def adapter_layout(adapter_dir) -> dict:
    """What a saved adapter holds: ``{"target_modules", "target_parameters", "rank_pattern": from
    adapter_config.json, "tensors": {tensor name: shape}}`` — what a server's LoRA loader has to map."""
    from safetensors import safe_open

    if not isinstance(adapter_dir, (str, Path)) or not str(adapter_dir).strip():
        raise TypeError(
            f"adapter_dir must be a directory path (str or Path), got {adapter_dir!r:.60} — the adapter is "
            "read from that folder — pass the directory PeftModel.save_pretrained wrote."
        )
    path = Path(adapter_dir)
    if not (path / "adapter_config.json").is_file() or not (path / "adapter_model.safetensors").is_file():
        raise ValueError(
            f"{adapter_dir!s} is not a saved peft adapter — adapter_layout reads adapter_config.json and "
            "adapter_model.safetensors — pass the directory PeftModel.save_pretrained wrote."
        )
    config = json.loads((path / "adapter_config.json").read_text())
    with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
        tensors = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    return {
        "target_modules": config.get("target_modules"),
        "target_parameters": config.get("target_parameters"),
        "rank_pattern": config.get("rank_pattern") or {},
        "tensors": tensors,
    }


def drop_tensors(adapter_dir, out_dir, contains: str) -> list[str]:
    """Copy an adapter, leaving out every tensor whose name contains ``contains`` and those targets from
    ``target_parameters``: the adapter as a loader that cannot map them serves it. Returns the dropped
    names."""
    from safetensors.torch import load_file, save_file

    if not isinstance(contains, str) or not contains.strip():
        raise ValueError(
            f"contains must be a non-empty string, got {contains!r} — it selects tensor names — "
            "pass e.g. contains='experts'."
        )
    names = sorted(adapter_layout(adapter_dir)["tensors"])  # validates the directory
    dropped = [k for k in names if contains in k]
    if not dropped or len(dropped) == len(names):
        what = ("none of" if not dropped else "every one of") + f" the adapter's {len(names)} tensors"
        result = "the adapter unchanged" if not dropped else "an adapter with no weights"
        raise ValueError(
            f"contains={contains!r} matches {what} (e.g. {names[:1]}) — the copy would be {result}, not "
            "the adapter with some tensors missing — pass a part of the names of the tensors to drop only, "
            "e.g. contains='experts'."
        )
    # never over the adapter or a folder with files: the copy is written file by file and would replace them
    out = validate.new_directory("out_dir", out_dir, inputs=[adapter_dir], what="the adapter copy's files")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(adapter_dir, out, dirs_exist_ok=True)
    state = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    save_file({k: v for k, v in state.items() if contains not in k}, str(out / "adapter_model.safetensors"))
    config = json.loads((out / "adapter_config.json").read_text())
    if config.get("target_parameters"):
        config["target_parameters"] = [t for t in config["target_parameters"] if contains not in t] or None
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return dropped


def coverage_heatmap(survey: dict, title: str = ""):
    """A figure of ``survey`` — ``{(family, config label): adapter_coverage(...)}`` — one panel per
    config label:
    families by groups, each cell the fraction of the group's weights that carry a LoRA (green all, red none,
    blank: no such group; "raises" where peft refuses the config). A family peft's remap rewrote is marked."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not isinstance(survey, dict) or not survey:
        raise ValueError(
            "survey must be a non-empty {(family, label): adapter_coverage(...)} dict — it is what "
            "the figure draws — build it with a dict comprehension over families and configs."
        )
    if not isinstance(title, str):
        raise TypeError(f"title={title!r:.40} must be a string — it is the figure's heading — pass e.g. "
                        "title='LoRA coverage per family', or leave it out.")
    families = list(dict.fromkeys(f for f, _ in survey))
    labels = list(dict.fromkeys(label for _, label in survey))
    fig, axes = plt.subplots(
        1, len(labels), figsize=(5.5 * len(labels), 0.42 * len(families) + 1.6), sharey=True, squeeze=False
    )
    for ax, label in zip(axes[0], labels):
        grid = np.full((len(families), len(GROUPS)), np.nan)
        for i, family in enumerate(families):
            result = survey[family, label]
            for j, group in enumerate(GROUPS):
                row = result["table"].get(group)
                if result["error"]:
                    ax.text(j, i, "raises", ha="center", va="center", fontsize=6)
                elif row:
                    grid[i, j] = row["adapted"] / row["tensors"]
                    ax.text(j, i, f"{row['adapted']}/{row['tensors']}", ha="center", va="center", fontsize=7)
        ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(GROUPS)), GROUPS, rotation=35, ha="right")
        ax.set_yticks(
            range(len(families)),
            [f + (" (remapped)" if survey[f, label]["rewritten"] else "") for f in families],
        )
        ax.set_xlabel("module group")
        ax.set_title(f"{label}: weights adapted / weights")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# what each problem means, for a report (the doctor's finding text lives with the doctor)
PROBLEMS = (
    "peft_refuses",
    "dropout_with_target_parameters",
    "all_linear_on_mamba",
    "remap_rewrote_targets",
    "frozen_group",
)


def coverage_problems(coverage: dict) -> list[dict]:
    """The problems in an ``adapter_coverage`` result, as ``{"kind": one of PROBLEMS, "detail": str}``:
    peft refusing the config (the lora_dropout of a target_parameters LoRA; ``"all-linear"`` or out_proj on
    a Mamba model; anything else), the remap's rewrite of ``target_modules``, and each group with weights and
    no adapter (the router left out: often frozen on purpose). Empty: every group is adapted."""
    if not isinstance(coverage, dict) or not {"table", "frozen", "rewritten", "error"} <= set(coverage):
        raise ValueError(
            "coverage must be what adapter_coverage() returned — its table, frozen groups, rewrite "
            "and error are read — call adapter_coverage(model_or_config, lora_config) first."
        )
    error = coverage["error"]
    if error:
        if "dropout" in error:
            kind = "dropout_with_target_parameters"
        elif "incompatible" in error.lower() and "mamba" in error.lower():
            kind = "all_linear_on_mamba"
        else:
            kind = "peft_refuses"
        return [{"kind": kind, "detail": error}]
    problems = []
    if coverage["rewritten"]:
        moves = "; ".join(
            f"{key}: {before!r} -> {after!r}" for key, (before, after) in coverage["rewritten"].items()
        )
        problems.append({"kind": "remap_rewrote_targets", "detail": moves})
    for group in frozen_groups(coverage["table"]):
        row = coverage["table"][group]
        problems.append({"kind": "frozen_group", "detail": f"{group}: 0 of {row['tensors']} weights adapted"})
    return problems
