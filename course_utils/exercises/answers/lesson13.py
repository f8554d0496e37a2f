"""Lesson 13's reference answers, and the generator of the saved adapters the checker grades (it knows
the truth: the per-group counts read from the LoRA model itself). No lesson notebook imports this module."""

from __future__ import annotations

import random
import re
import warnings

import torch

from ...lora_coverage import (
    EXPERT_PARAMETERS,
    FAMILIES,
    TUTORIAL_TARGETS,
    adapter_coverage,
    lora_coverage,
    module_groups,
    tiny_config,
)

# ------------------------------------------------------------------------------------------------
# Exercise 1 (fix): a LoRA config that adapts every group of an architecture
# ------------------------------------------------------------------------------------------------


def full_coverage_config(config):
    """Reference: every Linear of the non-router groups by its leaf name, every fused expert tensor by
    ``<container>.<parameter>`` in target_parameters, ``lora_dropout=0`` (peft refuses dropout there), and
    the Linears peft calls incompatible on this architecture (Mamba's out_proj) left out."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    modules = dict(model.named_modules())
    linears, parameters = set(), set()
    for name, group in module_groups(model).items():
        if group == "router":
            continue
        owner, _, leaf = name.rpartition(".")
        if isinstance(modules[owner], torch.nn.Linear):
            linears.add(owner.rpartition(".")[2])
        else:
            parameters.add(f"{owner.rpartition('.')[2]}.{leaf}")
    while True:
        lora = LoraConfig(
            r=8,
            lora_alpha=16,
            lora_dropout=0.0,
            target_modules=sorted(linears),
            target_parameters=sorted(parameters) or None,
            task_type="CAUSAL_LM",
        )
        error = adapter_coverage(config, lora)["error"] or ""
        refused = re.search(r"Incompatible modules: \{(.*?)\}", error)
        if not refused:
            return lora
        linears -= {m.strip(" '\"") for m in refused.group(1).split(",")}


# the families a learner's config is graded on: nemotron_h always (Mamba: "all-linear" raises; its experts
# are experts.up_proj), three more drawn per run
FIX_POOL = (
    "qwen3_moe",
    "olmoe",
    "gpt_oss",
    "granitemoe",
    "qwen2_moe",
    "mixtral",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "glm4_moe",
    "deepseek_v3",
    "qwen3_next",
)


def coverage_case_config(seed: int):
    """A fresh architecture for exercise 1: a family and tiny sizes drawn from ``seed``."""
    rng = random.Random(f"coverage-{seed}")
    family = "nemotron_h" if seed % 4 == 0 else rng.choice(FIX_POOL)
    sizes = {
        "hidden_size": rng.choice([32, 48, 64]),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
    }
    return tiny_config(family, **sizes)


# ------------------------------------------------------------------------------------------------
# Exercise 2 (diagnosis): what does this saved adapter train?
# ------------------------------------------------------------------------------------------------


def adapted_per_group(artefact) -> dict:
    """Reference: a base tensor is adapted when its module carries LoRA tensors and it is that module's
    ``weight`` (a Linear, or a router targeted by name) or a parameter ``target_parameters`` names."""
    prefix = "base_model.model."
    modules = {
        name.split(".lora_")[0].removeprefix(prefix).replace(".base_layer", "")
        for name in artefact["adapter_tensors"]
        if ".lora_" in name
    }
    targets = artefact["target_parameters"] or []
    counts: dict[str, int] = {}
    for name, group in artefact["base_tensors"].items():
        owner, _, leaf = name.rpartition(".")
        named = any(name == t or name.endswith("." + t) for t in targets)
        counts[group] = counts.get(group, 0) + (owner in modules and (leaf == "weight" or named))
    return counts


_CONFIGS = {
    "the tutorial list": dict(target_modules=TUTORIAL_TARGETS),
    "all-linear": dict(target_modules="all-linear"),
    "list + target_parameters": dict(target_modules=TUTORIAL_TARGETS, target_parameters=EXPERT_PARAMETERS),
    "attention only + experts.down_proj": dict(
        target_modules=["q_proj", "v_proj"], target_parameters=["experts.down_proj"]
    ),
    "attention only": dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
}


def saved_adapter_case(seed: int, *, graded: bool):
    """``(artefact, truth)``: a saved adapter's tensor names and target_parameters, the base model's
    tensors with their groups; truth ``{group: adapted tensors}`` read from the LoRA model. ``graded``
    draws from another stream than the cases a notebook shows."""
    from peft import LoraConfig, get_peft_model
    from peft.utils import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    rng = random.Random(f"{'graded' if graded else 'shown'}-adapter-{seed}")
    # The LoRA config cycles with the seed (the family is drawn): the checker's eight consecutive seeds
    # (``checks.fresh_seeds``) hold every config, so no draw leaves out the one a misconception trips on.
    label = sorted(_CONFIGS)[seed % len(_CONFIGS)]
    while True:
        family = rng.choice(sorted(FAMILIES))
        layers = {} if "num_hidden_layers" in FAMILIES[family] else {"num_hidden_layers": rng.choice([2, 3])}
        config = tiny_config(family, **layers)
        try:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
            base_tensors = module_groups(model)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                peft_model = get_peft_model(
                    model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, **_CONFIGS[label])
                )
        except ValueError:
            continue  # peft refuses it on this family (all-linear on Mamba; no such parameter): draw again
        named = _CONFIGS[label].get("target_parameters") or []
        if named and not any(t.endswith("." + p) for p in named for t in base_tensors):
            continue  # a family without those parameters: the config would be another 'attention only'
        break
    lora = peft_model.peft_config["default"]
    artefact = {
        "adapter_tensors": sorted(get_peft_model_state_dict(peft_model)),
        "target_parameters": sorted(lora.target_parameters) if lora.target_parameters else None,
        "base_tensors": base_tensors,
    }
    truth = {group: row["adapted"] for group, row in lora_coverage(peft_model).items()}
    return artefact, truth


# ------------------------------------------------------------------------------------------------
# The self-test (lesson 11): what a LoRA set-up reports before training, the cause to name
# ------------------------------------------------------------------------------------------------

SELF_TEST_CAUSES = {
    "fused_experts_unreached": "the routed experts are fused 3-D parameters that target_modules cannot reach",
    "mixer_unreached": "the linear-attention / Mamba mixers have Linear names the target list does not hold",
    "dropout_with_target_parameters": "TRL's default lora_dropout=0.05 with adapters on fused parameters",
    "healthy": "nothing: every group the config aims at is adapted",
}
# (family, LoraConfig fields): each cause's set-ups; the cause is checked against the measured table
_SELF_TEST_SETUPS = {
    "fused_experts_unreached": (("qwen2_moe", dict(target_modules=TUTORIAL_TARGETS)),
                                ("gpt_oss", dict(target_modules="all-linear")),
                                ("granitemoe", dict(target_modules=TUTORIAL_TARGETS))),
    "mixer_unreached": (("qwen3_5_text", dict(target_modules=TUTORIAL_TARGETS)),),
    "dropout_with_target_parameters": (("qwen3_moe", dict(target_modules=TUTORIAL_TARGETS,
                                                          lora_dropout=0.05)),
                                       ("qwen2_moe", dict(target_modules=TUTORIAL_TARGETS, lora_dropout=0.05,
                                                          target_parameters=EXPERT_PARAMETERS))),
    "healthy": (("qwen2_moe", dict(target_modules=TUTORIAL_TARGETS, target_parameters=EXPERT_PARAMETERS)),
                ("qwen3_5_text", dict(target_modules="all-linear")),
                ("qwen3_moe", dict(target_modules=TUTORIAL_TARGETS))),
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: the per-group LoRA table (or the error) a practitioner gets for a config on a
    model, its true cause as a plain phrase, and the phrases to choose from. Measured with peft on a
    meta-device model; the listed cause is checked against the measurement."""
    from peft import LoraConfig

    from ...lora_coverage import format_table

    causes = tuple(SELF_TEST_CAUSES)
    cause = causes[seed % len(causes)]
    setups = _SELF_TEST_SETUPS[cause]
    family, fields = setups[(seed // len(causes)) % len(setups)]
    draw = random.Random(f"self-test-{seed}")  # its own rank and alpha: no two draws alike
    rank = draw.randint(1, 256)
    fields = {"r": rank, "lora_alpha": rank * draw.choice((1, 2, 4, 8)), **fields}
    config = LoraConfig(**{"lora_dropout": 0.0, **fields})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = adapter_coverage(tiny_config(family), config)
    frozen = set(result["frozen"]) - {"router"}
    measured = ("dropout_with_target_parameters" if result["error"] and "dropout" in result["error"] else
                "fused_experts_unreached" if "routed_experts" in frozen else
                "mixer_unreached" if "linear_mixer" in frozen else "healthy")
    if measured != cause:
        raise RuntimeError(f"self-test set-up {family}/{fields} measured {measured!r}, listed as {cause!r}")
    shown = dict(fields)
    lines = [f"model_type={family!r}; LoraConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"]
    if result["error"]:
        lines.append(f"SFTTrainer(...) raised: ValueError: {result['error'][:160]}")
    else:
        total = sum(row["lora_params"] for row in result["table"].values())
        lines += [f"the loss falls; print_trainable_parameters(): {total:,} trainable LoRA parameters",
                  "per group:", format_table(result["table"])]
    return "\n".join(lines), SELF_TEST_CAUSES[cause], tuple(SELF_TEST_CAUSES.values())
