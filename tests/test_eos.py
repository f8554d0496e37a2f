"""Tests for course_utils.eos (lesson 02): the stop helpers, the masks, and the bad input each public
function refuses (issue 36). The exercises' checkers and generator: test_exercises_lesson02.py."""

import copy

import pytest
import torch

from course_utils.eos import (
    StopCriterion,
    answer_accuracy,
    chat_prompts,
    generate_greedy,
    graded_span_has_stop,
    graded_span_text,
    plain_text_batches,
    plain_text_example,
    reply,
    stop_criterion_callback,
    stop_probability,
    stop_rate,
    stop_token_ids,
    train_until_stops,
    untrained_stop_template,
)
from course_utils.exercises.answers import lesson02 as answers
from course_utils.model import give_base_convention, is_instruct_checkpoint, load_base_checkpoint


@pytest.fixture(scope="module")
def tok(course):  # `course` is the session-wide (model, tokenizer) of tests/conftest.py
    return course[1]


# --- exercise 1: stop ids -------------------------------------------------------------------------

def test_stop_token_ids_reference(tok):
    from transformers import GenerationConfig

    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(tok) == [tok.eos_token_id, im_end]
    base = GenerationConfig(eos_token_id=tok.eos_token_id)
    instruct = GenerationConfig(eos_token_id=[im_end, tok.eos_token_id])
    assert answers.stop_ids_for_generate(tok, base) == [tok.eos_token_id, im_end]
    assert answers.stop_ids_for_generate(tok, instruct) == [im_end, tok.eos_token_id], "nothing added twice"
    assert answers.stop_ids_for_generate(tok, GenerationConfig()) == [tok.eos_token_id, im_end]


def test_stop_ids_add_nothing_for_a_template_that_closes_turns_in_plain_text(tok):
    """A template whose turns end in plain text (no special token after the answer): no id can stop there,
    so the reference adds nothing to the checkpoint's own list (lesson 02 exercise 1's new case)."""
    from transformers import GenerationConfig

    plain = copy.deepcopy(tok)
    plain.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert answers.stop_ids_for_generate(plain, GenerationConfig(eos_token_id=tok.eos_token_id)) == [
        tok.eos_token_id]


# --- helpers --------------------------------------------------------------------------------------

def test_a_reply_ends_at_a_llama_style_eos_too():
    """With eos = "</s>" (no <|endoftext|> in the vocabulary) a stopped reply's text ends with "</s>": the
    reply and the accuracy read the answer without it."""
    record = {"ids": [1, 2], "text": "81</s>", "n_new": 2, "ended": True, "opened_turn": False,
              "stopped": True}
    assert reply(record) == "81"
    conv = [{"role": "user", "content": "23 plus 58"}, {"role": "assistant", "content": "81"}]
    assert answer_accuracy([record], [conv]) == 1.0


def _instruct_copy(course):
    """The course model with the instruct convention, as Qwen2.5-Instruct ships it: eos = <|im_end|> in the
    tokenizer and both configs, pad = <|endoftext|>."""
    model, tok = copy.deepcopy(course[0]), copy.deepcopy(course[1])
    tok.eos_token = "<|im_end|>"
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


def test_the_base_convention_is_given_to_an_instruct_checkpoint_only(course):
    """A base checkpoint is left alone; an instruct one gets eos = its end of document in all three places:
    lessons 02 and 08 reproduce a base checkpoint's failure on whatever COURSE_MODEL holds."""
    model, tok = copy.deepcopy(course[0]), copy.deepcopy(course[1])
    base = (tok.eos_token, model.config.eos_token_id, model.generation_config.eos_token_id)
    assert not is_instruct_checkpoint(tok) and not give_base_convention(model, tok)
    assert (tok.eos_token, model.config.eos_token_id, model.generation_config.eos_token_id) == base
    model, tok = _instruct_copy(course)
    assert is_instruct_checkpoint(tok) and give_base_convention(model, tok)
    assert (tok.eos_token, model.config.eos_token_id, model.generation_config.eos_token_id) == base
    assert not is_instruct_checkpoint(tok)
    tok.chat_template = None
    assert not is_instruct_checkpoint(tok), "no template, no end of turn: nothing to call instruct"


def test_the_document_end_is_found_by_name_when_pad_is_eos(course):
    """Without a pad of its own the end of document is looked up by name; with none, a clear error."""
    model, tok = _instruct_copy(course)
    tok.pad_token = tok.eos_token
    assert give_base_convention(model, tok) and tok.eos_token == "<|endoftext|>"
    model, tok = _instruct_copy(course)
    tok.pad_token = tok.eos_token
    vocab = tok.get_vocab()
    tok.get_vocab = lambda: {k: v for k, v in vocab.items() if k != "<|endoftext|>"}
    with pytest.raises(ValueError, match="no end-of-document token"):
        give_base_convention(model, tok)


def test_load_base_checkpoint_loads_a_saved_base_copy_of_an_instruct_checkpoint(tmp_path, course, capsys):
    """The copy is on disk, so what reloads the base by path (an adapter's base, lesson 10) gets it too; one
    line says so, once; a base checkpoint loads as it is, silently."""
    from course_utils import load_course_model

    model, tok = _instruct_copy(course)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_base_checkpoint(str(tmp_path))
    assert loaded_tok.eos_token == "<|endoftext|>" == load_course_model(loaded.name_or_path)[1].eos_token
    assert load_course_model(loaded.name_or_path)[0].generation_config.eos_token_id == loaded_tok.eos_token_id
    assert "instruct convention" in capsys.readouterr().out
    again, _ = load_base_checkpoint(str(tmp_path))
    assert again.name_or_path == loaded.name_or_path and capsys.readouterr().out == "", "saved and said once"
    assert load_base_checkpoint()[0].name_or_path == course[0].name_or_path
    assert capsys.readouterr().out == "", "a base checkpoint loads as it is, silently"


def test_untrained_stop_template_moves_im_end_out_of_the_mask(tok):
    from trl.chat_template_utils import is_chat_template_stop_token_trained, qwen2_5_training_chat_template

    broken = untrained_stop_template(qwen2_5_training_chat_template)
    conv = [{"role": "user", "content": "What is 1 + 2?"}, {"role": "assistant", "content": "3"}]
    assert (tok.apply_chat_template(conv, tokenize=False, chat_template=broken)
            == tok.apply_chat_template(conv, tokenize=False, chat_template=qwen2_5_training_chat_template))
    assert is_chat_template_stop_token_trained(tok, qwen2_5_training_chat_template)
    assert not is_chat_template_stop_token_trained(tok, broken)
    with pytest.raises(ValueError, match="qwen2_5 training template"):
        untrained_stop_template(tok.chat_template)


def test_pad_id_collator_masks_every_eos(tok):
    from transformers import DataCollatorForLanguageModeling
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling as TRLCollator

    from course_utils import make_messages

    convs = make_messages("mixed", 6, seed=3)
    trap = plain_text_batches(tok, convs, 6, DataCollatorForLanguageModeling(tok, mlm=False))[0]
    fixed = plain_text_batches(tok, convs, 6, TRLCollator(pad_token_id=tok.pad_token_id))[0]
    assert graded_span_has_stop(trap, tok.eos_token_id) == [False] * 6
    assert graded_span_has_stop(fixed, tok.eos_token_id) == [True] * 6
    assert graded_span_text(tok, fixed["input_ids"][0], fixed["labels"][0]).endswith("<|endoftext|>")
    with pytest.raises(ValueError, match="batch_size"):
        plain_text_batches(tok, convs, 0, TRLCollator(pad_token_id=tok.pad_token_id))


def test_generate_greedy_records_stops(course):
    model, tok = course
    prompts = ["### Question: What is 1 + 2?\n### Answer:", "the words red cat"]
    every_id = list(range(len(tok)))     # any token stops: one new token per row
    records = generate_greedy(model, tok, prompts, max_new_tokens=5, eos_token_id=every_id)
    assert [r["n_new"] for r in records] == [1, 1] and stop_rate(records) == 1.0
    assert tok.padding_side == "right", "generate_greedy restores the tokenizer's padding side"
    with pytest.raises(ValueError, match="prompts"):
        generate_greedy(model, tok, [], max_new_tokens=5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_greedy(model, tok, prompts, max_new_tokens=0)
    with pytest.raises(ValueError, match="non-empty list"):
        stop_rate([])


def test_a_reply_that_opens_a_turn_is_not_a_stop():
    records = [{"text": "42<|im_end|>", "ended": True, "opened_turn": False, "stopped": True},
               {"text": "<|im_start|>assistant\n7<|im_end|>", "ended": True, "opened_turn": True,
                "stopped": False}]
    assert stop_rate(records) == 0.5
    convs = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}],
             [{"role": "user", "content": "q"}, {"role": "assistant", "content": "7"}]]
    assert reply(records[0]) == "42"
    assert answer_accuracy(records, convs) == 0.5, "a reply that opened a turn is not a correct answer"
    with pytest.raises(ValueError, match="conversations"):
        answer_accuracy(records, convs[:1])


def test_stop_probability_reads_the_last_stop_token(course):
    from course_utils import make_batches, make_messages

    model, tok = course
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    batch = make_batches(tok, make_messages("mixed", 3, seed=5), 3)[0]
    p = stop_probability(model, batch, eot)
    assert p.shape == (3,) and bool(((p >= 0) & (p <= 1)).all())
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"][:1], attention_mask=batch["attention_mask"][:1]).logits
    last = int((batch["input_ids"][0] == eot).nonzero()[-1, 0])
    assert torch.isclose(p[0], logits[0, last - 1].softmax(-1)[eot], atol=1e-5)
    no_stop = dict(batch, input_ids=torch.where(batch["input_ids"] == eot, 5, batch["input_ids"]))
    with pytest.raises(ValueError, match="contain no token"):
        stop_probability(model, no_stop, eot)


def test_train_until_stops_respects_cap_and_criterion(course):
    from course_utils import load_course_model, make_batches, make_messages

    model, tok = load_course_model()
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    batches = make_batches(tok, make_messages("mixed", 8, seed=1), 4)
    fit = train_until_stops(model, batches, StopCriterion(batches[0], eot, level=1.0), lr=1e-3, chunk=2,
                            max_steps=3)
    assert fit["steps"] == 3 and not fit["reached"], "an unreachable level stops at the cap"
    assert [r["step"] for r in fit["records"]] == [1, 2, 3]
    fit = train_until_stops(model, batches, StopCriterion(batches[0], eot, level=1e-9), lr=1e-3, chunk=2,
                            max_steps=10)
    assert fit["steps"] == 2 and fit["reached"], "a met criterion stops at the first check"
    assert fit["stop_rate"] is None, "no prompts, no generation check"
    with pytest.raises(ValueError, match="max_steps"):
        train_until_stops(model, batches, StopCriterion(batches[0], eot), lr=1e-3, max_steps=0)
    with pytest.raises(ValueError, match="StopCriterion"):
        train_until_stops(model, batches, batches[0], lr=1e-3)
    with pytest.raises(ValueError, match="every"):
        stop_criterion_callback(StopCriterion(batches[0], eot), every=0)
    with pytest.raises(ValueError, match="together"):
        StopCriterion(batches[0], eot, tokenizer=tok)


def test_stop_criterion_also_needs_the_models_own_replies_to_stop(course):
    """With prompts, a high teacher-forced P(stop) is not enough: the greedy replies must stop too."""
    from course_utils import make_batches, make_messages

    model, tok = course
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    convs = make_messages("mixed", 4, seed=2)
    probe = make_batches(tok, convs, 4)[0]
    crit = StopCriterion(probe, eot, level=1e-9, tokenizer=tok, prompts=chat_prompts(tok, convs),
                         max_new_tokens=3)
    model.train()
    measured = crit.measure(model)
    assert model.training, "measure() leaves the train/eval mode as it found it"
    replies = generate_greedy(model, tok, chat_prompts(tok, convs), max_new_tokens=3,
                              eos_token_id=[tok.eos_token_id, eot], turn_markers=("<|im_start|>",))
    assert measured["stop_rate"] == stop_rate(replies), "the stop rate with the eos list"
    assert crit.met(dict(measured, stop_rate=0.0)) is False, "both measurements must reach the level"
    assert crit.met(dict(measured, stop_rate=1.0)) is True
    unreachable = StopCriterion(probe, eot, level=1.0, tokenizer=tok, prompts=chat_prompts(tok, convs),
                                max_new_tokens=3)
    assert unreachable.measure(model, lazy=True)["stop_rate"] is None, "lazy: no generations below the level"
    assert unreachable.measure(model)["stop_rate"] == measured["stop_rate"], "in full: the same generations"
    assert crit.measure(model, lazy=True) == measured, "lazy at or above the level: the full measurement"
    fit = train_until_stops(model, make_batches(tok, convs, 2), unreachable, lr=1e-3, chunk=1, max_steps=2)
    assert [h[2] is None for h in fit["history"]] == [True, False], "lazy between steps, in full at the cap"


# ---- the "what if" control: another eos list for generate() ---------------------------------------

def test_stop_explorer_generates_each_setting_and_prints_its_start(course):
    from course_utils.eos import stop_explorer

    model, tokenizer = course
    prompts = chat_prompts(tokenizer, [[{"role": "user", "content": "What is 2 + 2?"}]])
    # every token is a stop token in the second list: generation must stop at once
    everything = list(range(model.config.vocab_size))
    control = stop_explorer({"course model": model}, tokenizer, prompts,
                            {"generation_config": None, "every token": everything}, max_new_tokens=4)
    assert "stop rate" in control._repr_mimebundle_()["text/plain"]
    control.children[1].value = "every token"
    assert control.text.splitlines()[0].startswith("stop rate 1.00"), "a reply ends on its first token"


@pytest.mark.parametrize("models, eos_choices", [({}, {"x": None}), ({"m": 1}, []), ("model", {"x": None})])
def test_stop_explorer_rejects_empty_or_non_dict_choices(course, models, eos_choices):
    from course_utils.eos import stop_explorer

    with pytest.raises(ValueError, match="non-empty dict"):
        stop_explorer(models, course[1], ["hi"], eos_choices)


# ---- bad input (issue 36): refused with what — why — fix, never a silently wrong result -----------------

WHAT_WHY_FIX = r"(?s).+ — .+ — .+"


def _refused(error, phrase, fn, *args, **kwargs):
    with pytest.raises(error, match=phrase) as info:
        fn(*args, **kwargs)
    assert __import__("re").match(WHAT_WHY_FIX, str(info.value)), str(info.value)
    return str(info.value)


def test_stop_token_ids_refuses_what_is_not_a_tokenizer():
    _refused(TypeError, "transformers tokenizer", stop_token_ids, None)


def test_reply_refuses_one_string_for_the_stop_strings():
    """A single string was iterated character by character: "<|im_end|>" cut at the first '<', '|', 'i'…"""
    record = {"text": "time is 5<|im_end|>", "stopped": True}
    message = _refused(TypeError, "one string, not a list", reply, record, stop_strings="<|im_end|>")
    assert "['<|im_end|>']" in message, "the fix names the list to pass"
    assert reply(record, stop_strings=("<|im_end|>",)) == "time is 5"
    _refused(ValueError, "empty string", reply, record, stop_strings=("",))
    _refused(TypeError, "pass one of them", reply, [record])


def test_reply_refuses_no_stop_strings():
    """An empty list cut nothing: the reply came back with the stop token and what followed it."""
    record = {"text": "4<|im_end|>", "stopped": True}
    _refused(ValueError, "stop_strings is empty", reply, record, stop_strings=[])


@pytest.mark.parametrize(("helper", "name"), [("graded_span_has_stop", "stop_id"),
                                              ("eos_labels_kept", "eos_id")])
def test_stop_ids_beyond_any_vocabulary_are_refused(helper, name):
    """Only ids at hand: 10**7 indexes no vocabulary (every row read False, or (0, 0), before)."""
    import course_utils.eos as eos

    batch = {"input_ids": torch.tensor([[5, 9, 0]]), "attention_mask": torch.tensor([[1, 1, 1]]),
             "labels": torch.tensor([[5, 9, -100]])}
    _refused(ValueError, f"{name}=10000000 is beyond any vocabulary", getattr(eos, helper), batch, 10 ** 7)


@pytest.mark.parametrize(("kwargs", "error", "says"), [
    ({"prompts": [""]}, ValueError, r"prompts\[0\] is empty"),
    ({"max_tokens": 5}, TypeError, "got \\['max_tokens'\\] — not a generate.*use 'max_new_tokens'"),
    ({"eos_token_id": 600}, ValueError, "eos_token_id=600 is beyond the 523 token ids of the model"),
])
def test_generate_greedy_refuses_empty_prompts_and_unknown_keywords(course, kwargs, error, says):
    model, tok = course
    args = {"prompts": ["hi"], "max_new_tokens": 2, **kwargs}
    _refused(error, says, generate_greedy, model, tok, **args)
    assert generate_greedy(model, tok, ["hi"], max_new_tokens=2, repetition_penalty=1.1)  # a real keyword


def test_stop_criterion_refuses_a_percentage_level(course):
    from course_utils import make_batches, make_messages

    model, tok = course
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    probe = make_batches(tok, make_messages("mixed", 2, seed=1), 2)[0]
    message = _refused(ValueError, "looks like a percentage", StopCriterion, probe, eot, level=80)
    assert "pass level=0.8" in message
    _refused(ValueError, "level=0 ", StopCriterion, probe, eot, level=0)
    _refused(ValueError, "fraction between 0 and 1", StopCriterion, probe, eot, level=1.5)
    _refused(TypeError, "token string", StopCriterion, probe, "<|im_end|>")
    _refused(ValueError, "contain no token", StopCriterion, probe, 7)  # no row holds token 7
    _refused(TypeError, "one string", StopCriterion, probe, eot, tokenizer=tok, prompts="hi")
    _refused(ValueError, "beyond the 523 token ids of the tokenizer", StopCriterion, probe, 10_000,
             tokenizer=tok, prompts=["hi"])
    criterion = StopCriterion(probe, eot)
    _refused(TypeError, "torch model", criterion.measure, tok)
    _refused(TypeError, "measure\\(model\\) returns", criterion.met, 0.9)


def test_generation_refuses_ids_beyond_the_embedding_and_other_slips(course):
    model, tok = course
    prompts = chat_prompts(tok, [[{"role": "user", "content": "What is 2 + 2?"}]])
    _refused(ValueError, "beyond the 523 token ids", generate_greedy, model, tok, prompts,
             eos_token_id=[0, 523])
    _refused(TypeError, "token string", generate_greedy, model, tok, prompts, eos_token_id="<|im_end|>")
    _refused(ValueError, "lists no stop id", generate_greedy, model, tok, prompts, eos_token_id=[])
    _refused(TypeError, "one string", generate_greedy, model, tok, prompts[0])
    _refused(TypeError, "one string", generate_greedy, model, tok, prompts, turn_markers="<|im_start|>")
    _refused(TypeError, "sets \\['do_sample'\\] itself", generate_greedy, model, tok, prompts, do_sample=True)
    _refused(TypeError, "torch model", generate_greedy, tok, model, prompts)
    bigger = copy.deepcopy(tok)
    bigger.add_tokens([f"<new_{i}>" for i in range(8)])
    _refused(ValueError, "different checkpoints", generate_greedy, model, bigger, prompts)
    no_pad = copy.deepcopy(tok)
    no_pad.pad_token = None
    _refused(ValueError, "no pad token", generate_greedy, model, no_pad, prompts * 2)


def test_stop_probability_refuses_ids_the_model_cannot_read_or_write(course):
    from course_utils import make_batches, make_messages

    model, tok = course
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    batch = make_batches(tok, make_messages("mixed", 2, seed=5), 2)[0]
    _refused(ValueError, "beyond the 523 token ids", stop_probability, model, batch, 523)
    _refused(TypeError, "token string", stop_probability, model, batch, "<|im_end|>")
    foreign = dict(batch, input_ids=batch["input_ids"].clone())
    foreign["input_ids"][0, 1] = 600
    _refused(ValueError, "has only 523 embeddings", stop_probability, model, foreign, eot)
    first_only = dict(batch, input_ids=torch.where(batch["input_ids"] == eot, 5, batch["input_ids"]))
    first_only["input_ids"][:, 0] = eot
    _refused(ValueError, "only at position 0", stop_probability, model, first_only, eot)


def test_train_until_stops_refuses_a_bad_run_before_training(course):
    from course_utils import make_batches, make_messages

    model, tok = course
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    batches = make_batches(tok, make_messages("mixed", 4, seed=1), 2)
    criterion = StopCriterion(batches[0], eot)
    _refused(ValueError, "lr=-0.001", train_until_stops, model, batches, criterion, lr=-1e-3)
    _refused(ValueError, "non-empty list", train_until_stops, model, [], criterion, lr=1e-3)
    foreign = [dict(b, input_ids=b["input_ids"] + 600) for b in batches]
    _refused(ValueError, "has only 523 embeddings", train_until_stops, model, foreign, criterion, lr=1e-3)
    _refused(ValueError, "chunk=0", train_until_stops, model, batches, criterion, lr=1e-3, chunk=0)


def test_records_and_conversations_are_checked(tok):
    _refused(TypeError, "not a generation record", stop_rate, ["42<|im_end|>"])
    _refused(ValueError, "non-empty list", stop_rate, {"text": "42", "stopped": True})
    records = [{"text": "42<|im_end|>", "stopped": True}]
    no_answer = [[{"role": "user", "content": "q"}]]
    _refused(ValueError, "no 'assistant' message", answer_accuracy, records, no_answer)
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
    _refused(TypeError, "wrap it: \\[conversation\\]", chat_prompts, tok, conversation)
    _refused(TypeError, "wrap it", answer_accuracy, records, conversation[:1])
    assert answer_accuracy(records, [conversation]) == 1.0
    no_template = copy.deepcopy(tok)
    no_template.chat_template = None
    _refused(ValueError, "no chat_template", chat_prompts, no_template, [conversation])


def test_graded_span_text_reads_one_row_with_the_shift(tok):
    ids = tok("### Answer: 42", add_special_tokens=False)["input_ids"]
    labels = list(ids)  # every label set: column 0 is still no target (nothing predicts it)
    assert graded_span_text(tok, ids, labels) == tok.decode(ids[1:])
    masked = torch.tensor([-100, -100] + ids[2:])
    assert graded_span_text(tok, torch.tensor(ids), masked) == tok.decode(ids[2:])
    _refused(ValueError, "must be one row", graded_span_text, tok, torch.tensor([ids]),
             torch.tensor([labels]))
    _refused(ValueError, "one label per token", graded_span_text, tok, ids, labels[:-1])
    _refused(ValueError, "another tokenizer", graded_span_text, tok, ids + [9999], labels + [9999])
    _refused(TypeError, "integer token ids", graded_span_text, tok, "### Answer", labels)


def test_graded_span_has_stop_counts_graded_labels_only(tok):
    eos = tok.eos_token_id
    rows = torch.tensor([[eos, 5, 6], [5, 6, eos]])
    batch = {"input_ids": rows, "labels": rows.clone()}
    assert graded_span_has_stop(batch, eos) == [False, True], "column 0 is never a target"
    _refused(TypeError, "token string", graded_span_has_stop, batch, "<|endoftext|>")
    _refused(ValueError, "has no \\['labels'\\]", graded_span_has_stop, {"input_ids": rows}, eos)


def test_plain_text_helpers_refuse_a_tokenizer_without_eos_and_a_bad_collator(tok):
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
    no_eos = copy.deepcopy(tok)
    no_eos.eos_token = None
    _refused(ValueError, "no eos_token", plain_text_example, no_eos, conversation)
    _refused(ValueError, "no 'assistant' message", plain_text_example, tok, conversation[:1])
    _refused(TypeError, "must be a function", plain_text_batches, tok, [conversation], 1, "collator")
    _refused(ValueError, "without input_ids, attention_mask and labels", plain_text_batches, tok,
             [conversation], 1, lambda rows: {"input_ids": rows})
    _refused(TypeError, "wrap it", plain_text_batches, tok, conversation, 1, lambda rows: rows)
    _refused(TypeError, "chat template string", untrained_stop_template, None)


def test_stop_explorer_refuses_an_eos_choice_beyond_the_embedding(course):
    from course_utils.eos import stop_explorer

    model, tok = course
    _refused(ValueError, "eos_choices\\['far'\\]\\[0\\]=600 is beyond", stop_explorer, {"m": model}, tok,
             ["hi"], {"far": [600]})
    _refused(TypeError, "one string", stop_explorer, {"m": model}, tok, "hi", {"default": None})


# --- lesson 02's learner-first helpers ------------------------------------------------------------

def test_eos_labels_kept_counts_real_eos_only():
    from course_utils.eos import eos_labels_kept

    batch = {"input_ids": torch.tensor([[5, 9, 0, 0], [5, 6, 9, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]]),
             "labels": torch.tensor([[5, 9, -100, -100], [5, 6, 9, -100]])}
    assert eos_labels_kept(batch, 0) == (0, 1), "the attended eos at [0, 2] is real: it has no label"
    assert eos_labels_kept(batch, 9) == (2, 2)


def test_plot_stop_rates_says_whether_every_fix_clears_the_threshold(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from course_utils.eos import plot_stop_rates

    assert plot_stop_rates({"bug": 0.1, "fix": 0.9}, ["bug"], margin=0.5)
    assert not plot_stop_rates({"bug": 0.5, "fix": 0.9}, ["bug"], margin=0.5)
