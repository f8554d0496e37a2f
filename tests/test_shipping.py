"""Lesson 10's tools (``course_utils.shipping``) and the ship check's command line (``course_utils.ship``).

``tests/ship_artefacts.py`` trains once per module (a LoRA run of the course model with TRL that learns to
stop, two short added-token runs) and saves it every way issue 44 lists, each mistake next to its healthy
twin; the ship check must give each its verdict, and the numbers that decide each verdict are asserted here.
"""

import json
import shutil
import subprocess
import sys

import pytest
from ship_artefacts import FAMILIES, build, family_tokenizer  # noqa: I001 — tests/ is on sys.path

from course_utils import make_batches, make_messages
from course_utils.model import COURSE_MODEL_DIR
from course_utils.shipping import (
    LOGIT_TOLERANCE,
    PRECISION_TOLERANCE,
    ShipInputError,
    end_of_turn_after_final,
    load_saved,
    logit_drift,
    lora_only_copy,
    main,
    precision_of,
    saved_files,
    ship_report,
    shipping_explorer,
    user_turn_header,
)


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return build(tmp_path_factory.mktemp("artefacts"))


@pytest.fixture(scope="module")
def reports(art):
    """Every artefact's ship report, against the model it was trained as."""
    return {name: ship_report(*art.references[case.reference], case.directory, base=case.base)
            for name, case in art.cases.items()}


def failed(findings) -> set[str]:
    return {f.check for f in findings if f.verdict == "fail"}


def finding(findings, check):
    return next(f for f in findings if f.check == check)


def test_every_artefact_gets_its_verdict(art, reports):
    wrong = {name: (sorted(failed(reports[name])), sorted(case.expect)) for name, case in art.cases.items()
             if failed(reports[name]) - case.may_fail != case.expect}
    assert not wrong, wrong
    assert len(art.cases) >= 20
    for findings in reports.values():
        assert [f.check for f in findings] == ["files", "stops", "tokenizer_eos", "served_prompt",
                                               "precision", "token_rows", "dtype"]
        assert all(f.verdict in ("pass", "warn", "fail", "could-not-measure") for f in findings)
        assert all(f.why and f.fix for f in findings if f.verdict == "fail"), "a failure says why and the fix"


def test_a_correct_bf16_save_and_a_bf16_merge_pass_on_what_a_user_feels(reports):
    for name in ("merged in memory, saved bf16", "LoRA merged into a bf16 base, eos copied"):
        report = reports[name]
        precision = finding(report, "precision")
        kl = float(precision.what.split("KL ")[1].split(" ")[0])
        max_abs = float(precision.what.split("max |Δlogit| ")[1].split(" ")[0])
        assert max_abs > LOGIT_TOLERANCE, "the old max |Δlogit| rule would have failed it"
        assert kl < PRECISION_TOLERANCE["bfloat16"][0] / 10, "yet the next-token distribution barely moves"
        assert finding(report, "dtype").verdict == "warn" and "bfloat16" in finding(report, "dtype").what
        assert not failed(report)


def test_the_lost_rows_are_far_past_the_tolerance(reports):
    precision = finding(reports["LoRA matrices only (trained rows dropped)"], "precision")
    assert float(precision.what.split("KL ")[1].split(" ")[0]) > 100 * PRECISION_TOLERANCE["float32"][0]


def test_an_adapter_is_served_with_the_base_eos_and_says_so(art, reports):
    listing = saved_files(art.cases["save_model (adapter, base's eos)"].directory)
    assert listing["kind"] == "adapter" and listing["generation_eos"] is None
    stops = finding(reports["save_model (adapter, base's eos)"], "stops")
    assert "NOT in it" in stops.what and "base's generation_config" in stops.what
    assert "merge_and_unload" in stops.fix
    assert "generation_config.json" in finding(reports["save_model (adapter, base's eos)"], "files").what


def test_a_generation_config_beside_the_adapter_is_not_read(art, tmp_path):
    patched = shutil.copytree(art.cases["save_model (adapter, base's eos)"].directory, tmp_path / "patched")
    art.trained.generation_config.save_pretrained(patched)
    assert saved_files(patched)["generation_eos"] == [2, 0]
    model, _ = load_saved(patched)
    assert model.generation_config.eos_token_id == 0, "peft serves the base's generation_config"
    assert failed(ship_report(art.trained, art.tok, patched)) == {"stops"}


def test_the_base_tokenizer_serves_another_prompt(reports):
    report = reports["merged, saved with the base's tokenizer"]
    prompt = finding(report, "served_prompt")
    assert "16 of 16" in prompt.what and "Qwen" in prompt.what, "the base's default system prompt appears"
    assert float(prompt.what.split("KL on the first reply token ")[1].split(" ")[0]) > 0
    assert finding(report, "precision").verdict == "pass", "the same ids on both sides: the weights are right"
    assert "'<|endoftext|>'" in finding(report, "tokenizer_eos").what


def test_untrained_added_rows_are_reported_not_crashed_on(reports):
    rows = finding(reports["added tokens, without modules_to_save"], "token_rows")
    assert "2 added token(s)" in rows.what and "modules_to_save" in rows.fix
    assert finding(reports["added tokens, with modules_to_save"], "token_rows").verdict == "pass"


def test_a_reference_that_does_not_stop_cannot_be_compared(reports):
    assert sum(" template, eos list " in name for name in reports) == 2 * len(FAMILIES)
    for name, report in reports.items():
        if " template, eos list " in name and finding(report, "stops").verdict != "fail":
            assert finding(report, "stops").verdict == "could-not-measure", name
            assert "max_new_tokens" in finding(report, "stops").fix


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_end_of_turn_follows_the_final_message_and_the_header_is_the_user_turn(family):
    _, final, earlier, header = FAMILIES[family]
    tok = family_tokenizer(family)
    assert tok.convert_ids_to_tokens(end_of_turn_after_final(tok)) == final
    assert user_turn_header(tok) == header
    if family == "gptoss":
        assert final != earlier, "gpt-oss ends earlier turns with <|end|>: a stop there cuts the final answer"


def test_chatml_end_of_turn_and_header(art):
    assert art.tok.convert_ids_to_tokens(end_of_turn_after_final(art.tok)) == "<|im_end|>"
    assert user_turn_header(art.tok) == "<|im_start|>user"


def test_your_own_probe_chats_and_probe_length(art):
    own = make_messages("add", 6, seed=11)
    merged = art.cases["merged in memory, float32"].directory
    findings = ship_report(art.trained, art.tok, merged, conversations=own)
    assert "of 6 probe prompts" in finding(findings, "stops").what and not failed(findings)
    short = ship_report(art.trained, art.tok, merged, max_new_tokens=1)
    assert finding(short, "stops").verdict == "could-not-measure"
    with pytest.raises(ValueError, match="non-empty list"):
        ship_report(art.trained, art.tok, merged, conversations=[])


def test_logit_drift_is_zero_for_a_copy_and_measures_a_merge(art):
    import copy

    batches = make_batches(art.tok, make_messages("mixed", 8, seed=3), 8)
    same = logit_drift(art.merged, copy.deepcopy(art.merged), batches)
    assert same == {"max_abs": 0.0, "kl": 0.0, "agreement": 1.0}
    reloaded, _ = load_saved(art.cases["merged in memory, float32"].directory)
    drift = logit_drift(art.trained, reloaded, batches)
    assert 0 < drift["max_abs"] < LOGIT_TOLERANCE, "merging into float32 is exact up to round-off"


def test_a_lora_only_copy_drops_modules_to_save(art, tmp_path):
    out = lora_only_copy(art.cases["save_model (adapter, base's eos)"].directory, tmp_path / "lo")
    assert saved_files(out)["modules_to_save"] is None


def test_bad_input_is_refused_with_what_why_fix(art, tmp_path):
    with pytest.raises(ShipInputError, match="is not a directory — .* — "):
        saved_files(tmp_path / "missing")
    with pytest.raises(ShipInputError, match="neither config.json nor adapter_config.json"):
        saved_files(tmp_path)
    with pytest.raises(TypeError, match="not a directory path"):
        load_saved(None)
    with pytest.raises(ValueError, match="full model, not an adapter"):
        lora_only_copy(art.cases["merged in memory, float32"].directory, tmp_path / "x")
    with pytest.raises(ValueError, match="non-empty dict"):
        shipping_explorer({})
    with pytest.raises(ValueError, match="quantization='int3'"):
        load_saved(art.cases["save_model (adapter, base's eos)"].directory, quantization="int3")


def _adapter_with_base(src, dst, base):
    shutil.copytree(src, dst)
    config = json.loads((dst / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base
    (dst / "adapter_config.json").write_text(json.dumps(config))
    return dst


def test_the_command_line_exits_0_1_2_and_never_a_traceback(art, tmp_path, capsys):
    from course_utils.model import SHIPPED_MODELS

    merged = str(art.cases["merged in memory, float32"].directory)
    adapter = art.cases["save_model (adapter, base's eos)"].directory
    assert main(["--trained", merged, "--saved", merged]) == 0
    assert "ship check: no failure" in capsys.readouterr().err
    assert main(["--trained", merged, "--saved", str(adapter), "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert [f["check"] for f in printed if f["verdict"] == "fail"] == ["stops"] and printed[1]["fix"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"messages": m}) for m in make_messages("add", 3, seed=5)))
    assert main(["--trained", merged, "--saved", merged, "--prompts", str(prompts),
                 "--max-new-tokens", "24"]) == 0
    assert "of 3 probe prompts" in capsys.readouterr().out
    assert main(["--trained", merged, "--saved", str(tmp_path / "nowhere")]) == 2
    assert main(["--trained", merged, "--saved", str(tmp_path)]) == 2   # no config.json
    assert main(["--trained", merged, "--saved", merged, "--prompts", str(tmp_path / "none.jsonl")]) == 2
    lost = _adapter_with_base(adapter, tmp_path / "lost-base", "some-org/not-in-the-cache")
    assert main(["--trained", merged, "--saved", str(lost)]) == 2
    assert "cannot be found here" in capsys.readouterr().err
    other = _adapter_with_base(adapter, tmp_path / "other-arch", str(SHIPPED_MODELS["tiny-llama"]))
    assert main(["--trained", merged, "--saved", str(other)]) == 2, "another architecture: a clear error"
    assert "cannot be loaded" in capsys.readouterr().err
    moved = _adapter_with_base(adapter, tmp_path / "moved-base", str(tmp_path / "gone"))
    assert main(["--trained", merged, "--saved", str(moved), "--base", str(art.fixed_base)]) == 0


def test_the_command_line_loads_a_qlora_reference(art, capsys):
    code = main(["--trained", str(art.cases["save_model (adapter, base's eos)"].directory), "--trained-base",
                 str(art.fixed_base), "--trained-quantization", "nf4", "--saved",
                 str(art.cases["QLoRA shipped by lesson 10 (bf16 base, merge, eos copied)"].directory)])
    out = capsys.readouterr().out
    assert code == 0 and "trained in 4-bit, served in bfloat16" in out, out


def test_python_m_course_utils_ship_runs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "course_utils.ship", "--trained", str(tmp_path),
                           "--saved", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "bad input" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_embedding_modules_names_each_architectures_rows_and_refuses_what_has_none():
    """modules_to_save needs this architecture's names: GPT-NeoX calls its embedding embed_in (lesson 10 on
    the held-out NeoX model trained no full embedding row with ["embed_tokens", "lm_head"], silently)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from course_utils.shipping import embedding_modules

    shape = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                 num_attention_heads=2)
    neox = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_neox", **shape))
    llama = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **shape))
    assert embedding_modules(neox) == ["gpt_neox.embed_in", "lm_head"]
    assert embedding_modules(llama) == ["model.embed_tokens", "lm_head"]
    with pytest.raises(TypeError, match="torch model"):
        embedding_modules("gpt2")
    with pytest.raises(ValueError, match="causal LM"):
        embedding_modules(torch.nn.Linear(2, 2))


# ---- issue 42, part 3: options that would be ignored, and prompts that blamed the saved tokenizer --------
def _prompts(tmp_path, *chats):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats))
    return str(path)


@pytest.mark.parametrize("extra, named", [
    (lambda tmp: ["--base", str(COURSE_MODEL_DIR)], "holds a full model"),
    (lambda tmp: ["--trained-quantization", "nf4"], "quantization='nf4' was given"),
    (lambda tmp: ["--prompts", _prompts(tmp, {"messages": [{"role": "assistant", "content": "4"}]})],
     "holds only assistant messages"),
    (lambda tmp: ["--prompts", _prompts(tmp, {"messages": [{"role": "user", "content": 3}]})], "not text"),
])
def test_the_command_refuses_what_it_would_ignore_or_blame_on_the_saved_model(extra, named, tmp_path, capsys):
    full = str(COURSE_MODEL_DIR)
    assert main(["--trained", full, "--saved", full, "--max-new-tokens", "4", *extra(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count(" — ") >= 2 and "Traceback" not in err, err


@pytest.mark.parametrize("call, phrase", [
    (lambda: main("--trained x --saved y"), "is one string, not a list of strings"),
    (lambda: precision_of(None), "must be a torch model"),
    (lambda: precision_of("Qwen/Qwen2.5-0.5B"), "must be a torch model"),
])
def test_bad_arguments_are_refused_with_what_why_fix(call, phrase):
    with pytest.raises((TypeError, ValueError), match=phrase) as caught:
        call()
    assert str(caught.value).count(" — ") >= 2, "what — why — fix"
