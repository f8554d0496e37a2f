"""Lesson 10's tools (``course_utils.shipping``) and the ship check's command line (``course_utils.ship``).

One short LoRA run (the course model, ``SFTConfig(eos_token="<|im_end|>")``, ``modules_to_save`` on the
embedding and head: ~60 CPU steps) is saved every way the lesson compares; each check of the ship report
passes on the healthy directory and fails on the one broken for it; the command line exits 0, 1 and 2.
"""

import copy
import json
import warnings

import pytest
import torch

from course_utils import load_course_model, make_batches, make_chat_dataset, make_messages, make_sft_trainer
from course_utils.shipping import (
    LOGIT_TOLERANCE,
    ShipInputError,
    load_saved,
    logit_drift,
    lora_only_copy,
    main,
    saved_files,
    ship_report,
    shipping_explorer,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A trained LoRA run and its directories: ``adapter`` (trainer.save_model), ``merged`` (the in-memory
    model merged and saved with its tokenizer: the healthy one), the reference model and tokenizer."""
    from peft import LoraConfig, get_peft_model

    model, tok = load_course_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                            target_modules="all-linear", modules_to_save=["embed_tokens", "lm_head"])
        peft_model = get_peft_model(model, config)
        trainer = make_sft_trainer(peft_model, tok, make_chat_dataset("mixed", 400, seed=0), max_steps=60,
                                   per_device_train_batch_size=16, eos_token="<|im_end|>", progress=False)
        trainer.train()
        dirs = {name: tmp_path_factory.mktemp(name) for name in ("adapter", "merged")}
        trainer.save_model(str(dirs["adapter"]))
        merged = trainer.model.merge_and_unload()
    merged.eval()
    merged.save_pretrained(dirs["merged"])
    tok.save_pretrained(dirs["merged"])
    return {"model": merged, "tok": tok, **dirs}


def failed(findings) -> set[str]:
    return {f.check for f in findings if not f.ok}


def test_the_in_memory_merge_is_healthy(run):
    findings = ship_report(run["model"], run["tok"], run["merged"])
    assert failed(findings) == set(), "\n".join(map(str, findings))
    assert [f.check for f in findings] == ["logits", "stops", "chat_template", "token_rows", "dtype"]


def test_your_own_probe_chats(run):
    own = make_messages("add", 6, seed=11)
    findings = ship_report(run["model"], run["tok"], run["adapter"], conversations=own)
    assert failed(findings) == {"stops"} and "of 6 probe chats" in str(findings[1])
    with pytest.raises(ValueError, match="non-empty list"):
        ship_report(run["model"], run["tok"], run["adapter"], conversations=[])


def test_an_adapter_from_save_model_does_not_stop_and_says_why(run):
    listing = saved_files(run["adapter"])
    assert listing["kind"] == "adapter" and listing["generation_eos"] is None
    assert "generation_config.json" not in listing["files"]
    findings = ship_report(run["model"], run["tok"], run["adapter"])
    assert failed(findings) == {"stops"}, "the weights are right, the eos ids are the base's"
    stops = next(f for f in findings if f.check == "stops")
    assert "NOT in it" in stops.detail and "merge_and_unload" in stops.fix


def test_a_generation_config_beside_the_adapter_is_not_read(run, tmp_path):
    import shutil

    patched = shutil.copytree(run["adapter"], tmp_path / "patched")
    run["model"].generation_config.save_pretrained(patched)
    assert saved_files(patched)["generation_eos"] == [2, 0]
    model, _ = load_saved(patched)
    assert model.generation_config.eos_token_id == 0, "peft serves the base's generation_config"


def test_a_lora_only_loader_loses_the_trained_rows(run, tmp_path):
    lora_only = lora_only_copy(run["adapter"], tmp_path / "lora-only")
    assert saved_files(lora_only)["modules_to_save"] is None
    assert failed(ship_report(run["model"], run["tok"], lora_only)) >= {"logits", "token_rows", "stops"}


def test_a_changed_chat_template_is_found(run, tmp_path):
    out = tmp_path / "template"
    run["model"].save_pretrained(out)
    tok = copy.deepcopy(run["tok"])
    tok.chat_template = tok.chat_template.replace("You are Qwen", "You are Bob")
    tok.save_pretrained(out)
    assert failed(ship_report(run["model"], run["tok"], out)) == {"chat_template"}


def test_reset_special_rows_are_found(run, tmp_path):
    base, _ = load_course_model()
    broken = copy.deepcopy(run["model"])
    special = sorted(set(run["tok"].get_added_vocab().values()))
    with torch.no_grad():
        broken.get_input_embeddings().weight[special] = base.get_input_embeddings().weight[special]
    out = tmp_path / "rows"
    broken.save_pretrained(out)
    run["tok"].save_pretrained(out)
    assert {"token_rows", "logits"} <= failed(ship_report(run["model"], run["tok"], out))


def test_a_bf16_save_is_stated_and_fails_the_tolerance(run, tmp_path):
    out = tmp_path / "bf16"
    copy.deepcopy(run["model"]).to(torch.bfloat16).save_pretrained(out)
    run["tok"].save_pretrained(out)
    assert saved_files(out)["dtype"] == "bfloat16"
    model, _ = load_saved(out)
    assert next(model.parameters()).dtype == torch.bfloat16, "dtype='auto' loads what the config states"
    findings = ship_report(run["model"], run["tok"], out)
    assert failed(findings) == {"logits", "dtype"}
    assert "bfloat16" in next(f for f in findings if f.check == "dtype").detail
    assert not failed(ship_report(run["model"], run["tok"], out, tolerance=1.0)), "a stated tolerance passes"


def test_logit_drift_is_zero_for_a_copy_and_measures_a_merge(run):
    batches = make_batches(run["tok"], make_messages("mixed", 8, seed=3), 8)
    assert logit_drift(run["model"], copy.deepcopy(run["model"]), batches) == {"max_abs": 0.0, "kl": 0.0}
    adapter, _ = load_saved(run["adapter"])
    drift = logit_drift(adapter, run["model"], batches)
    assert 0 < drift["max_abs"] < LOGIT_TOLERANCE, "merging into float32 is exact up to round-off"


def test_bad_input_is_refused_with_what_why_fix(run, tmp_path):
    with pytest.raises(ShipInputError, match="is not a directory — .* — "):
        saved_files(tmp_path / "missing")
    with pytest.raises(ShipInputError, match="neither config.json nor adapter_config.json"):
        saved_files(tmp_path)
    with pytest.raises(TypeError, match="not a directory path"):
        load_saved(None)
    with pytest.raises(ValueError, match="full model, not an adapter"):
        lora_only_copy(run["merged"], tmp_path / "x")
    with pytest.raises(ValueError, match="non-empty dict"):
        shipping_explorer({})


def _adapter_with_base(src, dst, base):
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base
    (dst / "adapter_config.json").write_text(json.dumps(config))
    return dst


def test_the_command_line_exits_0_1_2(run, tmp_path, capsys):
    assert main(["--trained", str(run["merged"]), "--saved", str(run["merged"])]) == 0
    assert "ship check: healthy" in capsys.readouterr().err
    assert main(["--trained", str(run["merged"]), "--saved", str(run["adapter"]), "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert [f["check"] for f in printed if not f["ok"]] == ["stops"] and printed[1]["fix"]
    assert main(["--trained", str(run["merged"]), "--saved", str(tmp_path / "nowhere")]) == 2
    assert main(["--trained", str(run["merged"]), "--saved", str(tmp_path)]) == 2   # no config.json
    lost = _adapter_with_base(run["adapter"], tmp_path / "lost-base", "some-org/not-in-the-cache")
    assert main(["--trained", str(run["merged"]), "--saved", str(lost)]) == 2
    assert "cannot be found here" in capsys.readouterr().err
    moved = _adapter_with_base(run["adapter"], tmp_path / "moved-base", str(tmp_path / "gone"))
    assert main(["--trained", str(run["merged"]), "--saved", str(moved),
                 "--base", saved_files(run["adapter"])["base"]]) == 1, "--base finds it (and the eos is lost)"


def test_python_m_course_utils_ship_runs(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "course_utils.ship", "--trained", str(tmp_path),
                           "--saved", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "bad input" in done.stderr, done.stderr
