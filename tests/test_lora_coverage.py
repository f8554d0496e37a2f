"""course_utils.lora_coverage (lesson 13): the per-group table on tiny configs, with the installed peft as the
judge; the TRL-built LoraConfig; the saved adapter's layout; bad input rejected with what/why/fix."""

import re
import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model

from course_utils import lora_coverage as lc


def test_every_family_builds_and_groups_its_weights():
    for family in lc.FAMILIES:
        groups = lc.module_groups(lc.tiny_moe_or_hybrid(family, meta=True))
        assert {"attention"} <= set(groups.values()) <= set(lc.GROUPS), family
    hybrid = set(lc.module_groups(lc.tiny_moe_or_hybrid("qwen3_5_moe_text", meta=True)).values())
    assert hybrid == set(lc.GROUPS) - {"dense_mlp"}


def test_tutorial_list_leaves_fused_experts_frozen_unless_peft_remaps():
    for family in ("gpt_oss", "granitemoe", "qwen2_moe", "qwen3_moe", "mixtral"):
        result = lc.adapter_coverage(lc.tiny_config(family), LoraConfig(target_modules=lc.TUTORIAL_TARGETS))
        reached = result["table"]["routed_experts"]["adapted"] > 0
        assert reached == ("target_parameters" in result["rewritten"]), (family, result)


def test_target_parameters_reach_the_experts_and_dropout_is_refused():
    config = lc.tiny_config("gpt_oss")
    fixed = lc.adapter_coverage(
        config,
        LoraConfig(lora_dropout=0.0, target_modules=["q_proj"], target_parameters=lc.EXPERT_PARAMETERS),
    )
    assert fixed["table"]["routed_experts"]["adapted"] == fixed["table"]["routed_experts"]["tensors"]
    refused = lc.adapter_coverage(
        config,
        LoraConfig(lora_dropout=0.05, target_modules=["q_proj"], target_parameters=lc.EXPERT_PARAMETERS),
    )
    assert "dropout" in refused["error"] and refused["table"] == {}


def test_hybrids_mixers_and_all_linear_on_mamba():
    qwen35 = lc.tiny_config("qwen3_5_text")
    listed = lc.adapter_coverage(qwen35, LoraConfig(target_modules=lc.TUTORIAL_TARGETS))
    assert listed["frozen"] == ["linear_mixer"]
    assert lc.adapter_coverage(qwen35, LoraConfig(target_modules="all-linear"))["frozen"] == []
    assert (
        "incompatible"
        in lc.adapter_coverage(lc.tiny_config("nemotron_h"), LoraConfig(target_modules="all-linear"))["error"]
    )


def test_meta_table_equals_the_real_model_and_every_adapter_gets_a_gradient():
    lora = LoraConfig(
        lora_dropout=0.0, target_modules=lc.TUTORIAL_TARGETS, target_parameters=lc.EXPERT_PARAMETERS
    )
    planned = lc.adapter_coverage(lc.tiny_config("qwen2_moe"), lora)["table"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(lc.tiny_moe_or_hybrid("qwen2_moe"), lora)
    assert lc.lora_coverage(model) == planned
    grads = lc.gradient_by_group(model, torch.randint(3, 200, (2, 10)))
    assert all(r["with_grad"] == r["adapted"] > 0 for r in grads.values())
    assert sum(r["lora_params"] for r in planned.values()) == model.get_nb_trainable_parameters()[0]


def test_weight_change_by_group_sees_only_adapted_groups():
    base = lc.tiny_moe_or_hybrid("qwen2_moe")
    before = lc.weights_by_group(base)
    model = get_peft_model(base, LoraConfig(lora_dropout=0.0, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)
    change = lc.weight_change_by_group(before, model)
    assert change["attention"] > 0 and change["routed_experts"] == 0.0 == change["shared_experts"]


def test_lora_config_as_trl_builds_is_trls():
    from trl import ModelConfig, get_peft_config

    assert lc.lora_config_as_trl_builds({"use_peft": False}) is None
    built = lc.lora_config_as_trl_builds(
        {
            "use_peft": True,
            "lora_target_modules": ["q_proj"],
            "lora_target_parameters": lc.EXPERT_PARAMETERS,
            "learning_rate": 1e-4,
        }
    )
    assert (
        built.lora_dropout == 0.05 and built.target_modules == {"q_proj"} or built.target_modules == "q_proj"
    )
    assert sorted(built.target_parameters) == sorted(lc.EXPERT_PARAMETERS)
    same = get_peft_config(
        ModelConfig(
            use_peft=True, lora_target_modules=["q_proj"], lora_target_parameters=lc.EXPERT_PARAMETERS
        )
    )
    assert built.to_dict() == same.to_dict()


def test_saved_adapter_layout_and_drop(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(
            lc.tiny_moe_or_hybrid("qwen3_moe"),
            LoraConfig(lora_dropout=0.0, target_modules=["q_proj"], target_parameters=lc.EXPERT_PARAMETERS),
        )
    model.save_pretrained(tmp_path / "a")
    layout = lc.adapter_layout(tmp_path / "a")
    assert sorted(layout["target_parameters"]) == sorted(lc.EXPERT_PARAMETERS)
    assert any(".experts.base_layer.lora_A" in k for k in layout["tensors"])
    dropped = lc.drop_tensors(tmp_path / "a", tmp_path / "b", "experts")
    assert dropped and not any("experts" in k for k in lc.adapter_layout(tmp_path / "b")["tensors"])


@pytest.mark.parametrize(
    "call, phrase",
    [
        (lambda: lc.tiny_config("llama4"), "no tiny config"),
        (lambda: lc.module_groups("model"), "needs a transformers model"),
        (lambda: lc.lora_coverage(lc.tiny_moe_or_hybrid("qwen2_moe", meta=True)), "needs a PeftModel"),
        (lambda: lc.adapter_coverage(lc.tiny_config("qwen2_moe"), {"r": 8}), "must be a peft.LoraConfig"),
        (lambda: lc.adapter_coverage("qwen2_moe", LoraConfig()), "model_or_config must be"),
        (lambda: lc.lora_config_as_trl_builds(["q_proj"]), "fields must be a dict"),
        (lambda: lc.adapter_layout("/nonexistent"), "is not a saved peft adapter"),
        (lambda: lc.frozen_groups([]), "must be a coverage table"),
        (lambda: lc.weight_change_by_group({}, None), "before must be"),
    ],
)
def test_bad_input_says_what_why_and_how(call, phrase):
    with pytest.raises((TypeError, ValueError), match=phrase):
        call()


@pytest.mark.parametrize("ids, phrase", [
    (torch.zeros(2, 3), "integer token ids"),
    ([[1, 2, 3]], "must be a torch.Tensor"),
    (torch.zeros(4, 0, dtype=torch.long), "no row or no token"),
    (torch.tensor([[1, 2, 10**6]]), "only 256 embeddings"),
])
def test_gradient_by_group_refuses_ids_the_model_cannot_run(ids, phrase):
    model = get_peft_model(lc.tiny_moe_or_hybrid("qwen2_moe"), LoraConfig(target_modules=["q_proj"]))
    with pytest.raises((TypeError, ValueError), match=phrase) as caught:
        lc.gradient_by_group(model, ids)
    assert str(caught.value).count(" — ") >= 2, "what — why — fix"


# ---- issue 42, part 3: the audit's bad input ------------------------------------------------------------
ROW = {"tensors": 2, "adapted": 0, "lora_params": 0}


@pytest.mark.parametrize("call, phrase", [
    (lambda: lc.tiny_config("qwen3_moe", num_expertz=4), "did you mean 'num_experts'"),
    (lambda: lc.tiny_config("qwen3_moe", num_experts=0), "num_experts=0 must be an integer >= 1"),
    (lambda: lc.tiny_moe_or_hybrid("qwen3_moe", seed=float("nan")), "seed=nan"),
    (lambda: lc.tiny_moe_or_hybrid("qwen3_moe", seed=None), "seed=None"),
    (lambda: lc.tiny_moe_or_hybrid("qwen3_moe", seed=2.5), "seed=2.5"),
    (lambda: lc.tiny_moe_or_hybrid("qwen3_moe", seed="0"), "seed='0'"),
    (lambda: lc.tiny_moe_or_hybrid("qwen3_moe", meta="yes"), "meta='yes' must be True or False"),
    (lambda: lc.frozen_groups({}), "table is empty"),
    (lambda: lc.format_table({}), "table is empty"),
    (lambda: lc.format_table({"attention": 3}), "is not a coverage row"),
    (lambda: lc.frozen_groups({"attention": ROW}, include_router=None), "include_router=None"),
    (lambda: lc.lora_config_as_trl_builds({"use_peft": True, "lora_rank": 8}), "did you mean 'lora_r'"),
    (lambda: lc.lora_config_as_trl_builds({"use_peft": True, "lora_r": 0}), "lora_r=0"),
    (lambda: lc.lora_config_as_trl_builds({"use_peft": True, "lora_alpha": float("nan")}), "lora_alpha=nan"),
    (lambda: lc.lora_config_as_trl_builds({"use_peft": "yes"}), "use_peft='yes'"),
    (lambda: lc.coverage_heatmap({("qwen3_moe", "x"): {}}, title=["t"]), "title=['t'] must be a string"),
])
def test_the_audits_silent_calls_are_refused_with_what_why_fix(call, phrase):
    with pytest.raises((TypeError, ValueError), match=re.escape(phrase)) as caught:
        call()
    assert str(caught.value).count(" — ") >= 2, "what — why — fix"


def test_trl_fields_other_than_lora_ones_are_still_ignored():
    config = lc.lora_config_as_trl_builds({"use_peft": True, "lora_r": 8, "use_cpu": True, "max_length": 3})
    assert config.r == 8


def _adapter(path):
    """A saved adapter as adapter_layout reads it: its config and three tensors."""
    from safetensors.torch import save_file

    path.mkdir()
    names = ["base_model.model.q_proj.lora_A.weight", "base_model.model.experts.lora_A.weight",
             "base_model.model.experts.lora_B.weight"]
    save_file({n: torch.zeros(2, 2) for n in names}, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text('{"target_parameters": ["experts.gate_up_proj"]}')
    return path


@pytest.mark.parametrize("out, contains, phrase", [
    ("adapter", "experts", "inside it or around it"),
    ("adapter/sub", "experts", "inside it or around it"),
    (".", "experts", "inside it or around it"),
    ("busy", "experts", "already holds files"),
    ("new", "   ", "non-empty string"),
    ("new", "no_such_tensor", "matches none of"),
    ("new", ".", "matches every one of"),
])
def test_drop_tensors_never_overwrites_nor_writes_a_copy_it_did_not_change(tmp_path, out, contains, phrase):
    adapter = _adapter(tmp_path / "adapter")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "tokenizer.json").write_text("mine")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=phrase) as caught:
        lc.drop_tensors(adapter, tmp_path / out, contains)
    assert str(caught.value).count(" — ") >= 2, "what — why — fix"
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "new").exists()
    assert lc.drop_tensors(adapter, tmp_path / "new", "experts") == sorted(
        n for n in lc.adapter_layout(adapter)["tensors"] if "experts" in n)


def kinds(family, **lora):
    """The kinds of problem coverage_problems finds for a LoraConfig(**lora) on a tiny family."""
    return [
        p["kind"]
        for p in lc.coverage_problems(lc.adapter_coverage(lc.tiny_config(family), LoraConfig(**lora)))
    ]


def test_coverage_problems_name_each_trap():
    assert kinds("qwen2_moe", target_modules=lc.TUTORIAL_TARGETS) == ["frozen_group"]
    assert kinds("nemotron_h", target_modules="all-linear") == ["all_linear_on_mamba"]
    assert kinds(
        "gpt_oss", lora_dropout=0.05, target_modules=["q_proj"], target_parameters=lc.EXPERT_PARAMETERS
    ) == ["dropout_with_target_parameters"]
    assert kinds("glm4_moe", target_modules=lc.TUTORIAL_TARGETS) == [
        "remap_rewrote_targets",
        "frozen_group",
        "frozen_group",
    ]
    assert (
        kinds(
            "gpt_oss",
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            target_parameters=lc.EXPERT_PARAMETERS,
        )
        == []
    )


def test_adapter_coverage_leaves_the_callers_model_alone():
    model = lc.tiny_moe_or_hybrid("qwen2_moe")
    table = lc.adapter_coverage(model, LoraConfig(target_modules=["q_proj"]))["table"]
    assert table["attention"]["adapted"] == 2 and not hasattr(model, "peft_config")
    assert next(model.parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match="what adapter_coverage"):
        lc.coverage_problems({"table": {}})
