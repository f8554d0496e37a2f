"""Reference answers of lesson 02's exercises (``exercises/lesson02.py``'s checkers import them; notebooks
never do)."""

from __future__ import annotations

import random

from ...checks import Diagnosis
from ...data import IGNORE_INDEX
from ...eos import end_of_turn_token

CAUSES = ("wrong_stop_ids", "stop_token_not_graded", "pad_equals_eos", "max_new_tokens_too_small",
          "left_padding_without_mask")
# Chat families the generator draws from: (end-of-turn token, turn opener, eos) as their templates write them.
_FAMILIES = (("<|im_end|>", "<|im_start|>", "<|endoftext|>"), ("<|eot_id|>", "<|start_header_id|>",
             "<|end_of_text|>"), ("<end_of_turn>", "<start_of_turn>", "<eos>"), ("<|end|>", "<|user|>",
                                                                                  "<|endoftext|>"))
_WORDS = ("red", "cat", "moon", "road", "big", "box", "green", "cold", "bag", "cow", "sun", "tree")


def stop_ids_for_generate(tokenizer, generation_config) -> list[int]:
    """Exercise 1's reference: the ids ``generate()`` should stop on for chats — every id the checkpoint's
    ``generation_config`` already stops on (Llama 3.1 lists three), else the tokenizer's eos, plus the token
    the chat template writes after an assistant message, each once."""
    eos = generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    end_of_turn = tokenizer.convert_tokens_to_ids(end_of_turn_token(tokenizer))
    return ids if end_of_turn in ids else ids + [end_of_turn]


def _qa(rng: random.Random) -> tuple[list[str], list[str]]:
    """A question and answer as token strings (reverse-the-words: the answer length varies)."""
    words = rng.sample(_WORDS, rng.randint(3, 6))
    return ["Reverse", ":"] + words, list(reversed(words))


def broken_run_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """Exercise 2's artefact and its truth, ``Diagnosis(cause, evidence)``; ``graded=False`` is the stream
    the notebook shows (``broken_generation_run``), ``graded=True`` another one, for the checker.

    ``generate_config`` holds ``eos_tokens``, ``max_new_tokens``, ``padding_side`` and
    ``attention_mask_passed``; ``format`` is "chat" or "plain". Five causes, drawn by ``seed``: three
    from this lesson and two look-alikes (a ``max_new_tokens`` too small for the answers; left padding
    without an attention mask, lesson 03).
    """
    rng = random.Random(f"graded-{seed}" if graded else seed)
    cause = CAUSES[seed % len(CAUSES)] if seed < len(CAUSES) else rng.choice(CAUSES)
    eot, opener, eos = rng.choice(_FAMILIES)
    fmt = "plain" if cause == "pad_equals_eos" else "chat"
    stop = eos if fmt == "plain" else eot
    pad = eos if (fmt == "plain" or rng.random() < 0.5) else "<pad>"
    budget = rng.choice((32, 40, 64))
    cfg = {"eos_tokens": [eos, eot], "max_new_tokens": budget, "padding_side": "left",
           "attention_mask_passed": True}
    if cause == "wrong_stop_ids":
        cfg["eos_tokens"] = [eos]
    if cause == "left_padding_without_mask":
        cfg["attention_mask_passed"] = False
    qas = [_qa(rng) for _ in range(rng.randint(4, 6))]
    if cause == "left_padding_without_mask" and len({len(q) for q, _ in qas}) == 1:
        words = rng.sample(_WORDS, 3 if len(qas[0][0]) > 5 else 6)   # prompts of one length pad no row:
        qas[-1] = (["Reverse", ":"] + words, list(reversed(words)))   # make one of another length
    if cause == "max_new_tokens_too_small":
        cfg["max_new_tokens"] = budget = rng.randint(2, min(len(a) for _, a in qas) - 1)
    longest = max(len(q) for q, _ in qas)
    generations = []
    for q, a in qas:
        gen = _broken_reply(rng, cause, a, stop, opener, len(q) < longest)[:budget]
        stopped = bool(gen) and gen[-1] in cfg["eos_tokens"]
        generations.append({"prompt_tokens": q, "tokens": gen, "stopped": stopped, "reference": a})
    graded = []
    for _, a in qas[:3]:
        span = (["###", "Answer", ":"] if fmt == "plain" else ["\n"]) + a
        closing = [stop] if fmt == "plain" else [stop, "\n"]
        graded.append(span if cause in ("stop_token_not_graded", "pad_equals_eos") else span + closing)
    artefact = {"generations": generations, "generate_config": cfg, "graded_span": graded, "format": fmt,
                "end_of_turn_token": eot, "eos_token": eos, "pad_token": pad,
                "collator": ("transformers DataCollatorForLanguageModeling" if cause == "pad_equals_eos" else
                             rng.choice(("TRL DataCollatorForLanguageModeling", "course collate_right")))}
    if cause == "pad_equals_eos":
        evidence = eos
    elif cause in ("wrong_stop_ids", "stop_token_not_graded"):
        evidence = eot
    elif cause == "max_new_tokens_too_small":
        evidence = budget
    else:
        evidence = tuple(i for i, (q, _) in enumerate(qas) if len(q) < longest)
    return artefact, Diagnosis(cause, evidence)


def _broken_reply(rng: random.Random, cause: str, answer: list[str], stop: str, opener: str,
                  padded: bool) -> list[str]:
    """What the model generates for one prompt under ``cause`` (tokens; cut to the budget later)."""
    ramble = [rng.choice(_WORDS) for _ in range(80)]
    if cause == "wrong_stop_ids":  # writes the end-of-turn token, nobody watches it: invents turns
        return answer + [stop, "\n", opener, "assistant", "\n"] + ramble
    if cause in ("stop_token_not_graded", "pad_equals_eos"):  # never learned the stop: rambles on
        return answer + (["\n", "###", "Question", ":"] if cause == "pad_equals_eos" else ["\n"]) + ramble
    if cause == "left_padding_without_mask" and padded:  # attends to pad columns: garbled from token 1
        return [rng.choice(("##", "ss", "w", "0", "nsw")) for _ in range(80)]
    return answer + [stop]  # stops correctly (the budget may still cut it)


def diagnose_generations(artefact: dict) -> Diagnosis:
    """Exercise 2: read the generations first, then the config and the graded span.

    The look-alikes are ruled out first: garbling only on padded rows (lesson 03), and replies cut
    mid-answer without rambling (a too-small budget). Then: does the model write the end-of-turn
    token? If yes and generate() does not watch it: config. If no: was it ever graded?
    """
    gens, cfg = artefact["generations"], artefact["generate_config"]
    eot = artefact["end_of_turn_token"]
    if cfg["padding_side"] == "left" and not cfg["attention_mask_passed"]:
        longest = max(len(g["prompt_tokens"]) for g in gens)
        padded = [i for i, g in enumerate(gens) if len(g["prompt_tokens"]) < longest]
        if padded and not any(gens[i]["stopped"] for i in padded):
            return Diagnosis("left_padding_without_mask", padded[0])
    writes_eot = any(eot in g["tokens"] for g in gens)
    if writes_eot and eot not in cfg["eos_tokens"]:
        return Diagnosis("wrong_stop_ids", eot)
    if not any(g["stopped"] for g in gens) and not writes_eot:
        stop = eot if artefact["format"] == "chat" else artefact["eos_token"]
        if not any(stop in row for row in artefact["graded_span"]):
            cause = "pad_equals_eos" if artefact["pad_token"] == stop else "stop_token_not_graded"
            return Diagnosis(cause, stop)
    return Diagnosis("max_new_tokens_too_small", cfg["max_new_tokens"])


def collate_keep_eos(examples: list[dict], pad_token_id: int) -> dict:
    """Exercise 3: right-pad; labels are the example's own (``input_ids`` where it has none); every
    padding position is -100, by *position*, so the row's own eos keeps its label when pad == eos."""
    import torch

    width = max(len(e["input_ids"]) for e in examples)
    out = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        ids = list(e["input_ids"])
        labels = list(e.get("labels", ids))
        pad = width - len(ids)
        out["input_ids"].append(ids + [pad_token_id] * pad)
        out["attention_mask"].append([1] * len(ids) + [0] * pad)
        out["labels"].append(labels + [IGNORE_INDEX] * pad)
    return {k: torch.tensor(v) for k, v in out.items()}


SELF_TEST_CAUSES = {
    "wrong_stop_ids": "generate() does not watch the end-of-turn token",
    "stop_token_not_graded": "the end-of-turn token never carried loss",
    "pad_equals_eos": "pad == eos with a collator that masks labels by pad id",
    "max_new_tokens_too_small": "max_new_tokens cuts the answers short",
    "left_padding_without_mask": "batched generation with left padding and no attention mask",
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: what a practitioner sees of a fine-tune that does not stop (the generate()
    settings, the replies, the graded span of training rows), its true cause as a plain phrase, and the
    phrases to choose from (fixed order). Deterministic per seed; drawn from the checker's stream."""
    artefact, truth = broken_run_case(seed, graded=True)
    cfg = artefact["generate_config"]
    mask = "passed" if cfg["attention_mask_passed"] else "not passed"
    lines = [f"{artefact['format']} fine-tune; eos {artefact['eos_token']!r}, pad {artefact['pad_token']!r}, "
             f"the template ends a turn with {artefact['end_of_turn_token']!r}; "
             f"collator: {artefact['collator']}",
             f"generate(eos_token_id={cfg['eos_tokens']}, max_new_tokens={cfg['max_new_tokens']}, "
             f"padding_side={cfg['padding_side']!r}), attention mask {mask}"]
    for g in artefact["generations"]:
        reply = " ".join(g["tokens"])[:100]
        lines.append(f"  {' '.join(g['prompt_tokens'])} -> {reply!r} (stopped: {g['stopped']})")
    lines.append("tokens that carried loss in three training rows:")
    lines += [f"  {row}" for row in artefact["graded_span"]]
    return "\n".join(lines), SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())
