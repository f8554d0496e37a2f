"""The SFT doctor's checks for reasoning and tool-call data (issue 34; lesson 09 teaches the failures).

A chat template decides what of a row reaches the loss, and on reasoning and tool data it decides more
than on plain chats: Qwen3's original drops the ``<think>`` of every assistant turn before the last user
message, DeepSeek-R1-distill's drops all reasoning, Llama 3's, Phi-3's and DeepSeek's drop tool calls, a
template writes an empty ``<think>\\n\\n</think>`` into the graded span of data without reasoning, and
Qwen2.5's writes a JSON-string ``arguments`` as an escaped string beside a dict one. None of it raises.

Each check here measures the rows as TRL's ``SFTTrainer`` trains them: the doctor hands over its
``trl_view.prepare`` output (TRL's own ``_prepare_dataset``: the template TRL swaps in, ``tools`` and
``chat_template_kwargs`` per row, the labels), and ``_renderings`` renders each row again with the same
template to learn *where* each part of it lies (character spans → token positions, checked against TRL's
token ids). A part of a message counts as trained when a token of it carries a label.

TRL's own probes (``trl/chat_template_utils.py``, TRL 1.16) are quoted beside each measurement, since each
probes one synthetic conversation while the doctor measures your rows: ``is_chat_template_prefix_preserving``
(renders [user, assistant with a tool call] and the same + a tool message, and compares the prefix),
``supports_tool_calling`` (a sentinel tool call and tool reply must both survive rendering) and
``is_chat_template_stop_token_trained`` (the last token in the assistant mask of [user, assistant, user]
must be an added token). The last probes a plain turn only: it says "trained" for a template whose tool-call
branch leaves the end-of-turn token outside ``{% generation %}`` — the doctor measures the tool-call turns.

Used by ``course_utils.doctor`` (lesson 08's command); the lesson that teaches these failures is 09.
"""

from __future__ import annotations

import bisect
import copy
import functools
import json
import re
import types
from dataclasses import dataclass, field

from ..data import is_graded
from .report import Finding, could_not_check, guarded
from .trl_view import assistant_only_keeps_calls, family_training_template

# A room of the doctor, not an API: its names serve the package; users import ``course_utils.doctor``
__all__ = []

LESSON = "09"
# Where the templates TRL ships read a message's reasoning: Qwen3 (and vLLM) `reasoning_content`, gpt-oss
# `thinking`, LFM2.5 `reasoning`; DeepSeek-R1 and Qwen3 also split an inline <think>…</think> off `content`
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_INLINE_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)
_EMPTY_THINK = re.compile(r"<think>\s*</think>")


# ---------------------------------------------------------------------------------------------
# What the data holds
# ---------------------------------------------------------------------------------------------

def _reasoning_of(message: dict) -> str:
    """The reasoning an assistant message carries in the data (stripped), or ``""``."""
    for key in REASONING_FIELDS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    content = message.get("content")
    found = _INLINE_THINK.match(content) if isinstance(content, str) else None
    return found.group(1).strip() if found else ""


def _answer_of(message: dict) -> str:
    """The content of a message without an inline ``<think>`` block (what follows it)."""
    content = message.get("content")
    if not isinstance(content, str):
        return ""
    return _INLINE_THINK.sub("", content, count=1) if _INLINE_THINK.match(content) else content


def _calls_of(message: dict) -> list[tuple[str, object]]:
    """``(name, arguments)`` of each tool call of an assistant message (OpenAI's ``{"function": ...}`` form
    or a flat one)."""
    calls = message.get("tool_calls") or []
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function", call) if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out.append((function["name"], function.get("arguments")))
    return out


def _conversation(row: dict) -> tuple[list[dict], int]:
    """The messages TRL renders for a row (prompt + completion for prompt/completion rows) and the index of
    the first message it means to train (the completion's first; 0 for ``messages`` rows)."""
    if isinstance(row.get("messages"), list):
        return row["messages"], 0
    return list(row["prompt"]) + list(row["completion"]), len(row["prompt"])


def _render_kwargs(row: dict, chat_template) -> dict:
    """What TRL 1.16's ``_prepare_dataset`` passes ``apply_chat_template`` for a row: the template it trains
    with, the row's ``tools`` (a JSON string decoded) and its ``chat_template_kwargs``."""
    tools = row.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    return {"chat_template": chat_template, "tools": tools, **(row.get("chat_template_kwargs") or {})}


def _needs_rendering(dataset, tokenizer, chat_template) -> bool:
    """Whether there is anything for these checks to see: reasoning or tool calls / tool messages in the
    data, or a template that writes ``<think>`` (an empty block into data without reasoning)."""
    template = chat_template or tokenizer.chat_template or ""
    if "<think>" in template or "</think>" in template:
        return True
    for row in dataset:
        messages, _ = _conversation(row)
        if any(m.get("role") == "tool" or _calls_of(m) or (m.get("role") == "assistant" and _reasoning_of(m))
               for m in messages):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Where each part of a row lies in TRL's rendering, and whether it carries loss
# ---------------------------------------------------------------------------------------------

@dataclass
class _Span:
    """One part of one message: ``kind`` is "reasoning", "tool_output" or "call"; ``start`` is -1 when the
    rendering does not hold it; ``tokens`` / ``graded`` count its tokens and those with a label."""

    kind: str
    turn: int
    start: int = -1
    end: int = -1
    tokens: int = 0
    graded: int = 0
    how: str = ""        # a call's arguments: "object" (a JSON object) or "escaped" (a quoted JSON string)
    argument_type: str = ""  # a call's arguments in the data: "dict" or "string"
    stop_graded: bool | None = None  # a turn's last call: is the stop token after it graded (None: no stop)
    stop_id: int | None = None
    text: str = ""  # the reasoning, as the data holds it


@dataclass
class _Rendering:
    """One row as TRL trains it: the rendered ``text``, TRL's token ``ids`` with each token's character
    ``starts`` / ``ends`` in the text and TRL's ``labels``, and the located ``spans`` of its messages."""

    row: int
    messages: list
    first_trained: int
    text: str
    ids: list
    starts: list
    ends: list
    labels: list
    kwargs: dict  # what TRL passes apply_chat_template for this row: template, tools, chat_template_kwargs
    spans: list = field(default_factory=list)

    def render(self, tokenizer, messages, chat_template=None) -> str:
        """``messages`` rendered as TRL renders this row (or with ``chat_template`` instead of TRL's)."""
        kwargs = {**self.kwargs, **({"chat_template": chat_template} if chat_template else {})}
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)

    def token_range(self, start: int, end: int) -> range:
        """The token positions whose characters overlap ``[start, end)``."""
        first = bisect.bisect_right(self.ends, start)
        last = bisect.bisect_left(self.starts, end)
        return range(first, max(first, last))

    def graded(self, positions) -> int:
        """How many of the token ``positions`` carry a label (TRL's labels are unshifted)."""
        return sum(is_graded(self.labels[i]) for i in positions)


def _renderings(dataset, prepared, tokenizer, chat_template, stop_ids) -> list[_Rendering] | None:
    """Each row rendered as TRL renders it (``apply_chat_template`` with the template TRL trains with, the
    row's ``tools`` and ``chat_template_kwargs``, as in TRL 1.16's ``_prepare_dataset``), its parts located,
    and their tokens matched to TRL's labels (the untruncated, unpacked rows ``prepared``). Rows whose
    re-tokenized text differs from TRL's ids are left out (none on the families tested; when every row
    differs, ``ValueError``: the check could not run). ``None`` when the data has nothing these checks
    look at."""
    if prepared is None or not _needs_rendering(dataset, tokenizer, chat_template):
        return None
    by_row = {r: (ids, labels) for r, ids, labels in
              zip(prepared["_doctor_row"], prepared["input_ids"], prepared["labels"])}
    out = []
    for row in dataset:
        if row["_doctor_row"] not in by_row:
            continue
        ids, labels = by_row[row["_doctor_row"]]
        messages, first_trained = _conversation(row)
        kwargs = _render_kwargs(row, chat_template)
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if encoded["input_ids"] != list(ids):
            continue
        offsets = encoded["offset_mapping"]
        rendering = _Rendering(row["_doctor_row"], messages, first_trained, text, list(ids),
                               [a for a, _ in offsets], [b for _, b in offsets], list(labels), kwargs)
        rendering.spans = _locate(rendering, stop_ids)
        out.append(rendering)
    if by_row and not out:
        raise ValueError("no row's rendering re-tokenizes to TRL's token ids — the parts of a row cannot be "
                         "placed on TRL's labels — report the set-up as a doctor bug")
    return out


def _locate(rendering: _Rendering, stop_ids: set) -> list[_Span]:
    """The reasoning, tool calls and tool replies of each message, found in order in the rendered text
    (each search starts where the previous part ended, so a short reply is not matched in the prompt)."""
    text, spans, cursor = rendering.text, [], 0

    def find(needles, kind, turn) -> _Span:
        nonlocal cursor
        hits = [(text.find(n, cursor), n) for n in needles if n]
        hits = [(pos, n) for pos, n in hits if pos >= 0]
        if not hits:
            return _Span(kind, turn)
        pos, needle = min(hits)
        cursor = pos + len(needle)
        return _Span(kind, turn, pos, cursor)

    for turn, message in enumerate(rendering.messages):
        role = message.get("role")
        if role == "assistant":
            reasoning = _reasoning_of(message)
            if reasoning:
                spans.append(find([reasoning], "reasoning", turn))
                spans[-1].text = reasoning
            calls = _calls_of(message)
            answer = _answer_of(message)
            if answer.strip() and not calls:
                find([answer.strip()], "content", turn)
            for i, (name, arguments) in enumerate(calls):
                span = _locate_call(text, cursor, name, arguments, turn)
                if span.start >= 0:
                    cursor = span.end
                    if i == len(calls) - 1:
                        span.stop_id, span.stop_graded = _stop_after(rendering, span.end, stop_ids)
                spans.append(span)
        elif role == "tool":
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                spans.append(find([content.strip(), json.dumps(content.strip())[1:-1]], "tool_output", turn))
        else:
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                find([content.strip()], "content", turn)
    for span in spans:
        if span.start >= 0:
            positions = rendering.token_range(span.start, span.end)
            span.tokens, span.graded = len(positions), rendering.graded(positions)
    return spans


def _locate_call(text: str, cursor: int, name: str, arguments, turn: int) -> _Span:
    """A tool call in the rendering: its name, then its arguments as a JSON object (a dict rendered with
    ``tojson``, or a JSON string written as it is) or as an escaped string (a JSON string put through
    ``tojson``: ``"{\\"a\\": 2}"``)."""
    kind = "string" if isinstance(arguments, str) else "dict"
    start = text.find(name, cursor)
    span = _Span("call", turn, argument_type=kind)
    if start < 0:
        return span
    if isinstance(arguments, str):
        forms = [(arguments, "object"), (json.dumps(arguments)[1:-1], "escaped")]
        try:
            forms.append((json.dumps(json.loads(arguments)), "object"))
        except (ValueError, TypeError):
            pass
    else:
        forms = [(json.dumps(arguments), "object"), (json.dumps(arguments, separators=(",", ":")), "object"),
                 (json.dumps(json.dumps(arguments))[1:-1], "escaped")]
    hits = sorted((text.find(f, start + len(name)), len(f), how) for f, how in forms if f)
    hits = [h for h in hits if h[0] >= 0]
    end = hits[0][0] + hits[0][1] if hits else start + len(name)
    span.start, span.end, span.how = start, end, hits[0][2] if hits else "object"
    return span


def _stop_after(rendering: _Rendering, position: int, stop_ids: set) -> tuple[int | None, bool | None]:
    """The first stop token (one ``generate()`` stops on, or the template's end of turn) after ``position``
    and whether it carries a label; ``(None, None)`` when none follows."""
    for i in range(bisect.bisect_left(rendering.starts, position), len(rendering.ids)):
        if rendering.ids[i] in stop_ids:
            return rendering.ids[i], is_graded(rendering.labels[i])
    return None, None


# ---------------------------------------------------------------------------------------------
# The checks: each takes the renderings and the context the doctor passes (``_context``)
# ---------------------------------------------------------------------------------------------

def _context(tokenizer, chat_template, masked: bool, training):
    """What the checks share: TRL's tokenizer, the template TRL trains with (``None``: the tokenizer's),
    whether the set-up masks non-assistant tokens (``assistant_only_loss`` or completion-only loss),
    ``training()`` → ``(name, text)`` of TRL's training template of the template's family or ``None``."""
    return types.SimpleNamespace(tokenizer=tokenizer, chat_template=chat_template, masked=masked,
                                 training=training, probing=None)


def _probe(ctx, name: str) -> str:
    """TRL's probe ``trl.chat_template_utils.<name>`` on the template TRL trains with, as text for the
    evidence (``raised X`` when the probe itself fails on the template)."""
    from trl import chat_template_utils as ctu

    if ctx.probing is None:  # the probes read processing_class.chat_template: a copy carries TRL's template
        ctx.probing = ctx.tokenizer
        if ctx.chat_template is not None:
            ctx.probing = copy.deepcopy(ctx.tokenizer)
            ctx.probing.chat_template = ctx.chat_template
    try:
        if name == "is_chat_template_stop_token_trained":
            trained = ctu.is_chat_template_stop_token_trained(ctx.tokenizer, chat_template=ctx.chat_template)
            return str(trained)
        return str(getattr(ctu, name)(ctx.probing))
    except Exception as exc:  # noqa: BLE001 — a probe that fails on this template is evidence too
        return f"raised {type(exc).__name__}"


def _rows(ids) -> str:
    ids = sorted(set(ids))
    return f"row ids {ids[:8]}" + (" …" if len(ids) > 8 else "")


def _training_fix(ctx, renders, keeps) -> str | None:
    """``trl/chat_templates/<family>_training.jinja`` when TRL ships one for this template's family, it is
    not the template already in use, and ``keeps(text, rendering)`` holds for every row rendered with it."""
    training = ctx.training()
    if training is None or training[1] == (ctx.chat_template or ctx.tokenizer.chat_template):
        return None
    name, text = training
    for r in renders:
        if not keeps(r.render(ctx.tokenizer, r.messages, text), r):
            return None
    return f"trl/chat_templates/{name}_training.jinja"


def _prefix_findings(renders, ctx) -> list:
    """Multi-turn reasoning rows whose earlier turns the template renders differently once the
    conversation goes on (Qwen3's original drops their ``<think>``): the turn the model generated is not the
    turn it is trained on. Measured on the rows' own reasoning turns; TRL's
    ``is_chat_template_prefix_preserving`` (one tool-message probe) is quoted: it says True for gpt-oss's
    training template, which drops earlier turns' analysis all the same."""
    checked, rewritten, bad = 0, 0, []
    for r in renders:
        for turn, message in enumerate(r.messages[:-1]):
            if message.get("role") != "assistant" or turn < r.first_trained or not _reasoning_of(message):
                continue
            checked += 1
            if not r.text.startswith(r.render(ctx.tokenizer, r.messages[:turn + 1])):
                rewritten += 1
                bad.append(r)
    if not rewritten:
        return []

    def keeps(text, r):  # every earlier reasoning turn rendered in the full conversation too
        return all(_reasoning_of(m) in text for m in r.messages if m.get("role") == "assistant"
                   and _reasoning_of(m))

    training = _training_fix(ctx, bad, keeps)
    return [Finding(
        "warning", "prefix-not-preserved",
        f"the chat template rewrites {rewritten} of {checked} earlier reasoning turns once the conversation "
        "goes on (not prefix-preserving)",
        f"{_rows(r.row for r in bad)}: an assistant turn rendered as the last message differs from the same "
        "turn followed by the next user message (its reasoning is dropped from the history); trl "
        f"is_chat_template_prefix_preserving={_probe(ctx, 'is_chat_template_prefix_preserving')}",
        "split each multi-turn row into one row per assistant turn (prompt = the messages before it, "
        "completion = that turn): each turn's reasoning is then trained in the context inference shows it"
        + (f"; or train with TRL's prefix-preserving {training} (chat_template_path, or assistant_only_loss="
           "True, which swaps it in) — then history at inference, rendered by the original, lacks the "
           "reasoning the model was trained with" if training else ""), LESSON)]


def _reasoning_lost_findings(renders, ctx) -> list:
    """Reasoning in the data that never reaches the loss: dropped by the template, or rendered outside the
    graded span. Counted in tokens of the reasoning text (``tokenizer(reasoning)``)."""
    turns = [(r, s) for r in renders for s in r.spans if s.kind == "reasoning" and s.turn >= r.first_trained]
    if not turns:
        return []
    size = {id(s): len(ctx.tokenizer(s.text, add_special_tokens=False)["input_ids"]) for _, s in turns}
    dropped = [(r, s) for r, s in turns if s.start < 0]
    outside = [(r, s) for r, s in turns if s.start >= 0 and s.graded == 0]
    if not dropped and not outside:
        return []
    lost_tokens = sum(size[id(s)] for _, s in dropped) + sum(s.tokens - s.graded for _, s in turns
                                                             if s.start >= 0)
    total_tokens = sum(size.values())
    bad = [r for r, _ in dropped + outside]
    training = _training_fix(ctx, bad, lambda text, r: all(
        s.text in text for s in r.spans if s.kind == "reasoning" and s.turn >= r.first_trained))
    fix = (f"train with TRL's {training}, which renders every turn's reasoning (chat_template_path, or "
           "assistant_only_loss=True, which swaps it in for the original)" if training else
           "put the reasoning where this template renders it — e.g. one row per assistant turn (prompt = the "
           "messages before it, completion = that turn), since it keeps only the last turn's reasoning — or "
           "train with a template that renders it")
    if outside:
        fix += "; reasoning rendered outside the loss: put it inside {% generation %}…{% endgeneration %}"
    return [Finding(
        "error", "reasoning-lost",
        f"{len(dropped) + len(outside)} of {len(turns)} reasoning turns ({lost_tokens:,} of "
        f"{total_tokens:,} reasoning tokens) never reach the loss",
        f"{len(dropped)} dropped by the chat template (not in TRL's rendering), {len(outside)} rendered "
        f"outside the graded span; {_rows(r.row for r in bad)}", fix, LESSON)]


def _empty_think_findings(renders, ctx) -> list:
    """Empty ``<think></think>`` blocks the template writes into the graded span (data without reasoning
    on a thinking template): the model is taught to close its reasoning at once."""
    graded, rows = 0, []
    for r in renders:
        for block in _EMPTY_THINK.finditer(r.text):
            if r.graded(r.token_range(block.start(), block.end())):
                graded += 1
                rows.append(r.row)
    if not graded:
        return []
    turns = [m for r in renders for m in r.messages[r.first_trained:] if m.get("role") == "assistant"]
    bare = sum(not _reasoning_of(m) for m in turns)
    return [Finding(
        "warning", "empty-think-graded",
        f"{graded} empty <think></think> blocks carry loss, in {len(set(rows))} of {len(renders)} rows",
        f"{bare} of {len(turns)} assistant turns have no reasoning in the data, and the chat template writes "
        f"an empty think block into the graded span; {_rows(rows)}: the model learns to close its reasoning "
        "at once, and skips thinking when asked to think",
        "add the reasoning to the data; or keep the empty block in the prompt: prompt/completion rows with "
        "chat_template_kwargs={'enable_thinking': False} (Qwen3's generation prompt then ends with the empty "
        "block, and TRL grades only what follows it); or a template without think blocks (a non-thinking "
        "variant of the family)", LESSON)]


def _tool_output_findings(renders, ctx) -> list:
    """Tool replies that carry loss: the model is trained to write the tool's answer itself."""
    replies = [(r, s) for r in renders for s in r.spans if s.kind == "tool_output" and s.start >= 0]
    graded = [(r, s) for r, s in replies if s.graded]
    if not graded:
        return []
    how = ("the non-assistant tokens are masked (assistant_only_loss or completion-only loss) but the tool "
           "replies are not: they sit in the completion or inside {% generation %}" if ctx.masked else
           "full-sequence loss (assistant_only_loss=False): every token is graded, the tool replies too")
    rows = ("turn each assistant turn into a prompt/completion row (the conversation before it, tool replies "
            "included, as the prompt): TRL grades only the completion")
    keeps = assistant_only_keeps_calls(ctx.tokenizer, ctx.chat_template)  # llama3_training drops the calls
    fix = ("put tool messages in the prompt (prompt/completion rows), not in {% generation %}" if ctx.masked
           else f"set assistant_only_loss=True (TRL's template grades only the assistant's turns and renders "
           f"their calls), or {rows[0].lower()}{rows[1:]}" if keeps else f"{rows}; assistant_only_loss would "
           "fail here (TRL cannot train this template assistant-only and keep its tool calls)")
    return [Finding(
        "error" if ctx.masked else "warning", "tool-output-graded",
        f"{len(graded)} of {len(replies)} tool replies carry loss "
        f"({sum(s.graded for _, s in graded):,} tokens)",
        f"{how}; {_rows(r.row for r, _ in graded)}: the model learns to write the tool's reply itself (a "
        "made-up result after its call) instead of waiting for the tool", fix, LESSON)]


def _tool_arguments_findings(renders, ctx) -> list:
    """Tool-call arguments as dicts in some calls and JSON strings in others — or strings the template
    writes escaped (``tojson`` on a string: ``"{\\"a\\": 2}"``), which teaches a string, not an object."""
    calls = [(r, s) for r in renders for s in r.spans if s.kind == "call"]
    strings = [(r, s) for r, s in calls if s.argument_type == "string"]
    escaped = [(r, s) for r, s in strings if s.start >= 0 and s.how == "escaped"]
    if not strings:
        return []
    example = (f"; e.g. row {escaped[0][0].row}: "
               f"{escaped[0][0].text[escaped[0][1].start:escaped[0][1].end][-60:]!r}" if escaped else "")
    mixed = len(strings) < len(calls)
    if not mixed and not escaped:
        return []
    if not mixed:
        return [Finding(
            "error", "tool-arguments-escaped",
            f"the chat template writes {len(escaped)} of {len(strings)} tool-call arguments as escaped "
            "strings",
            f"the arguments are JSON strings in the data and the template puts them through tojson{example}: "
            "the model learns to write a quoted string where the template's format has a JSON object",
            "write each call's arguments as an object (json.loads the strings): transformers' documented "
            "form",
            LESSON)]
    alike = not escaped
    return [Finding(
        "info" if alike else "error", "tool-arguments-mixed",
        f"tool-call arguments are dicts in {len(calls) - len(strings)} calls and JSON strings in "
        f"{len(strings)}" + ("" if alike else f": {len(escaped)} of the strings are trained as escaped "
                             "strings"),
        (f"this template renders both alike ({_rows(r.row for r, _ in strings)}); a template that puts a "
         "string through tojson (Qwen2.5's, Llama 3.1's, gpt-oss's) trains the strings escaped" if alike else
         f"the template renders a dict as a JSON object and puts a string through tojson{example} "
         f"({_rows(r.row for r, _ in escaped)}): the model learns two formats for one call"),
        "write the arguments one way in every row: objects (dicts), transformers' documented form — or JSON "
        "strings everywhere if your template writes strings as they are", LESSON)]


def _tool_calls_dropped_findings(renders, ctx) -> list:
    """Tool calls in the data that never reach the loss: the template does not render ``tool_calls`` (Llama
    3's basic template, Phi-3's, DeepSeek-R1's when content is set), or renders them outside the loss.
    TRL's ``supports_tool_calling`` (a sentinel call and reply must survive rendering) is quoted beside it."""
    calls = [(r, s) for r in renders for s in r.spans if s.kind == "call" and s.turn >= r.first_trained]
    dropped = [(r, s) for r, s in calls if s.start < 0]
    outside = [(r, s) for r, s in calls if s.start >= 0 and not s.graded]
    if not dropped and not outside:
        return []
    fixes = []
    if dropped:
        fixes.append("use a template that renders tool_calls (trl supports_tool_calling must be True) — the "
                     "family's own tool-aware template with {% generation %} markers around the assistant's "
                     "output (e.g. Llama 3.1's original, not llama3_training.jinja, which renders content "
                     "only) — or write the calls into the assistant's content in the model's format")
    if outside:
        fixes.append("put the tool-call branch of the template inside {% generation %}…{% endgeneration %} "
                     "(TRL's qwen2_5_training.jinja does)")
    return [Finding(
        "error", "tool-calls-dropped",
        f"{len(dropped) + len(outside)} of {len(calls)} tool calls never reach the loss",
        f"{len(dropped)} are not in TRL's rendering (the template drops tool_calls), {len(outside)} are "
        f"rendered outside the graded span; {_rows(r.row for r, _ in dropped + outside)}; trl "
        f"supports_tool_calling={_probe(ctx, 'supports_tool_calling')}: the model never learns to call the "
        "tools", "; ".join(fixes),
        LESSON)]


def _tool_stop_findings(renders, ctx) -> list:
    """The stop token after a tool call (``<|im_end|>``, gpt-oss's ``<|call|>``) without loss: the model
    does not learn to stop and wait for the tool, and writes the tool's reply itself. TRL's
    ``is_chat_template_stop_token_trained`` probes [user, assistant, user] without a tool call, so it says
    True for a template whose tool-call branch alone leaves the stop outside ``{% generation %}``."""
    turns = [(r, s) for r in renders for s in r.spans
             if s.kind == "call" and s.turn >= r.first_trained and s.stop_graded is not None]
    untrained = [(r, s) for r, s in turns if not s.stop_graded]
    if not untrained:
        return []
    token = ctx.tokenizer.convert_ids_to_tokens(untrained[0][1].stop_id)
    return [Finding(
        "error", "tool-stop-untrained",
        f"the stop token {token!r} after a tool call carries no loss in {len(untrained)} of {len(turns)} "
        "tool-call turns",
        f"{_rows(r.row for r, _ in untrained)}; trl is_chat_template_stop_token_trained="
        f"{_probe(ctx, 'is_chat_template_stop_token_trained')} (it probes a plain assistant turn, not a tool "
        "call): after its call the model is not taught to stop, and writes the tool's reply itself",
        f"put {token!r} of the tool-call branch inside {{% generation %}}…{{% endgeneration %}}, as TRL's "
        "training templates do (qwen2_5_training.jinja)", LESSON)]


# The checks in the order they report; names are the findings' `check`
CHECKS = {
    "prefix-not-preserved": _prefix_findings,
    "reasoning-lost": _reasoning_lost_findings,
    "empty-think-graded": _empty_think_findings,
    "tool-output-graded": _tool_output_findings,
    "tool-arguments-mixed": _tool_arguments_findings,
    "tool-calls-dropped": _tool_calls_dropped_findings,
    "tool-stop-untrained": _tool_stop_findings,
}


def reasoning_and_tool_findings(dataset, prepared, tokenizer, chat_template, masked, stop_ids) -> list:
    """The checks of this module (``CHECKS``), each through ``guarded``, on the rows as
    TRL renders and labels them (``prepared``: untruncated, unpacked)."""
    if dataset is None or prepared is None:
        return []
    try:
        renders = _renderings(dataset, prepared, tokenizer, chat_template, stop_ids)
    except Exception as exc:  # noqa: BLE001 — a check that cannot run is a finding, not a traceback
        return could_not_check("reasoning-and-tools", exc)
    if not renders:
        return []
    template = chat_template or tokenizer.chat_template
    training = functools.cache(lambda: family_training_template(template))  # computed once, when asked
    ctx = _context(tokenizer, chat_template, masked, training)
    return [f for check, run in CHECKS.items() for f in guarded(check, run, renders, ctx)]


# ---------------------------------------------------------------------------------------------
# A template error: the row it fails on, never a traceback
# ---------------------------------------------------------------------------------------------

def template_error_findings(dataset, tokenizer, chat_template, exc) -> list:
    """The first row the chat template raises on (rendered as TRL renders it), the message and a fix; TRL's
    preparation stops at that row with the same jinja2 error. ``[]`` when no row raises on its own."""
    row_id, error = None, exc
    for row in dataset:
        try:
            tokenizer.apply_chat_template(_conversation(row)[0], tokenize=False,
                                          **_render_kwargs(row, chat_template))
        except Exception as raised:  # noqa: BLE001 — the first row that fails is the one to name
            row_id, error = row["_doctor_row"], raised
            break
    if row_id is None:  # no row raises when rendered alone: the error came from elsewhere in TRL
        return []
    message = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
    fix = ("make the row fit the template: give every message a 'content' (\"\" where there is none) and "
           "tool-call arguments in the form the template reads" if "content" in message or "arguments"
           in message or "tool" in message else "make the row fit the template, or use a template that "
           "renders every role and field your rows hold")
    if any(_calls_of(m) for row in dataset for m in _conversation(row)[0]):
        ctx = _context(tokenizer, chat_template, False, lambda: None)
        fix += (f"; trl supports_tool_calling={_probe(ctx, 'supports_tool_calling')} for this template: "
                "where it is False the calls are dropped once the row renders — use a template that renders "
                "tool_calls")
    return [Finding("error", "template-error",
                    f"the chat template raises on row {row_id}: SFTTrainer stops there",
                    f"{type(error).__name__}: {message} (raised while TRL renders the row)",
                    fix + "; render the row with tokenizer.apply_chat_template(row['messages'], tools=...) "
                    "to see it", LESSON)]
