"""Lesson 00's checkers: every correct answer passes, each typical wrong one is named."""

import pytest
from conftest import stub

from course_utils import tour
from course_utils.answers import lesson00 as answers
from course_utils.checks import Diagnosis
from course_utils.data import IGNORE_INDEX


def _without_newlines(tokenizer, input_ids):
    """A second correct answer: the answer tokens and <|im_end|>, but not the whitespace around them."""
    labels = answers.assistant_only_labels(tokenizer, input_ids)
    return [IGNORE_INDEX if lab != IGNORE_INDEX and tokenizer.decode([lab]).strip() == "" else lab
            for lab in labels]


def _whole(tokenizer, input_ids):
    return list(input_ids)


def _no_stop(tokenizer, input_ids):
    labels = answers.assistant_only_labels(tokenizer, input_ids)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [IGNORE_INDEX if lab == eot else lab for lab in labels]


def _shifted(tokenizer, input_ids):
    labels = answers.assistant_only_labels(tokenizer, input_ids)
    return [input_ids[i + 1] if lab != IGNORE_INDEX and i + 1 < len(input_ids) else IGNORE_INDEX
            for i, lab in enumerate(labels)]


def _first_turn_only(tokenizer, input_ids):
    labels, seen_end = answers.assistant_only_labels(tokenizer, input_ids), False
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for lab in labels:
        out.append(IGNORE_INDEX if seen_end else lab)
        seen_end = seen_end or lab == eot
    return out


@pytest.mark.parametrize("fn", [answers.assistant_only_labels, _without_newlines],
                         ids=["reference", "no-newlines"])
def test_labels_checker_accepts_every_correct_variant(tokenizer, fn):
    assert tour.check_assistant_only_labels(fn, tokenizer)


@pytest.mark.parametrize(("fn", "phrase"), [
    (stub, "not implemented yet"),
    (_whole, "whole sequence"),
    (_no_stop, "never learn to stop"),
    (_shifted, "shifted by one"),
    (_first_turn_only, "every assistant turn"),
])
def test_labels_checker_names_each_misconception(tokenizer, capsys, fn, phrase):
    assert not tour.check_assistant_only_labels(fn, tokenizer)
    assert phrase in capsys.readouterr().out


def _diagnose_other_order(example):
    """A second correct diagnosis: counts first, then looks at the stop token and the header."""
    n = sum(label != IGNORE_INDEX for label in example["labels"])
    rows = zip(example["tokens"], example["labels"], example["input_ids"])
    pairs = [(tok, lab == i) for tok, lab, i in rows if lab != IGNORE_INDEX]
    if n == 0:
        cause = "nothing_graded"
    elif not all(same for _, same in pairs):
        cause = "shifted_labels"
    elif "<|im_start|>" in [tok for tok, _ in pairs]:
        cause = "whole_sequence"
    elif "<|im_end|>" in [tok for tok, _ in pairs]:
        cause = "correct"
    else:
        cause = "stop_token_not_graded"
    return Diagnosis(cause, n)


@pytest.mark.parametrize("fn", [answers.diagnose_labels, _diagnose_other_order], ids=["reference", "other"])
def test_diagnosis_checker_accepts_correct_logic(tokenizer, fn):
    assert tour.check_label_diagnosis(fn, tokenizer)


@pytest.mark.parametrize(("fn", "phrase"), [
    (stub, "not implemented yet"),
    (lambda ex: Diagnosis("correct", sum(lab != IGNORE_INDEX for lab in ex["labels"])), "is not what broke"),
    (lambda ex: answers.diagnose_labels(ex).cause, "expected a Diagnosis"),
    (lambda ex: Diagnosis(answers.diagnose_labels(ex).cause, len(ex["labels"])), "evidence"),
])
def test_diagnosis_checker_rejects_memorised_or_partial_answers(tokenizer, capsys, fn, phrase):
    assert not tour.check_label_diagnosis(fn, tokenizer)
    assert phrase in capsys.readouterr().out


def test_diagnosis_generator_covers_every_cause(tokenizer):
    causes = {tour._labelled_case(tokenizer, seed)[1].cause for seed in range(1000, 1010)}
    assert causes == set(tour.LABEL_CAUSES)
    with pytest.raises(ValueError, match="seed"):
        tour.unseen_labelled_example(tokenizer, -1)


def test_environment_check_needs_no_offline_variable(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    rows = dict((name, ok) for name, ok, _ in tour.check_environment(load_model=False))
    assert rows["nothing downloads at run time"], "the shipped model needs no network, whatever the variable"
    monkeypatch.setenv("COURSE_MODEL", "Qwen/Qwen2.5-0.5B")
    rows = dict((name, ok) for name, ok, _ in tour.check_environment(load_model=False))
    assert not rows["nothing downloads at run time"], "a hub id with the hub on would download"


# ---- lesson 00's "what if": the loss mode x an example chat -> which tokens carry loss -----------------

def _graded_count(text):
    return int(text.split("graded tokens: ")[1].split(" of ")[0])


def test_loss_mode_explorer_grades_what_each_mode_says(tokenizer):
    box = tour.loss_mode_explorer(tokenizer)
    mode, chat, _ = box.children
    start = box.text
    assert start.startswith("full sequence") and "(100%)" in start, "TRL's default grades every token"
    assert start in box._repr_mimebundle_()["text/plain"], "without a frontend: the start frame's text"

    chat.value = "two exchanges"
    counts = {}
    for label in ("full sequence", "completion only", "assistant only"):
        mode.value = label
        counts[label] = _graded_count(box.text)
    assert counts["completion only"] < counts["assistant only"] < counts["full sequence"]
    assert "[<|im_start|>]" not in box.text and box.text.count("[<|im_end|>]") == 2, "both answers, no markup"
    mode.value = "completion only"
    assert box.text.count("[<|im_end|>]") == 1, "a completion is the last turn only"
    assert "assistant\\n[" in box.text, "the generation prompt (with its newline) is part of the prompt"


@pytest.mark.slow  # builds three SFTTrainers (~4 s with the first imports): make test-slow runs it
def test_graded_labels_equal_trls_in_each_mode(course):
    import warnings

    from datasets import Dataset

    from course_utils import make_sft_trainer

    model, tokenizer = course
    chats = list(tour.example_chats(seed=3).values())
    sets = {"full sequence": ({"messages": chats}, {}),
            "completion only": ({"prompt": [c[:-1] for c in chats],
                                 "completion": [c[-1:] for c in chats]}, {}),
            "assistant only": ({"messages": chats}, {"assistant_only_loss": True})}
    for mode, (columns, config) in sets.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = make_sft_trainer(model, tokenizer, Dataset.from_dict(columns), max_steps=1, **config)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(chats))])
        for row, chat in enumerate(chats):
            ours = tour.graded_labels(tokenizer, chat, mode)
            n = len(ours["input_ids"])
            assert batch["input_ids"][row, :n].tolist() == ours["input_ids"], mode
            assert batch["labels"][row, :n].tolist() == ours["labels"], f"{mode}: TRL grades other tokens"


def test_graded_labels_rejects_an_unknown_mode_and_a_completion_without_an_answer(tokenizer):
    chat = tour.example_chats(seed=0)["one exchange"]
    with pytest.raises(ValueError, match="not one of"):
        tour.graded_labels(tokenizer, chat, "prompt only")
    with pytest.raises(ValueError, match="ends with an assistant turn"):
        tour.graded_labels(tokenizer, chat[:1], "completion only")
