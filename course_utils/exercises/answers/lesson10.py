"""Reference answers of lesson 10's exercises (``exercises/lesson10.py``'s checkers import them; notebooks
never do)."""

from __future__ import annotations

from ...checks import Diagnosis


def save_for_serving(model, tokenizer, out_dir) -> None:
    """Exercise 1: merge the adapter into the base and save the full model with its generation_config
    (the in-memory one, which carries the end-of-turn fix) and the tokenizer the run trained with.

    ``merge_and_unload`` keeps the model's ``generation_config``; ``save_pretrained`` writes it. An
    adapter directory cannot carry it: peft serves an adapter with its base's generation_config.
    """
    merged = model.merge_and_unload()   # modules_to_save rows and W + BA, in the trained dtype
    merged.save_pretrained(out_dir)     # config.json, generation_config.json, model.safetensors
    tokenizer.save_pretrained(out_dir)  # the training chat template travels with the tokenizer


def diagnose_saved(artefact: dict) -> Diagnosis:
    """Exercise 2: what the user will be served, compared with what the run trained.

    An adapter is served with its base's generation_config (one saved beside the adapter is not read)
    and, without tokenizer files, with the base's chat template; a full directory with its own.
    """
    saved, base, trained = artefact["saved"], artefact["base"], artefact["trained"]
    adapter = saved["kind"] == "adapter"
    served_eos = base["generation_eos"] if adapter else saved["generation_eos"]
    if artefact["end_of_turn_id"] not in served_eos:
        return Diagnosis("eos_not_shipped", served_eos)
    served_template = saved["chat_template_sha"] or base["chat_template_sha"]
    if served_template != trained["chat_template_sha"]:
        return Diagnosis("template_not_shipped", served_template)
    if adapter and trained["modules_to_save"]:
        missing = sorted(set(trained["modules_to_save"]) - set(saved["modules_to_save"] or []))
        if missing:
            return Diagnosis("token_rows_not_shipped", missing)
    if saved["dtype"] is not None and saved["dtype"] != trained["dtype"]:
        return Diagnosis("dtype_changed", saved["dtype"])
    return Diagnosis("healthy", None)
