"""Reference answers of lesson 09's exercises (``exercises/lesson09.py``'s checkers import them; notebooks
never do), and the generator of the diagnosis exercise's renderings, which knows each one's cause."""

from __future__ import annotations

import copy
import functools
import random

from ... import validate
from ...checks import Diagnosis
from ...data import is_graded


def turn_rows(conversation: list[dict]) -> list[dict]:
    """Exercise 1: one prompt-completion row per assistant turn — the history up to that turn as the
    prompt, the turn as the completion; a turn without reasoning is rendered with ``enable_thinking=False``.

    Qwen3's template renders the last assistant turn with its reasoning and every earlier one without: so
    each turn, made the last one of its own row, trains its reasoning, and its context (the history,
    rendered without earlier reasoning) is exactly what the same template shows at inference. A last turn
    without reasoning renders an empty ``<think>`` block; with ``enable_thinking=False`` that block is part
    of the generation prompt, so it is context, not a target.
    """
    return [
        {
            "prompt": conversation[:i],
            "completion": [message],
            "chat_template_kwargs": {"enable_thinking": bool(message.get("reasoning_content"))},
        }
        for i, message in enumerate(conversation)
        if message["role"] == "assistant"
    ]


def _walk(tokens: list) -> tuple[list, list]:
    """The ``<think>`` and ``<tool_response>`` blocks of a rendering: (text inside, graded tokens inside)."""
    blocks, replies, i = [], [], 0
    while i < len(tokens):
        closing = {"<think>": "</think>", "<tool_response>": "</tool_response>"}.get(tokens[i][0])
        if closing:
            j = next(k for k in range(i + 1, len(tokens)) if tokens[k][0] == closing)
            inside = tokens[i + 1 : j]
            (blocks if closing == "</think>" else replies).append(
                ("".join(t for t, _ in inside).strip(), sum(bool(g) for _, g in inside))
            )
            i = j
        i += 1
    return blocks, replies


def diagnose_rendering(artefact: dict) -> Diagnosis:
    """Exercise 2: compare each row's data (``messages``) with what its prepared row renders and grades
    (``tokens``: ``(text, graded)`` pairs), summed over the rows."""
    counts = dict.fromkeys(CAUSES[1:], 0)
    for row in artefact["rows"]:
        tokens = row["tokens"]
        text = "".join(t for t, _ in tokens)
        blocks, replies = _walk(tokens)
        calls = [c for m in row["messages"] for c in (m.get("tool_calls") or [])]
        counts["tool_calls_dropped"] += sum(c["function"]["name"] not in text for c in calls)
        counts["arguments_as_string"] += text.count('"arguments": "')
        counts["tool_reply_graded"] += sum(g > 0 for _, g in replies)
        counts["empty_think_graded"] += sum(not inside and g > 0 for inside, g in blocks)
        graded = {inside for inside, g in blocks if inside and g > 0}
        reasoning = [m["reasoning_content"] for m in row["messages"] if m.get("reasoning_content")]
        counts["reasoning_dropped"] += sum(r.strip() not in graded for r in reasoning)
    found = [(cause, n) for cause, n in counts.items() if n]
    return Diagnosis(*found[0]) if found else Diagnosis("healthy", None)


# ------------------------------------------------------------------------------------------------
# Exercise 2's generator: real TRL preparations of real templates on the course tokenizer
# ------------------------------------------------------------------------------------------------

CAUSES = (
    "healthy",
    "reasoning_dropped",
    "empty_think_graded",
    "tool_reply_graded",
    "tool_calls_dropped",
    "arguments_as_string",
)
# Each set-up: (template, SFTConfig fields, how the rows are built, data) -> the one cause it plants, or a
# healthy look-alike with the same surface (the same template, the same kind of data).
_SETUPS = {
    "reasoning_dropped": [("qwen3", {}, "messages", "multi")],
    "empty_think_graded": [
        ("qwen3", {}, "prompt_completion", "plain"),
        ("qwen3", {"assistant_only_loss": True}, "messages", "plain"),
    ],
    "tool_reply_graded": [("qwen2_5", {}, "messages", "tools_dict")],
    "tool_calls_dropped": [("llama3", {"assistant_only_loss": True}, "messages", "tools_dict")],
    "arguments_as_string": [("qwen2_5", {"assistant_only_loss": True}, "messages", "tools_json")],
    "healthy": [
        ("qwen3", {"assistant_only_loss": True}, "messages", "multi"),  # TRL's training template
        ("qwen3", {}, "messages", "single"),  # one turn, reasoned
        ("qwen3", {}, "prompt_completion", "plain_nothink"),  # the empty block in the prompt
        ("qwen3", {}, "messages", "multi_plain_first"),  # turn 1 had no reasoning
        ("qwen2_5", {"assistant_only_loss": True}, "messages", "tools_dict"),  # replies not graded
        ("llama3", {"assistant_only_loss": True}, "messages", "plain"),
    ],  # no call to drop
}


@functools.cache
def _tokenizer():
    from ...model import add_reasoning_tokens, load_course_model

    model, tokenizer = load_course_model("tiny-qwen")
    add_reasoning_tokens(model, tokenizer)
    return tokenizer


def _template(name: str) -> str:
    from trl import chat_template_utils as ctu

    return {
        "qwen3": ctu.qwen3_chat_template,
        "qwen2_5": ctu.qwen2_5_chat_template,
        "llama3": ctu.llama3_chat_template,
    }[name]


def _data(kind: str, seed: int) -> list[dict]:
    from ...reasoning import reasoning_chats, tool_chats

    if kind.startswith("tools"):
        return tool_chats(1, seed, arguments="json" if kind == "tools_json" else "dict")[0]
    if kind.startswith("plain"):
        return reasoning_chats(1, seed, reasoning_share=0.0)[0]
    if kind == "single":
        return reasoning_chats(1, seed)[0]
    chat = reasoning_chats(1, seed, turns=2 + seed % 2)[0]
    if kind == "multi_plain_first":  # the data never had reasoning before the last turn: nothing to lose
        for message in chat[:-1]:
            message.pop("reasoning_content", None)
    return chat


def _row(kind: str, layout: str, chat: list[dict]) -> dict:
    if layout == "messages":
        return {"messages": chat}
    prompt, completion = chat[:-1], chat[-1:]
    return {
        "prompt": prompt,
        "completion": completion,
        "chat_template_kwargs": {"enable_thinking": False} if kind == "plain_nothink" else {},
    }


def rendering_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """A prepared row set as a practitioner inspects it, and its truth (see ``_rendering_case``); a fresh copy
    each call (a learner's function may change what it is given), the TRL preparation done once per seed."""
    artefact, truth = _rendering_case(seed, graded)
    return copy.deepcopy(artefact), truth


def uncached_rendering_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """``rendering_case`` without its cache, for the checker: a cached ``(artefact, truth)`` pair stays alive
    where ``gc`` can list it, and a learner's function could match its artefact against it (issue 43)."""
    return _rendering_case.__wrapped__(seed, graded)


def _draw(seed: int, graded: bool) -> tuple[random.Random, str, tuple]:
    """A case's first draws — its cause and its set-up ``(template, fields, layout, kind)`` — and the
    generator that draws the rest: ``_rendering_case`` renders from them; the checker's look-alike search
    reads them to skip, without rendering, the seeds that cannot be the look-alike it wants (rendering is
    the slow part)."""
    rng = random.Random(f"{'graded' if graded else 'shown'}-{seed}")
    cause = CAUSES[seed % len(CAUSES)] if seed < len(CAUSES) else rng.choice(CAUSES)
    return rng, cause, rng.choice(_SETUPS[cause])


def drawn_setup(seed: int, graded: bool = True) -> tuple[str, tuple]:
    """``(cause, set-up)`` a seed draws, without rendering it (see ``_draw``)."""
    validate.seed("seed", seed)
    validate.flag("graded", graded, why="it picks the stream: the checker's cases or the ones shown")
    _, cause, setup = _draw(seed, graded)
    return cause, setup


@functools.lru_cache(maxsize=256)
def _rendering_case(seed: int, graded: bool) -> tuple[dict, Diagnosis]:
    """A prepared row as a practitioner inspects it — the data row (``messages``), the template's family,
    the loss settings, and the rendered tokens with their mask — and its truth. ``CAUSES[seed % 6]`` for the
    first seeds, then random; healthy cases are look-alikes of broken ones. ``graded`` picks the stream, so
    the checker's cases and the ones ``rendering`` shows are drawn apart."""
    from ...reasoning import reasoning_budget, think_blocks, tool_budget, trained_rows
    from ...viz import token_strings

    rng, cause, (template, fields, layout, kind) = _draw(seed, graded)
    chats = [_data(kind, rng.randrange(10**6)) for _ in range(rng.choice((2, 3)))]
    tokenizer = copy.copy(_tokenizer())
    tokenizer.chat_template = _template(template)
    if template == "llama3":
        tokenizer.bos_token = (
            tokenizer.eos_token
        )  # Llama 3's template opens with it; the course tokenizer has none
    rows = trained_rows(tokenizer, [_row(kind, layout, chat) for chat in chats], **fields)
    budget, tools = reasoning_budget(tokenizer, rows), None
    if kind.startswith("tools"):
        tools = tool_budget(tokenizer, rows, chats)
    graded_blocks = sum(
        b["graded"] > 0 and not b["empty"] for row in rows for b in think_blocks(tokenizer, row)
    )
    lost = sum(1 for chat in chats for m in chat if m.get("reasoning_content")) - graded_blocks
    evidence = {
        "healthy": None,
        "reasoning_dropped": lost,
        "empty_think_graded": budget["graded_empty_blocks"],
        "tool_reply_graded": tools and tools["graded_tool_replies"],
        "tool_calls_dropped": tools and tools["tool_calls"] - tools["calls_rendered"],
        "arguments_as_string": tools and tools["arguments_as_string"],
    }[cause]
    shown = []
    for chat, row in zip(chats, rows):
        texts = [t.replace("\\n", "\n") for t in token_strings(tokenizer, row["input_ids"])]
        shown.append(
            {"messages": chat, "tokens": [(t, is_graded(label)) for t, label in zip(texts, row["labels"])]}
        )
    artefact = {
        "template": template,
        "loss": "assistant_only_loss=True"
        if fields
        else ("completion only (prompt-completion rows)" if layout != "messages" else "every token"),
        "rows": shown,
    }
    return artefact, Diagnosis(cause, evidence)


# The self-test's plain phrases, in a fixed order (what a learner of lesson 09 can name).
SELF_TEST_CAUSES = {
    "healthy": "nothing: every reasoning and tool-call token the data holds is trained as intended",
    "reasoning_dropped": "the template dropped earlier turns' reasoning before the loss saw it",
    "empty_think_graded": "an empty think block is trained: the model learns to skip reasoning",
    "tool_reply_graded": "the tool's reply is trained: the model learns to write it itself",
    "tool_calls_dropped": "the template silently dropped the tool calls",
    "arguments_as_string": "the call's arguments are trained as an escaped JSON string",
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: a prepared row with its loss mask (graded tokens in [brackets]), the data it
    came from, its true cause as a plain phrase, and the phrases to choose from (fixed order)."""
    artefact, truth = rendering_case(seed, graded=False)
    row = artefact["rows"][0]
    shown = "".join(f"[{t}]" if g else t for t, g in row["tokens"])
    data = "; ".join(
        f"{m['role']}: {m.get('reasoning_content', '') and '(reasoning) '}"
        f"{m['content'] or m.get('tool_calls')}"
        for m in row["messages"]
    )
    text = (
        f"Data (first of {len(artefact['rows'])} rows): {data}\nTemplate: {artefact['template']}; loss on: "
        f"{artefact['loss']}\nRendered (graded tokens in [brackets]):\n{shown}"
    )
    return text, SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())
