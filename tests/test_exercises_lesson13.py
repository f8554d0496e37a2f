"""Lesson 13's exercises (``course_utils.exercises.lesson13``): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: ``tests/test_checkers.py`` runs them);
shortcuts a learner has at each exercise fail; the graded adapters come from a stream apart from the shown
ones.
"""

import torch
from conftest import Row, graded
from peft import LoraConfig
from transformers import AutoModelForCausalLM

from course_utils.exercises import lesson13 as ex
from course_utils.exercises.answers import lesson13
from course_utils.lora_coverage import EXPERT_PARAMETERS, GROUPS, TUTORIAL_TARGETS, lora_config_as_trl_builds


def coverage_by_parameter_shapes(config):
    """A second correct answer: every Linear by name (the router's too: allowed), every parameter with
    3 dims by its owner's leaf name; drops out_proj only where peft refuses it (asks peft)."""
    from course_utils.lora_coverage import adapter_coverage

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    modules = dict(model.named_modules())
    linears = {n.rpartition(".")[2] for n, m in modules.items() if isinstance(m, torch.nn.Linear)} - {
        "lm_head"
    }
    params = {
        f"{n.rpartition('.')[0].rpartition('.')[2]}.{n.rpartition('.')[2]}"
        for n, p in model.named_parameters()
        if p.dim() == 3 and "conv" not in n
    }
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=sorted(linears),
        target_parameters=sorted(params) or None,
    )
    if adapter_coverage(config, lora)["error"]:
        lora = LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=sorted(linears - {"out_proj", "conv1d"}),
            target_parameters=sorted(params) or None,
        )
    return lora


def tutorial_list(config):
    """The config every tutorial prints: the routed experts (and the hybrids' mixers) get no adapter."""
    return LoraConfig(target_modules=TUTORIAL_TARGETS)


def all_linear_with_expert_parameters(config):
    """A blanket fix: all-linear plus the usual expert names — all-linear raises on the Mamba hybrid."""
    return LoraConfig(lora_dropout=0.0, target_modules="all-linear", target_parameters=EXPERT_PARAMETERS)


def trl_default_dropout(config):
    """What `trl sft --lora_target_parameters ...` builds: TRL's lora_dropout=0.05 makes peft refuse it."""
    return lora_config_as_trl_builds(
        {
            "use_peft": True,
            "lora_target_modules": TUTORIAL_TARGETS + ["in_proj"],
            "lora_target_parameters": EXPERT_PARAMETERS + ["experts.up_proj"],
        }
    )


def usual_expert_names_only(config):
    """Hand list with gate_up_proj/down_proj, Mamba's in_proj: misses Nemotron-H's experts.up_proj."""
    return LoraConfig(
        lora_dropout=0.0,
        target_modules=TUTORIAL_TARGETS
        + ["in_proj", "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "in_proj_qkvz", "in_proj_ba"],
        target_parameters=EXPERT_PARAMETERS,
    )


def not_a_lora_config(config):
    """An always-equal object instead of a config."""

    class Equal:
        def __eq__(self, other):
            return True

    return Equal()


def read_adapter_by_layer_modules(artefact):
    """A second correct answer: walk the base tensors, look for an adapter tensor on each one's module."""
    names = [n.removeprefix("base_model.model.") for n in artefact["adapter_tensors"]]
    targets = artefact["target_parameters"] or []
    out = {g: 0 for g in set(artefact["base_tensors"].values())}
    for tensor, group in artefact["base_tensors"].items():
        module, _, leaf = tensor.rpartition(".")
        carried = any(
            n.startswith(module + ".lora_") or n.startswith(module + ".base_layer.lora_") for n in names
        )
        if carried and (leaf == "weight" or any(tensor == t or tensor.endswith("." + t) for t in targets)):
            out[group] += 1
    return out


def any_lora_on_the_module_adapts_all(artefact):
    """Counts every parameter of an experts module that carries LoRA, ignoring which target_parameters
    it names."""
    modules = {
        n.split(".lora_")[0].removeprefix("base_model.model.").replace(".base_layer", "")
        for n in artefact["adapter_tensors"]
        if ".lora_" in n
    }
    out = {}
    for tensor, group in artefact["base_tensors"].items():
        out[group] = out.get(group, 0) + (tensor.rpartition(".")[0] in modules)
    return out


def linear_names_only(artefact):
    """Reads only '<module>.lora_A' names onto '<module>.weight': misses the expert parameters' LoRA."""
    modules = {n.split(".lora_")[0].removeprefix("base_model.model.") for n in artefact["adapter_tensors"]}
    out = {}
    for tensor, group in artefact["base_tensors"].items():
        out[group] = out.get(group, 0) + (tensor.endswith(".weight") and tensor[: -len(".weight")] in modules)
    return out


def everything_adapted(artefact):
    """Memorised: an adapter adapts every weight of the base."""
    out = {}
    for group in artefact["base_tensors"].values():
        out[group] = out.get(group, 0) + 1
    return out


CHECKERS = [
    Row("full_coverage", graded(ex.check_full_coverage), lesson13.full_coverage_config),
    Row("read_adapter", graded(ex.check_read_adapter), lesson13.adapted_per_group),
]
ALSO_CORRECT = [
    ("full_coverage", coverage_by_parameter_shapes),
    ("read_adapter", read_adapter_by_layer_modules),
]
WRONG = [
    ("full_coverage", tutorial_list, "target_modules cannot reach them"),
    ("full_coverage", all_linear_with_expert_parameters, "leave those out"),
    ("full_coverage", trl_default_dropout, "set lora_dropout=0.0"),
    ("full_coverage", usual_expert_names_only, "experts.up_proj"),
    ("full_coverage", not_a_lora_config, "expected a peft.LoraConfig"),
    ("read_adapter", any_lora_on_the_module_adapts_all, "experts.down_proj alone"),
    ("read_adapter", linear_names_only, "base_layer.lora_A"),
    ("read_adapter", everything_adapted, "only if the adapter holds lora_A/lora_B"),
]


def test_the_shown_and_graded_adapters_are_streams_apart():
    assert not hasattr(ex, "saved_adapter_case"), (
        "the generator that knows the truth is in answers/lesson13.py"
    )
    shown, graded_ = ex.saved_adapter(3), lesson13.saved_adapter_case(3, graded=True)[0]
    assert shown == lesson13.saved_adapter_case(3, graded=False)[0] and shown != graded_


def test_the_graded_adapters_include_frozen_experts_and_partial_expert_lora():
    drawn = [lesson13.saved_adapter_case(seed, graded=True) for seed in range(24)]
    assert any(t.get("routed_experts", 1) == 0 for _, t in drawn), "an adapter that leaves the experts frozen"
    assert any(a["target_parameters"] and t.get("routed_experts", 0) for a, t in drawn), (
        "one that adapts them"
    )
    assert all(set(t) <= set(GROUPS) for _, t in drawn)


def test_the_coverage_cases_include_the_mamba_hybrid():
    assert any(case.tag == "nemotron_h" for case in ex._coverage_cases())


def test_shortcut_helpers_fail():
    """The helpers the notebook imports are not the answers: lora_coverage / adapter_coverage take a model."""
    from course_utils.lora_coverage import frozen_groups, lora_coverage

    assert not ex.check_read_adapter(lora_coverage)
    assert not ex.check_read_adapter(lambda artefact: frozen_groups({}))
