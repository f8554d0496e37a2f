"""Lesson 00's exercises: which tokens carry loss in a labelled example (diagnosis), and labelling one
yourself, assistant tokens only (fix).

- ``LABEL_CAUSES``: what can be wrong with a labelled example (the learner picks one);
- ``unseen_labelled_example(tokenizer, seed)``: an example labelled by a pipeline you have not seen, the
  artefact only; ``check_label_diagnosis``: grades a diagnosis function on fresh ones;
- ``check_assistant_only_labels``: grades a labelling function on conversations the notebook never shows.

The examples are generated together with their cause in ``answers/lesson00.py`` (``labelled_case``); only
the checker reads it, on a stream of examples the public ``unseen_labelled_example`` never shows.
"""

from __future__ import annotations

from .. import validate
from ..checks import Case, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import IGNORE_INDEX, end_of_turn_id, is_graded, tokenize_chat
from ..tour import graded_labels
from .answers import lesson00 as _answers

# ------------------------------------------------------------------------------------------------
# Exercise 1 (diagnosis): which tokens carry loss in a labelled example you have not seen?
# ------------------------------------------------------------------------------------------------

LABEL_CAUSES = _answers.LABEL_CAUSES  # what can be wrong with a labelled example (the learner picks one)
_LABEL_MISCONCEPTIONS = {
    ("correct", "stop_token_not_graded"): "every assistant word is graded, but is <|im_end|>? Without it "
                                          "the model never learns to stop (lesson 02).",
    ("correct", "shifted_labels"): "a label must be the token at its own position; compare labels with "
                                   "input_ids where both are set (the model shifts internally).",
    ("whole_sequence", "shifted_labels"): "many tokens carry a label, but do the labels equal the tokens "
                                          "at their positions?",
    ("correct", "whole_sequence"): "look at the system and user turns: do they carry labels?",
    ("stop_token_not_graded", "correct"): "find <|im_end|> right after the answer: it is graded here (the "
                                          "newline after it may or may not be: both are correct).",
}


def unseen_labelled_example(tokenizer, seed: int) -> dict:
    """An example labelled by a data pipeline you have not seen — possibly broken (exercise 1).

    Returns ``input_ids``, ``labels`` and ``tokens`` (the token strings). The checker grades your
    diagnosis on other seeds, so look at the labels, not at this function.
    """
    validate.tokenizer("tokenizer", tokenizer)
    return _answers.labelled_case(tokenizer, validate.seed("seed", seed), graded=False)[0]


def check_label_diagnosis(fn, tokenizer):
    """Checker for exercise 1: ``fn(example) -> Diagnosis(cause, evidence)`` with ``cause`` one of
    ``LABEL_CAUSES`` and ``evidence`` the number of tokens that carry loss. Graded on twelve cases drawn
    fresh on every run, three per cause, healthy controls included (no keyword fixes them: see
    ``checks.fresh_seeds``)."""
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    validate.tokenizer("tokenizer", tokenizer)
    return check_diagnosis(
        "diagnose_labels", fn, lambda seed: _answers.labelled_case(tokenizer, seed),
        seeds=lambda: fresh_seeds(3 * len(LABEL_CAUSES)),
        misconceptions=_LABEL_MISCONCEPTIONS,
        hint=Hints("Open the token viewer of §2 beside this example: which property of a correct labelling "
                   "could a broken pipeline lose?",
                   "Compare example['labels'] with example['input_ids'] position by position; the token "
                   "viewer of §2 shows what a correct example looks like.",
                   "graded = [i for i, l in enumerate(labels) if l != -100]; a label != input_ids[i] -> "
                   "shifted_labels; a graded <|im_start|> -> "
                   "whole_sequence; <|im_end|> after the answer not graded -> stop_token_not_graded; "
                   "else correct. Evidence: len(graded)."))


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): label an example yourself, assistant tokens only
# ------------------------------------------------------------------------------------------------

def _whitespace(tokenizer, token_id: int) -> bool:
    return tokenizer.decode([token_id]).strip() == ""


def _label_cases(tokenizer) -> list[Case]:
    """Rows as a real pipeline hands them to a labeller: whole chats, a chat cut by ``max_length`` inside
    its last answer, and a chat padded to its batch's width. The last two are why the exercise is done on
    the ids: decoding a row and re-rendering its messages (``tokenize_chat``) does not give back those ids
    (a cut answer has no ``<|im_end|>``; the pads are not a turn), so it labels the wrong positions."""
    cases = []
    for seed, extra_turn, layout in ((2001, False, "whole"), (2002, True, "whole"), (2003, True, "cut"),
                                     (2004, False, "padded"), (2005, True, "padded"), (2006, False, "cut")):
        messages = _answers._messages_for(seed, two_exchanges=extra_turn)  # a second exchange: both graded
        example = tokenize_chat(tokenizer, messages)
        ids, labels = list(example["input_ids"]), list(example["labels"])
        if layout == "cut":  # max_length cuts the last answer after its first token, as TRL truncates
            last_answer = max(i for i, label in enumerate(labels) if label == IGNORE_INDEX) + 1
            ids, labels = ids[:last_answer + 2], labels[:last_answer + 2]  # its newline + 1 token
        elif layout == "padded":  # right-padded to a longer row of its batch with the pad token
            n_pad = 5 + seed % 4
            ids, labels = ids + [tokenizer.pad_token_id] * n_pad, labels + [IGNORE_INDEX] * n_pad
        tag = "multi_turn" if extra_turn else "single_turn"
        shape = {"whole": "whole", "cut": "cut by max_length inside the last answer",
                 "padded": "right-padded"}[layout]
        label = f"{'two exchanges' if extra_turn else 'one exchange'}, {shape}, seed {seed}"
        cases.append(Case((tokenizer, ids), (ids, labels), label=label, tag=f"{tag}_{layout}"))
    return cases


# The exercise writes a label array position by position (TRL's convention, unshifted), so the checks
# below compare labels at their own positions rather than through data.graded (which drops column 0).

def _compare_labels(tokenizer):
    """Accept every correct variant: the graded set must hold each answer token and its <|im_end|>,
    may add or leave out the whitespace around them, and nothing else; labels equal the tokens."""
    def compare(got, expected) -> str | None:
        ids, expected = expected
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"expected a list of {len(expected)} labels (one per token), got {got!r:.120}"
        graded = {i for i, label in enumerate(got) if is_graded(label)}
        reference = {i for i, label in enumerate(expected) if is_graded(label)}
        core = {i for i in reference if not _whitespace(tokenizer, ids[i])}
        wrong = [i for i in graded if int(got[i]) != ids[i]]
        if wrong:
            return f"position {wrong[0]}: label {got[wrong[0]]} but the token there is {ids[wrong[0]]}"
        if not core <= graded:
            missing = tokenizer.decode([ids[min(core - graded)]])
            return f"{len(core - graded)} assistant token(s) carry no loss, e.g. {missing!r}"
        if graded - reference:
            extra = tokenizer.decode([ids[min(graded - reference)]])
            n_extra = len(graded - reference)
            return f"{n_extra} token(s) outside the assistant's answers carry loss, e.g. {extra!r}"
        return None
    return compare


def _diagnose_labels(tokenizer):
    eot = end_of_turn_id(tokenizer)

    def diagnose(got, case) -> str | None:
        ids = case.args[1]
        if isinstance(got, (list, tuple)) and len(got) != len(ids):
            return (f"{len(got)} labels for {len(ids)} ids: label the ids you are given, position by "
                    "position. Decoding the row and re-rendering its messages gives other ids when the row "
                    "was cut by "
                    "max_length (no closing <|im_end|>) or padded to its batch's width.")
        if not isinstance(got, (list, tuple)):
            return None
        graded = [i for i, label in enumerate(got) if is_graded(label)]
        if graded and all(int(got[i]) == ids[i + 1] for i in graded if i + 1 < len(ids)) and \
                any(int(got[i]) != ids[i] for i in graded):
            return ("your labels are shifted by one: don't shift them, the model does "
                    "(logit t predicts label t+1).")
        if len(graded) == len(ids):
            return "you graded the whole sequence: system and user tokens would carry loss too."
        if all(ids[i] != eot for i in graded):
            return ("<|im_end|> after each answer carries no loss: the model would never learn to stop "
                    "(lesson 02).")
        if case.tag.startswith("multi_turn") and any(
                is_graded(int(e)) and not is_graded(int(g)) for g, e in zip(got, case.expected[1])):
            return "only part of the conversation's answers is graded: every assistant turn carries loss."
        return None
    return diagnose


def check_assistant_only_labels(fn, tokenizer):
    """Checker for exercise 2: ``fn(tokenizer, input_ids) -> labels`` grades exactly the assistant's
    answers and their ``<|im_end|>`` (whitespace around them either way), -100 elsewhere."""
    validate.function("fn", fn)  # not an answer yet: a value the checker cannot call
    validate.tokenizer("tokenizer", tokenizer)
    return run_check(
        "assistant_only_labels", lambda tok, ids: fn(tok, list(ids)), lambda: _label_cases(tokenizer),
        compare=_compare_labels(tokenizer), diagnose=_diagnose_labels(tokenizer),
        hint=Hints("Which token opens an assistant turn, and which one closes it? What should a label be at "
                   "a position that carries loss?",
                   "Print tokenizer.convert_ids_to_tokens(input_ids) for one example, find '<|im_start|>' "
                   "followed by 'assistant', and the next '<|im_end|>'.",
                   "walk the tokens; after <|im_start|> + assistant (+ newline) set labels[i] = input_ids[i] "
                   "up to and including the next <|im_end|>; -100 everywhere else."),
        out_of_reach=(tokenize_chat, graded_labels))
