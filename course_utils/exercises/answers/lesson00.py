"""Reference answers for lesson 00 (tour); ``course_utils.exercises.lesson00`` holds the checkers."""

from __future__ import annotations

from ...checks import Diagnosis
from ...data import IGNORE_INDEX


def diagnose_labels(example: dict) -> Diagnosis:
    """Exercise 1: name what is wrong with a labelled example, and count its graded tokens."""
    ids, labels, tokens = example["input_ids"], example["labels"], example["tokens"]
    graded = [i for i, label in enumerate(labels) if label != IGNORE_INDEX]
    if not graded:
        return Diagnosis("nothing_graded", 0)
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
