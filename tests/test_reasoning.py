"""Lesson 09's tools (``course_utils.reasoning``) and the reasoning tokens (``model.add_reasoning_tokens``):
the counts of what TRL grades are exact on TRL's real templates; the reply readers parse what a server
would."""

import copy
import json

import pytest
import torch
from trl.chat_template_utils import (
    llama3_chat_template,
    qwen2_5_chat_template,
    qwen3_chat_template,
    qwen3_training_chat_template,
)

from course_utils import load_course_model
from course_utils.model import REASONING_TOKENS, add_reasoning_tokens
from course_utils.reasoning import (
    arguments_shape,
    data_reasoning_tokens,
    load_reasoning_model,
    read_reply,
    read_tool_call,
    reasoning_budget,
    reasoning_chats,
    reasoning_explorer,
    reasoning_for,
    reply_kinds,
    reply_to,
    think_blocks,
    tool_budget,
    tool_chats,
    trained_rows,
)


@pytest.fixture(scope="module")
def qwen3():
    return load_reasoning_model(qwen3_chat_template)[1]


def with_template(tokenizer, template):
    other = copy.copy(tokenizer)
    other.chat_template = template
    return other


@pytest.mark.parametrize("name", ["tiny-qwen", "tiny-llama"])
def test_reasoning_tokens_are_single_ids_whose_rows_start_at_the_mean_of_their_pieces(name):
    model, tok = load_course_model(name)
    pieces = {t: tok(t, add_special_tokens=False)["input_ids"] for t in REASONING_TOKENS}
    before_in = model.get_input_embeddings().weight.detach().clone()
    before_out = model.get_output_embeddings().weight.detach().clone()
    ids = add_reasoning_tokens(model, tok)
    assert ids == list(range(len(before_in), len(before_in) + len(REASONING_TOKENS)))
    assert [tok(t, add_special_tokens=False)["input_ids"] for t in REASONING_TOKENS] == [[i] for i in ids]
    assert not any(tok.get_added_vocab() and t in tok.all_special_tokens for t in REASONING_TOKENS), (
        "added as Qwen3 has them: special=False, so skip_special_tokens keeps them"
    )
    new_in, new_out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert torch.equal(new_in[: len(before_in)], before_in), "the old rows are untouched"
    for token, i in zip(REASONING_TOKENS, ids):
        assert torch.allclose(new_in[i], before_in[pieces[token]].mean(0))
        assert torch.allclose(new_out[i], before_out[pieces[token]].mean(0)), (
            "the head's own mean where untied"
        )
    assert model.config.tie_word_embeddings == (new_in.data_ptr() == new_out.data_ptr())
    assert add_reasoning_tokens(model, tok) == ids and len(tok) == len(before_in) + 6, (
        "a second call changes nothing"
    )


def test_reasoning_tokens_are_deterministic():
    rows = []
    for _ in range(2):
        model, tok = load_course_model()
        add_reasoning_tokens(model, tok)
        rows.append(model.get_input_embeddings().weight[-6:].detach().clone())
    assert torch.equal(*rows)


def test_the_shipped_models_are_not_changed():
    model, tok = load_course_model()
    assert "<think>" not in tok.get_vocab() and model.get_input_embeddings().num_embeddings == len(tok)


def test_data_is_deterministic_and_reasons_where_asked():
    a, b = reasoning_chats(20, 3, turns=2), reasoning_chats(20, 3, turns=2)
    assert a == b and all(len(c) == 4 for c in a)
    assert all("reasoning_content" in m for c in a for m in c if m["role"] == "assistant")
    plain = reasoning_chats(20, 3, reasoning_share=0.0)
    assert not any("reasoning_content" in m for c in plain for m in c)
    assert reasoning_for("What is 23 + 58?", "81") == "23 plus 58 is 81."
    assert reasoning_for("Reverse the words: red cat", "cat red") == "the words red cat reversed are cat red."
    call = tool_chats(1, 0, arguments="json")[0][2]["tool_calls"][0]["function"]
    assert isinstance(call["arguments"], str) and json.loads(call["arguments"]).keys() == {"a", "b"}


def test_qwen3_default_grades_only_the_last_turns_reasoning_and_the_training_template_all(qwen3):
    chats = reasoning_chats(6, 1, turns=2)
    data = data_reasoning_tokens(qwen3, chats)
    default = reasoning_budget(qwen3, trained_rows(qwen3, [{"messages": c} for c in chats]))
    guarded = reasoning_budget(
        qwen3, trained_rows(qwen3, [{"messages": c} for c in chats], assistant_only_loss=True)
    )
    assert data["reasoning_turns"] == 12
    assert default["reasoning_blocks"] == 6 and guarded["reasoning_blocks"] == 12
    assert (
        default["graded_reasoning_tokens"]
        == data_reasoning_tokens(qwen3, [c[2:] for c in chats])["reasoning_tokens"]
    )
    assert guarded["graded_reasoning_tokens"] == data["reasoning_tokens"]


def test_an_empty_block_is_graded_unless_the_row_is_rendered_without_thinking(qwen3):
    plain = reasoning_chats(4, 2, reasoning_share=0.0)
    rows = [{"prompt": c[:1], "completion": c[1:]} for c in plain]
    graded = reasoning_budget(qwen3, trained_rows(qwen3, rows))
    fixed = reasoning_budget(
        qwen3, trained_rows(qwen3, [{**r, "chat_template_kwargs": {"enable_thinking": False}} for r in rows])
    )
    assert (
        graded["graded_empty_blocks"] == 4
        and fixed["graded_empty_blocks"] == 0
        and fixed["empty_blocks"] == 4
    )
    blocks = think_blocks(qwen3, trained_rows(qwen3, rows)[0])
    assert blocks == [{"tokens": 2, "empty": True, "graded": 2, "opening_graded": True}]


def test_tool_budget_counts_escaped_arguments_graded_replies_and_dropped_calls(qwen3):
    chats = {shape: tool_chats(3, 4, arguments=shape) for shape in ("dict", "json")}
    q25 = with_template(qwen3, qwen2_5_chat_template)
    full = tool_budget(q25, trained_rows(q25, [{"messages": c} for c in chats["json"]]), chats["json"])
    assert full == {
        "tool_calls": 3,
        "calls_rendered": 3,
        "arguments_as_string": 3,
        "tool_replies": 3,
        "graded_tool_replies": 3,
    }
    aol = tool_budget(
        q25,
        trained_rows(q25, [{"messages": c} for c in chats["dict"]], assistant_only_loss=True),
        chats["dict"],
    )
    assert aol["arguments_as_string"] == 0 and aol["graded_tool_replies"] == 0
    q3 = tool_budget(qwen3, trained_rows(qwen3, [{"messages": c} for c in chats["json"]]), chats["json"])
    assert q3["arguments_as_string"] == 0, "Qwen3's template passes a string through"
    llama = with_template(qwen3, llama3_chat_template)
    llama.bos_token = (
        llama.eos_token
    )  # Llama 3's template opens with bos_token; the course tokenizer has none
    dropped = tool_budget(llama, trained_rows(llama, [{"messages": c} for c in chats["dict"]]), chats["dict"])
    assert dropped["calls_rendered"] == 0


def test_trained_rows_uses_the_training_template_like_sft_trainer(qwen3):
    chat = reasoning_chats(1, 5, turns=2)[0]
    row = trained_rows(qwen3, [{"messages": chat}], assistant_only_loss=True)[0]
    rendered = with_template(qwen3, qwen3_training_chat_template).apply_chat_template(
        chat, tokenize=True, return_dict=False
    )
    assert row["input_ids"] == rendered


@pytest.mark.parametrize(
    "text, kind, leaked, clean",
    [
        ("<think>\n2 plus 3 is 5.\n</think>\n\n5<|im_end|>", "reasoned", False, False),
        ("<think>\n\n</think>\n\n5<|im_end|>", "empty", False, False),
        ("<think>\nthe words red cat<|im_end|>", "unclosed", False, False),
        ("5<|im_end|>", "no_block", False, True),
        ("2 plus 3 is 5.\n</think>\n\n5<|im_end|>", "no_block", True, False),
        ("<think>\nx\n</think>\n\ny\n</think>z", "reasoned", True, False),
    ],
)
def test_read_reply(text, kind, leaked, clean):
    read = read_reply(text)
    assert (read["kind"], read["leaked"], read["clean"]) == (kind, leaked, clean)


def test_read_reply_ends_the_answer_at_any_end_token():
    """A Llama-style vocabulary ends with "</s>": the answer stops there as it does at <|im_end|>."""
    for end in ("<|im_end|>", "</s>", "<|endoftext|>"):
        assert read_reply(f"<think>\nx\n</think>\n\n5{end}")["answer"] == "5"
        assert read_reply(f"5{end}")["answer"] == "5"


def test_reply_kinds_and_tool_calls():
    shares = reply_kinds([{"text": "<think>\nx\n</think>\n\ny"}, {"text": "<think>\n\n</think>\n\ny"}])
    assert shares == {"reasoned": 0.5, "empty": 0.5, "unclosed": 0.0, "no_block": 0.0, "leaked": 0.0,
                      "clean": 0.0, "with_reasoning": 0.5}
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    escaped = '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>'
    assert read_tool_call(good) == {"name": "add", "arguments": {"a": 1, "b": 2}}
    assert read_tool_call(escaped)["arguments"] == '{"a": 1, "b": 2}'
    assert read_tool_call("<tool_call>\n{broken\n</tool_call>") is None
    assert (arguments_shape(good), arguments_shape(escaped), arguments_shape("81")) == (
        "object",
        "string",
        None,
    )


def test_explorer_shows_a_run_served_one_way():
    runs = {"a run": {"on": [{"text": "<think>\nx\n</think>\n\ny"}], "off": [{"text": "y"}]}}
    assert "reasoned" in reasoning_explorer(runs).text


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: reasoning_for("What is the time?", "noon"), "not one of the course's tasks"),
        (lambda: reasoning_chats(2, 0, reasoning_share=80), "reasoning_share"),
        (lambda: tool_chats(2, 0, arguments="yaml"), "arguments"),
        (lambda: read_reply(None), "reply string"),
        (lambda: reply_kinds([]), "non-empty list"),
        (lambda: trained_rows(load_course_model()[1], {"messages": []}), "non-empty list of dicts"),
        (
            lambda: think_blocks(load_course_model()[1], {"input_ids": [1], "labels": [1]}),
            "add_reasoning_tokens",
        ),
        (lambda: reasoning_explorer({}), "non-empty dict"),
        (lambda: reply_to(*load_course_model(), {"role": "user", "content": "hi"}), "list of message lists"),
        (lambda: add_reasoning_tokens(load_course_model()[0], "tokenizer"), "tokenizer"),
    ],
)
def test_bad_input_is_refused_with_what_why_fix(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.fixture(scope="module")
def reasoning_pair():
    return load_reasoning_model(qwen3_chat_template)


_HISTORY = [{"role": "user", "content": "What is 2 plus 3?"}]
_SHAREGPT = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "4"}]


@pytest.mark.parametrize("call, error, match", [
    # no tokenizer (AttributeError deep inside before)
    (lambda m, t: reply_to(m, None, [_HISTORY]), TypeError, "tokenizer must be a transformers tokenizer"),
    (lambda m, t: reply_to(m, "Qwen/Qwen2.5-0.5B", [_HISTORY]), TypeError, "transformers tokenizer"),
    (lambda m, t: reply_to(m, m, [_HISTORY]), TypeError, "transformers tokenizer"),
    (lambda m, t: tool_budget(None, [{"input_ids": [1], "labels": [1]}], [_HISTORY]), TypeError,
     "transformers tokenizer"),
    # histories that are not a list of conversations
    (lambda m, t: reply_to(m, t, [3, 4]), ValueError, r"histories\[0\] must be a non-empty list"),
    (lambda m, t: reply_to(m, t, _HISTORY), TypeError, "one conversation .* wrap it"),
    (lambda m, t: reply_to(m, t, [[{"role": "user"}]]), ValueError, "has no 'content'"),
    # a misspelt template argument was silently ignored
    (lambda m, t: reply_to(m, t, [_HISTORY], enable_thinkin=False), TypeError,
     "enable_thinkin.*never reads.*use 'enable_thinking'"),
    (lambda m, t: reply_to(m, t, [_HISTORY], tokenize=True), TypeError, "sets \\['tokenize'\\] itself"),
    # records and rows
    (lambda m, t: reply_kinds([{"ids": [1]}]), ValueError, r"records\[0\] is a dict without a text 'text'"),
    (lambda m, t: reply_kinds([3]), ValueError, r"records\[0\] is a int"),
    (lambda m, t: trained_rows(t, [{"x": 1}]), ValueError,
     r"rows\[0\] has keys \['x'\], none of TRL's forms"),
    (lambda m, t: trained_rows(t, [{"conversations": _SHAREGPT}]), ValueError, "convert ShareGPT's"),
    (lambda m, t: trained_rows(t, [{"messages": _HISTORY}, {"text": "hi"}]), ValueError,
     "one dataset holds one"),
    (lambda m, t: trained_rows(t, [{"messages": [{"role": "bot", "content": "4"}]}]), ValueError,
     "role 'bot'"),
    (lambda m, t: read_reply("x", opened=None), TypeError, "opened=None must be True or False"),
    (lambda m, t: read_reply("x", opened="yes"), TypeError, "opened='yes' must be True or False"),
])
def test_reasoning_helpers_refuse_what_they_cannot_read(reasoning_pair, call, error, match):
    with pytest.raises(error, match=match) as info:
        call(*reasoning_pair)
    assert " — " in str(info.value), "what — why — fix"


@pytest.mark.parametrize("rows, match", [
    ([{"x": 1}], "none of TRL's forms"),
    ([{"conversations": _SHAREGPT}], "convert ShareGPT's"),
])
def test_train_on_refuses_rows_and_a_progress_before_loading_a_model(rows, match):
    from course_utils.reasoning import train_on

    with pytest.raises(ValueError, match=match):
        train_on(qwen2_5_chat_template, rows)
    with pytest.raises(TypeError, match="progress=None must be True or False"):
        train_on(qwen2_5_chat_template, [{"messages": _HISTORY}], progress=None)


def test_reply_to_takes_the_template_arguments_it_reads(reasoning_pair):
    records = reply_to(*reasoning_pair, [_HISTORY], max_new_tokens=2, enable_thinking=False)
    assert len(records) == 1


def test_reply_to_renders_each_history_and_stops_at_the_end_of_turn():
    model, tok = load_reasoning_model(qwen3_chat_template)
    history = [{"role": "user", "content": "What is 2 plus 3?"}]
    records = reply_to(model, tok, [history, history], max_new_tokens=5)
    assert len(records) == 2 and records[0]["ids"] == records[1]["ids"]
    assert all(r["n_new"] <= 5 for r in records)


def test_thinking_flag_diff_shows_what_each_family_switches():
    import copy

    from trl.chat_template_utils import gemma4_chat_template, glm4moe_chat_template, qwen3_chat_template

    from course_utils.reasoning import load_reasoning_model, thinking_flag_diff

    _, tok = load_reasoning_model(qwen3_chat_template)
    conv = [{"role": "user", "content": "What is 2 + 2?"}]
    assert thinking_flag_diff(tok, conv) == ["+ <think>", "+ ", "+ </think>", "+ "]   # Qwen3: an empty block
    glm = copy.copy(tok)
    glm.chat_template = glm4moe_chat_template
    assert any(line.startswith("+ ") and "/nothink" in line for line in thinking_flag_diff(glm, conv))
    gemma = copy.copy(tok)
    gemma.chat_template = gemma4_chat_template
    gemma_diff = thinking_flag_diff(gemma, conv)    # Gemma 4: the flag ON adds <|think|> in a system turn
    assert "- <|think|>" in gemma_diff and all(line.startswith("- ") for line in gemma_diff), gemma_diff
    with pytest.raises(ValueError, match="conversation must be"):
        thinking_flag_diff(tok, "What is 2 + 2?")


def test_train_on_ends_on_its_criterion_and_refuses_a_criterion_that_is_not_one():
    """until= ends the run once the criterion holds (checked every `every` steps); steps stays the cap."""
    from course_utils.reasoning import calls_written, train_on

    rows = [{"messages": c} for c in tool_chats(16, 0)]
    checked = []

    def after_two_checks(model, tokenizer):
        checked.append(model.training)
        return len(checked) >= 2

    model, tokenizer = train_on(qwen2_5_chat_template, rows, steps=40, batch=4, until=after_two_checks,
                                every=2)
    assert model.steps_trained == 4 and checked == [False, False], "two checks, in eval mode, then it stops"
    assert 0.0 <= calls_written(model, tokenizer, [c[:2] for c in tool_chats(2, 1)], max_new_tokens=8) <= 1.0
    with pytest.raises(TypeError, match="until must be a function"):
        train_on(qwen2_5_chat_template, rows, until=0.8)
    with pytest.raises(ValueError, match="every=0"):
        train_on(qwen2_5_chat_template, rows, until=after_two_checks, every=0)


def test_calls_written_counts_only_a_call_that_ends_the_turn(monkeypatch):
    """The tool runs' criterion: a call, in either shape, then the stop token — valid JSON or not (a tiny
    model miscounts braces long after it has the format) — but not a call that runs on, or a reply never
    ended."""
    import course_utils.reasoning as reasoning

    tok = load_reasoning_model(qwen2_5_chat_template)[1]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    as_string = '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>\n'
    braces = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}}\n</tool_call>'
    replies = [(call + "<|im_end|>", True), (as_string + "<|im_end|>", True),   # both shapes count
               (braces + "<|im_end|>", True),                                     # and a miscounted brace
               (call + "\n<|im_start|>user\n<tool_response>\n3<|im_end|>", True),  # runs on
               ('<tool_call>\n{"name": "add"}\n</tool_call><|im_end|>', True),    # no arguments
               (call, False)]                                                     # never ended
    records = [{"text": text, "ended": ended, "ids": [end if ended else 5]} for text, ended in replies]
    monkeypatch.setattr(reasoning, "reply_to", lambda *args, **kwargs: records)
    assert reasoning.calls_written(None, tok, [[{"role": "user", "content": "hi"}]]) == 3 / 6


def test_reply_to_stops_on_the_tokenizers_own_eos_without_an_endoftext_token(tmp_path, reasoning_pair):
    """A Llama-style vocabulary calls its eos "</s>": reply_to asked for "<|endoftext|>" by name and passed
    generate() a None id (found on a held-out copy of the course model, 2026-12-07)."""
    model, tok = reasoning_pair
    tok.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = tmp_path / name
        path.write_text(path.read_text(encoding="utf-8").replace("<|endoftext|>", "</s>"), encoding="utf-8")
    from transformers import AutoTokenizer

    llama_style = AutoTokenizer.from_pretrained(tmp_path)
    assert llama_style.eos_token == "</s>" and llama_style.convert_tokens_to_ids("<|endoftext|>") is None
    records = reply_to(model, llama_style, [_HISTORY], max_new_tokens=4)
    assert len(records) == 1 and records[0]["n_new"] <= 4
