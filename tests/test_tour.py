"""Lesson 00 (course_utils.tour): the diagnosis generator, the environment check. The checkers' answers
(reference, stub, second correct, each wrong one) are in test_checkers.py."""

import pytest

from course_utils import tour


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


def test_bytecode_row_fails_only_where_nothing_is_or_will_be_compiled(monkeypatch, tmp_path):
    import sys
    import types

    fresh = types.ModuleType("fresh")
    fresh.__file__ = str(tmp_path / "fresh.py")  # never compiled: no __pycache__/fresh.*.pyc
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert tour._bytecode_row(fresh)[1], "Python will cache it at its first import"
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    name, ok, detail = tour._bytecode_row(fresh)
    assert not ok and "make lab" in detail, "no cache, and none will be written: say how to fix it"
    (tmp_path / "fresh.py").write_text("x = 1\n")
    import py_compile
    py_compile.compile(str(tmp_path / "fresh.py"))
    assert tour._bytecode_row(fresh)[1], "compiled already: imports are fast"


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
