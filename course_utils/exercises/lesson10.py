"""Lesson 10's exercises: their checkers, and the saved directories of the diagnosis exercise.

1. ``check_save_for_serving(fn)``: ``fn(model, tokenizer, out_dir)`` writes a trained LoRA model (with the
   end-of-turn fix in its ``generation_config``, a training chat template, trained embedding rows) so that
   a user who loads ``out_dir`` gets the same model; graded by loading it as a user does
   (``shipping.load_saved``) on models the notebook never shows (both course models).
2. ``saved_directory(seed)`` (the artefact a learner reads) + ``check_diagnose_saved(fn)``:
   ``fn(artefact) -> Diagnosis(cause, evidence)``, one of ``CAUSES``, graded on fresh directories that
   include healthy look-alikes.

The generator that knows a directory's cause lives with the reference answers (``answers/lesson10.py``,
``saved_directory_case``), on a stream of directories apart from the ones ``saved_directory`` shows.
"""

from __future__ import annotations

import copy
import tempfile
import warnings

import torch

from .. import validate
from ..checks import Case, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import end_of_turn_token, make_batches, make_messages
from ..model import course_seed, load_course_model
from ..shipping import PRECISION_TOLERANCE, _drift, _logits, load_saved, precision_of, saved_files
from .answers import lesson10 as _answers

# ------------------------------------------------------------------------------------------------
# Exercise 1 (fix): save what a user needs
# ------------------------------------------------------------------------------------------------

def _trained_lora(model_name: str, seed: int):
    """A LoRA model as a run leaves it in memory, without the run: random LoRA updates, trained rows of the
    special tokens (``modules_to_save``), the end-of-turn token prepended to ``generation_config`` (what
    ``SFTConfig(eos_token=...)`` does), and a training chat template that differs from the base's."""
    from peft import LoraConfig, get_peft_model
    from trl.chat_template_utils import qwen2_5_training_chat_template

    model, tokenizer = load_course_model(model_name)
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = qwen2_5_training_chat_template  # with {% generation %}: not the base's
    with warnings.catch_warnings():  # peft's tied-embedding notice is lesson text, not checker output
        warnings.simplefilter("ignore")
        config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                            task_type="CAUSAL_LM", modules_to_save=["embed_tokens", "lm_head"])
        model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    special = sorted(set(tokenizer.get_added_vocab().values()))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
            elif "modules_to_save" in name:
                p[special] += 0.2 * torch.randn(p[special].shape, generator=gen)
    eot = tokenizer.convert_tokens_to_ids(end_of_turn_token(tokenizer))
    model.generation_config.eos_token_id = [eot, tokenizer.eos_token_id]
    model.eval()
    return model, tokenizer


def _save_cases() -> list[Case]:
    cases = []
    for k, name in enumerate(("tiny-qwen", "tiny-llama")):
        model, tokenizer = _trained_lora(name, 10 * course_seed() + k)
        batches = make_batches(tokenizer, make_messages("mixed", 8, seed=500 + k), 8)
        expected = {"logits": _logits(model, batches), "batches": batches,
                    "template": tokenizer.chat_template, "eos": list(model.generation_config.eos_token_id),
                    "out_dir": tempfile.mkdtemp(prefix="ship-ex-")}
        cases.append(Case((model, tokenizer, expected["out_dir"]), expected,
                          label=f"a LoRA run on {name}", tag=name))
    return cases


def _compare_saved(_got, expected: dict) -> str | None:
    try:
        info = saved_files(expected["out_dir"])
    except ValueError:
        return ("out_dir holds no saved model (no config.json nor adapter_config.json) — call "
                "save_pretrained with out_dir")
    try:
        served, served_tok = load_saved(expected["out_dir"])
    except ValueError as exc:
        return f"a user cannot load it: {str(exc).split(' — ')[0]}"
    eos = served.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if expected["eos"][0] not in eos:
        if info["kind"] == "adapter":
            return (f"served eos_token_id {eos}, without the end-of-turn id {expected['eos'][0]}: an adapter "
                    "directory is served on its base, with the base's generation_config (peft does not read "
                    "a generation_config.json saved beside the adapter) — which saved object carries it?")
        return (f"served eos_token_id {eos}, without the end-of-turn id {expected['eos'][0]} the run added "
                "in memory — which model object's generation_config did your directory get?")
    if served_tok.chat_template != expected["template"]:
        return ("the chat template served is not the one the run trained with — where does a user's "
                "loader take the template from when the directory has none?")
    drift = _drift(expected["logits"], _logits(served, expected["batches"]), expected["batches"])
    # what a user feels decides, as in the ship check: a correct bf16 save passes
    kl_tolerance, agreement = PRECISION_TOLERANCE.get(precision_of(served), PRECISION_TOLERANCE["float32"])
    if drift["kl"] > kl_tolerance or drift["agreement"] < agreement:
        return (f"the served next-token distribution differs from the trained model's (KL "
                f"{drift['kl']:.3g} nats/token, greedy agreement {drift['agreement']:.2f}; loaded in "
                f"{precision_of(served)}): the trained embedding and head rows (modules_to_save) or the LoRA "
                "update were not saved")
    return None


SAVE_HINTS = Hints(
    question="When a user loads your directory, where does generate() read its eos_token_id from — for an "
             "adapter directory, and for a full one?",
    pointer="Sections 2-3: trainer.save_model() wrote the adapter and the tokenizer, and the reloaded model "
            "took the base's generation_config; section 5 merges the in-memory model.",
    answer="merged = model.merge_and_unload(); merged.save_pretrained(out_dir); "
           "tokenizer.save_pretrained(out_dir)")


def check_save_for_serving(fn):
    """Checker for exercise 1: ``fn(model, tokenizer, out_dir)`` on two LoRA models the notebook never shows;
    ``out_dir`` is loaded as a user does and compared with the model in memory (eos ids, chat template,
    logits). Any way of writing it that a user loads back correctly passes."""
    validate.function("fn", fn)
    with warnings.catch_warnings():  # peft's merge notices (tied embeddings) are lesson text, not the verdict
        warnings.simplefilter("ignore")
        return run_check("save_for_serving", fn, _save_cases, compare=_compare_saved, hint=SAVE_HINTS)


# ------------------------------------------------------------------------------------------------
# Exercise 2 (diagnosis): what will break when this directory is served?
# ------------------------------------------------------------------------------------------------

CAUSES = _answers.CAUSES


def saved_directory(seed: int) -> dict:
    """A saved model directory as a practitioner sees it (``saved``: its files and configs; ``base``: the base
    it names; ``trained``: what the run had in memory), without its verdict: the exercise. The checker grades
    directories drawn apart from these (no seed of this function gives one of them)."""
    validate.seed("seed", seed)
    return _answers.saved_directory_case(seed, graded=False)[0]


def _graded_case(seed: int):
    """The checker's case and its truth (which lives with the reference answers)."""
    return _answers.saved_directory_case(seed, graded=True)


_LOOK_ALIKES = {
    "adapter without generation_config.json, on an instruct base":
        lambda a: a["saved"]["kind"] == "adapter" and a["saved"]["generation_eos"] is None,
    "no tokenizer files, the base's template is the training one":
        lambda a: a["saved"]["chat_template_sha"] is None,
    "a float32 run saved in bf16":
        lambda a: a["saved"]["dtype"] == "bfloat16" and a["trained"]["dtype"] == "float32",
}


def _look_alike_seeds(start: int) -> list[int]:
    """The first seed from ``start`` on that draws each healthy look-alike: graded in every checker run."""
    found = []
    for check in _LOOK_ALIKES.values():
        seed = start
        while not (_graded_case(seed)[1].cause == "healthy" and check(_graded_case(seed)[0])):
            seed += 1
        found.append(seed)
    return found


def _evidence_ok(got, truth) -> bool:
    if isinstance(truth.evidence, list):
        return isinstance(got, (list, tuple)) and sorted(got) == sorted(truth.evidence)
    return got == truth.evidence


DIAGNOSIS_MISCONCEPTIONS = {
    ("healthy", "eos_not_shipped"):
        "an adapter is served on its base with the base's generation_config — a generation_config.json "
        "beside the adapter is not read: compare artefact['base']['generation_eos'] with the end-of-turn id",
    ("eos_not_shipped", "healthy"):
        "no generation_config.json beside an adapter is fine when the base's generation_config already "
        "stops on the end-of-turn token (an instruct base): look at artefact['base']['generation_eos']",
    ("template_not_shipped", "healthy"):
        "without tokenizer files the base's chat template is served — here it is the one the run "
        "trained with",
    ("healthy", "template_not_shipped"):
        "the directory has no chat template, so the base's is served, and it is not the one the run "
        "trained with",
    ("token_rows_not_shipped", "healthy"):
        "a merged (full) directory holds every weight: modules_to_save is an adapter's field",
    ("healthy", "token_rows_not_shipped"):
        "the run trained embed_tokens and lm_head fully (modules_to_save) and the adapter's config has "
        "none: a loader restores the base's rows",
    ("dtype_changed", "healthy"):
        "another dtype is not what breaks a shipped model: a float32 run saved in bf16 serves the same "
        "replies (section 6.1 — the next-token distribution barely moves; the ship check warns, it does not "
        "fail): look at what is served — the stop tokens, the template, the trained rows",
}

DIAGNOSIS_HINTS = Hints(
    question="What will the user's generate() stop on, and which chat template will render their prompt — "
             "for an adapter directory, and for a full one?",
    pointer="artefact['saved'] is the directory, artefact['base'] what an adapter is loaded on, "
            "artefact['trained'] what the run had in memory — sections 2-4 and the ship report's checks.",
    answer="adapter: served eos = base['generation_eos'], template = saved template or the base's; full: "
           "its own. eot id not in served eos -> eos_not_shipped (served eos); served template != trained "
           "-> template_not_shipped (served sha); adapter missing trained modules_to_save -> "
           "token_rows_not_shipped (missing modules); else healthy (None) — the dtype is not a cause.")


def check_diagnose_saved(fn):
    """Checker for exercise 2: ``fn(artefact) -> Diagnosis`` on fresh saved directories (every cause once,
    then 12 drawn fresh on every run, and each healthy look-alike, in a shuffled order: no keyword fixes
    them)."""
    validate.function("fn", fn)
    return check_diagnosis("diagnose_saved", fn, _graded_case, evidence_ok=_evidence_ok,
                           seeds=lambda: [*range(len(CAUSES)), *fresh_seeds(12),
                                          *_look_alike_seeds(5000 + 100 * course_seed())],
                           misconceptions=DIAGNOSIS_MISCONCEPTIONS, hint=DIAGNOSIS_HINTS)

