"""Tests for course_utils.eos (lesson 02): the checkers, the stop-id helpers, the masks."""

import copy
import logging

import pytest
import torch

from course_utils import IGNORE_INDEX
from course_utils.eos import (
    captured_log,
    check_graded_span_has_stop,
    check_stop_token_ids,
    end_of_turn_token,
    generate_greedy,
    graded_span_has_stop,
    graded_text,
    plain_text_batches,
    stop_rate,
    stop_token_ids,
    untrained_stop_template,
)


@pytest.fixture(scope="module")
def tok(course):  # `course` is the session-wide (model, tokenizer) of tests/conftest.py
    return course[1]


def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise: write your solution here")


# --- exercise 1: stop ids -------------------------------------------------------------------------

def test_stop_token_ids_reference(tok):
    assert end_of_turn_token(tok) == "<|im_end|>"
    assert stop_token_ids(tok) == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    assert check_stop_token_ids(stop_token_ids, tok)


def test_stop_token_ids_checker_rejects_stub(tok, capsys):
    result = check_stop_token_ids(_stub, tok)
    assert not result
    assert "not implemented" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (lambda t: [t.eos_token_id], "you returned only the tokenizer's eos"),
    (lambda t: [0, 2], "you hard-coded <|im_end|>'s id"),
    (lambda t: [t.convert_tokens_to_ids(end_of_turn_token(t))], "keep the tokenizer's eos"),
    (lambda t: [t.eos_token_id, t.convert_tokens_to_ids("<|im_start|>")], "turn *opener*"),
])
def test_stop_token_ids_checker_names_the_misconception(tok, wrong, hint):
    result = check_stop_token_ids(wrong, tok)
    assert not result
    assert hint in result.message


def test_end_of_turn_token_bad_input(tok):
    no_template = copy.deepcopy(tok)
    no_template.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        end_of_turn_token(no_template)
    plain = copy.deepcopy(tok)
    plain.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="plain text"):
        end_of_turn_token(plain)


# --- exercise 2: graded span ----------------------------------------------------------------------

def test_graded_span_checker_accepts_reference(tok):
    assert check_graded_span_has_stop(graded_span_has_stop, tok)


def test_graded_span_checker_rejects_stub(tok):
    assert not check_graded_span_has_stop(_stub, tok)


@pytest.mark.parametrize("wrong, hint", [
    (lambda b, s: [bool((r == s).any()) for r in b["input_ids"]], "you looked at input_ids"),
    (lambda b, s: [int(r[r != IGNORE_INDEX][-1]) == s for r in b["labels"]], "only the last graded token"),
    (lambda b, s: bool((b["labels"] == s).any()), "one bool per row"),
])
def test_graded_span_checker_names_the_misconception(tok, wrong, hint):
    result = check_graded_span_has_stop(wrong, tok)
    assert not result
    assert hint in result.message


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
    with pytest.raises(ValueError, match="no records"):
        stop_rate([])


def test_captured_log_collects_warnings():
    with captured_log("trl") as messages:
        logging.getLogger("trl.trainer.sft_trainer").warning("the model may not learn to stop")
    assert messages == ["the model may not learn to stop"]


def test_graded_span_has_stop_is_per_row():
    batch = {"input_ids": torch.tensor([[5, 2, 1], [5, 2, 1]]),
             "labels": torch.tensor([[IGNORE_INDEX, 2, 1], [IGNORE_INDEX, IGNORE_INDEX, 1]])}
    assert graded_span_has_stop(batch, 2) == [True, False]
