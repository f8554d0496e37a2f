"""Lesson 13's exercises: their checkers, and the saved adapters of the diagnosis exercise.

1. ``check_full_coverage(fn)``: ``fn(config) -> LoraConfig`` must adapt every attention, linear-mixer,
   routed-expert, shared-expert and dense-MLP weight of an architecture the notebook does not train (the
   router may stay frozen), in a config peft and TRL accept; graded by counting, with ``adapter_coverage``,
   on fresh families and sizes — at least as many tensors per group as the reference reaches (on some
   families peft 0.21's remap makes a group unreachable for any config: then the reference's count).
2. ``saved_adapter(seed)`` (the artefact a learner reads) + ``check_read_adapter(fn)``: ``fn(artefact) ->
   {group: adapted tensors}`` from a saved adapter's tensor names and ``target_parameters``; graded on fresh
   adapters (families and configs drawn per run).

The generator that knows an adapter's truth lives with the reference answers (``answers/lesson13.py``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping

from .. import validate
from ..checks import Case, Hints, fresh_seeds, run_check
from ..lora_coverage import GROUPS, adapter_coverage
from ..model import course_seed
from .answers import lesson13 as _answers

# ------------------------------------------------------------------------------------------------
# Exercise 1 (fix): a config that trains every group
# ------------------------------------------------------------------------------------------------

_MISSED = {
    "routed_experts": "the routed experts are fused 3-D parameters (experts.gate_up_proj, experts.down_proj "
    "— "
    "or experts.up_proj on some models), not Linear modules: target_modules cannot reach them; "
    "name them in target_parameters, with the model's own parameter names",
    "linear_mixer": "the linear-attention / Mamba mixer's Linears have their own names "
    "(in_proj_qkv, in_proj_z, "
    "in_proj_b, in_proj_a, out_proj; Mamba's in_proj): list them — the tutorial list misses them",
    "shared_experts": "the shared expert is a plain MLP of Linears (gate_proj, up_proj, down_proj)",
    "dense_mlp": "the dense MLP's Linears (gate_proj, up_proj, down_proj) are missing",
    "attention": "the attention projections are missing (MLA models name them q_a_proj, q_b_proj, "
    "kv_a_proj_with_mqa, kv_b_proj, o_proj)",
}

COVERAGE_HINTS = Hints(
    question="Which of the model's weights are nn.Linear modules, and which are parameters of a "
    "module that is "
    "not a Linear? Which LoraConfig field reaches each kind?",
    pointer="Section 4 (the experts are 3-D parameters), section 5 (target_parameters, lora_dropout=0), the "
    "Mamba row of the section-4 table (peft refuses some Linears there); build the model on the meta "
    "device and read named_modules() / named_parameters().",
    answer="leaf names of the Linears outside the router -> target_modules; '<container>.<param>' of the 3-D "
    "expert tensors -> target_parameters; lora_dropout=0.0; drop what peft says is incompatible.",
)


def _coverage_cases() -> list[Case]:
    seeds = [4 * (course_seed() + 1) * 10 + i for i in range(4)]  # one in four is the Mamba hybrid
    cases = []
    for seed in seeds:
        config = _answers.coverage_case_config(seed)
        reference = adapter_coverage(config, _answers.full_coverage_config(config))["table"]
        cases.append(
            Case((config,), (config, reference), label=f"a tiny {config.model_type}", tag=config.model_type)
        )
    return cases


def _compare_coverage(got, expected: tuple) -> str | None:
    from peft import LoraConfig

    config, reference = expected
    if not isinstance(got, LoraConfig):
        return f"expected a peft.LoraConfig, got {type(got).__name__}"
    result = adapter_coverage(config, got)
    if result["error"]:
        error = result["error"]
        if "dropout" in error:
            return (
                "peft refuses it: target_parameters wrap a parameter, and dropout cannot be applied to its "
                "input — set lora_dropout=0.0 (TRL's default is 0.05)"
            )
        refused = re.search(r"Incompatible modules: \{.*?\}", error)
        if refused:
            return (
                f"peft refuses it on {config.model_type} (a Mamba mixer's fused kernel reads these weights "
                f'directly): {refused.group(0)} — leave those out, and "all-linear" with them'
            )
        return f"peft refuses it on {config.model_type}: {error[:200]}"
    for group in _MISSED:  # the experts first: the group a tutorial config misses on every MoE
        if group not in reference:
            continue
        row, best = result["table"][group], reference[group]["adapted"]
        if row["adapted"] < best:
            return (
                f"{config.model_type}: {group} {row['adapted']} of {row['tensors']} weights adapted "
                f"(reachable: {best}) — {_MISSED[group]}"
            )
    return None


def _lora_config_types() -> tuple[type, ...]:
    """What a LoraConfig answer is made of, rebuilt as such in the grading process (anything else in it
    arrives as a stand-in)."""
    from peft import LoraConfig
    from peft.tuners.lora.config import LoraRuntimeConfig
    from peft.utils.peft_types import PeftType, TaskType

    return LoraConfig, LoraRuntimeConfig, PeftType, TaskType


def check_full_coverage(fn):
    """Checker for exercise 1: ``fn(config) -> LoraConfig`` on four architectures the notebook does not
    train (a Mamba hybrid among them), counted per group with ``adapter_coverage``."""
    validate.function("fn", fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's notices while wrapping are lesson text, not the verdict
        return run_check(
            "full_coverage", fn, _coverage_cases, compare=_compare_coverage, hint=COVERAGE_HINTS,
            answer_types=_lora_config_types(),
        )


# ------------------------------------------------------------------------------------------------
# Exercise 2 (diagnosis): what does this saved adapter train?
# ------------------------------------------------------------------------------------------------


def saved_adapter(seed: int) -> dict:
    """A saved adapter as a practitioner can list it: ``adapter_tensors`` (the names in
    adapter_model.safetensors), ``target_parameters`` (from adapter_config.json), ``base_tensors`` (the base
    model's weights and their groups). The checker grades adapters drawn apart from these."""
    validate.seed("seed", seed)
    return _answers.saved_adapter_case(seed, graded=False)[0]


def _normalise(counts) -> dict | None:
    """``{group: n}`` with the zeros dropped (a table that lists a frozen group as 0 and one that leaves it
    out say the same); None when it is not such a mapping."""
    if not isinstance(counts, Mapping):
        return None
    out = {}
    for group, n in counts.items():
        if not isinstance(group, str) or isinstance(n, bool) or not isinstance(n, int):
            return None
        if n:
            out[group] = int(n)
    return out


def _compare_read(got, truth: dict) -> str | None:
    mine, want = _normalise(got), _normalise(truth)
    if mine is None:
        return f"expected a dict {{group name: number of adapted tensors}}, got {type(got).__name__}"
    if mine == want:
        return None
    wrong = [g for g in GROUPS if mine.get(g, 0) != want.get(g, 0)]
    g = wrong[0]
    said, real = mine.get(g, 0), want.get(g, 0)
    why = ""
    if g == "routed_experts" and said > real:
        why = (
            ": an experts module carrying LoRA tensors adapts only the parameters target_parameters names "
            "(experts.down_proj alone leaves experts.gate_up_proj frozen)"
        )
    elif g == "routed_experts":
        why = (
            ": the expert LoRA tensors sit on the experts module "
            "(…experts.lora_A…, …experts.base_layer.lora_A…),"
            " one per parameter in target_parameters; peft's remap writes bare names (gate_up_proj)"
        )
    elif said > real:
        why = ": a weight is adapted only if the adapter holds lora_A/lora_B for its module"
    return f"{g}: you counted {said} adapted tensors, the adapter adapts {real}{why}"


READ_HINTS = Hints(
    question="For one LoRA tensor name, which module of the base does it sit on once peft's prefix and "
    "base_layer wrappers are taken away — and which of that module's weights does it adapt?",
    pointer="Section 7: the saved adapter's tensor names and its target_parameters (adapter_layout).",
    answer="modules = {name.split('.lora_')[0] without 'base_model.model.' and '.base_layer'}; a base tensor "
    "owner.leaf is adapted when owner in modules and (leaf == 'weight' or target_parameters names it); "
    "count per group.",
)


def _read_cases() -> list[Case]:
    """Eight saved adapters drawn fresh on every run (``checks.fresh_seeds``), each with its truth."""
    drawn = (_answers.saved_adapter_case(seed, graded=True) for seed in fresh_seeds(8))
    return [Case((artefact,), truth, label="a fresh adapter") for artefact, truth in drawn]


def check_read_adapter(fn):
    """Checker for exercise 2: ``fn(artefact) -> {group: adapted tensors}`` on eight saved adapters drawn
    fresh on every run (no keyword fixes them: see ``checks.fresh_seeds``)."""
    validate.function("fn", fn)
    # the cases built in the grading process: this one never holds a truth
    return run_check("read_adapter", fn, _read_cases, compare=_compare_read, hint=READ_HINTS)
