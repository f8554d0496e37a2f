"""Lesson 10's exercises (``course_utils.exercises.lesson10``): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: ``tests/test_checkers.py`` runs them);
the diagnosis generator draws every cause and healthy look-alikes; the graders refuse bad set-up arguments.
"""

import copy

import pytest
import torch
from conftest import Row, graded

from course_utils.checks import Diagnosis
from course_utils.exercises import lesson10 as ex
from course_utils.exercises.answers import lesson10


def save_merged_copy(model, tokenizer, out_dir):
    """A second correct answer: merge a deep copy (the caller's model stays a PeftModel), write the in-memory
    generation_config explicitly."""
    merged = copy.deepcopy(model).merge_and_unload()
    merged.generation_config = copy.deepcopy(model.generation_config)
    merged.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def save_adapter_and_generation_config(model, tokenizer, out_dir):
    """Writes the adapter, the tokenizer and the generation_config beside it: peft never reads the latter."""
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)


def save_merged_without_tokenizer(model, tokenizer, out_dir):
    """Merges and saves the model but not the tokenizer: the base's chat template is served."""
    from transformers import AutoTokenizer

    model.merge_and_unload().save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model.peft_config["default"].base_model_name_or_path).save_pretrained(out_dir)


def save_merged_in_bf16(model, tokenizer, out_dir):
    """Halves the download: the model loads in bf16 under dtype='auto'."""
    model.merge_and_unload().to(torch.bfloat16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def save_lora_matrices_only(model, tokenizer, out_dir):
    """Keeps the LoRA matrices, drops modules_to_save — and the fixed generation_config is restored by
    merging onto a reloaded base, so only the rows are missing."""
    import tempfile

    from course_utils.shipping import load_saved, lora_only_copy

    adapter = tempfile.mkdtemp()
    model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    lora_only_copy(adapter, adapter + "-lora")
    tokenizer.save_pretrained(adapter + "-lora")
    reloaded, _ = load_saved(adapter + "-lora")
    merged = reloaded.merge_and_unload()
    merged.generation_config = copy.deepcopy(model.generation_config)
    merged.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def diagnose_saved_other_order(artefact):
    """A second correct answer: rows first, then what is served."""
    saved, base, trained = artefact["saved"], artefact["base"], artefact["trained"]
    if saved["kind"] == "adapter" and trained["modules_to_save"] and not saved["modules_to_save"]:
        return Diagnosis("token_rows_not_shipped", list(trained["modules_to_save"]))
    eos = saved["generation_eos"] if saved["kind"] == "full" else base["generation_eos"]
    if artefact["end_of_turn_id"] not in eos:
        return Diagnosis("eos_not_shipped", eos)
    template = saved["chat_template_sha"] if saved["chat_template_sha"] else base["chat_template_sha"]
    if template != trained["chat_template_sha"]:
        return Diagnosis("template_not_shipped", template)
    return Diagnosis("healthy", None)


def reads_the_adapters_own_generation_config(artefact):
    """Believes a generation_config.json beside an adapter is served."""
    truth = lesson10.diagnose_saved(artefact)
    saved = artefact["saved"]
    if truth.cause == "eos_not_shipped" and saved["kind"] == "adapter" and saved["generation_eos"]:
        return Diagnosis("healthy", None)
    return truth


def no_generation_config_file_means_broken(artefact):
    """Calls every adapter without a generation_config.json broken, also on an instruct base that stops."""
    saved = artefact["saved"]
    if saved["kind"] == "adapter" and saved["generation_eos"] is None:
        return Diagnosis("eos_not_shipped", artefact["base"]["generation_eos"])
    return lesson10.diagnose_saved(artefact)


def no_tokenizer_means_broken(artefact):
    """Calls every directory without a chat template broken, also when the base's is the training one."""
    truth = lesson10.diagnose_saved(artefact)
    if truth.cause == "healthy" and artefact["saved"]["chat_template_sha"] is None:
        return Diagnosis("template_not_shipped", artefact["base"]["chat_template_sha"])
    return truth


def always_healthy(artefact):
    """Memorised: every saved directory is fine."""
    return Diagnosis("healthy", None)


CHECKERS = [
    Row("save_for_serving", graded(ex.check_save_for_serving), lesson10.save_for_serving),
    Row("diagnose_saved", graded(ex.check_diagnose_saved), lesson10.diagnose_saved),
]
ALSO_CORRECT = [("save_for_serving", save_merged_copy), ("diagnose_saved", diagnose_saved_other_order),
                ("save_for_serving", save_merged_in_bf16)]  # what a user feels decides: bf16 is correct
def any_other_dtype_is_the_fault(artefact):
    """Exercise 2: a saved dtype other than the trained one is the fault (the folklore lesson 10 measures)."""
    saved, trained = artefact["saved"], artefact["trained"]
    if saved["dtype"] is not None and saved["dtype"] != trained["dtype"]:
        return Diagnosis("dtype_changed", saved["dtype"])
    return lesson10.diagnose_saved(artefact)


WRONG = [
    ("save_for_serving", save_adapter_and_generation_config, "peft does not read a generation_config.json"),
    ("save_for_serving", save_merged_without_tokenizer, "not the one the run trained with"),
    ("save_for_serving", save_lora_matrices_only, "modules_to_save"),
    ("diagnose_saved", reads_the_adapters_own_generation_config, "beside the adapter is not read"),
    ("diagnose_saved", no_generation_config_file_means_broken, "an instruct base"),
    ("diagnose_saved", no_tokenizer_means_broken, "here it is the one the run trained with"),
    ("diagnose_saved", always_healthy, "is not what broke this"),
    ("diagnose_saved", any_other_dtype_is_the_fault, "another dtype is not what breaks a shipped model"),
]


def test_the_generator_draws_every_cause_and_healthy_look_alikes():
    drawn = [lesson10.saved_directory_case(seed) for seed in range(200)]
    causes = {truth.cause for _, truth in drawn}
    assert causes == set(ex.CAUSES)
    healthy = [a for a, truth in drawn if truth.cause == "healthy"]
    assert any(a["saved"]["kind"] == "adapter" and a["saved"]["generation_eos"] is None for a in healthy), \
        "a healthy adapter without generation_config.json (an instruct base)"
    assert any(a["saved"]["chat_template_sha"] is None for a in healthy), "a healthy adapter, no tokenizer"
    assert any(a["saved"]["kind"] == "full" and a["saved"]["dtype"] == "bfloat16"
               and a["trained"]["dtype"] == "float32" for a in healthy), "a float32 run saved in bf16"
    broken_eos = [a for a, truth in drawn
                  if truth.cause == "eos_not_shipped" and a["saved"]["kind"] == "adapter"]
    assert any(a["saved"]["generation_eos"] for a in broken_eos), "a generation_config.json beside it, unread"


def test_the_truth_lives_with_the_answers_on_a_stream_apart():
    assert not hasattr(ex, "_saved_directory"), "the generator that knows the truth is in answers/lesson10.py"
    assert ex.saved_directory(3) == lesson10.saved_directory_case(3, graded=False)[0]
    assert ex.saved_directory(3) != lesson10.saved_directory_case(3, graded=True)[0]


# ---- shortcuts a learner has at each exercise: each fails the checker (issue 33) ----------------------

def save_adapter_with_tokenizer(model, tokenizer, out_dir):
    """Exercise 1: what trainer.save_model() wrote in section 1 (the adapter and the tokenizer)."""
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def merge_the_reloaded_adapter(model, tokenizer, out_dir):
    """Exercise 1: save the adapter, reload it as a user does (load_saved), merge that and save it."""
    import tempfile

    from course_utils.shipping import load_saved

    adapter_dir = tempfile.mkdtemp()
    model.save_pretrained(adapter_dir)
    load_saved(adapter_dir)[0].merge_and_unload().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def match_the_shown_directories(artefact):
    """Exercise 2: look the artefact up among saved_directory(seed) and read the cause off the seed."""
    for seed in range(3000):
        if ex.saved_directory(seed) == artefact:
            return Diagnosis(ex.CAUSES[seed % len(ex.CAUSES)], None)
    return Diagnosis("healthy", None)


SHORTCUTS = [
    ("save_for_serving", "what trainer.save_model() wrote", save_adapter_with_tokenizer),
    ("save_for_serving", "the generation_config beside the adapter (section 3's patch)",
     save_adapter_and_generation_config),
    ("save_for_serving", "merge the adapter reloaded from disk", merge_the_reloaded_adapter),
    ("save_for_serving", "merge, without the tokenizer", save_merged_without_tokenizer),
    ("diagnose_saved", "match the shown directories over seeds", match_the_shown_directories),
    ("diagnose_saved", "no generation_config.json means broken", no_generation_config_file_means_broken),
    ("diagnose_saved", "no chat template means broken", no_tokenizer_means_broken),
    ("diagnose_saved", "another dtype than trained is the fault", any_other_dtype_is_the_fault),
    ("diagnose_saved", "always healthy", always_healthy),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, capsys):
    checks = {"save_for_serving": ex.check_save_for_serving, "diagnose_saved": ex.check_diagnose_saved}
    check = checks[exercise]
    assert not check(function), f"{description} passes exercise {exercise}"


def test_the_artefact_names_no_cause():
    artefact = ex.saved_directory(3)
    assert "cause" not in str(sorted(artefact))
    assert not any(isinstance(v, Diagnosis) for v in artefact.values())


def test_the_graders_refuse_bad_set_up_arguments():
    with pytest.raises(TypeError, match="must be a function"):
        ex.check_save_for_serving("my_save_for_serving")
    with pytest.raises(ValueError, match="seed"):
        ex.saved_directory(None)
