"""Lesson 09's exercises: their checkers, and the renderings of the diagnosis exercise.

1. ``check_turn_rows(fn)``: ``fn(conversation) -> rows`` turns one multi-turn reasoning conversation into
   TRL rows that train every turn's reasoning, grade no empty think block, and train each turn in the
   context Qwen3's template serves it in; graded by preparing the rows with TRL itself
   (``reasoning.trained_rows``) on conversations the notebook never shows.
2. ``rendering(seed)`` (the artefact a learner reads: data rows, the template, the loss setting, each row's
   rendered tokens with their mask) + ``check_diagnose_rendering(fn)``: ``fn(artefact) ->
   Diagnosis(cause, evidence)``, one of ``CAUSES``, graded on fresh renderings that include healthy
   look-alikes.

The generator that knows a rendering's cause lives with the reference answers (``answers/lesson09.py``,
``rendering_case``), on a stream apart from the renderings ``rendering`` shows.
"""

from __future__ import annotations

import copy
import functools

from .. import validate
from ..checks import Case, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import is_graded
from ..model import course_seed
from ..reasoning import data_reasoning_tokens, reasoning_budget, reasoning_chats, think_blocks, trained_rows
from .answers import lesson09 as _answers

# ------------------------------------------------------------------------------------------------
# Exercise 1 (fix): every turn's reasoning, in the context it is served in
# ------------------------------------------------------------------------------------------------


@functools.cache
def _qwen3_tokenizer():
    """The course tokenizer with the reasoning tokens and Qwen3's original template (what serves)."""
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = copy.copy(_answers._tokenizer())
    tokenizer.chat_template = qwen3_chat_template
    return tokenizer


def _conversations() -> list[list[dict]]:
    """Fresh conversations: 2 or 3 turns, some turns without reasoning (a plain chat turn), seeded apart
    from the notebook's; at least one with a plain turn and one where every turn reasons."""
    base = 9000 + 17 * course_seed()
    chats = [reasoning_chats(1, base + k, turns=2 + k % 2, reasoning_share=0.6)[0] for k in range(4)]
    chats.append(reasoning_chats(1, base + 50, turns=3)[0])  # every turn reasons
    plain = reasoning_chats(1, base + 60, turns=3, reasoning_share=0.0)[0]
    plain[3]["reasoning_content"] = "the middle turn reasons."  # only the middle one
    chats.append(plain)
    return chats


def _serving_prompt(tokenizer, history: list[dict], thinking: bool) -> list[int]:
    """What Qwen3's template puts before the reply at inference: the history, then the generation prompt
    (with an empty think block when the turn is served with ``enable_thinking=False``)."""
    kwargs = {} if thinking else {"enable_thinking": False}
    return tokenizer.apply_chat_template(
        history, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )


def _compare_turn_rows(got, conversation) -> str | None:
    tokenizer = _qwen3_tokenizer()
    if (
        isinstance(got, dict)
        or not isinstance(got, (list, tuple))
        or not got
        or not all(isinstance(r, dict) for r in got)
    ):
        return (
            f"expected a non-empty list of row dicts (TRL's forms: 'prompt'/'completion' or 'messages'), "
            f"got {type(got).__name__}"
        )
    try:
        rows = trained_rows(tokenizer, list(got))
    except Exception as exc:  # a learner's row TRL cannot prepare: say what TRL said
        return f"TRL could not prepare your rows: {type(exc).__name__}: {str(exc)[:160]}"
    turns = [m for m in conversation if m["role"] == "assistant"]
    data = data_reasoning_tokens(tokenizer, [conversation])
    budget = reasoning_budget(tokenizer, rows)
    cut = [
        b
        for row in rows
        for b in think_blocks(tokenizer, row)
        if not b["empty"] and 0 < b["graded"] < b["tokens"]
    ]
    if cut:
        return (
            f"{len(cut)} reasoning block(s) are only partly graded: the opening <think> sits in the row's "
            "prompt, after an empty block, and is never trained — which rendering setting put it there, and "
            "for which turns?"
        )
    if budget["graded_reasoning_tokens"] < data["reasoning_tokens"]:
        return (
            f"{data['reasoning_tokens'] - budget['graded_reasoning_tokens']} of {data['reasoning_tokens']} "
            "reasoning tokens never reach the loss: which assistant turns does Qwen3's template render with "
            "their reasoning?"
        )
    if budget["graded_reasoning_tokens"] > data["reasoning_tokens"]:
        return "some reasoning is graded twice: in how many rows' completions does each turn appear?"
    if budget["graded_empty_blocks"]:
        return (
            f"{budget['graded_empty_blocks']} empty think block(s) carry loss: they teach the model to skip "
            "reasoning — what does the template render in a completion for a turn without reasoning, and "
            "where else could that block sit?"
        )
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    graded_ends = graded_starts = 0
    for row in rows:
        labels = row["labels"]
        graded_ends += sum(
            t == im_end and is_graded(label) for t, label in zip(row["input_ids"], labels)
        )
        graded_starts += sum(
            t == im_start and is_graded(label) for t, label in zip(row["input_ids"], labels)
        )
    if graded_starts:
        return (
            "tokens outside the assistant's replies carry loss (a turn's <|im_start|> is graded): what do "
            "your rows' completions hold?"
        )
    if graded_ends != len(turns):
        return (
            f"{graded_ends} graded replies for {len(turns)} assistant turns: how many times is each turn's "
            "reply trained?"
        )
    for row in rows:
        first = next(i for i, label in enumerate(row["labels"]) if is_graded(label))
        prefix = list(row["input_ids"][:first])
        served = [
            _serving_prompt(tokenizer, conversation[:i], bool(m.get("reasoning_content")))
            for i, m in enumerate(conversation)
            if m["role"] == "assistant"
        ]
        if prefix not in served:
            return (
                "a row's context is not what Qwen3's template shows at inference (the history, rendered by "
                f"the same template, then the generation prompt): {tokenizer.decode(prefix)[-80:]!r}"
            )
    return None


TURN_ROWS_HINTS = Hints(
    question="Which assistant turns does Qwen3's template render with their reasoning — and what does it "
    "render, in a row's completion, for a turn that has none?",
    pointer="Section 4 (the template's jinja: last_query_index) and section 5a (the empty block, and the "
    "prompt-completion fix with chat_template_kwargs).",
    answer="[{'prompt': conversation[:i], 'completion': [m], 'chat_template_kwargs': {'enable_thinking': "
    "bool(m.get('reasoning_content'))}} for i, m in enumerate(conversation) if m['role'] == 'assistant']",
)


def check_turn_rows(fn):
    """Checker for exercise 1: ``fn(conversation)`` on six fresh conversations; its rows are prepared by
    TRL (``reasoning.trained_rows``, Qwen3's original template) and compared with the data."""
    validate.function("fn", fn)
    _qwen3_tokenizer()  # loaded here once (no answer in it): every grading process inherits it
    return run_check(  # the cases built in the grading process: this one never holds them
        "turn_rows", fn,
        lambda: [Case((c,), c, label=f"a {sum(m['role'] == 'user' for m in c)}-turn conversation")
                 for c in _conversations()],
        compare=_compare_turn_rows, hint=TURN_ROWS_HINTS)


# ------------------------------------------------------------------------------------------------
# Exercise 2 (diagnosis): what does this rendering train?
# ------------------------------------------------------------------------------------------------

CAUSES = _answers.CAUSES


def rendering(seed: int) -> dict:
    """A few prepared rows as a practitioner inspects them (``rows``: each with its data ``messages`` and its
    rendered ``tokens`` as ``(text, graded)`` pairs; the ``template`` family; the ``loss`` setting), without
    their verdict: the exercise. The checker grades renderings drawn apart from these."""
    validate.seed("seed", seed)
    return _answers.rendering_case(seed, graded=False)[0]


def _graded_case(seed: int):
    # Not through rendering_case's cache: a cached (artefact, truth) pair is an object gc can list, and a
    # learner's function could match its artefact against it. The checker renders each case once anyway.
    return _answers.uncached_rendering_case(seed, graded=True)


_LOOK_ALIKES = {
    "TRL's training template on multi-turn reasoning": ("qwen3", "assistant_only_loss=True", "multi"),
    "an empty think block in the prompt": ("qwen3", "completion only", "plain"),
    "turn 1 had no reasoning in the data": ("qwen3", "every token", "multi"),
    "tool replies rendered, not graded": ("qwen2_5", "assistant_only_loss=True", "tools"),
    "Llama 3 without tool calls in the data": ("llama3", "assistant_only_loss=True", "plain"),
}


def _surface(artefact: dict) -> tuple[str, str, str]:
    messages = artefact["rows"][0]["messages"]
    kind = (
        "tools"
        if any(m.get("tool_calls") for m in messages)
        else "multi"
        if sum(m["role"] == "user" for m in messages) > 1
        else "plain"
    )
    return artefact["template"], artefact["loss"].split(" (")[0], kind


@functools.cache
def _look_alike_seeds(start: int) -> list[int]:
    """For each look-alike, the first seed from ``start`` on that draws it healthy: graded in every run."""
    found = []
    for surface in _LOOK_ALIKES.values():
        seed = start
        while True:
            cause, setup = _answers.drawn_setup(seed)  # cheap: render only healthy draws of the template
            if cause == "healthy" and setup[0] == surface[0]:
                artefact, truth = _graded_case(seed)
                if truth.cause == "healthy" and _surface(artefact) == surface:
                    break
            seed += 1
        found.append(seed)
    return found


DIAGNOSIS_MISCONCEPTIONS = {
    (
        "reasoning_dropped",
        "healthy",
    ): "a turn whose data has no reasoning loses nothing when it renders without a block — compare each "
    "turn's reasoning_content with the graded blocks",
    (
        "healthy",
        "reasoning_dropped",
    ): "the data holds reasoning for a turn whose rendering has no graded think block: Qwen3's template "
    "dropped it (every turn before the last user message)",
    (
        "empty_think_graded",
        "healthy",
    ): "an empty think block in the prompt (not graded) is what enable_thinking=False renders: it teaches "
    "nothing — only a graded empty block does",
    (
        "healthy",
        "empty_think_graded",
    ): "the empty <think></think> is inside the graded span: the model learns to close the block at once",
    ("tool_reply_graded", "healthy"): "the tool's reply is rendered, but none of its tokens is graded",
    (
        "healthy",
        "tool_reply_graded",
    ): "tokens inside <tool_response> carry loss: the model learns to write the tool's reply",
    ("tool_calls_dropped", "healthy"): "the data holds no tool call here, so there is nothing to drop",
    (
        "healthy",
        "tool_calls_dropped",
    ): "the data's tool calls are not in the rendering at all: this template ignores message['tool_calls']",
    (
        "healthy",
        "arguments_as_string",
    ): 'the arguments render as an escaped JSON string ("arguments": "{\\"a\\"…): the model learns to '
    "write a string where a server expects an object",
}


DIAGNOSIS_HINTS = Hints(
    question="For each row: which of the data's reasoning, tool calls and tool replies reach the rendering, "
    "and which rendered tokens are graded?",
    pointer="Sections 3 and 5: count graded tokens inside each <think>…</think> and <tool_response>…"
    "</tool_response>, look for each call's name in the rendering and for '\"arguments\": \"'.",
    answer='Sum over rows: calls missing from the text -> tool_calls_dropped; \'"arguments": "\' -> '
    "arguments_as_string; tool_response blocks with a graded token -> tool_reply_graded; empty think "
    "blocks with a graded token -> empty_think_graded; reasoning_content not in any graded block -> "
    "reasoning_dropped; else healthy (None). The evidence is the count.",
)


def check_diagnose_rendering(fn):
    """Checker for exercise 2: ``fn(artefact) -> Diagnosis`` on fresh renderings (every cause once, then
    six drawn fresh on every run, and each healthy look-alike, in a shuffled order: no keyword fixes them)."""
    validate.function("fn", fn)
    # the look-alikes are found by search (seconds of rendering), so their seeds are the course seed's: fixed
    # seeds, searched here once (cached) so that every grading process inherits them; the fresh draws are the
    # grading process's own
    _look_alike_seeds(5000 + 100 * course_seed())
    return check_diagnosis(
        "diagnose_rendering",
        fn,
        _graded_case,
        seeds=lambda: [*range(len(CAUSES)), *fresh_seeds(6), *_look_alike_seeds(5000 + 100 * course_seed())],
        misconceptions=DIAGNOSIS_MISCONCEPTIONS,
        hint=DIAGNOSIS_HINTS,
    )
