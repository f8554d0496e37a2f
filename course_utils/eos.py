"""Lesson 02 (the model that never stops): stop tokens, stop rates and the graded span.

A chat model stops when ``generate()`` sees one of its ``eos_token_id``s. Two things must agree for
that to happen: the *config* (``generate()`` must be told the template's end-of-turn token, e.g.
``<|im_end|>``, not only the tokenizer's ``<|endoftext|>``) and the *training* (the end-of-turn token
must sit inside the graded span, or the model never learns to emit it). This module measures both:

- ``end_of_turn_token`` / ``stop_token_ids``: read the end-of-turn token off the chat template.
- ``generate_greedy`` / ``stop_rate``: batched greedy generation and the fraction that stopped.
- ``graded_text``: decode the tokens of a training batch that carry loss.
- ``untrained_stop_template``: TRL's Qwen2.5 training template with ``<|im_end|>`` moved out of
  ``{% generation %}`` (the template bug TRL warns about).
- ``plain_text_example``: the plain-text format that appends ``tokenizer.eos_token`` (where the
  pad == eos trap bites).
- ``check_stop_token_ids`` / ``check_graded_span_has_stop``: the lesson's exercise checkers.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random

from .checks import Case, run_check
from .data import IGNORE_INDEX

_PROBE_USER, _PROBE_ANSWER = "probe question", "probe answer"


def _added_ids(tokenizer) -> set[int]:
    return set(tokenizer.get_added_vocab().values())


def end_of_turn_token(tokenizer) -> str:
    """The token the chat template writes right after an assistant message (e.g. ``<|im_end|>``).

    Found by rendering a probe conversation, as TRL's ``is_chat_template_stop_token_trained`` does:
    the first added (special) token after the assistant's text is what the model must emit to stop.
    A user turn follows, because some templates only close a turn when another one starts.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat_template — the end-of-turn token is defined by the "
                         "template — set tokenizer.chat_template (or load an instruct tokenizer).")
    messages = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ANSWER},
                {"role": "user", "content": _PROBE_USER}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    after = text[text.index(_PROBE_ANSWER) + len(_PROBE_ANSWER):]
    added = _added_ids(tokenizer)
    for token in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if token in added:
            return tokenizer.convert_ids_to_tokens(token)
        if tokenizer.decode([token]).strip():
            break  # plain text before any special token: the template closes turns with text
    raise ValueError(f"no special token follows the assistant message in {after[:40]!r} — this template "
                     "ends turns with plain text, so there is no single stop id — pass stop strings to "
                     "generate() instead (stop_strings=..., tokenizer=...).")


def stop_token_ids(tokenizer) -> list[int]:
    """The ``eos_token_id`` list for ``generate()``: the tokenizer's eos, then the end-of-turn token.

    Keeping the eos covers plain-text use; adding the end-of-turn token makes a chat turn stop.
    """
    eot = tokenizer.convert_tokens_to_ids(end_of_turn_token(tokenizer))
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    return ids + [eot] if eot not in ids else ids


def chat_prompts(tokenizer, conversations: list[list[dict]]) -> list[str]:
    """Each conversation's user turn rendered with the generation prompt (``<|im_start|>assistant``)."""
    return [tokenizer.apply_chat_template([m for m in c if m["role"] != "assistant"], tokenize=False,
                                          add_generation_prompt=True) for c in conversations]


def _as_list(eos) -> list[int]:
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def generate_greedy(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 40,
                    **generate_kwargs) -> list[dict]:
    """Greedy, batched, left-padded generation; one record per prompt.

    Records: ``ids`` (new tokens, up to and including the stop token), ``text``, ``n_new`` and
    ``stopped`` (a stop id was generated before ``max_new_tokens``). Without ``eos_token_id`` in
    ``generate_kwargs``, ``generate()`` uses ``model.generation_config`` — the default a user meets.
    Left padding, because a decoder continues from the last position of each row.
    """
    import torch

    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a non-empty list of strings — generate_greedy tokenizes them — "
                         "build them with chat_prompts(tokenizer, conversations).")
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    encoded = encoded.to(model.device)
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, **generate_kwargs)
    stops = set(_as_list(generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)))
    records = []
    for row in out[:, encoded["input_ids"].shape[1]:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stops), None)
        ids = row[:end] if end else row
        records.append({"ids": ids, "text": tokenizer.decode(ids), "n_new": len(ids),
                        "stopped": end is not None})
    return records


def stop_rate(records: list[dict]) -> float:
    """Fraction of generations that ended on a stop token instead of running to ``max_new_tokens``."""
    if not records:
        raise ValueError("stop_rate got no records — it is a fraction of generations — pass "
                         "generate_greedy()'s output.")
    return sum(r["stopped"] for r in records) / len(records)


def graded_text(tokenizer, input_ids, labels) -> str:
    """The text of the tokens that carry loss in one row (``labels != -100``), decoded in order."""
    ids = [int(i) for i, label in zip(input_ids, labels) if int(label) != IGNORE_INDEX]
    return tokenizer.decode(ids)


_ASSISTANT_OUT = "{{- '\\n' + message.content + '<|im_end|>\\n' }}"


def untrained_stop_template(training_template: str) -> str:
    """TRL's Qwen2.5 training template with ``<|im_end|>\\n`` moved after ``{% endgeneration %}``.

    It renders the same text, but the end-of-turn token is no longer part of the assistant mask: the
    mistake TRL's ``is_chat_template_stop_token_trained`` warns about. A string edit of the shipped
    template, so the lesson breaks TRL's real template rather than a hand-written one.
    """
    if training_template.count(_ASSISTANT_OUT) != 1 or "{%- endgeneration %}" not in training_template:
        raise ValueError("this is not TRL's qwen2_5 training template (the assistant output line or "
                         "{%- endgeneration %} is missing) — the edit looks for those exact strings — pass "
                         "trl.chat_template_utils.qwen2_5_training_chat_template.")
    moved = "{%- endgeneration %}\n        {%- if not message.tool_calls %}{{- '<|im_end|>\\n' }}{%- endif %}"
    return (training_template.replace(_ASSISTANT_OUT, "{{- '\\n' + message.content }}")
            .replace("{%- endgeneration %}", moved))


def plain_text_example(tokenizer, conversation: list[dict]) -> str:
    """A conversation as plain text ending in ``tokenizer.eos_token``, as pre-chat SFT scripts wrote it.

    The only stop signal is the eos, so whether the model learns to stop depends on its label.
    """
    question = next(m["content"] for m in conversation if m["role"] == "user")
    answer = next(m["content"] for m in conversation if m["role"] == "assistant")
    return f"### Question: {question}\n### Answer: {answer}{tokenizer.eos_token}"


def plain_text_prompt(conversation: list[dict]) -> str:
    """The prompt part of ``plain_text_example``: the model continues after ``### Answer:``."""
    question = next(m["content"] for m in conversation if m["role"] == "user")
    return f"### Question: {question}\n### Answer:"


def plain_text_batches(tokenizer, conversations: list[list[dict]], batch_size: int, collator) -> list[dict]:
    """``plain_text_example`` rows, tokenized and cut into batches by ``collator`` (in order).

    The collator decides the labels: that is the point of lesson 02's pad == eos section, which
    passes transformers' ``DataCollatorForLanguageModeling`` (masks by pad *id*) or TRL's (masks by
    *position*).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer — it is the rows per batch "
                         "— pass e.g. batch_size=16.")
    rows = [{"input_ids": tokenizer(plain_text_example(tokenizer, c), add_special_tokens=False)["input_ids"]}
            for c in conversations]
    batches = []
    for i in range(0, len(rows), batch_size):
        batch = collator(rows[i: i + batch_size])
        batches.append({k: batch[k] for k in ("input_ids", "attention_mask", "labels")})
    return batches


@contextlib.contextmanager
def captured_log(name: str = "trl"):
    """Collect the messages logged under ``name`` (e.g. TRL's warnings) into a list, instead of stderr."""
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler, logger = _Collect(level=logging.WARNING), logging.getLogger(name)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def graded_span_has_stop(batch: dict, stop_id: int) -> list[bool]:
    """Reference for exercise 2: per row, does a token with id ``stop_id`` carry loss?

    Only ``labels`` count: the prompt's ``<|im_end|>`` tokens are in ``input_ids`` but are not trained.
    """
    return [bool((row == stop_id).any()) for row in batch["labels"]]


# ------------------------------------------------------------------------------------------------
# Exercise 1: the stop ids for generate()
# ------------------------------------------------------------------------------------------------

def _variant(tokenizer, template: str, extra: list[str], eos: str | None = None):
    """A copy of ``tokenizer`` with another family's chat template and its special tokens."""
    variant = copy.deepcopy(tokenizer)
    variant.add_special_tokens({"additional_special_tokens": extra})
    variant.chat_template = template
    if eos is not None:
        variant.eos_token = eos
    return variant


def _stop_cases(tokenizer) -> list[Case]:
    from trl.chat_template_utils import gemma_chat_template, llama3_chat_template, phi3_chat_template

    llama = _variant(tokenizer, llama3_chat_template, ["<|start_header_id|>", "<|end_header_id|>",
                                                       "<|eot_id|>", "<|begin_of_text|>"])
    llama.bos_token = "<|begin_of_text|>"
    gemma = _variant(tokenizer, gemma_chat_template, ["<start_of_turn>", "<end_of_turn>", "<bos>"])
    gemma.bos_token = "<bos>"
    phi = _variant(tokenizer, phi3_chat_template, ["<|user|>", "<|assistant|>", "<|end|>"])
    eos_is_eot = _variant(tokenizer, tokenizer.chat_template, [], eos="<|im_end|>")
    cases = []
    for label, tok in (("course tokenizer (Qwen2.5 template)", tokenizer), ("Llama 3 template", llama),
                       ("Gemma template", gemma), ("Phi-3 template", phi),
                       ("eos already set to <|im_end|>", eos_is_eot)):
        cases.append(Case((tok,), stop_token_ids(tok), label=label))
    return cases


def _compare_stop_ids(got, expected) -> str | None:
    if not isinstance(got, (list, tuple)) or not all(isinstance(g, int) and not isinstance(g, bool)
                                                      for g in got):
        return f"expected a list of int token ids, got {got!r:.120}"
    if len(set(got)) != len(got):
        return f"{list(got)} lists an id twice"
    return None if sorted(got) == sorted(expected) else f"expected the ids {expected}, got {list(got)}"


def _diagnose_stop_ids(got, case: Case) -> str | None:
    tok = case.args[0]
    if not isinstance(got, (list, tuple)):
        return "return a list of ids: generate(eos_token_id=[...]) stops on any of them."
    got = list(got)
    eot = tok.convert_tokens_to_ids(end_of_turn_token(tok))
    if got == [tok.eos_token_id] and eot != tok.eos_token_id:
        return ("you returned only the tokenizer's eos: that is the default that never stops a chat turn; "
                "add the token the template writes after an assistant message.")
    if eot in got and tok.eos_token_id not in got:
        return "keep the tokenizer's eos in the list too: plain-text generations still end with it."
    if len(set(got)) != len(got):
        return "when the eos already IS the end-of-turn token, list it once."
    if 2 in got and eot != 2:
        return ("you hard-coded <|im_end|>'s id (2); other families close turns with other tokens — "
                "read the token off the rendered chat template.")
    opener = [t for t in got if t != tok.eos_token_id and t != eot]
    if opener:
        return (f"{tok.convert_ids_to_tokens(opener)} is not what follows the assistant's text — that is "
                "probably a turn *opener*; the stop token comes right after the assistant's content.")
    return None


def check_stop_token_ids(fn, tokenizer):
    """Checker for exercise 1: ``fn(tokenizer) -> list[int]``, the stop ids to pass to ``generate()``."""
    return run_check("stop_token_ids", fn, _stop_cases(tokenizer), compare=_compare_stop_ids,
                     diagnose=_diagnose_stop_ids,
                     hint="render [user, assistant, user] with tokenizer.apply_chat_template(..., "
                          "tokenize=False), find the first special token after the assistant's text, "
                          "and return [tokenizer.eos_token_id, its id] (each id once).")


# ------------------------------------------------------------------------------------------------
# Exercise 2: does a batch's graded span include the stop token?
# ------------------------------------------------------------------------------------------------

def _span_cases(tokenizer) -> list[Case]:
    from transformers import DataCollatorForLanguageModeling

    from .data import collate_right, make_messages, tokenize_chat

    rng = random.Random(7)
    convs = make_messages("mixed", 6, seed=2024)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    trained = [tokenize_chat(tokenizer, c) for c in convs]
    untrained = [tokenize_chat(tokenizer, c, train_on_eos=False) for c in convs]
    mixed = [trained[i] if rng.random() < 0.5 else untrained[i] for i in range(6)]
    mixed[0], mixed[1] = trained[0], untrained[1]  # at least one of each
    texts = [plain_text_example(tokenizer, c) for c in convs[:4]]
    trap = DataCollatorForLanguageModeling(tokenizer, mlm=False)(
        [tokenizer(t, add_special_tokens=False) for t in texts])
    trap = {k: trap[k] for k in ("input_ids", "attention_mask", "labels")}
    cases = []
    for label, examples in (("<|im_end|> trained", trained), ("<|im_end|> left out", untrained),
                            ("a mix of rows", mixed)):
        batch = collate_right(examples, tokenizer.pad_token_id)
        cases.append(Case((batch, eot), graded_span_has_stop(batch, eot), label=label))
    cases.append(Case((trap, tokenizer.eos_token_id), graded_span_has_stop(trap, tokenizer.eos_token_id),
                      label="plain text, pad == eos, eos labels masked by the collator"))
    return cases


def _diagnose_span(got, case: Case) -> str | None:
    batch, stop_id = case.args
    if isinstance(got, bool) or not isinstance(got, (list, tuple)):
        return "return one bool per row of the batch (a list), not one answer for the whole batch."
    got = [bool(g) for g in got]
    if got == [bool((row == stop_id).any()) for row in batch["input_ids"]]:
        return ("you looked at input_ids: the stop token is always *in the text* (the prompt's turns end "
                "with it too); what matters is whether its label is kept — look at labels.")
    last = []
    for row in batch["labels"]:
        kept = row[row != IGNORE_INDEX]
        last.append(bool(len(kept)) and int(kept[-1]) == stop_id)
    if got == last:
        return ("you checked only the last graded token; the span may end with the '\\n' after "
                "<|im_end|> — check whether the stop id appears anywhere in the row's labels.")
    return None


def check_graded_span_has_stop(fn, tokenizer):
    """Checker for exercise 2: ``fn(batch, stop_id) -> list[bool]``, one per row."""
    return run_check("graded_span_has_stop", fn, _span_cases(tokenizer),
                     compare=lambda got, exp: None if isinstance(got, (list, tuple)) and
                     [bool(g) for g in got] == exp else f"expected {exp}, got {got!r:.120}",
                     diagnose=_diagnose_span,
                     hint="a token carries loss where labels != -100; a row trains the stop token when "
                          "one of its labels equals stop_id (return a list of Python bools).")
