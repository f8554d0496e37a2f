"""The shared helpers: datasets, labels, the training loop, the checker framework, the viewer."""

import math

import pytest
import torch

from course_utils import IGNORE_INDEX, clip_rate, make_chat_dataset, make_messages, tokenize_chat
from course_utils.checks import Case, close, run_check
from course_utils.data import collate_right, make_batches
from course_utils.training import train
from course_utils.viz import plot_curves, token_viewer


def test_datasets_are_deterministic_and_shaped():
    assert make_messages("add", 5, seed=1) == make_messages("add", 5, seed=1)
    assert make_messages("add", 5, seed=1) != make_messages("add", 5, seed=2)
    conv = make_messages("reverse", 1, seed=0)[0]
    assert [m["role"] for m in conv] == ["user", "assistant"]
    words = conv[0]["content"].split(": ")[1].split()
    assert conv[1]["content"].split() == words[::-1]
    pc = make_chat_dataset("add", 4, form="prompt_completion")
    assert set(pc.column_names) == {"prompt", "completion"} and pc[0]["completion"][0]["role"] == "assistant"


def test_long_tail_has_a_tail():
    lengths = sorted(len(c[0]["content"].split()) for c in make_messages("add", 400, context_words=20,
                                                                           long_tail=True))
    assert lengths[-1] > 4 * lengths[len(lengths) // 2], "the longest prompt dwarfs the median"


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [({"task": "poetry"}, "task"), ({"n": 0}, "n=0"), ({"context_words": -1}, "context_words"),
     ({"long_tail": True}, "long_tail"), ({"n": 2.5}, "n=2.5")],
)
def test_dataset_bad_input(kwargs, word):
    with pytest.raises(ValueError, match="—") as excinfo:
        make_messages(**kwargs)
    assert word in str(excinfo.value)


def test_labels_cover_the_answer_and_end_of_turn(tokenizer):
    conv = make_messages("reverse", 1, seed=0)[0]
    example = tokenize_chat(tokenizer, conv)
    graded = [t for t in example["labels"] if t != IGNORE_INDEX]
    assert tokenizer.decode(graded) == "\n" + conv[1]["content"] + "<|im_end|>\n"
    without_eos = tokenize_chat(tokenizer, conv, train_on_eos=False)
    graded = [t for t in without_eos["labels"] if t != IGNORE_INDEX]
    assert tokenizer.decode(graded) == "\n" + conv[1]["content"]


def test_labels_match_trls_generation_mask(tokenizer):
    """Our prefix-based spans equal the mask of TRL's {% generation %} training template."""
    from trl.chat_template_utils import get_training_chat_template

    template = get_training_chat_template(tokenizer)
    for conv in make_messages("mixed", 5, seed=4, context_words=3):
        ours = tokenize_chat(tokenizer, conv)
        theirs = tokenizer.apply_chat_template(conv, chat_template=template, return_dict=True,
                                               return_assistant_tokens_mask=True)
        assert theirs["input_ids"] == ours["input_ids"]
        assert list(theirs["assistant_masks"]) == ours["assistant_mask"]


def test_truncation_can_erase_every_label(tokenizer):
    conv = make_messages("add", 1, seed=0, context_words=200)[0]
    example = tokenize_chat(tokenizer, conv, max_length=64)
    assert len(example["input_ids"]) == 64 and set(example["labels"]) == {IGNORE_INDEX}


def test_tokenize_and_collate_bad_input(tokenizer):
    with pytest.raises(ValueError, match="list of"):
        tokenize_chat(tokenizer, "hello")
    with pytest.raises(ValueError, match="no examples"):
        collate_right([], 0)


_HI = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(("messages", "says"), [
    ([_HI, {"role": "bot", "content": "4"}], "role 'bot'.*never be graded — rename it 'assistant'"),
    ([{"role": "", "content": "hi"}, {"role": "assistant", "content": "4"}], "role ''"),
    ([{"role": "User", "content": "hi"}, {"role": "assistant", "content": "4"}], "write it 'user'"),
    ([{"x": 1}], "has no 'role'"),
    ([{"role": "user", "content": 3}, {"role": "assistant", "content": "4"}], r"content 3 \(int\), not text"),
    ([{"role": "user", "content": None}, {"role": "assistant", "content": "4"}], "content None"),
    ([{"role": "user"}, {"role": "assistant", "content": "4"}], "has no 'content'"),
])
def test_tokenize_chat_refuses_messages_the_template_cannot_grade(tokenizer, messages, says):
    """An unknown role rendered, and its answer was never graded; a missing role or content was a KeyError or
    a Jinja error from inside the template."""
    from course_utils.data import assistant_char_spans

    with pytest.raises(ValueError, match=says):
        tokenize_chat(tokenizer, messages)
    with pytest.raises(ValueError, match=says):
        assistant_char_spans(tokenizer, messages)


def test_a_tool_calling_turn_may_have_no_content():
    from course_utils import validate

    tool_call = {"function": {"name": "add", "arguments": {}}}
    call = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
    assert validate.chat("messages", [_HI, call]) == [_HI, call]


@pytest.mark.parametrize("value", [None, "yes", 1])
def test_train_on_eos_is_a_flag(tokenizer, value):
    from course_utils.data import assistant_char_spans

    conv = make_messages("add", 1)[0]
    for call in (lambda: tokenize_chat(tokenizer, conv, train_on_eos=value),
                 lambda: make_batches(tokenizer, [conv], 1, train_on_eos=value),
                 lambda: assistant_char_spans(tokenizer, conv, train_on_eos=value)):
        with pytest.raises(TypeError, match="train_on_eos=.* must be True or False"):
            call()


@pytest.mark.parametrize("label", [2.5, 3.0, torch.tensor([1.5, -100.0])])
def test_is_graded_refuses_a_label_that_is_not_an_integer(label):
    from course_utils.data import is_graded

    with pytest.raises(TypeError, match="is not an integer"):
        is_graded(label)
    assert is_graded(5) and not is_graded(IGNORE_INDEX)
    assert is_graded(torch.tensor([5, -100])).tolist() == [True, False]


def test_collate_right_refuses_a_pad_id_no_vocabulary_holds(tokenizer):
    example = tokenize_chat(tokenizer, make_messages("add", 1)[0])
    with pytest.raises(ValueError, match="pad_token_id=10000000 is beyond any vocabulary"):
        collate_right([example], 10 ** 7)


def test_collate_right_pads_labels_with_ignore(tokenizer):
    batch = make_batches(tokenizer, make_messages("mixed", 4, seed=0), batch_size=4)[0]
    pads = batch["attention_mask"] == 0
    assert pads.any() and (batch["labels"][pads] == IGNORE_INDEX).all()
    assert (batch["input_ids"][pads] == tokenizer.pad_token_id).all()


def test_train_records_and_clipping(course, tokenizer):
    from course_utils import load_course_model

    model, _ = load_course_model()
    batches = make_batches(tokenizer, make_messages("mixed", 16, seed=0), batch_size=4)
    records = train(model, batches, steps=3, accum_steps=2, lr=1e-3, max_grad_norm=1e-3)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["clipped"] and r["grad_norm"] > 1e-3 for r in records) and clip_rate(records) == 1.0
    assert all(math.isfinite(r["loss"]) and r["nonfinite"] == 0 for r in records)
    assert records[0]["n_tokens"] == sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches[:2])
    seen = []
    records = train(model, batches, steps=5, lr=1e-3, on_step=lambda step, m: seen.append(step) or step == 2)
    assert seen == [1, 2] and len(records) == 2, "on_step returning True ends training after that step"


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [({"steps": 0}, "steps"), ({"accum_steps": 1.5}, "accum_steps"), ({"normalise": "median"}, "normalise"),
     ({"optimizer": "lion"}, "optimizer"), ({"max_grad_norm": 0}, "max_grad_norm")],
)
def test_train_bad_input(course, kwargs, word):
    model, tokenizer = course
    args = {"steps": 1, **kwargs}
    with pytest.raises(ValueError, match=word):
        train(model, [{"input_ids": torch.zeros(1, 2, dtype=torch.long)}], **args)
    with pytest.raises(ValueError, match="non-empty"):
        train(model, [], steps=1)


def test_clip_rate_needs_records():
    with pytest.raises(ValueError, match="no records"):
        clip_rate([])


@pytest.mark.parametrize(("summed", "n_tokens", "says"), [
    (-3.0, 3, "summed=-3 is negative"),
    (12.0, 0, "summed=12 with n_tokens=0"),
])
def test_micro_batch_loss_refuses_a_sum_no_micro_batch_gives(summed, n_tokens, says):
    from course_utils.training import micro_batch_loss

    with pytest.raises(ValueError, match=says):
        micro_batch_loss(torch.tensor(summed), n_tokens, normalise="token", accum_steps=2,
                         divide_by_accum=True, step_tokens=8)
    # an empty micro-batch (sum 0 over 0 tokens) is the failure lessons 05 and 07 show: still computed
    empty = micro_batch_loss(torch.tensor(0.0), 0, normalise="mean", accum_steps=1, divide_by_accum=True,
                             step_tokens=0)
    assert math.isnan(float(empty))


@pytest.mark.parametrize(("kwargs", "error", "says"), [
    ({"on_step": 3}, TypeError, "on_step must be a function"),
    ({"loss_fn": "mean"}, TypeError, "loss_fn must be a function"),
    ({"progress": None}, TypeError, "progress=None must be True or False"),
    ({"progress": "yes"}, TypeError, "progress='yes' must be True or False"),
    ({"skip_empty": None}, TypeError, "skip_empty=None must be True or False"),
    ({"lr": 0.0}, ValueError, "e.g. lr=0.001"),
])
def test_train_refuses_bad_callbacks_and_flags(course, tokenizer, kwargs, error, says):
    batches = make_batches(tokenizer, make_messages("add", 2), batch_size=2)
    with pytest.raises(error, match=says):
        train(course[0], batches, steps=1, **kwargs)


@pytest.mark.parametrize(("records", "says"), [
    ([{"x": 1}], r"records\[0\] has no 'clipped'"),
    ([3, 4], r"records\[0\] has a int"),
    ([{"clipped": "yes"}], "clipped='yes'"),
])
def test_clip_rate_refuses_records_that_are_not_train_records(records, says):
    with pytest.raises(ValueError, match=says):
        clip_rate(records)


@pytest.mark.parametrize(("kwargs", "error", "says"), [
    ({"max_steps": None}, ValueError, "max_steps=None must be an integer >= 1 .* or -1 to train"),
    ({"progress": "yes"}, TypeError, "progress='yes' must be True or False"),
])
def test_make_sft_trainer_refuses_no_step_count_and_text_flags(course, kwargs, error, says):
    from course_utils.training import make_sft_trainer

    with pytest.raises(error, match=says):
        make_sft_trainer(course[0], course[1], make_chat_dataset("add", n=4), **kwargs)


def test_close_compares_structures():
    assert close(1.0, 1.0 + 1e-9) is None
    assert close([1, {"a": torch.tensor([1.0])}], [1, {"a": torch.tensor([1.0])}]) is None
    assert "max difference" in close(torch.tensor([1.0]), torch.tensor([2.0]))
    assert close(float("nan"), float("nan")) is None
    assert close(True, 1) is not None or close(1, True) is not None


def test_run_check_reports_stub_wrong_and_error(capsys):
    cases = [Case((2,), 4)]

    def stub(x):
        raise NotImplementedError

    assert not run_check("double", stub, cases)
    assert "not implemented" in capsys.readouterr().out
    assert not run_check("double", lambda x: x + 3, cases, diagnose=lambda g, c: "added, not doubled")
    assert "added, not doubled" in capsys.readouterr().out
    assert not run_check("double", lambda x: 1 / 0, cases, hint="divide less")
    assert "ZeroDivisionError" in capsys.readouterr().out
    assert run_check("double", lambda x: 2 * x, cases)
    with pytest.raises(ValueError, match="function itself"):
        run_check("double", 4, cases)


def test_token_viewer_and_plot(tokenizer):
    example = tokenize_chat(tokenizer, make_messages("add", 1)[0])
    html = token_viewer(tokenizer, example["input_ids"], example["labels"]).data
    assert "&lt;|im_end|&gt;" in html and "outline" in html
    with pytest.raises(ValueError, match="mask value"):
        token_viewer(tokenizer, [1, 2], [1])
    ax = plot_curves({"run": [{"step": 1, "loss": 2.0}]}, threshold=1.0)
    assert ax.get_title() == "loss"
    with pytest.raises(ValueError, match="no runs"):
        plot_curves({})


@pytest.mark.parametrize(("call", "error", "says"), [
    (lambda tok: plot_curves({"run": [{"step": 1, "loss": 2.0}]}, key=["loss"]), ValueError,
     "key=\\['loss'\\] is not a non-empty string"),  # unhashable type: 'list' before
    (lambda tok: plot_curves({"run": [{"step": 1, "loss": 2.0}]}, threshold=float("nan")), ValueError,
     "threshold=nan must be a finite number"),
    (lambda tok: plot_curves({"run": [{"step": 1, "loss": 2.0}]}, threshold_label=""), ValueError,
     "threshold_label=''"),
    (lambda tok: plot_curves({"run": [{"step": 1, "loss": 2.0}]}, logy="yes"), TypeError, "logy='yes'"),
    (lambda tok: plot_curves({"run": [3, 4]}), ValueError, "not a non-empty list of records"),
    (lambda tok: token_viewer(tok, ["a", "b"], [1, 1]), TypeError, "input_ids holds 'a'"),
    (lambda tok: token_viewer(tok, [1, 2], ["a", "b"]), TypeError, "mask holds 'a'"),
    (lambda tok: token_viewer(tok, [1, 2], [1, 1], legend=3), ValueError, "legend=3"),
    (lambda tok: token_viewer(tok, [1, 2], [1, 1], highlight="<|im_end|>"), TypeError, "one string"),
])
def test_viz_refuses_what_it_cannot_draw(tokenizer, call, error, says):
    with pytest.raises(error, match=says) as info:
        call(tokenizer)
    assert " — " in str(info.value)


def test_token_viewer_takes_a_boolean_attention_mask(tokenizer):
    html = token_viewer(tokenizer, [1, 2, 3], torch.tensor([True, True, False]), legend="attended").data
    assert "2/3 tokens" in html


@pytest.mark.parametrize(("kwargs", "error", "says"), [
    ({"controls": {"nope": [1, 2]}}, ValueError, "controls \\['nope'\\] are not keywords of the frame"),
    ({"controls": {"kk": [1, 2]}}, ValueError, "did you mean 'k'"),
    ({"width": 3}, ValueError, "width=3 is not a non-empty string"),
    ({"width": ["440px"]}, ValueError, "width=\\['440px'\\]"),
    ({"width": None}, ValueError, "width=None"),
])
def test_what_if_refuses_controls_the_frame_does_not_take_and_a_bad_width(kwargs, error, says):
    from course_utils.viz import what_if

    args = {"controls": {"k": [1, 2]}, **kwargs}
    with pytest.raises(error, match=says):
        what_if(lambda k: f"k={k}", **args)
    with pytest.raises(ValueError, match="the frame needs \\['mode'\\]"):
        what_if(lambda k, mode: "", {"k": [1]})


def test_only_a_lesson_kernel_freezes_its_imports_and_only_once(monkeypatch):
    # load_course_model freezes the imports so that Trainer.train()'s full gc.collect() skips them
    # (0.2-0.3 s a run); a process that never called use_course_defaults() (a user's) is left alone
    import gc

    import course_utils

    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(course_utils, "_imports_frozen", False)
    monkeypatch.setattr(course_utils, "_lesson_kernel", False)
    course_utils.freeze_lesson_imports()
    assert calls == [], "a process that is not a lesson kernel must not have its heap frozen"
    monkeypatch.setattr(course_utils, "_lesson_kernel", True)
    course_utils.load_course_model()
    course_utils.load_course_model()
    assert calls == ["freeze"], calls


def test_a_model_loaded_after_the_freeze_is_still_freed():
    # the freeze happens before a lesson's first model exists: a model (held in reference cycles by
    # transformers' modules) frozen would never be collected — here, one is, once dropped
    import gc
    import weakref

    import course_utils

    model, _ = course_utils.load_course_model()
    assert course_utils._imports_frozen and gc.get_freeze_count() > 0, "the tests run as a lesson kernel"
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None, "a model loaded after the freeze must still be freed"
