"""Reference answers of lesson 10's exercises (``exercises/lesson10.py``'s checkers import them; notebooks
never do)."""

from __future__ import annotations

import hashlib
import random

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
    and, without tokenizer files, with the base's chat template; a full directory with its own. The dtype is
    not a cause: a float32 run saved in bf16 serves the same replies (section 6.1; the ship check warns).
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
    return Diagnosis("healthy", None)


# ------------------------------------------------------------------------------------------------
# Exercise 2's generator: it knows the truth, so it lives here (the checker imports it; no notebook does)
# ------------------------------------------------------------------------------------------------

CAUSES = ("healthy", "eos_not_shipped", "template_not_shipped", "token_rows_not_shipped")
# (end-of-turn token, its id, the eos token id): families' conventions, on a small vocabulary
_FAMILIES = (("<|im_end|>", 2, 0), ("<|eot_id|>", 128009, 128001), ("<end_of_turn>", 107, 1),
             ("<|end|>", 32007, 32000))
_ADAPTER_FILES = ["README.md", "adapter_config.json", "adapter_model.safetensors"]
_TOKENIZER_FILES = ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
_FULL_FILES = ["config.json", "model.safetensors"]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def saved_directory_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """A saved directory as a practitioner lists it, with what the run trained and the base it names, and
    its truth. ``CAUSES[seed % 4]`` for the first seeds, then random; each healthy case is a look-alike
    of a broken one (no generation_config.json beside an adapter whose base already stops; no tokenizer
    where the base's template is the training one; a merged directory without modules_to_save; a float32
    run saved in bf16, which serves the same replies). ``graded`` picks the stream: the checker's directories
    and the ones ``saved_directory``
    shows are drawn apart, so matching a shown one over seeds finds none of the graded ones."""
    rng = random.Random(f"{'graded' if graded else 'shown'}-{seed}")
    cause = CAUSES[seed % len(CAUSES)] if seed < len(CAUSES) else rng.choice(CAUSES)
    eot, eot_id, eos_id = rng.choice(_FAMILIES)
    base_template, train_template = _sha(f"base {graded} {seed}"), _sha(f"training {graded} {seed}")
    trained_dtype = rng.choice(("float32", "bfloat16"))
    if cause in ("eos_not_shipped", "token_rows_not_shipped", "template_not_shipped"):
        kind = "adapter"
    else:
        kind = rng.choice(("adapter", "full"))
    # an adapter is served with its base's generation_config: only an instruct base (eos list with the
    # end-of-turn id) stops — every adapter case but eos_not_shipped has one; a full directory brings its own
    base_instruct = (cause != "eos_not_shipped") if kind == "adapter" else rng.random() < 0.5
    base = {"generation_eos": [eot_id, eos_id] if base_instruct else [eos_id],
            "chat_template_sha": base_template}
    trained = {"generation_eos": [eot_id, eos_id], "chat_template_sha": train_template,
               "modules_to_save": rng.choice((["embed_tokens", "lm_head"], None)) if kind == "full" else
               ["embed_tokens", "lm_head"], "dtype": trained_dtype}
    if kind == "adapter":
        with_tokenizer = cause != "template_not_shipped" and rng.random() < 0.7
        files = _ADAPTER_FILES + (_TOKENIZER_FILES if with_tokenizer else [])
        if not with_tokenizer and cause != "template_not_shipped":
            trained["chat_template_sha"] = base_template  # the look-alike: trained with the base's template
        gen_file = cause == "eos_not_shipped" and rng.random() < 0.5  # written beside it, and still not read
        if gen_file:
            files.append("generation_config.json")
        saved = {"files": sorted(files), "kind": "adapter", "base": "org/base-model",
                 "modules_to_save": (None if cause == "token_rows_not_shipped"
                                     else ["embed_tokens", "lm_head"]),
                 "generation_eos": [eot_id, eos_id] if gen_file else None,
                 "chat_template_sha": train_template if with_tokenizer else None, "dtype": None}
    else:
        merged_from_reload = cause == "eos_not_shipped"
        saved = {"files": sorted(_FULL_FILES + ["generation_config.json"] + _TOKENIZER_FILES), "kind": "full",
                 "base": None, "modules_to_save": None,
                 "generation_eos": [eos_id] if merged_from_reload else [eot_id, eos_id],
                 "chat_template_sha": train_template,
                 "dtype": "bfloat16" if rng.random() < 0.5 else trained_dtype}  # bf16: what users ship
    artefact = {"saved": saved, "base": base, "trained": trained, "end_of_turn_token": eot,
                "end_of_turn_id": eot_id}
    served_eos = base["generation_eos"] if kind == "adapter" else saved["generation_eos"]
    evidence = {"healthy": None, "eos_not_shipped": served_eos,
                "template_not_shipped": base_template,
                "token_rows_not_shipped": ["embed_tokens", "lm_head"]}[cause]
    return artefact, Diagnosis(cause, evidence)


# The self-test's plain phrases, in a fixed order (what a learner of lesson 10 can name).
SELF_TEST_CAUSES = {
    "healthy": "nothing: the user gets the trained model",
    "eos_not_shipped": "the end-of-turn fix stayed in memory: the served generate() does not stop",
    "template_not_shipped": "the training chat template was not shipped",
    "token_rows_not_shipped": "the trained embedding rows were not shipped",
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: a saved directory as a practitioner lists it (its files and configs, the base
    it names, what the run had in memory), its true cause as a plain phrase, and the phrases to choose from
    (fixed order). Deterministic per seed; nothing is loaded."""
    artefact, truth = saved_directory_case(seed, graded=False)
    saved, base, trained = artefact["saved"], artefact["base"], artefact["trained"]
    text = "\n".join([
        f"A colleague's saved directory ({saved['kind']}): {', '.join(saved['files'])}",
        f"  its generation_config.json eos_token_id: {saved['generation_eos']}; chat template sha: "
        f"{saved['chat_template_sha']}; dtype in config.json: {saved['dtype']}",
        f"  adapter_config.json modules_to_save: {saved['modules_to_save']}"
        + (f"; base: {saved['base']}" if saved["base"] else ""),
        f"The base model: generation_config eos_token_id {base['generation_eos']}, chat template sha "
        f"{base['chat_template_sha']}",
        f"The run in memory: eos_token_id {trained['generation_eos']}, chat template sha "
        f"{trained['chat_template_sha']}, modules_to_save {trained['modules_to_save']}, "
        f"dtype {trained['dtype']}",
        f"The template ends a turn with {artefact['end_of_turn_token']} (id {artefact['end_of_turn_id']}).",
        "Served with PeftModel.from_pretrained (an adapter) or AutoModelForCausalLM (a full directory).",
    ])
    return text, SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())
