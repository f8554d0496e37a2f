"""Reference answers of lesson 02's exercises (``exercises/lesson02.py``'s checkers import them; notebooks
never do)."""

from __future__ import annotations

import random

from ...checks import Diagnosis
from ...data import IGNORE_INDEX, first_special_after

CAUSES = ("wrong_stop_ids", "stop_token_not_graded", "pad_equals_eos", "max_new_tokens_too_small")
# Chat families the generator draws from: (end-of-turn token, turn opener, eos) as their templates write them.
_FAMILIES = (("<|im_end|>", "<|im_start|>", "<|endoftext|>"), ("<|eot_id|>", "<|start_header_id|>",
             "<|end_of_text|>"), ("<end_of_turn>", "<start_of_turn>", "<eos>"), ("<|end|>", "<|user|>",
                                                                                  "<|endoftext|>"))
_WORDS = ("red", "cat", "moon", "road", "big", "box", "green", "cold", "bag", "cow", "sun", "tree")


def stop_ids_for_generate(tokenizer, generation_config) -> list[int]:
    """Exercise 1's reference: the ids ``generate()`` should stop on for chats — every id the checkpoint's
    ``generation_config`` already stops on (Llama 3.1 lists three), else the tokenizer's eos, plus the token
    the chat template writes after an assistant message, each once — when that is one token: a template
    copied onto a tokenizer without its turn tokens writes them as text, and there is nothing to add."""
    eos = generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ANSWER"},
                {"role": "user", "content": "bye"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    end_of_turn = first_special_after(tokenizer, text[text.index("ANSWER") + len("ANSWER"):])
    # None: the template closes turns with text this tokenizer splits into pieces; no id can stop there
    return ids if end_of_turn is None or end_of_turn in ids else ids + [end_of_turn]


def _qa(rng: random.Random) -> tuple[list[str], list[str]]:
    """A question and answer as token strings (reverse-the-words: the answer length varies)."""
    words = rng.sample(_WORDS, rng.randint(3, 8))
    return ["Reverse", ":"] + words, list(reversed(words))


def broken_run_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """Exercise 2's artefact and its truth, ``Diagnosis(cause, evidence)``; ``graded=False`` is the stream
    the notebook shows (``broken_generation_run``), ``graded=True`` another one, for the checker.

    The artefact is what a practitioner has in front of them: ``generations`` (prompt, reply tokens,
    ``stopped``, the ``reference`` answer), ``generate_call`` (what they typed: ``max_new_tokens``),
    ``training_rows`` (three rows of a training batch: tokens and which carry loss), ``special_tokens`` and
    ``format``. What decides the cause is never a setting alone: the stop list generate() used is not shown
    (the reply shows it), the collator is not named (the label array shows it), and every setting a cause
    needs also appears in runs with another cause — a small budget that still fits the answers, pad == eos
    with a collator that keeps the eos label, a chat format either way. Four causes, drawn by ``seed``:
    three from this lesson and a look-alike (a ``max_new_tokens`` too small for the answers).
    """
    rng = random.Random(f"graded-{seed}" if graded else seed)
    cause = CAUSES[seed % len(CAUSES)] if seed < len(CAUSES) else rng.choice(CAUSES)
    eot, opener, eos = rng.choice(_FAMILIES)
    fmt = {"pad_equals_eos": "plain", "wrong_stop_ids": "chat"}.get(cause, rng.choice(("chat", "plain")))
    stop = eos if fmt == "plain" else eot
    pad = eos if cause == "pad_equals_eos" or rng.random() < 0.5 else "<pad>"
    if cause == "stop_token_not_graded" and fmt == "plain":
        pad = "<pad>"  # plain text whose rows never got the eos appended (pad == eos is the other cause)
    qas = [_qa(rng) for _ in range(rng.randint(4, 6))]
    longest_answer = max(len(a) for _, a in qas)
    if cause == "max_new_tokens_too_small":  # cuts the longest answer, not necessarily the others
        budget = rng.randint(2, longest_answer - 1)
    else:  # room for every answer and its stop, and a few tokens past it
        budget = rng.randint(longest_answer + 3, longest_answer + 12)
    generations = []
    for q, a in qas:
        gen = _broken_reply(rng, cause, a, stop, opener)[:budget]
        stopped = bool(gen) and gen[-1] == stop and cause != "wrong_stop_ids"
        generations.append({"prompt_tokens": q, "tokens": gen, "stopped": stopped, "reference": a})
    artefact = {"generations": generations,
                "generate_call": {"max_new_tokens": budget},
                "training_rows": _training_rows(cause, fmt, qas[:3], eot, opener, eos, pad),
                "special_tokens": {"eos": eos, "pad": pad, "end_of_turn": eot}, "format": fmt}
    return artefact, Diagnosis(cause, budget if cause == "max_new_tokens_too_small" else stop)


def _training_rows(cause: str, fmt: str, qas, eot: str, opener: str, eos: str, pad: str) -> list[dict]:
    """Three rows of a right-padded training batch: ``tokens`` and ``graded`` (does it carry loss).

    Chat rows grade the assistant's reply and its end-of-turn token, except under
    ``stop_token_not_graded`` (a template that leaves the token outside ``{% generation %}``). Plain
    rows grade every real token, the appended eos included, except under ``pad_equals_eos`` (a collator
    that masks every position whose id is the pad id, and pad is the eos) and ``stop_token_not_graded``
    (the tokenizer never appended the eos: it is not in the row).
    """
    rows = []
    for q, a in qas:
        if fmt == "chat":
            prompt = [opener, "user", "\n", *q, eot, "\n", opener, "assistant", "\n"]
            reply = a + [eot]
            tokens = prompt + reply
            graded = [False] * len(prompt) + [True] * len(a) + [cause != "stop_token_not_graded"]
        else:
            tokens = ["###", "Question", ":", *q, "\n", "###", "Answer", ":", *a]
            if cause != "stop_token_not_graded":
                tokens.append(eos)
            graded = [True] * (len(tokens) - 1) + [cause != "pad_equals_eos"]
        rows.append((tokens, graded))
    width = max(len(t) for t, _ in rows)
    return [{"tokens": t + [pad] * (width - len(t)), "graded": g + [False] * (width - len(t))}
            for t, g in rows]


def _broken_reply(rng: random.Random, cause: str, answer: list[str], stop: str, opener: str) -> list[str]:
    """What the model generates for one prompt under ``cause`` (tokens; cut to the budget later)."""
    ramble = [rng.choice(_WORDS) for _ in range(80)]
    if cause == "wrong_stop_ids":  # writes the end-of-turn token, nobody watches it: invents turns
        return answer + [stop, "\n", opener, "assistant", "\n"] + ramble
    if cause in ("stop_token_not_graded", "pad_equals_eos"):  # never learned the stop: rambles on
        return answer + (["\n", "###", "Question", ":"] if cause == "pad_equals_eos" else ["\n"]) + ramble
    return answer + [stop]  # stops correctly (the budget may still cut it)


def diagnose_generations(artefact: dict) -> Diagnosis:
    """Exercise 2: read the replies first, then the training rows.

    A reply that writes the stop token and goes on: generate() is not watching it. A reply cut inside its
    answer: the budget. Otherwise the model never writes its stop, and the training rows show why: the
    stop token never carries loss. When it is also the pad token, a collator that masks by pad id erased
    it (5d); otherwise the template left it outside the graded span, or it was never appended (5c).
    """
    gens, special = artefact["generations"], artefact["special_tokens"]
    stop = special["end_of_turn"] if artefact["format"] == "chat" else special["eos"]
    if any(stop in g["tokens"][:-1] for g in gens):
        return Diagnosis("wrong_stop_ids", stop)
    if any(len(g["tokens"]) < len(g["reference"]) and g["tokens"] == g["reference"][:len(g["tokens"])]
           for g in gens):
        return Diagnosis("max_new_tokens_too_small", artefact["generate_call"]["max_new_tokens"])
    graded = {t for row in artefact["training_rows"] for t, g in zip(row["tokens"], row["graded"]) if g}
    if stop in graded:  # never happens in these runs: a graded stop token is learned
        raise ValueError(f"the training rows grade {stop!r}, yet no reply ends with it")
    if special["pad"] == stop:  # every position holding the pad id is masked, the real eos with them
        return Diagnosis("pad_equals_eos", stop)
    return Diagnosis("stop_token_not_graded", stop)


def with_eos(example: dict, eos_token_id: int) -> dict:
    """``example`` ending with exactly one ``eos_token_id``, graded: appended (with its label) when the row
    was tokenized without it, as TRL's dataset preparation does for non-conversational rows (``add_eos``)."""
    ids = list(example["input_ids"])
    labels = list(example.get("labels", ids))
    if ids and ids[-1] == eos_token_id:
        return {"input_ids": ids, "labels": labels}
    return {"input_ids": ids + [eos_token_id], "labels": labels + [eos_token_id]}


def collate_keep_eos(examples: list[dict], pad_token_id: int, eos_token_id: int) -> dict:
    """Exercise 3: every row ends with its eos, graded (appended where the row has none); right-pad; labels
    are the example's own (``input_ids`` where it has none); every padding position is -100, by
    *position*, so the row's own eos keeps its label when pad == eos."""
    import torch

    examples = [with_eos(e, eos_token_id) for e in examples]
    width = max(len(e["input_ids"]) for e in examples)
    out = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        ids, labels = e["input_ids"], e["labels"]
        pad = width - len(ids)
        out["input_ids"].append(ids + [pad_token_id] * pad)
        out["attention_mask"].append([1] * len(ids) + [0] * pad)
        out["labels"].append(labels + [IGNORE_INDEX] * pad)
    return {k: torch.tensor(v) for k, v in out.items()}


SELF_TEST_CAUSES = {
    "wrong_stop_ids": "generate() does not watch the end-of-turn token",
    "stop_token_not_graded": "the stop token never carried loss (the template left it out, or it was never "
                             "appended)",
    "pad_equals_eos": "pad == eos with a collator that masks labels by pad id",
    "max_new_tokens_too_small": "max_new_tokens cuts the answers short",
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: what a practitioner sees of a fine-tune that does not stop (the generate()
    call, the replies, three training rows with the tokens that carry no loss in parentheses), its true
    cause as a plain phrase, and the phrases to choose from (fixed order). Deterministic per seed; drawn
    from the checker's stream."""
    artefact, truth = broken_run_case(seed, graded=True)
    return show_run(artefact), SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())


def show_run(artefact: dict) -> str:
    """The artefact as a practitioner reads it (the notebook prints the same through the exercise)."""
    call, special = artefact["generate_call"], artefact["special_tokens"]
    turn = f", the chat template ends a turn with {special['end_of_turn']!r}"
    turn = turn if artefact["format"] == "chat" else ""
    lines = [f"{artefact['format']} fine-tune; eos {special['eos']!r}, pad {special['pad']!r}{turn}",
             f"model.generate(**inputs, max_new_tokens={call['max_new_tokens']}), prompt by prompt:"]
    for g in artefact["generations"]:
        reply = " ".join(g["tokens"])
        lines.append(f"  {' '.join(g['prompt_tokens'])} -> {reply[:100]!r} (stopped: {g['stopped']})")
    lines.append("three training rows; tokens in (parentheses) carry no loss:")
    for row in artefact["training_rows"]:
        shown = (t.replace("\n", "\\n") for t in row["tokens"])
        lines.append("  " + " ".join(t if g else f"({t})" for t, g in zip(shown, row["graded"])))
    return "\n".join(lines)
