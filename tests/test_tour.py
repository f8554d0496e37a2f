"""Lesson 00's learner tools (course_utils.tour): the environment report, the loss modes. The exercises'
checkers and their generator are tested in test_exercises_lesson00.py."""

import pytest

from course_utils import tour


def test_environment_report_needs_no_offline_variable(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    rows = dict((name, ok) for name, ok, _ in tour.environment_report(load_model=False))
    assert rows["nothing downloads at run time"], "the shipped model needs no network, whatever the variable"
    monkeypatch.setenv("COURSE_MODEL", "Qwen/Qwen2.5-0.5B")
    rows = dict((name, ok) for name, ok, _ in tour.environment_report(load_model=False))
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


# ---- bad input: what / why / fix (issue 36) -------------------------------------------------------

def test_environment_report_refuses_a_string_for_its_switch():
    with pytest.raises(TypeError, match="True or False — "):
        tour.environment_report(load_model="no")  # a non-empty string would have loaded the model


def test_example_chats_refuses_a_negative_seed():
    with pytest.raises(ValueError, match="seed=-1"):
        tour.example_chats(seed=-1)


def test_graded_labels_refuses_a_message_without_content(tokenizer):
    with pytest.raises(ValueError, match="no 'role' and 'content' strings — "):
        tour.graded_labels(tokenizer, [{"role": "user", "text": "hi"}], "full sequence")


def test_loss_mode_frame_refuses_a_typo_in_the_mode(tokenizer):
    chat = tour.example_chats(seed=0)["one exchange"]
    with pytest.raises(ValueError, match="did you mean 'assistant only'"):
        tour.loss_mode_frame(tokenizer, chat, "assistant-only")


def test_loss_mode_explorer_refuses_a_chat_it_could_not_show_in_every_mode(tokenizer):
    """A chat that ends on a user turn has no completion: refused when the control is built, not when
    the learner later moves the dropdown to "completion only"."""
    chats = {"no answer": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValueError, match="ends with an assistant turn"):
        tour.loss_mode_explorer(tokenizer, chats)
    with pytest.raises(ValueError, match="non-empty dict"):
        tour.loss_mode_explorer(tokenizer, {})


def test_graded_text_refuses_mismatched_lengths_and_a_zero_width(tokenizer):
    with pytest.raises(ValueError, match="one label per token"):
        tour.graded_text(tokenizer, [1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="width=0"):
        tour.graded_text(tokenizer, [1, 2], [1, 2], width=0)


def test_uncached_imports_are_a_warning_never_a_failed_environment(monkeypatch, capsys):
    """PYTHONDONTWRITEBYTECODE (Docker images set it) makes kernels start slower; lesson 00's first cell
    must not fail on it."""
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(tour, "_bytecode_row",
                        lambda module: ("imports are cached (bytecode)", False, "hint"))
    rows = tour.environment_report(load_model=False)
    assert dict((name, ok) for name, ok, _ in rows)["imports are cached (bytecode)"] is True
    assert "[WARN] imports are cached (bytecode)" in capsys.readouterr().out


def test_prompt_shares_split_the_whole_sequence_loss_into_prompt_and_answer(course):
    from course_utils import make_messages

    model, tok = course
    chats = make_messages("mixed", 4, seed=3)
    shares = tour.prompt_shares(model, tok, chats)
    assert 0.5 < shares["token_share"] < 1 and 0 < shares["loss_share"] < 1 and shares["gradient_ratio"] > 0
    assert all(p.grad is None for p in model.parameters()), "the caller's model keeps no gradient"
    with pytest.raises(ValueError, match=".+ — .+ — .+"):
        tour.prompt_shares(model, tok, [])
