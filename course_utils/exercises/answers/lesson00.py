"""Reference answers for lesson 00 (tour), and the generator of exercise 1's labelled examples, which knows
their cause; ``course_utils.exercises.lesson00`` holds the checkers (no notebook imports this module)."""

from __future__ import annotations

import random

from ...checks import Diagnosis
from ...data import IGNORE_INDEX, is_graded, make_messages, tokenize_chat

# What can be wrong with a labelled example in lesson 00: only what the tour showed (the token viewer, the
# graded span, the model shifting labels itself). Lesson 05's all-masked row is not drawn: it comes later.
LABEL_CAUSES = ("correct", "whole_sequence", "stop_token_not_graded", "shifted_labels")


def _messages_for(seed: int, two_exchanges: bool = False) -> list[dict]:
    rng = random.Random(seed)
    task = rng.choice(("add", "reverse"))
    conversation = make_messages(task, 1, seed=seed)[0]
    if rng.random() < 0.5:  # some examples carry their own system prompt
        conversation = [{"role": "system", "content": "You answer briefly."}] + conversation
    if two_exchanges:
        conversation = conversation + make_messages("add", 1, seed=seed + 7)[0]
    return conversation


def labelled_case(tokenizer, seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """A labelled example broken in one of ``LABEL_CAUSES`` ways (or healthy), and its true ``Diagnosis``.

    ``graded=False`` is the stream the notebook shows (``unseen_labelled_example``), ``graded=True`` the
    checker's: the two never draw the same conversation, so matching shown examples grades nothing.
    Healthy controls vary the way a correct pipeline may (a second exchange, the newline after
    ``<|im_end|>`` graded or not), so "the last graded token is <|im_end|>" is no test of the stop token.
    """
    cause = LABEL_CAUSES[seed % len(LABEL_CAUSES)]
    rng = random.Random(seed * 2 + int(graded))
    messages = _messages_for(500_000 * (1 + int(graded)) + seed, two_exchanges=rng.random() < 0.4)
    example = tokenize_chat(tokenizer, messages, train_on_eos=cause != "stop_token_not_graded")
    ids, labels = list(example["input_ids"]), list(example["labels"])
    if rng.random() < 0.5:  # a pipeline that leaves the whitespace after each answer ungraded: still correct
        labels = [IGNORE_INDEX if is_graded(lab) and tokenizer.decode([lab]).strip() == "" else lab
                  for lab in labels]
    if cause == "whole_sequence":
        labels = list(ids)
    elif cause == "shifted_labels":  # "I shift the labels myself": each label is the *next* token
        labels = [ids[i + 1] if i + 1 < len(ids) and is_graded(lab) else IGNORE_INDEX
                  for i, lab in enumerate(labels)]
    artefact = {"input_ids": ids, "labels": labels, "tokens": tokenizer.convert_ids_to_tokens(ids)}
    # the evidence counts the labels that are set, position by position, as the learner reads them in the
    # token viewer (unshifted: a whole-sequence example grades position 0 too)
    return artefact, Diagnosis(cause, sum(is_graded(label) for label in labels))


def diagnose_labels(example: dict) -> Diagnosis:
    """Exercise 1: name what is wrong with a labelled example, and count its graded tokens."""
    ids, labels, tokens = example["input_ids"], example["labels"], example["tokens"]
    graded = [i for i, label in enumerate(labels) if is_graded(label)]
    if any(labels[i] != ids[i] for i in graded):
        return Diagnosis("shifted_labels", len(graded))
    if any(tokens[i] == "<|im_start|>" for i in graded):
        return Diagnosis("whole_sequence", len(graded))
    if not any(tokens[i] == "<|im_end|>" for i in graded):
        return Diagnosis("stop_token_not_graded", len(graded))
    return Diagnosis("correct", len(graded))


def assistant_only_labels(tokenizer, input_ids: list[int]) -> list[int]:
    """Exercise 2: labels equal to the tokens of every assistant answer, from the newline after
    ``<|im_start|>assistant`` through ``<|im_end|>`` and its newline (TRL's generation span); -100
    elsewhere."""
    tokens = tokenizer.convert_ids_to_tokens(input_ids)
    labels = [IGNORE_INDEX] * len(input_ids)
    for i, token in enumerate(tokens):
        if token != "<|im_start|>" or tokenizer.decode(input_ids[i + 1:i + 2]) != "assistant":
            continue
        j = i + 2  # the header <|im_start|>assistant is given at inference: not graded
        while j < len(tokens):
            labels[j] = input_ids[j]
            j += 1
            if tokens[j - 1] == "<|im_end|>":
                break
        if j < len(tokens) and tokenizer.decode(input_ids[j:j + 1]).strip() == "":
            labels[j] = input_ids[j]  # the newline that closes the turn, as TRL's span has it
    return labels
