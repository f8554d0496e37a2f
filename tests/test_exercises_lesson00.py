"""Lesson 00's exercises (course_utils.exercises.lesson00): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: tests/test_checkers.py runs them);
the hints; the diagnosis generator covers every cause; bad non-learner arguments are refused."""

import pytest
from conftest import Row, graded_on_tokenizer, tried_twice

from course_utils.checks import Diagnosis
from course_utils.data import IGNORE_INDEX
from course_utils.exercises import lesson00 as ex
from course_utils.exercises.answers import lesson00

# ---- exercise 2 (fix): assistant_only_labels --------------------------------------------------------

def _without_newlines(tokenizer, input_ids):
    """A second correct answer: the answer tokens and <|im_end|>, but not the whitespace around them."""
    labels = lesson00.assistant_only_labels(tokenizer, input_ids)
    return [IGNORE_INDEX if lab != IGNORE_INDEX and tokenizer.decode([lab]).strip() == "" else lab
            for lab in labels]


def _whole(tokenizer, input_ids):
    """Grades the whole sequence: the prompt and the system text carry loss too."""
    return list(input_ids)


def _no_stop(tokenizer, input_ids):
    """Leaves <|im_end|> out of the labels: the model never learns to stop."""
    labels = lesson00.assistant_only_labels(tokenizer, input_ids)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [IGNORE_INDEX if lab == eot else lab for lab in labels]


def _shifted(tokenizer, input_ids):
    """Shifts the labels by hand (labels[i] = input_ids[i + 1]): the model shifts them again."""
    labels = lesson00.assistant_only_labels(tokenizer, input_ids)
    return [input_ids[i + 1] if lab != IGNORE_INDEX and i + 1 < len(input_ids) else IGNORE_INDEX
            for i, lab in enumerate(labels)]


def _first_turn_only(tokenizer, input_ids):
    """Grades the first assistant turn only: later turns of a multi-turn chat are not trained."""
    labels, seen_end = lesson00.assistant_only_labels(tokenizer, input_ids), False
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for lab in labels:
        out.append(IGNORE_INDEX if seen_end else lab)
        seen_end = seen_end or lab == eot
    return out


# ---- exercise 1 (diagnosis): label_diagnosis ----------------------------------------------------------

def _diagnose_other_order(example):
    """A second correct diagnosis: counts first, then looks at the stop token and the header."""
    n = sum(label != IGNORE_INDEX for label in example["labels"])
    rows = zip(example["tokens"], example["labels"], example["input_ids"])
    pairs = [(tok, lab == i) for tok, lab, i in rows if lab != IGNORE_INDEX]
    if not all(same for _, same in pairs):
        cause = "shifted_labels"
    elif "<|im_start|>" in [tok for tok, _ in pairs]:
        cause = "whole_sequence"
    elif "<|im_end|>" in [tok for tok, _ in pairs]:
        cause = "correct"
    else:
        cause = "stop_token_not_graded"
    return Diagnosis(cause, n)


def always_correct(example):
    """Memorised: every example is "correct" (with the right count), whatever its labels show."""
    return Diagnosis("correct", sum(lab != IGNORE_INDEX for lab in example["labels"]))


def cause_without_diagnosis(example):
    """Returns the cause as a bare string instead of a Diagnosis(cause, evidence)."""
    return lesson00.diagnose_labels(example).cause


def counts_every_token(example):
    """Right cause, but the evidence counts every label, -100 included, not the graded tokens."""
    return Diagnosis(lesson00.diagnose_labels(example).cause, len(example["labels"]))


# ---- the tables (tests/test_checkers.py runs them) ---------------------------------------------------

CHECKERS = [
    Row("assistant_only_labels", graded_on_tokenizer(ex.check_assistant_only_labels),
        lesson00.assistant_only_labels),
    Row("label_diagnosis", graded_on_tokenizer(ex.check_label_diagnosis), lesson00.diagnose_labels),
]
ALSO_CORRECT = [("assistant_only_labels", _without_newlines), ("label_diagnosis", _diagnose_other_order)]
WRONG = [
    ("assistant_only_labels", _whole, "whole sequence"),
    ("assistant_only_labels", _no_stop, "never learn to stop"),
    ("assistant_only_labels", _shifted, "shifted by one"),
    ("assistant_only_labels", _first_turn_only, "every assistant turn"),
    ("label_diagnosis", always_correct, "is not what broke"),
    ("label_diagnosis", cause_without_diagnosis, "expected a Diagnosis"),
    ("label_diagnosis", counts_every_token, "evidence"),
]


# ---- hints ------------------------------------------------------------------------------------------

def test_the_first_hint_holds_no_code_and_the_last_level_does(tokenizer, capsys):
    result = tried_twice(ex.check_assistant_only_labels, tokenizer)
    levels = [result.hint() for _ in range(3)]
    assert "labels[i] = input_ids[i]" not in levels[0] and "labels[i] = input_ids[i]" in levels[2]


# ---- the generator ----------------------------------------------------------------------------------

def test_diagnosis_generator_covers_every_cause_and_hands_out_the_artefact_only(tokenizer):
    causes = {lesson00.labelled_case(tokenizer, seed)[1].cause for seed in range(1000, 1010)}
    assert causes == set(ex.LABEL_CAUSES)
    assert "nothing_graded" not in ex.LABEL_CAUSES, "lesson 05's look-alike is not drawn before lesson 05"
    example = ex.unseen_labelled_example(tokenizer, 3)
    assert set(example) == {"input_ids", "labels", "tokens"}, "the public function names no cause"
    assert example == lesson00.labelled_case(tokenizer, 3, graded=False)[0]
    shown = [ex.unseen_labelled_example(tokenizer, seed)["input_ids"] for seed in range(40)]
    graded = [lesson00.labelled_case(tokenizer, seed)[0]["input_ids"] for seed in range(1000, 1012)]
    assert not [ids for ids in graded if ids in shown], "the checker grades examples the notebook never shows"
    assert not hasattr(ex, "_labelled_case") and not hasattr(ex, "labelled_case"), "truth: answers"


# ---- shortcuts a learner has at each exercise (issue 33): each fails the checker ----------------------

def _last_graded_token_is_the_stop(example):
    """The stop token decides: looks at the last graded token only (the newline after <|im_end|> may be
    graded in a healthy example, and a shifted example ends on <|im_end|> too)."""
    graded = [tok for tok, lab in zip(example["tokens"], example["labels"]) if lab != -100]
    cause = "whole_sequence" if graded and graded[0] == "<|im_start|>" else \
        "correct" if graded and graded[-1] == "<|im_end|>" else "stop_token_not_graded"
    return Diagnosis(cause, len(graded))


def _many_graded_is_the_whole_sequence(example):
    """Counts instead of reading the labels: over half graded -> whole sequence; never checks the shift."""
    graded = [tok for tok, lab in zip(example["tokens"], example["labels"]) if lab != -100]
    cause = "whole_sequence" if 2 * len(graded) > len(example["labels"]) else \
        "correct" if "<|im_end|>" in graded else "stop_token_not_graded"
    return Diagnosis(cause, len(graded))


def _whole_sequence_labels(tokenizer, input_ids):
    """The blanket fix: labels = input_ids (what TRL does by default for messages)."""
    return list(input_ids)


def _after_the_first_assistant_header(tokenizer, input_ids):
    """Grades everything after the first '<|im_start|>assistant': a second exchange's user turn too."""
    tokens = tokenizer.convert_ids_to_tokens(input_ids)
    start = next(i for i, t in enumerate(tokens) if t == "<|im_start|>"
                 and tokenizer.decode(input_ids[i + 1:i + 2]) == "assistant") + 2
    return [IGNORE_INDEX] * start + list(input_ids[start:])


def _from_the_last_assistant_header(tokenizer, input_ids):
    """Grades the last assistant turn only (the one a generation would produce)."""
    tokens = tokenizer.convert_ids_to_tokens(input_ids)
    start = max(i for i, t in enumerate(tokens) if t == "<|im_start|>"
                and tokenizer.decode(input_ids[i + 1:i + 2]) == "assistant") + 2
    return [IGNORE_INDEX] * start + list(input_ids[start:])


def _rerendered_with_tokenize_chat(tokenizer, input_ids):
    """Issue 43's shortcut: decode the row, regex its turns back into messages, label them with tokenize_chat
    (the labeller of §2), and fit the result to the row's length."""
    import re

    from course_utils.data import tokenize_chat

    text = tokenizer.decode(input_ids)
    turns = re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", text, re.S)
    labels = tokenize_chat(tokenizer, [{"role": r, "content": c} for r, c in turns])["labels"]
    return (labels + [IGNORE_INDEX] * len(input_ids))[:len(input_ids)]


def _rerendered_exact(tokenizer, input_ids):
    """The same shortcut without fitting the length: tokenize_chat's labels as they come."""
    import re

    from course_utils.data import tokenize_chat

    turns = re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", tokenizer.decode(input_ids), re.S)
    return tokenize_chat(tokenizer, [{"role": r, "content": c} for r, c in turns])["labels"]


SHORTCUTS = [
    ("assistant_only_labels", "decode, regex the turns, tokenize_chat (issue 43)", _rerendered_exact),
    ("assistant_only_labels", "decode, regex, tokenize_chat, fitted to the row's length",
     _rerendered_with_tokenize_chat),
    ("label_diagnosis", "always correct", always_correct),
    ("label_diagnosis", "the last graded token decides", _last_graded_token_is_the_stop),
    ("label_diagnosis", "count the graded tokens, never compare them with input_ids",
     _many_graded_is_the_whole_sequence),
    ("assistant_only_labels", "labels = input_ids (the blanket default)", _whole_sequence_labels),
    ("assistant_only_labels", "all after the first assistant header", _after_the_first_assistant_header),
    ("assistant_only_labels", "the last assistant turn only", _from_the_last_assistant_header),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, tokenizer, capsys):
    check = {"label_diagnosis": ex.check_label_diagnosis,
             "assistant_only_labels": ex.check_assistant_only_labels}[exercise]
    assert not check(function, tokenizer), f"{description} passes exercise {exercise}"


# ---- bad input: what / why / fix (issue 36) ---------------------------------------------------------

# (The diagnosis checker takes no seeds: it draws fresh cases per run; tests/test_checkers.py tries
# the shortcuts.)


@pytest.mark.parametrize("call", [
    lambda tok: ex.check_label_diagnosis(lesson00.diagnose_labels, None),
    lambda tok: ex.check_assistant_only_labels(lesson00.assistant_only_labels, "Qwen/Qwen2.5-0.5B"),
    lambda tok: ex.unseen_labelled_example(None, 0),
], ids=["label_diagnosis", "assistant_only_labels", "unseen_labelled_example"])
def test_a_missing_tokenizer_is_refused(call, tokenizer):
    with pytest.raises(TypeError, match="must be a transformers tokenizer, got .* — "):
        call(tokenizer)


@pytest.mark.parametrize("seed, words", [(None, "seed=None"), (-1, "seed=-1"), ("3", "seed='3'")])
def test_unseen_labelled_example_refuses_a_seed_that_is_not_one(seed, words, tokenizer):
    with pytest.raises(ValueError, match=words):
        ex.unseen_labelled_example(tokenizer, seed)


def test_a_wrong_answer_that_raises_is_reported_not_raised(tokenizer, capsys):
    result = ex.check_assistant_only_labels(lambda tok, ids: ids[10_000], tokenizer)
    assert not result and "your function raised IndexError" in result.message
    result = ex.check_label_diagnosis(lambda example: example["cause"], tokenizer)
    assert not result and "your function raised KeyError" in result.message
