"""Reasoning and tool-call data: what a chat template renders, what TRL grades, what the model then writes.

Lesson 09. The course model learns Qwen3's ``<think>`` / ``<tool_call>`` format here (the tokens come from
``model.add_reasoning_tokens``); the chats come from the course's two tasks (``data.make_messages``) with a
short reasoning that restates the sum or the reversal, so a model of under a million parameters learns the
*format* in seconds. Three kinds of helper:

- data: ``reasoning_chats`` (single- or multi-turn, some turns without reasoning), ``tool_chats`` (a call
  to ``add`` with its arguments as a dict or as a JSON string, the tool's reply, the answer);
- what is graded, read from rows TRL prepared (``internals.prepare_sft_dataset``): ``think_blocks``,
  ``reasoning_budget``, ``tool_budget``;
- what the trained model wrote: ``reply_to`` (greedy replies to chat histories, stopping at the end of
  turn), ``read_reply`` / ``reply_kinds`` (reasoned, an empty block, no block, reasoning leaked past the
  block), ``read_tool_call`` (the call a server would parse);
- ``thinking_flag_diff``: what ``enable_thinking`` changes in *your* template's render (each family spells
  it differently: Qwen3 an empty think block, GLM-4.5 ``/nothink`` after the user message, Gemma 4 a
  ``<|think|>`` in the system turn);
- ``reasoning_explorer``: the lesson's "what if" over its runs.

The lesson's notebook generates with ``generation.generate_greedy`` and passes the records here.
"""

from __future__ import annotations

import difflib
import json
import random
import re
import tempfile
from collections.abc import Sequence

from . import validate
from .data import is_graded, make_messages
from .model import REPLY_ENDS

THINK, END_THINK = "<think>", "</think>"
TOOL_CALL, END_TOOL_CALL = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, END_TOOL_RESPONSE = "<tool_response>", "</tool_response>"
REPLY_KINDS = ("reasoned", "empty", "unclosed", "no_block")

_ADD = re.compile(r"What is (\d+) \+ (\d+)\?")
_REVERSE = "Reverse the words: "


def load_reasoning_model(chat_template: str, name_or_path=None):
    """``(model, tokenizer)``: a fresh course model (``COURSE_MODEL`` unless ``name_or_path``) as a base
    checkpoint (``model.load_base_checkpoint``: lesson 09's runs generate with a base's stop, as lesson 02's
    do), with Qwen3's reasoning and tool tokens added (``model.add_reasoning_tokens``) and ``chat_template``
    set — e.g. one of TRL's real templates (``trl.chat_template_utils.qwen3_chat_template``). Each call
    loads anew, so every run of the lesson starts from the same weights."""
    from .model import add_reasoning_tokens, load_base_checkpoint

    validate.non_empty_string("chat_template", chat_template, why="it renders every chat of the run")
    model, tokenizer = load_base_checkpoint(name_or_path)
    add_reasoning_tokens(model, tokenizer)
    tokenizer.chat_template = chat_template
    return model, tokenizer


def reasoning_for(question: str, answer: str) -> str:
    """The short reasoning of a course question: ``"23 plus 58 is 81."`` or ``"the words red cat reversed
    are cat red."`` — the sentences of the course model's pretraining text, so it learns the format fast."""
    validate.non_empty_string("question", question, why="the reasoning restates it")
    validate.non_empty_string("answer", answer, why="the reasoning ends on it")
    match = _ADD.search(question)
    if match:
        return f"{match[1]} plus {match[2]} is {answer}."
    if _REVERSE in question:
        return f"the words {question.split(_REVERSE, 1)[1]} reversed are {answer}."
    raise ValueError(
        f"question {question!r:.60} is not one of the course's tasks — the reasoning restates an "
        "addition or a reversal — pass a question from make_messages()."
    )


def reasoning_chats(
    n: int, seed: int, *, turns: int = 1, reasoning_share: float = 1.0, task: str = "mixed"
) -> list[list[dict]]:
    """``n`` conversations of ``turns`` user/assistant pairs from ``make_messages``; an assistant turn holds
    its reasoning in ``reasoning_content`` (the field Qwen3's template reads) with probability
    ``reasoning_share``, else no reasoning at all (a plain chat row). Deterministic in ``seed``."""
    validate.positive_int("n", n, why="it counts conversations")
    validate.positive_int("turns", turns, why="it counts user/assistant pairs per conversation")
    validate.fraction("reasoning_share", reasoning_share, why="it is the share of turns that reason")
    validate.seed("seed", seed)
    pairs = make_messages(task, n * turns, seed=seed)
    rng = random.Random(seed + 7)
    chats = []
    for i in range(n):
        messages = []
        for user, assistant in pairs[i * turns : (i + 1) * turns]:
            turn = {"role": "assistant", "content": assistant["content"]}
            if rng.random() < reasoning_share:
                turn["reasoning_content"] = reasoning_for(user["content"], assistant["content"])
            messages += [dict(user), turn]
        chats.append(messages)
    return chats


def tool_chats(n: int, seed: int, *, arguments: str = "dict") -> list[list[dict]]:
    """``n`` tool-use conversations: a short system prompt, an addition question, the assistant's call
    ``add(a, b)`` (``arguments`` as a ``"dict"`` — the transformers convention — or as a ``"json"`` string —
    the OpenAI wire format), the tool's reply and the answer. The system prompt is short on purpose: it
    replaces Qwen2.5's default one and keeps rows short; it changes nothing the lesson measures."""
    validate.positive_int("n", n, why="it counts conversations")
    validate.choice(
        "arguments", arguments, ("dict", "json"), why="a call's arguments travel in one of these two shapes"
    )
    chats = []
    for user, assistant in make_messages("add", n, seed=seed):
        a, b = map(int, _ADD.search(user["content"]).groups())
        args = {"a": a, "b": b}
        call = {
            "type": "function",
            "function": {"name": "add", "arguments": args if arguments == "dict" else json.dumps(args)},
        }
        chats.append(
            [
                {"role": "system", "content": "Use the tools."},
                dict(user),
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "add", "content": assistant["content"]},
                {"role": "assistant", "content": assistant["content"]},
            ]
        )
    return chats


# ------------------------------------------------------------------------------------------------
# What is graded: read from the rows TRL prepared (input_ids + labels)
# ------------------------------------------------------------------------------------------------


def trained_rows(tokenizer, rows: list[dict], **config):
    """The rows ``SFTTrainer`` would train on ``rows`` (TRL's data forms: ``messages``, or ``prompt`` /
    ``completion``, with optional ``chat_template_kwargs`` and ``tools``), tokenized and labelled by TRL
    itself, without a model. ``config``: ``SFTConfig`` fields (e.g. ``assistant_only_loss=True``).

    Two decisions ``SFTTrainer.__init__`` makes before it prepares the data (TRL 1.16) are made here the same
    way, so what you count is what that trainer grades: with ``assistant_only_loss`` it swaps in TRL's
    training template when the tokenizer's has no ``{% generation %}`` markers; with ``completion_only_loss``
    unset it grades only the completion of prompt-completion rows.
    """
    from datasets import Dataset
    from trl import SFTConfig

    from .internals import prepare_sft_dataset, sft_chat_template, sft_completion_only
    from .quiet import quiet_libraries

    validate.tokenizer("tokenizer", tokenizer)
    _check_trl_rows(rows)
    validate.sft_config("config", config)
    args = SFTConfig(
        **{
            "output_dir": tempfile.mkdtemp(prefix="sft-lab-rows-"),
            "report_to": "none",
            "use_cpu": True,
            "bf16": False,
            "activation_checkpointing": False,
            **config,
        }
    )
    chat_template = sft_chat_template(tokenizer, args.assistant_only_loss)
    completion_only = sft_completion_only(args, "prompt" in rows[0] and "completion" in rows[0])
    with quiet_libraries(logs=False):
        return prepare_sft_dataset(
            Dataset.from_list(list(rows)),
            tokenizer,
            args,
            chat_template=chat_template,
            completion_only_loss=completion_only,
        )


# TRL's dataset forms (SFTTrainer): language modelling, conversational, prompt-completion
_TRL_FORMS = (("text",), ("messages",), ("prompt", "completion"))


def _check_trl_rows(rows) -> list[dict]:
    """A non-empty list of dicts in one of TRL's forms, every row in the same one. A row in none of them
    (ShareGPT's ``conversations``, a typo) is prepared by TRL into nothing or fails inside ``datasets``."""
    if isinstance(rows, (str, bytes, dict)) or not isinstance(rows, Sequence) or not rows or not all(
            isinstance(r, dict) for r in rows):
        raise ValueError(f"rows must be a non-empty list of dicts in one of TRL's forms, got "
                         f"{type(rows).__name__} — TRL prepares each — pass e.g. "
                         "[{'messages': conversation}, ...].")
    forms = [next((form for form in _TRL_FORMS if all(k in row for k in form)), None) for row in rows]
    bad = next((i for i, form in enumerate(forms) if form is None), None)
    if bad is not None:
        keys = sorted(rows[bad], key=str)
        fix = ("convert ShareGPT's 'conversations' [{'from', 'value'}] to 'messages' [{'role', 'content'}] "
               "(human -> user, gpt -> assistant)" if "conversations" in rows[bad]
               else "pass e.g. [{'messages': conversation}, ...]")
        forms_text = " / ".join(map(str, _TRL_FORMS))
        raise ValueError(f"rows[{bad}] has keys {keys}, none of TRL's forms ({forms_text}) — TRL would "
                         f"prepare it into nothing, or fail inside datasets — {fix}.")
    if len(set(forms)) > 1:
        other = next(i for i, form in enumerate(forms) if form != forms[0])
        raise ValueError(f"rows[0] is in the form {forms[0]} but rows[{other}] in {forms[other]} — one "
                         "dataset holds one form, and TRL prepares it by its columns — split them, or "
                         "convert to one form.")
    for i, row in enumerate(rows):
        if forms[0] == ("messages",):
            validate.chat(f"rows[{i}]['messages']", row["messages"])
    return list(rows)


def _check_row(row) -> tuple[list[int], list[int]]:
    if not isinstance(row, dict) or "input_ids" not in row or "labels" not in row:
        raise TypeError(
            f"row must be a prepared example with 'input_ids' and 'labels', got "
            f"{type(row).__name__} — the helper reads which tokens are graded — pass a row of "
            "internals.prepare_sft_dataset(...) (or of trainer.train_dataset)."
        )
    ids, labels = list(row["input_ids"]), list(row["labels"])
    if len(ids) != len(labels) or not ids:
        raise ValueError(
            f"row has {len(ids)} input_ids and {len(labels)} labels — one label per token — "
            "pass a row as TRL prepared it."
        )
    return ids, labels


def _ids(tokenizer, *tokens: str) -> list[int]:
    vocab = tokenizer.get_vocab()
    missing = [t for t in tokens if t not in vocab]
    if missing:
        raise ValueError(
            f"the tokenizer has no {missing} token — the lesson's format needs single ids for "
            "them — call course_utils.model.add_reasoning_tokens(model, tokenizer) first."
        )
    return [vocab[t] for t in tokens]


def _spans(ids: list[int], open_id: int, close_id: int) -> list[tuple[int, int]]:
    """(position of the opening token, position of its closing token) for each closed block."""
    spans, start = [], None
    for i, t in enumerate(ids):
        if t == open_id:
            start = i
        elif t == close_id and start is not None:
            spans.append((start, i))
            start = None
    return spans


def think_blocks(tokenizer, row) -> list[dict]:
    """Each ``<think>…</think>`` block of a prepared row: ``tokens`` (between the markers, newlines
    included), ``empty`` (only whitespace inside), ``graded`` (how many tokens inside carry loss) and
    ``opening_graded`` (the ``<think>`` itself is a target: the model learns to *open* the block there)."""
    validate.tokenizer("tokenizer", tokenizer)
    ids, labels = _check_row(row)
    think, end = _ids(tokenizer, THINK, END_THINK)
    blocks = []
    for s, e in _spans(ids, think, end):
        inside = ids[s + 1 : e]
        blocks.append(
            {
                "tokens": len(inside),
                "empty": not tokenizer.decode(inside).strip(),
                "graded": sum(is_graded(label) for label in labels[s + 1 : e]),
                "opening_graded": is_graded(labels[s]),
            }
        )
    return blocks


def reasoning_budget(tokenizer, rows) -> dict:
    """Over prepared rows: the reasoning blocks and tokens the rendering holds, how many of those tokens
    carry loss, and the empty blocks (and how many of them are graded — a lesson to skip reasoning)."""
    rows = _check_rows(rows)
    blocks = [b for row in rows for b in think_blocks(tokenizer, row)]
    reasoned = [b for b in blocks if not b["empty"]]
    empty = [b for b in blocks if b["empty"]]
    return {
        "rows": len(rows),
        "reasoning_blocks": len(reasoned),
        "reasoning_tokens": sum(b["tokens"] for b in reasoned),
        "graded_reasoning_tokens": sum(b["graded"] for b in reasoned),
        "empty_blocks": len(empty),
        "graded_empty_blocks": sum(b["graded"] > 0 for b in empty),
    }


def data_reasoning_tokens(tokenizer, conversations) -> dict:
    """What the *data* holds, whatever a template keeps: the assistant turns with reasoning, and their
    tokens as a Qwen3 template writes them between ``<think>`` and ``</think>`` (``\\n`` + reasoning +
    ``\\n``; the markers are added tokens, so this text is tokenized on its own in any rendering)."""
    validate.tokenizer("tokenizer", tokenizer)
    conversations = _check_conversations(conversations)
    texts = [
        m["reasoning_content"]
        for c in conversations
        for m in c
        if m["role"] == "assistant"
        and isinstance(m.get("reasoning_content"), str)
        and m["reasoning_content"].strip()
    ]
    tokens = sum(
        len(tokenizer("\n" + t.strip("\n") + "\n", add_special_tokens=False)["input_ids"]) for t in texts
    )
    return {"reasoning_turns": len(texts), "reasoning_tokens": tokens}


def tool_budget(tokenizer, rows, conversations) -> dict:
    """Over prepared rows and the conversations they came from: tool calls in the data, calls whose
    name and arguments reach the rendering, calls rendered with their arguments as a JSON *string*
    (``"arguments": "{…}"``), and tool replies whose tokens carry loss (the model learns to write them)."""
    validate.tokenizer("tokenizer", tokenizer)
    rows = _check_rows(rows)
    conversations = _check_conversations(conversations)
    if len(rows) != len(conversations):
        raise ValueError(
            f"{len(rows)} rows but {len(conversations)} conversations — each row is compared with "
            "the conversation it was prepared from — pass both in the same order (and check "
            "that TRL dropped no row)."
        )
    response, end_response = _ids(tokenizer, TOOL_RESPONSE, END_TOOL_RESPONSE)
    calls = rendered = as_string = replies = graded_replies = 0
    for row, conversation in zip(rows, conversations):
        ids, labels = _check_row(row)
        text = tokenizer.decode(ids)
        for m in conversation:
            for call in m.get("tool_calls") or []:
                calls += 1
                function = call.get("function", call)
                args = function["arguments"]
                args = json.loads(args) if isinstance(args, str) else args
                values = [str(v) for v in args.values()]
                rendered += function["name"] in text and all(v in text for v in values)
        as_string += len(re.findall(r'"arguments": "', text))
        for s, e in _spans(ids, response, end_response):
            replies += 1
            graded_replies += any(is_graded(label) for label in labels[s + 1 : e])
    return {
        "tool_calls": calls,
        "calls_rendered": rendered,
        "arguments_as_string": as_string,
        "tool_replies": replies,
        "graded_tool_replies": graded_replies,
    }


def _check_rows(rows) -> list[dict]:
    if isinstance(rows, dict) or not hasattr(rows, "__len__") or not len(rows):
        raise ValueError(
            f"rows must be a non-empty list (or Dataset) of prepared rows, got {type(rows).__name__} "
            "— the helper counts over them — pass internals.prepare_sft_dataset(...)."
        )
    return [rows[i] for i in range(len(rows))]


def _check_conversations(conversations) -> list[list[dict]]:
    if isinstance(conversations, (str, dict)) or not isinstance(conversations, Sequence) or not conversations:
        raise ValueError(
            f"conversations must be a non-empty list of message lists, got "
            f"{type(conversations).__name__} — the helper reads each message — pass e.g. "
            "reasoning_chats(8, seed=0)."
        )
    for i, c in enumerate(conversations):
        validate.messages(f"conversations[{i}]", c)
    return list(conversations)


# ------------------------------------------------------------------------------------------------
# What the trained model wrote
# ------------------------------------------------------------------------------------------------


def read_reply(text: str, *, opened: bool = False) -> dict:
    """A generated reply, read as a reasoning parser reads it: ``kind`` is ``"reasoned"`` (``<think>``, text,
    ``</think>``), ``"empty"`` (``<think>``, only whitespace, ``</think>``: reasoning skipped), ``"unclosed"``
    (``<think>`` never closed: no answer a parser can find) or ``"no_block"`` (the reply does not open with
    ``<think>``); ``reasoning``, ``answer`` (after the first ``</think>``, before the end of turn); ``leaked``
    (a ``</think>`` inside the answer, or in a reply without a block: reasoning where the user reads the
    answer); ``clean`` (no think tag at all: a plain answer). ``opened=True`` when the prompt itself ended
    inside a block (DeepSeek-R1's ``<think>\\n`` prefill)."""
    if not isinstance(text, str):
        raise TypeError(
            f"text must be a reply string, got {type(text).__name__} — the helper parses it — "
            "pass a generate_greedy record's ['text']."
        )
    validate.flag("opened", opened, why="it says whether the prompt itself opened the think block")
    body = text
    for end in REPLY_ENDS:
        body = body.split(end, 1)[0]
    stripped = body.lstrip()
    clean = THINK not in body and END_THINK not in body
    if opened or stripped.startswith(THINK):
        inside = stripped[len(THINK) :] if stripped.startswith(THINK) else stripped
        if END_THINK in inside:
            reasoning, answer = inside.split(END_THINK, 1)
            kind = "reasoned" if reasoning.strip() else "empty"
            return {
                "kind": kind,
                "reasoning": reasoning.strip(),
                "answer": answer.strip(),
                "leaked": END_THINK in answer,
                "clean": False,
            }
        return {
            "kind": "unclosed",
            "reasoning": inside.strip(),
            "answer": "",
            "leaked": False,
            "clean": False,
        }
    return {
        "kind": "no_block",
        "reasoning": "",
        "answer": stripped.strip(),
        "leaked": END_THINK in body,
        "clean": clean,
    }


def reply_kinds(records) -> dict:
    """Shares of ``REPLY_KINDS`` over generation records, and of the replies that leaked reasoning, that are
    clean (no think tag at all) and that wrote reasoning in a block (``with_reasoning``: reasoned or unclosed,
    the opposite of skipping it)."""
    if isinstance(records, (str, bytes, dict)) or not isinstance(records, Sequence) or not records:
        raise ValueError(
            f"records must be a non-empty list of generate_greedy records, got "
            f"{type(records).__name__} — the helper reads each reply — pass generate_greedy(...)."
        )
    for i, r in enumerate(records):
        if not (isinstance(r, str) or (isinstance(r, dict) and isinstance(r.get("text"), str))):
            got = (f"a dict without a text 'text' (keys: {sorted(r, key=str)})" if isinstance(r, dict)
                   else f"a {type(r).__name__}")
            raise ValueError(f"records[{i}] is {got} — the helper reads each reply's text — pass "
                             "generate_greedy(...)'s records (or the reply strings).")
    read = [read_reply(r["text"] if isinstance(r, dict) else r) for r in records]
    shares = {k: sum(r["kind"] == k for r in read) / len(read) for k in REPLY_KINDS}
    shares["leaked"] = sum(r["leaked"] for r in read) / len(read)
    shares["clean"] = sum(r["clean"] for r in read) / len(read)
    shares["with_reasoning"] = shares["reasoned"] + shares["unclosed"]  # text in the block, closed or not
    return shares


def reply_to(model, tokenizer, histories, max_new_tokens: int = 48, **render) -> list[dict]:
    """Greedy replies to each history (a list of message lists), rendered by the tokenizer's template with the
    generation prompt (``render``: more template arguments, e.g. ``enable_thinking=False``), stopping at
    ``<|im_end|>`` or the tokenizer's eos: ``generate_greedy``'s records."""
    from .generation import generate_greedy

    validate.model("model", model)
    validate.tokenizer("tokenizer", tokenizer)
    if isinstance(histories, (str, dict)) or not isinstance(histories, Sequence) or not histories:
        raise ValueError(
            f"histories must be a non-empty list of message lists, got {type(histories).__name__} — each is "
            "one prompt to reply to — pass e.g. [conversation[:1] for conversation in chats]."
        )
    if isinstance(histories[0], dict) and "role" in histories[0]:
        raise TypeError("histories is one conversation (a list of messages), not a list of them — each item "
                        "is one prompt to reply to — wrap it: [conversation].")
    for i, history in enumerate(histories):
        validate.chat(f"histories[{i}]", history)
    validate.positive_int("max_new_tokens", max_new_tokens, why="it caps each reply")
    _check_render(tokenizer, render)
    prompts = [
        tokenizer.apply_chat_template(h, tokenize=False, add_generation_prompt=True, **render)
        for h in histories
    ]
    # the tokenizer's own eos, not the literal "<|endoftext|>": a Llama-style vocabulary calls it "</s>"
    # and has no "<|endoftext|>" (its id would be None)
    stop = [i for i in dict.fromkeys((tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id))
            if i is not None]
    return generate_greedy(model, tokenizer, prompts, max_new_tokens=max_new_tokens, eos_token_id=stop)


# apply_chat_template's own arguments a render may pass besides the template's variables
_RENDER_ARGUMENTS = ("tools", "documents", "chat_template", "continue_final_message")


def _template_variables(template: str) -> set[str] | None:
    """The variables a chat template reads (what ``apply_chat_template``'s extra keywords become), or
    ``None`` when it cannot be parsed here (then nothing is refused)."""
    import jinja2
    import jinja2.meta
    from jinja2.ext import loopcontrols

    # TRL's training templates mark the graded span with {% generation %}, a tag transformers adds
    plain = re.sub(r"{%-?\s*(end)?generation\s*-?%}", "", template)
    try:
        parsed = jinja2.Environment(extensions=[loopcontrols]).parse(plain)
        return set(jinja2.meta.find_undeclared_variables(parsed))
    except jinja2.TemplateError:
        return None


def _check_render(tokenizer, render: dict) -> None:
    """``render``: keywords the chat template reads (or ``apply_chat_template`` takes). A misspelt one
    (``enable_thinkin``) is an undefined template variable: silently ignored, the reply rendered
    without it."""
    clash = [k for k in ("tokenize", "add_generation_prompt", "conversation") if k in render]
    if clash:
        raise TypeError(f"reply_to sets {clash} itself — it renders the text of each history with the "
                        "generation prompt — drop them.")
    template = render.get("chat_template") or getattr(tokenizer, "chat_template", None)
    known = _template_variables(template) if isinstance(template, str) else None
    if known is None:
        return
    allowed = sorted((known | set(_RENDER_ARGUMENTS)) - {"messages", "add_generation_prompt"})
    unknown = [k for k in render if k not in allowed]
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1, cutoff=0.6)
        raise TypeError(f"reply_to got {unknown}, which the chat template never reads (it reads {allowed}) — "
                        "an unknown template argument is silently ignored, so the replies would be rendered "
                        f"without it — {'use ' + repr(close[0]) if close else 'drop it'}.")


def read_tool_call(text: str) -> dict | None:
    """The first ``<tool_call>`` of a reply as a Hermes-style server parses it: ``{"name", "arguments"}``
    with ``arguments`` as the JSON held there — a dict when the model wrote an object, a *string* when it
    wrote an escaped string — or ``None`` when the reply holds no complete, valid call."""
    if not isinstance(text, str):
        raise TypeError(
            f"text must be a reply string, got {type(text).__name__} — the helper parses it — "
            "pass a generate_greedy record's ['text']."
        )
    match = re.search(re.escape(TOOL_CALL) + r"\s*(.*?)\s*" + re.escape(END_TOOL_CALL), text, re.S)
    if not match:
        return None
    try:
        call = json.loads(match[1])
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
        return None
    return {"name": call["name"], "arguments": call["arguments"]}


def arguments_shape(text: str) -> str | None:
    """What a reply's first call writes after ``"arguments": ``: ``"object"`` (``{``: a server parses it
    into a dict), ``"string"`` (``"``: an escaped JSON string, parsed into a str), or ``None`` (no call).
    The shape the model learned, whether or not the rest of its call is valid JSON."""
    if not isinstance(text, str):
        raise TypeError(
            f"text must be a reply string, got {type(text).__name__} — the helper reads it — pass a "
            "generate_greedy record's ['text']."
        )
    match = re.search(r'"arguments":\s*(.)', text.split(END_TOOL_CALL, 1)[0])
    if not match or TOOL_CALL not in text:
        return None
    return {"{": "object", '"': "string"}.get(match[1])


# ------------------------------------------------------------------------------------------------
# The lesson's "what if"
# ------------------------------------------------------------------------------------------------


def thinking_flag_diff(tokenizer, conversation: list[dict]) -> list[str]:
    """The lines of ``conversation``'s render (with the generation prompt) that change when
    ``enable_thinking`` goes from True to False: ``"- line"`` only with the flag on, ``"+ line"`` only with it
    off. ``enable_thinking`` is a template variable, not a library setting: what it does (or whether the
    template reads it at all: then ``[]``) is decided by the template, so diff yours before you train or serve
    with it."""
    validate.tokenizer("tokenizer", tokenizer)
    if isinstance(conversation, (str, dict)) or not isinstance(conversation, Sequence) or not conversation \
            or not all(isinstance(m, dict) and "role" in m for m in conversation):
        raise ValueError(f"conversation must be a non-empty list of messages, got {conversation!r:.60} — the "
                         "template renders it twice — pass e.g. "
                         "[{'role': 'user', 'content': 'What is 2 + 2?'}].")
    on, off = (tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True,
                                             enable_thinking=flag) for flag in (True, False))
    diff = difflib.unified_diff(on.splitlines(), off.splitlines(), lineterm="", n=0)
    return [f"{line[0]} {line[1:]}" for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def reasoning_explorer(runs: dict):
    """What if the run had been trained another way, or served with the other ``enable_thinking``?
    ``runs`` maps a run's label to ``{serve setting: generation records}``; one frame per pair: the shares
    of reasoned / empty / no block / leaked replies, and the first reply."""
    from .viz import what_if

    if not isinstance(runs, dict) or not runs or not all(isinstance(v, dict) and v for v in runs.values()):
        raise ValueError(
            f"runs must be a non-empty dict {{run: {{serve setting: records}}}}, got "
            f"{type(runs).__name__} — each frame shows one run served one way — pass the dict "
            "the lesson measured."
        )
    settings = list(next(iter(runs.values())))
    if any(list(v) != settings for v in runs.values()):
        raise ValueError(
            "every run must be measured under the same serve settings — the dropdowns choose "
            "one of each — measure each run with the same settings."
        )

    def frame(run, served):
        records = runs[run][served]
        shares = reply_kinds(records)
        bars = "\n".join(f"  {k:9s} {'█' * round(20 * v):20s} {v:.2f}" for k, v in shares.items())
        return f"{run} — served {served}\n{bars}\n  first reply: {records[0]['text'][:90]!r}"

    return what_if(
        frame,
        {"run": list(runs), "served": settings},
        descriptions={"run": "trained as", "served": "served with"},
        width="560px",
    )


def train_on(chat_template: str, rows: list[dict], *, steps: int = 160, batch: int = 4,
             progress: bool = False, until=None, every: int = 20, **config):
    """One lesson run: a fresh course model with the reasoning tokens (``load_reasoning_model``), TRL's
    ``SFTTrainer`` on ``rows`` (TRL's data forms) for ``steps`` optimizer steps of ``batch`` rows, the
    course's CPU defaults (``training.make_sft_trainer``); ``config``: more ``SFTConfig`` fields. Returns the
    trained ``(model, tokenizer)``, the model in eval mode; the loss the trainer logged at each step is kept
    on the model as ``model.logged_loss`` (a list, in step order). ``progress=True`` shows a bar (a run takes
    seconds on 2 cores: a silent cell that long reads as a hang).

    The defaults are lesson 09's runs A and B: many small steps. Measured on seven models (the two shipped
    and five built apart: NeoX, GPT-2, Phi-3, Mistral and Gemma styles), two seeds each, one thread: with 160
    steps of 4 rows every claim the lesson makes on A and B held on all 14 (B minus A on turn 1: 0.78 to 1.0;
    A on turn 2: 0.875 or more; B on turn 2, history as trained: 0.75 or more). With 60 steps of 16, half as
    many rows again, 2 of 14 failed (the GPT-2-style model's run A reasoned on turn 2 in 0.13 and 0.16 of its
    replies); with 120 steps of 4, B on turn 2 sat at exactly the 0.5 mark on that model (seed 0, 2 threads).

    ``until``: a criterion measured on the run, ``until(model, tokenizer) -> bool``, checked every ``every``
    steps in eval mode; training ends once it holds and ``steps`` is the cap (a fixed step count tuned on one
    model fails on another: issue 46). ``model.steps_trained`` keeps the steps run."""
    from datasets import Dataset

    from .training import logged, make_sft_trainer

    validate.positive_int("steps", steps, why="it counts optimizer steps")
    validate.positive_int("batch", batch, why="it is the rows per step")
    validate.flag("progress", progress, why="it switches the progress bar")
    _check_trl_rows(rows)
    validate.sft_config("config", config)
    validate.positive_int("every", every, why="it is the steps between two checks of the criterion")
    if until is not None:
        validate.function("until", until)
    model, tokenizer = load_reasoning_model(chat_template)
    trainer = make_sft_trainer(
        model,
        tokenizer,
        Dataset.from_list(list(rows)),
        max_steps=steps,
        per_device_train_batch_size=batch,
        progress=progress,
        **config,
    )
    if until is not None:
        trainer.add_callback(_until_callback(until, tokenizer, every))
    trainer.train()
    trainer.model.logged_loss = logged(trainer, "loss")
    trainer.model.steps_trained = trainer.state.global_step
    return trainer.model.eval(), tokenizer


def _until_callback(until, tokenizer, every: int):
    """``train_on``'s criterion as a ``TrainerCallback``: measured every ``every`` steps, in eval mode,
    without gradients; it ends training once ``until(model, tokenizer)`` holds."""
    import torch
    from transformers import TrainerCallback

    class UntilMet(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every == 0 and state.global_step < state.max_steps:
                model.eval()
                with torch.no_grad():
                    control.should_training_stop = bool(until(model, tokenizer))
                model.train()
            return control

    return UntilMet()


def calls_written(model, tokenizer, histories, *, max_new_tokens: int = 96) -> float:
    """The share of greedy replies to ``histories`` that write one tool call, in either shape (arguments as
    an object or as a string), and end the turn right after its ``</tool_call>``: whether a tool-call run has
    learned the *format* — what every row of lesson 09's tool runs grades, a call and then the end of the
    turn — whatever it learned to put in it: a criterion that does not presuppose which shape (lesson 09
    trains each run until it holds), nor valid JSON (a tiny model gets a closing brace wrong for a long
    while: 140 steps instead of 60 on the course model, measured). A reply that runs on past the call does
    not count: on a Gemma-style held-out model a run met a looser "writes ``"arguments":``" after 40 steps
    while its calls still ran on into tool replies it invented."""
    records = reply_to(model, tokenizer, histories, max_new_tokens=max_new_tokens)
    return sum(_call_then_end_of_turn(tokenizer, r) for r in records) / len(records)


def _call_then_end_of_turn(tokenizer, record: dict) -> bool:
    """One reply (a ``generate_greedy`` record) writes a call and stops with a stop token right after it."""
    text = record["text"]
    if not record["ended"] or arguments_shape(text) is None or END_TOOL_CALL not in text:
        return False
    after = text.split(END_TOOL_CALL, 1)[1]
    stop = tokenizer.decode(record["ids"][-1:])
    return after.endswith(stop) and not after[: len(after) - len(stop)].strip()


def fixes_figure(pairs: dict):
    """The lesson's verify plot: for each fix, the share of replies that do what the data meant, broken
    (red) beside fixed (green), with half the replies drawn as a line. ``pairs``: label -> (broken, fixed)."""
    import matplotlib.pyplot as plt  # a pyplot figure: the notebook's inline backend stores it as a picture

    if (
        not isinstance(pairs, dict)
        or not pairs
        or not all(isinstance(v, (tuple, list)) and len(v) == 2 for v in pairs.values())
    ):
        raise ValueError(
            f"pairs must be a non-empty dict {{label: (broken, fixed)}}, got {type(pairs).__name__} — "
            "each bar pair is one fix — pass the shares the lesson measured."
        )
    fig, ax = plt.subplots(figsize=(9, 3.4), dpi=90)
    x = range(len(pairs))
    ax.bar([i - 0.2 for i in x], [v[0] for v in pairs.values()], width=0.4, color="#d62828", label="broken")
    ax.bar([i + 0.2 for i in x], [v[1] for v in pairs.values()], width=0.4, color="#2a9d8f", label="fixed")
    ax.axhline(0.5, color="k", ls="--", lw=1)
    ax.set_xticks(list(x), list(pairs), fontsize=8)
    ax.set_ylabel("share of replies (0-1)")
    ax.set_ylim(0, 1.05)
    ax.set_title("What the data meant, before and after each fix (dashed: half the replies)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)  # shown once, as the returned figure (the inline backend would show an open one again)
    return fig
