"""The doctor's architecture checks (issues 45, 47, 48): what LoRA trains, whether packed samples stay apart,
whether the Trainer counts the step's tokens — each read from the user's ``config.json`` with the lesson's own
measuring function, planted failure found, healthy twin clean.

The model directories are the course model's tokenizer beside another family's tiny ``config.json`` (no
weights: every check here reads the config only, ``forward=False``)."""

import json
import shutil
from pathlib import Path

import pytest

from course_utils import load_course_model, lora_coverage, packing_arch
from course_utils.doctor import diagnose

CHATS = [{"messages": [{"role": "user", "content": f"what is {a} plus {a}?"},
                       {"role": "assistant", "content": f"{2 * a}."}]} for a in range(8)]
BASE = {"learning_rate": 2e-5}
LORA = {"learning_rate": 2e-4, "use_peft": True, "lora_target_modules": lora_coverage.TUTORIAL_TARGETS}


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """``family(model_type, config)`` -> a directory with the course tokenizer and that config.json."""
    source = Path(load_course_model.__module__.replace(".", "/")).parent / "course_model"
    root = tmp_path_factory.mktemp("families")

    def make(name: str, config) -> str:
        directory = root / name
        if not directory.exists():
            shutil.copytree(source, directory, ignore=shutil.ignore_patterns("*.safetensors"))
            (directory / "config.json").write_text(json.dumps(config.to_dict()))
        return str(directory)

    return make


def checks(report, severity=None):
    return {f.check for f in report if severity is None or f.severity == severity}


def packing_family(family, model_type):
    from transformers import AutoConfig

    arch = {**packing_arch._SHARED, **packing_arch.ARCHITECTURES[model_type]}  # noqa: SLF001 — the lesson's tiny config
    return family(f"pack-{model_type}", AutoConfig.for_model(model_type, **arch))


@pytest.mark.parametrize("model_type", ["gpt_oss", "qwen3_next"])
def test_packing_on_a_leaking_family_is_an_error(family, model_type):
    report = diagnose(packing_family(family, model_type), CHATS, {**BASE, "packing": True}, forward=False)
    found = checks(report, "error") & {"packing-leak", "packing-raises"}
    assert found, f"{model_type} packed: {checks(report)}"
    clean = diagnose(packing_family(family, model_type), CHATS, BASE, forward=False)
    assert not checks(clean) & {"packing-leak", "packing-raises"}, "unpacked: nothing to say"


def test_packing_on_a_standard_decoder_stays_clean():
    report = diagnose("tiny-qwen", CHATS, {**BASE, "packing": True}, forward=False)
    assert not checks(report) & {"packing-leak", "packing-raises"}


def test_flash_attention_packing_is_not_probed_on_cpu_and_says_why():
    config = {**BASE, "packing": True, "model_init_kwargs": {"attn_implementation": "flash_attention_2"}}
    report = diagnose("tiny-qwen", CHATS, config, forward=False)
    assert "packing-probe" in checks(report, "info") and report.exit_code == 0


def test_lora_that_leaves_routed_experts_frozen_warns(family):
    directory = family("qwen2_moe", lora_coverage.tiny_config("qwen2_moe"))
    report = diagnose(directory, CHATS, LORA, forward=False)
    frozen = next(f for f in report if f.check == "lora-frozen-groups")
    assert frozen.severity == "warning" and "routed_experts" in frozen.what
    fix = {**LORA, "lora_dropout": 0.0, "lora_target_parameters": lora_coverage.EXPERT_PARAMETERS}
    fixed = diagnose(directory, CHATS, fix, forward=False)
    assert "lora-frozen-groups" not in checks(fixed), "target_parameters reaches the experts"


def test_trl_dropout_default_with_remapped_experts_is_an_error(family):
    directory = family("qwen3_moe", lora_coverage.tiny_config("qwen3_moe"))
    report = diagnose(directory, CHATS, LORA, forward=False)
    assert "lora-config-raises" in checks(report, "error"), "TRL's dropout 0.05 + target_parameters raises"
    fixed = diagnose(directory, CHATS, {**LORA, "lora_dropout": 0.0}, forward=False)
    assert "lora-config-raises" not in checks(fixed) and "lora-remap" in checks(fixed, "info")


def test_hybrid_mixers_frozen_by_the_tutorial_list_warn(family):
    directory = family("qwen3_5_text", lora_coverage.tiny_config("qwen3_5_text"))
    report = diagnose(directory, CHATS, LORA, forward=False)
    assert any(f.check == "lora-frozen-groups" and "linear_mixer" in f.what for f in report)


def test_default_lora_on_a_dense_model_is_no_alarm():
    config = {"learning_rate": 2e-4, "use_peft": True, "eos_token": "<|im_end|>"}
    report = diagnose("tiny-qwen", CHATS, config, forward=False)
    assert not checks(report, "warning") & {"lora-frozen-groups", "lora-config-raises"}
    assert "lora-coverage" in checks(report, "info")
    assert "adapter-eos" in checks(report, "info"), "the eos fix reaches the in-memory model only"


def test_a_class_that_ignores_the_token_count_warns_under_accumulation(family):
    from transformers import AutoConfig

    text = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128, "vocab_size": 256}
    # as the checkpoint's config.json names it: the class AutoModelForCausalLM and SFTTrainer load
    config = AutoConfig.for_model("qwen2_5_vl", text_config=text,
                                  architectures=["Qwen2_5_VLForConditionalGeneration"])
    directory = family("qwen2_5_vl", config)
    report = diagnose(directory, CHATS, {**BASE, "gradient_accumulation_steps": 4}, forward=False)
    assert "loss-count-ignored" in checks(report, "warning")
    assert "loss-count-ignored" not in checks(diagnose(directory, CHATS, BASE, forward=False))
    assert "loss-count-ignored" not in checks(
        diagnose("tiny-qwen", CHATS, {**BASE, "gradient_accumulation_steps": 4}, forward=False))
