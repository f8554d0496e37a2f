"""Checks that depend on the model's architecture, read from its ``config.json``: what LoRA will adapt
(lesson 13), whether packed samples stay apart (lesson 12), and whether the Trainer counts the step's tokens
(lesson 07).

Each measures with the lesson's own function, on the user's config: ``lora_coverage.adapter_coverage`` on a
meta-device model (no weights loaded), ``packing_arch.packing_leak`` on a tiny random model of the user's
family (the leak is a property of the architecture, the attention implementation and the collator, not of
trained weights: lesson 12 proves it), ``token_weighting.loss_count_ignored`` on the classes the config
names. None of them loads the checkpoint's weights.
"""

from __future__ import annotations

import warnings

from .report import Finding

# The token-mixing and MLP projections a LoRA target list names when the user means "adapt the MLPs"
_MLP_NAMES = ("gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "fc1", "fc2", "experts", "mlp")
_ATTENTION_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "query_key_value", "c_attn")


def model_config(setup):
    """The model's ``PretrainedConfig``: the loaded model's, or ``config.json`` beside the checkpoint read
    offline; None when there is none to read (a tokenizer-only directory)."""
    if setup.model is not None:
        return setup.model.config
    if setup.source is None:
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(setup.source)
    except (OSError, ValueError, KeyError):  # no config.json, or a model type this transformers lacks
        return None


def _targets(lora_config) -> set[str] | str:
    value = lora_config.target_modules
    if value is None or isinstance(value, str):
        return value or set()
    return {str(v) for v in value}


def _intends(targets, names) -> bool:
    """Does a target list (or "all-linear") aim at modules of this kind?"""
    if targets == "all-linear":
        return True
    if isinstance(targets, str):  # a regex: the intent is what it names
        return any(n in targets for n in names)
    return any(any(n in t for n in names) for t in targets)


def lora_coverage_findings(setup) -> list[Finding]:
    """With LoRA: the trainable parameters per module group, as peft will build them from this config on
    this architecture (peft's v4->v5 remap included), with lesson 13's ``coverage_problems``: an error when
    peft will refuse the config (SFTTrainer raises at construction), the remap's rewrite, and a warning for
    every group the user's targets aim at that gets no adapter (routed or shared experts, the dense MLP, a
    linear-attention / Mamba mixer) — not for groups a short list leaves out on purpose (q/v-only LoRA)."""
    from peft import LoraConfig

    from ..lora_coverage import adapter_coverage, coverage_problems, format_table

    if not isinstance(setup.peft, LoraConfig):
        return []
    config = model_config(setup)
    if config is None:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = adapter_coverage(config, setup.peft)
    findings, targets = [], _targets(setup.peft)
    for problem in coverage_problems(result):
        kind, detail = problem["kind"], problem["detail"]
        if kind in _REFUSALS:
            return [Finding("error", "lora-config-raises", "peft refuses this LoRA config on this "
                            "architecture: SFTTrainer raises before the first step", detail[:240],
                            _REFUSALS[kind], "13")]
        if kind == "remap_rewrote_targets":
            findings.append(Finding("info", "lora-remap", f"peft rewrites your LoRA targets for "
                                    f"{config.model_type} (its v4->v5 remap)", detail,
                                    "read the per-group table: it is what trains", "13"))
    table = result["table"]
    aimed = {"routed_experts": _MLP_NAMES, "shared_experts": _MLP_NAMES, "dense_mlp": _MLP_NAMES,
             "linear_mixer": _ATTENTION_NAMES}
    frozen = [g for g in result["frozen"] if g in aimed and _intends(targets, aimed[g])]
    if frozen:
        sizes = ", ".join(f"{g} ({table[g]['tensors']} weight tensors)" for g in frozen)
        expert = any(g.endswith("experts") for g in frozen)
        findings.append(Finding(
            "warning", "lora-frozen-groups",
            f"your LoRA targets aim at them, but these groups get no adapter: {', '.join(frozen)}",
            f"{sizes}; targets {targets!r}; the loss will still fall",
            ("name the fused expert weights in target_parameters (e.g. [\"experts.gate_up_proj\", "
             "\"experts.down_proj\"]: read the names from model.named_parameters()) with lora_dropout=0"
             if expert else "add the mixer's Linear names to target_modules (or \"all-linear\")")
            + "; check again with lora_coverage.adapter_coverage", "13"))
    if table:  # empty: the model has no module group the table knows
        findings.append(Finding("info", "lora-coverage", "what LoRA trains, per module group",
                                format_table(table), "print_trainable_parameters() gives one total: this "
                                "table is per group", "13"))
    return findings


_REFUSALS = {  # coverage_problems' kinds of refusal, and what to do about each
    "dropout_with_target_parameters": "set lora_dropout=0 (TRL's default is 0.05; adapters on fused expert "
                                      "parameters take no dropout)",
    "all_linear_on_mamba": "name the target modules by hand (read them from model.named_modules(); the "
                           "Mamba mixer's in_proj): \"all-linear\" is refused on this model",
    "peft_refuses": "fix the LoRA config field peft names",
}


def _attention(config_fields: dict, model_config_obj) -> str:
    """The attention implementation training will use: SFTConfig's ``model_init_kwargs``, else the
    checkpoint's own setting, else transformers' default (SDPA where the family has it)."""
    init = config_fields.get("model_init_kwargs") or {}
    chosen = init.get("attn_implementation") if isinstance(init, dict) else None
    return chosen or getattr(model_config_obj, "_attn_implementation", None) or "sdpa"


def _probe_model(model_type: str, attention: str):
    """A tiny random model of the user's family for the two-sample probe, or None when lesson 12 has no tiny
    config of it. gpt-oss and MPT have no SDPA path: transformers runs them eager, and so does the probe."""
    from ..packing_arch import ARCHITECTURES, tiny_model, tiny_vl_model

    if model_type in ("qwen2_5_vl", "qwen3_vl"):
        return tiny_vl_model(model_type)
    if model_type not in ARCHITECTURES:
        return None
    try:
        return tiny_model(model_type, attention)
    except ValueError:  # no such implementation for this family: what from_pretrained falls back to
        return tiny_model(model_type, "eager")


def packing_leak_findings(setup, args) -> list[Finding]:
    """With ``packing`` or ``padding_free``: lesson 12's two-sample probe on a tiny random model of the
    user's family, with TRL's padding-free batch and the attention implementation training will use. An
    error when packed samples attend to each other, or when the first packed step raises on this machine."""
    if not (args.packing or getattr(args, "padding_free", False)):
        return []
    config = model_config(setup)
    if config is None:
        return []
    model_type = config.model_type
    attention = _attention(setup.config, config)
    if attention.startswith(("flash", "kernels")) or attention not in ("eager", "sdpa"):
        return [Finding("info", "packing-probe", f"packing with attn_implementation={attention!r} is not "
                        "probed here (the probe runs on CPU, eager or SDPA)",
                        "FlashAttention keeps a standard decoder's packed samples apart from cu_seq_lens; "
                        "mRoPE, eager-only and linear-attention / Mamba models decide it elsewhere",
                        "run packing_arch.packing_leak(model, \"trl\") on the GPU you train on", "12")]
    from ..packing_arch import packing_leak

    model = _probe_model(model_type, attention)
    if model is None:
        return [Finding("info", "packing-probe", f"no tiny {model_type} model to probe packing with",
                        "lesson 12's probe builds tiny models of the families it measured",
                        "run packing_arch.packing_leak(your_model, \"trl\") before training packed", "12")]
    result = packing_leak(model, "trl")
    if result.verdict == "raises":
        return [Finding("error", "packing-raises", f"packed training of {model_type} fails at the first step "
                        "on this machine", result.raised[:240],
                        "train unpacked (packing=False, padding_free=False), or on a GPU with the model's "
                        "kernels (causal-conv1d, fla / mamba-ssm), where the probe must pass first", "12")]
    if result.verdict == "leaks":
        return [Finding("error", "packing-leak", f"packed samples attend to each other on {model_type} with "
                        f"attn_implementation={attention!r} and TRL's padding-free batch",
                        f"two-sample probe: max |Δlogit| {result.max_delta:.3g} (round-off "
                        f"{result.threshold:.2g}); next-token argmax unchanged on "
                        f"{result.argmax_agreement:.0%}"
                        " of the second sample's positions", "train unpacked (packing=False), or prove "
                        "another set-up clean with packing_arch.packing_leak first", "12")]
    return []


def loss_count_findings(setup, args) -> list[Finding]:
    """With accumulation or several processes: does the model class take the step's token count? When its
    ``accepts_loss_kwargs`` is False, SFTTrainer's loss is lesson 07's per-micro-batch mean."""
    from ..token_weighting import loss_count_ignored

    steps = args.gradient_accumulation_steps
    if steps == 1 and setup.num_processes == 1:
        return []
    config = model_config(setup)
    if config is None:
        return []
    fields = config.to_dict()
    if setup.model is not None:
        fields["architectures"] = [type(setup.model).__name__]
    blind = loss_count_ignored(fields, gradient_accumulation_steps=steps, world_size=setup.num_processes)
    if not blind:
        return []
    return [Finding("warning", "loss-count-ignored",
                    f"{', '.join(blind)} does not take the step's token count: "
                    "each micro-batch is averaged over its own tokens, then divided by their number",
                    f"accepts_loss_kwargs=False; gradient_accumulation_steps={steps}, "
                    f"{setup.num_processes} process(es): rows with fewer graded tokens weigh more",
                    "after building the trainer, set trainer.model_accepts_loss_kwargs = True: SFTTrainer "
                    "computes the loss itself and never passes the count to the model's forward, so the "
                    "class's flag only stops the count (lesson 07 measures the fix)"
                    + ("" if setup.num_processes > 1 else "; or train with one micro-batch per step"), "07")]
