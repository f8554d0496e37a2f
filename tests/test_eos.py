"""Tests for course_utils.eos (lesson 02): the checkers, the stop helpers, the masks."""

import copy

import pytest
import torch

from course_utils import IGNORE_INDEX
from course_utils.answers import lesson02 as answers
from course_utils.checks import Diagnosis
from course_utils.eos import (
    CAUSES,
    answer_accuracy,
    broken_generation_run,
    check_collate_keep_eos,
    check_diagnosis_exercise,
    check_stop_token_ids,
    generate_greedy,
    graded_span_has_stop,
    graded_text,
    plain_text_batches,
    reply,
    stop_criterion_callback,
    stop_probability,
    stop_rate,
    train_until_stops,
    untrained_stop_template,
)


@pytest.fixture(scope="module")
def tok(course):  # `course` is the session-wide (model, tokenizer) of tests/conftest.py
    return course[1]


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: write your solution here")


# --- exercise 1: stop ids -------------------------------------------------------------------------

def stop_ids_by_token_scan(tokenizer):
    """A second correct answer: tokenize the whole rendering and scan from the answer's last token."""
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "zebra"},
                {"role": "user", "content": "b"}]
    enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    answer = tokenizer("zebra", add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(enc)) if enc[i:i + len(answer)] == answer) + len(answer)
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    eot = next(t for t in enc[start:] if t in special)
    return list(dict.fromkeys([tokenizer.eos_token_id, eot]))


@pytest.mark.parametrize("answer", [answers.stop_token_ids, stop_ids_by_token_scan])
def test_stop_token_ids_checker_accepts_correct_answers(tok, answer):
    assert check_stop_token_ids(answer, tok)


def test_stop_token_ids_reference(tok):
    assert answers.end_of_turn_token(tok) == "<|im_end|>"
    assert answers.stop_token_ids(tok) == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]


def test_stop_token_ids_checker_rejects_stub(tok, capsys):
    assert not check_stop_token_ids(stub, tok)
    assert "not implemented" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (lambda t: [t.eos_token_id], "you returned only the tokenizer's eos"),
    (lambda t: [t.eos_token_id, t.convert_tokens_to_ids("<|im_end|>")], "you hard-coded <|im_end|>"),
    (lambda t: [t.convert_tokens_to_ids(answers.end_of_turn_token(t))], "keep the tokenizer's eos"),
    (lambda t: [t.eos_token_id, t.convert_tokens_to_ids("<|im_start|>")], "turn *opener*"),
])
def test_stop_token_ids_checker_names_the_misconception(tok, wrong, hint):
    result = check_stop_token_ids(wrong, tok)
    assert not result
    assert hint in result.message


def test_stop_token_ids_hints_are_graded(tok):
    result = check_stop_token_ids(stub, tok)
    first = result.hint()
    assert "question" in first and "get_added_vocab" not in first
    result.hint()
    assert "answer" in result.hint()


def test_end_of_turn_token_bad_input(tok):
    no_template = copy.deepcopy(tok)
    no_template.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        answers.end_of_turn_token(no_template)
    plain = copy.deepcopy(tok)
    plain.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="plain text"):
        answers.end_of_turn_token(plain)


# --- exercise 2: diagnosis ------------------------------------------------------------------------

def diagnose_generations_other_order(artefact):
    """A second correct answer: graded span first, padding look-alike by the rows, all rows as evidence."""
    gens, cfg = artefact["generations"], artefact["generate_config"]
    stop = artefact["end_of_turn_token"] if artefact["format"] == "chat" else artefact["eos_token"]
    if not any(stop in row for row in artefact["graded_span"]):
        cause = "pad_equals_eos" if artefact["pad_token"] == stop and artefact["format"] == "plain" \
            else "stop_token_not_graded"
        return Diagnosis(cause, stop)
    if not cfg["attention_mask_passed"]:
        longest = max(len(g["prompt_tokens"]) for g in gens)
        return Diagnosis("left_padding_without_mask",
                         [i for i, g in enumerate(gens) if len(g["prompt_tokens"]) < longest])
    if stop not in cfg["eos_tokens"]:
        return Diagnosis("wrong_stop_ids", stop)
    return Diagnosis("max_new_tokens_too_small", cfg["max_new_tokens"])


@pytest.mark.parametrize("answer", [answers.diagnose_generations, diagnose_generations_other_order])
def test_diagnosis_checker_accepts_correct_answers(answer):
    assert check_diagnosis_exercise(answer)


def test_diagnosis_checker_rejects_stub():
    assert not check_diagnosis_exercise(stub)


def _always(cause):
    def diagnose(artefact):
        return Diagnosis(cause, artefact["end_of_turn_token"])
    return diagnose


def _never_pad_eos(artefact):
    truth = answers.diagnose_generations(artefact)
    if truth.cause == "pad_equals_eos":
        return Diagnosis("stop_token_not_graded", truth.evidence)
    return truth


def _ignores_padding(artefact):
    """Calls every run that does not stop a graded-span bug: misses lesson 03's look-alike."""
    truth = answers.diagnose_generations(artefact)
    if truth.cause == "left_padding_without_mask":
        return Diagnosis("stop_token_not_graded", artefact["end_of_turn_token"])
    return truth


def _wrong_evidence(artefact):
    truth = answers.diagnose_generations(artefact)
    return Diagnosis(truth.cause, "row 0")


@pytest.mark.parametrize("wrong, phrase", [
    (_always("wrong_stop_ids"), "no reply contains the end-of-turn token"),
    (_always("stop_token_not_graded"), "the model DOES write the end-of-turn token"),
    (_never_pad_eos, "which collator built the labels"),
    (_ignores_padding, "only padded rows are garbled"),
    (_wrong_evidence, "does not show it"),
])
def test_diagnosis_checker_names_the_misconception(wrong, phrase):
    result = check_diagnosis_exercise(wrong)
    assert not result
    assert phrase in result.message


def test_broken_generation_run_draws_every_cause_and_varies():
    causes = {broken_generation_run(seed)[1].cause for seed in range(len(CAUSES))}
    assert causes == set(CAUSES)
    a, b = broken_generation_run(100), broken_generation_run(101)
    assert a[0] != b[0]
    assert broken_generation_run(7) == broken_generation_run(7), "seeded: the same seed, the same case"
    with pytest.raises(ValueError, match="seed"):
        broken_generation_run(-1)


# --- exercise 3: the keep-eos collator ------------------------------------------------------------

def collate_left(examples, pad_token_id):
    """A second correct answer: left padding."""
    width = max(len(e["input_ids"]) for e in examples)
    rows = [(width - len(e["input_ids"]), list(e["input_ids"]), list(e.get("labels", e["input_ids"])))
            for e in examples]
    return {"input_ids": torch.tensor([[pad_token_id] * k + ids for k, ids, _ in rows]),
            "attention_mask": torch.tensor([[0] * k + [1] * len(ids) for k, ids, _ in rows]),
            "labels": torch.tensor([[IGNORE_INDEX] * k + labels for k, _, labels in rows])}


def collate_pad_id_then_first_eos(examples, pad_token_id):
    """A third correct answer, the common fix: mask by pad id, then restore the first eos of each row."""
    batch = answers.collate_keep_eos(examples, pad_token_id)
    labels = batch["input_ids"].clone()
    for i, e in enumerate(examples):
        if "labels" in e:
            labels[i, :len(e["labels"])] = torch.tensor(e["labels"])
    labels[batch["input_ids"] == pad_token_id] = IGNORE_INDEX
    for i, e in enumerate(examples):
        eos = e["input_ids"][-1]
        first = int((batch["input_ids"][i] == eos).nonzero()[0, 0])
        labels[i, first] = eos
        labels[i, first + 1:] = IGNORE_INDEX
    batch["labels"] = labels
    return batch


@pytest.mark.parametrize("answer", [answers.collate_keep_eos, collate_left, collate_pad_id_then_first_eos])
def test_collate_checker_accepts_correct_answers(answer):
    assert check_collate_keep_eos(answer)


def test_collate_checker_rejects_stub():
    assert not check_collate_keep_eos(stub)


def _pad_id_masking(examples, pad):
    batch = answers.collate_keep_eos(examples, pad)
    batch["labels"] = batch["input_ids"].clone()
    batch["labels"][batch["input_ids"] == pad] = IGNORE_INDEX  # transformers' collator: by id
    return batch


def _ignores_prompt_mask(examples, pad):
    return answers.collate_keep_eos([{"input_ids": e["input_ids"]} for e in examples], pad)


def _trains_padding(examples, pad):
    batch = answers.collate_keep_eos(examples, pad)
    batch["labels"] = torch.where(batch["attention_mask"] == 1, batch["labels"], batch["input_ids"])
    return batch


def _keeps_last_eos(examples, pad):
    batch = answers.collate_keep_eos(examples, pad)
    batch["labels"][:, -1] = batch["input_ids"][:, -1]
    return batch


def _all_ones_mask(examples, pad):
    batch = answers.collate_keep_eos(examples, pad)
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    return batch


@pytest.mark.parametrize("wrong, phrase", [
    (_pad_id_masking, "you masked by pad *id*"),
    (_ignores_prompt_mask, "overwrote the example's prompt mask"),
    (_trains_padding, "the padding carries labels"),
    (_keeps_last_eos, "you kept the row's *last* eos"),
    (_all_ones_mask, "the attention mask is all ones"),
])
def test_collate_checker_names_the_misconception(wrong, phrase):
    result = check_collate_keep_eos(wrong)
    assert not result
    assert phrase in result.message


# --- helpers --------------------------------------------------------------------------------------

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
    assert graded_text(tok, fixed["input_ids"][0], fixed["labels"][0]).endswith("<|endoftext|>")
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
    fit = train_until_stops(model, batches, batches[0], eot, lr=1e-3, level=1.01, chunk=2, max_steps=3)
    assert fit["steps"] == 3 and not fit["reached"], "an unreachable level stops at the cap"
    assert [r["step"] for r in fit["records"]] == [1, 2, 3]
    fit = train_until_stops(model, batches, batches[0], eot, lr=1e-3, level=1e-9, chunk=2, max_steps=10)
    assert fit["steps"] == 2 and fit["reached"], "a met criterion stops at the first check"
    with pytest.raises(ValueError, match="max_steps"):
        train_until_stops(model, batches, batches[0], eot, lr=1e-3, max_steps=0)
    with pytest.raises(ValueError, match="every"):
        stop_criterion_callback(batches[0], eot, every=0)


# ---- the "what if" control: another eos list for generate() ---------------------------------------

def test_stop_explorer_generates_each_setting_and_prints_its_start(course):
    from course_utils.eos import chat_prompts, stop_explorer

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
