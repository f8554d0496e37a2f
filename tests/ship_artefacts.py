"""Saved artefacts for the ship check's tests, made the way practitioners make them (issue 44).

One LoRA run of the course model with TRL (``SFTConfig(eos_token="<|im_end|>")``, ``modules_to_save`` on the
embedding and head, a training template whose system prompt differs from the base tokenizer's), trained until
it stops, then saved every way the issue lists — each mistake next to its healthy twin — plus two short runs
with added tokens (with and without ``modules_to_save``). ``build(root)`` returns ``Artefacts``: the trained
references and ``cases``, ``{name: (directory, base or None, expected failing checks)}``. The expected sets
are what the mechanism decides (an eos list without the end of turn, another rendering, untrained rows), and
the tests assert the measured numbers behind each.
"""

from __future__ import annotations

import copy
import json
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from course_utils import load_course_model, make_chat_dataset, make_sft_trainer
from course_utils.model import COURSE_MODEL_DIR
from course_utils.templates import base_variant

EOT = "<|im_end|>"


@dataclass
class Artefacts:
    trained: object             # the LoRA run in memory (a PeftModel), its generation_config fixed by TRL
    tok: object                 # the tokenizer it trained with (training template, eos <|im_end|>)
    merged: object              # the same, merged in memory
    fixed_base: Path            # the base with generation_config.eos_token_id [<|im_end|>, <|endoftext|>]
    # {"trained", "added-with", "added-without", "qlora", a template family}: (model, tokenizer)
    references: dict = field(default_factory=dict)
    cases: dict = field(default_factory=dict)    # {name: Case}


@dataclass
class Case:
    directory: Path
    base: Path | None           # the adapter's base when it is not the one its config names
    expect: set                 # the checks that must fail (every other one passes, warns or cannot measure)
    reference: str = "trained"  # which model of Artefacts.references it is compared with
    may_fail: frozenset = frozenset()  # consequences that may also fail, by how far the model drifts


def _lora(modules_to_save=("embed_tokens", "lm_head")):
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules="all-linear",
                      modules_to_save=list(modules_to_save) if modules_to_save else None)


def _train(model, tok, steps: int):
    return make_sft_trainer(model, tok, make_chat_dataset("mixed", 400, seed=0), max_steps=steps,
                            per_device_train_batch_size=16, eos_token=EOT, progress=False)


def _copy_generation_config(source_model, directory) -> None:
    source_model.generation_config.save_pretrained(directory)


def build(root: Path) -> Artefacts:
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    root = Path(root)
    base, base_tok = load_course_model()
    tok = copy.deepcopy(base_tok)
    tok.chat_template = base_variant(tok.chat_template)  # trained with another system prompt than the base's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = _train(get_peft_model(base, _lora()), tok, 60)
        trainer.train()
        trained = trainer.model.eval()
        d = lambda name: root / name  # noqa: E731
        cases = {}
        trainer.save_model(str(d("save_model")))
        cases["save_model (adapter, base's eos)"] = Case(d("save_model"), None, {"stops"})
        fixed_base = d("fixed_base")
        shutil.copytree(COURSE_MODEL_DIR, fixed_base)
        _copy_generation_config(trained, fixed_base)
        cases["adapter on a base whose eos list holds <|im_end|>"] = Case(d("save_model"), fixed_base, set())
        trained.save_pretrained(d("peft_save"))  # PeftModel.save_pretrained: adapter files only
        cases["PeftModel.save_pretrained (no tokenizer)"] = Case(d("peft_save"), None,
                                                              {"stops", "served_prompt", "tokenizer_eos"})
        merged = copy.deepcopy(trained).merge_and_unload().eval()
        merged.save_pretrained(d("merged"))
        tok.save_pretrained(d("merged"))
        cases["merged in memory, float32"] = Case(d("merged"), None, set())
        copy.deepcopy(merged).to(torch.bfloat16).save_pretrained(d("merged_bf16"))
        tok.save_pretrained(d("merged_bf16"))
        cases["merged in memory, saved bf16"] = Case(d("merged_bf16"), None, set())
        reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(COURSE_MODEL_DIR)),
                                             str(d("save_model")))
        reloaded.merge_and_unload().save_pretrained(d("merged_after_reload"))
        tok.save_pretrained(d("merged_after_reload"))
        cases["merged after reloading (base's eos)"] = Case(d("merged_after_reload"), None, {"stops"})
        # the QLoRA / bf16 ship path: the base reloaded in bf16, the adapter on it, merged, eos list copied
        bf16_base = AutoModelForCausalLM.from_pretrained(str(COURSE_MODEL_DIR), dtype=torch.bfloat16)
        bf16_merged = PeftModel.from_pretrained(bf16_base, str(d("save_model"))).merge_and_unload()
        bf16_merged.save_pretrained(d("bf16_merge"))
        tok.save_pretrained(d("bf16_merge"))
        shutil.copytree(d("bf16_merge"), d("bf16_merge_no_eos"))
        _copy_generation_config(trained, d("bf16_merge"))
        cases["LoRA merged into a bf16 base, eos copied"] = Case(d("bf16_merge"), None, set())
        cases["LoRA merged into a bf16 base, eos not copied"] = Case(d("bf16_merge_no_eos"), None, {"stops"})
        merged.save_pretrained(d("base_tokenizer"))
        base_tok.save_pretrained(d("base_tokenizer"))
        cases["merged, saved with the base's tokenizer"] = Case(d("base_tokenizer"), None,
                                                             {"served_prompt", "tokenizer_eos"})
        merged.save_pretrained(d("no_template"))
        tok.save_pretrained(d("no_template"))
        (d("no_template") / "chat_template.jinja").unlink()
        config = json.loads((d("no_template") / "tokenizer_config.json").read_text())
        config.pop("chat_template", None)
        (d("no_template") / "tokenizer_config.json").write_text(json.dumps(config))
        cases["merged, saved without a chat template"] = Case(d("no_template"), None, {"served_prompt"})
        from course_utils.shipping import lora_only_copy

        lora_only_copy(d("save_model"), d("lora_only"))
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(d("save_model") / f, d("lora_only") / f)
        # the defect is the lost rows (token_rows, precision); whether the probes' stop rate also drops past
        # the margin depends on how much the run leaned on those rows (0.62 vs 1.00 on one machine, within it
        # on another): a consequence, allowed either way
        cases["LoRA matrices only (trained rows dropped)"] = Case(d("lora_only"), fixed_base,
                                                              {"precision", "token_rows"},
                                                              may_fail=frozenset({"stops"}))
    art = Artefacts(trained=trained, tok=tok, merged=merged, fixed_base=fixed_base, cases=cases,
                    references={"trained": (trained, tok)})
    _added_token_runs(art, root)
    _qlora(art, root)
    _families(art, root)
    return art


def _added_token_runs(art: Artefacts, root: Path) -> None:
    """Added tokens (``resize_token_embeddings``), trained with and without ``modules_to_save``; the adapters
    carry their tokenizer and are served on the base whose eos list holds ``<|im_end|>``."""
    from peft import get_peft_model

    for label, modules in (("with", ("embed_tokens", "lm_head")), ("without", None)):
        model, _ = load_course_model()
        tok = copy.deepcopy(art.tok)
        tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
        model.resize_token_embeddings(len(tok))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = _train(get_peft_model(model, _lora(modules)), tok, 6)
            trainer.train()
            directory = root / f"added_{label}"
            trainer.save_model(str(directory))
        art.references[f"added-{label}"] = (trainer.model.eval(), tok)
        expected = set() if modules else {"token_rows"}
        art.cases[f"added tokens, {label} modules_to_save"] = Case(directory, art.fixed_base, expected,
                                                                   f"added-{label}")


def _qlora(art: Artefacts, root: Path) -> None:
    """A QLoRA reference: the run's adapter on the base loaded in 4-bit nf4 (bitsandbytes 0.50.2 runs it on
    the CPU). Shipped two ways: merged into the in-memory 4-bit model and saved 4-bit (re-quantised), and
    lesson 10's way (the bf16 base reloaded, the adapter merged, the eos list copied: ``bf16_merge``)."""
    from course_utils.shipping import load_saved

    art.references["qlora"] = load_saved(root / "save_model", art.fixed_base, quantization="nf4")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: "Merge lora module to 4-bit linear may get different ..."
        model, tok = load_saved(root / "save_model", art.fixed_base, quantization="nf4")
        model.merge_and_unload().save_pretrained(root / "qlora_merged_4bit")
    tok.save_pretrained(root / "qlora_merged_4bit")
    art.cases["QLoRA merged in 4-bit, saved 4-bit"] = Case(root / "qlora_merged_4bit", None, set(), "qlora")
    art.cases["QLoRA shipped by lesson 10 (bf16 base, merge, eos copied)"] = Case(
        root / "bf16_merge", None, set(), "qlora")
    art.cases["QLoRA merged in bf16, eos not copied"] = Case(
        root / "bf16_merge_no_eos", None, {"stops"}, "qlora")


# Templates TRL ships (trl/chat_templates), their special tokens, the end of turn after the final message,
# the end of an *earlier* turn, and the header that opens a user turn.
FAMILIES = {
    "gptoss": (["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>",
                "<|constrain|>"], "<|return|>", "<|end|>", "<|start|>user<|message|>"),
    "llama3_1": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                  "<|python_tag|>"], "<|eot_id|>", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>"),
    "gemma3": (["<bos>", "<start_of_turn>", "<end_of_turn>"], "<end_of_turn>", "<end_of_turn>",
               "<start_of_turn>user"),
}


def family_tokenizer(name: str):
    """The course tokenizer with a family's special tokens and TRL's shipped template for it."""
    import trl

    tokens = FAMILIES[name][0]
    _, tok = load_course_model()
    tok = copy.deepcopy(tok)
    tok.add_special_tokens({"additional_special_tokens": tokens})
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()
    if tokens[0] in ("<|begin_of_text|>", "<bos>"):
        tok.bos_token = tokens[0]
    return tok


def _families(art: Artefacts, root: Path) -> None:
    """The course model (untrained on these templates: it does not stop) saved with a family's template, its
    eos list right (the end of turn after the final message) or wrong (gpt-oss: ``<|end|>``, the end of an
    earlier turn; the others: the tokenizer's ``<|endoftext|>``)."""
    for name, (_, final, earlier, _) in FAMILIES.items():
        model, _ = load_course_model()
        tok = family_tokenizer(name)
        model.resize_token_embeddings(len(tok), mean_resizing=False)
        art.references[name] = (model.eval(), tok)
        for label, eos in (("right", [final]), ("wrong", [earlier if earlier != final else tok.eos_token])):
            directory = root / f"{name}_{label}"
            model.generation_config.eos_token_id = tok.convert_tokens_to_ids(eos)
            model.save_pretrained(directory)
            tok.save_pretrained(directory)
            expect = set() if label == "right" else {"stops"}
            art.cases[f"{name} template, eos list {eos}"] = Case(directory, None, expect, name)
        model.generation_config.eos_token_id = tok.convert_tokens_to_ids([final])
