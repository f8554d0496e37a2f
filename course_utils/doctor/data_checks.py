"""The doctor's checks of the data itself: what a row says, read as JSON, before any template or tokenizer.

They need no model and no torch (``python -m course_utils.doctor --data FILE`` runs them alone, in about a
second), and they run as part of every ``diagnose``. What they find is invisible to TRL's preparation,
which trains on all of it without a word:

- ``rendered-markers``: chat-template turn markers (ChatML, Llama 3 headers, ``[INST]``, Gemma turns, ...)
  inside ``text`` / ``content`` — text rendered once already. An error when the family is not the model's
  own (the model learns a foreign format), a warning when it is (rendered twice: double markers, double bos);
- ``duplicate-rows`` and ``contradicting-answers``: exact and near copies (case, whitespace and punctuation
  normalised), and one prompt answered differently — with counts and example row ids;
- ``response-empty``, ``response-looping``, ``response-copies-prompt``, and (with a tokenizer)
  ``response-length-cap``: many answers of exactly the longest token length, the mark of a generation cap in
  synthetic data;
- ``reasoning-partial``: reasoning (``<think>`` or a reasoning field) in only some answers;
- schema traps: ``sharegpt-roles`` (``human`` / ``gpt``: on Qwen2.5's template such rows render nothing but
  the default system prompt, measured with TRL 1.16) and ``unknown-roles`` (any other role outside TRL's
  seven, compared as exact strings: ``model``, ``USER``), each with the renaming; ``content-not-string`` (a
  dict becomes Python text), ``unread-keys`` (a ``response``, ``system`` or ``reasoning`` beside
  ``messages``: never read). ``sharegpt_hint`` names the ShareGPT
  format (``from`` / ``value``) in the bad-input message of a file TRL cannot read at all.

Each check takes the rows as ``inputs.read_rows`` returns them (``_doctor_row``: the row's index in the data).
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter, defaultdict

from ..validate import CHAT_ROLES, ROLE_STAND_INS
from .report import SAMPLED, Finding, share_of

# Turn markers by template family (the first of each is the one a rendering always holds). Tool-call and
# reasoning tags are content, not turn markers, and are not listed.
FAMILY_MARKERS = {
    "ChatML (Qwen, ...)": ("<|im_start|>", "<|im_end|>"),
    "Llama 3": ("<|start_header_id|>", "<|eot_id|>", "<|begin_of_text|>"),
    "[INST] (Llama 2, Mistral)": ("[INST]", "[/INST]"),
    "Gemma": ("<start_of_turn>", "<end_of_turn>"),
    "Phi-3 / Zephyr": ("<|user|>", "<|assistant|>", "<|end|>"),
    "DeepSeek": ("<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>"),
    "gpt-oss (harmony)": ("<|start|>", "<|message|>", "<|channel|>"),
    "Gemma 4": ("<|turn>", "<turn|>"),
    "Cohere": ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>"),
    "GLM-4": ("[gMASK]<sop>", "<|user|>", "<|assistant|>"),
    "Muse (harmony-like)": ("<|start|>", "<|message|>", "<|eot|>"),
}
# top-level keys beside the row's form that TRL never reads (it passes only `tools` and `chat_template_kwargs`
# to the template): what is in them is not trained on. A reasoning field inside a message is read by the
# family's template (`reasoning_content`, gpt-oss's `thinking`) and is never one of these.
UNREAD_KEYS = ("response", "assistant", "output", "answer", "reply", "target", "chosen", "text", "completion",
               "system", "reasoning", "thinking", "rationale", "explanation", "solution")
# the roles TRL's templates compare with (exact strings: 'USER' is not 'user') and the usual stand-ins live in
# validate (CHAT_ROLES, ROLE_STAND_INS: data.tokenize_chat refuses the same roles)
SHAREGPT_ROLES = ("human", "gpt", "bot")
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
THINK = re.compile(r"<think>(.*?)</think>", re.S)
LOOP_MIN_WORDS, LOOP_DISTINCT = 40, 0.3  # an answer of 40+ words whose 4-grams are < 30 % distinct loops
LOOP_CHUNK = 8  # ... or whose 8-word chunks mostly recur 3+ times (a paragraph repeated)
CAP_MIN_TOKENS, CAP_MIN_SHARE, CAP_MIN_LENGTHS = 16, 0.02, 5
# a length held by more distinct answers than its neighbours (within CAP_WINDOW) make likely at p < CAP_P
CAP_WINDOW, CAP_P = 10, 1e-6
ENDINGS = tuple(".!?。！？…\"')]}`*>|")  # how a finished answer ends; a cut one ends mid-sentence
SEVERE = 0.10  # a share of damaged rows from which a finding is an error, not a warning
EXAMPLES = 8


def data_findings(rows, form, tokenizer=None, answerless=()) -> list[Finding]:
    """Every check of this module on ``rows`` (``form``: ``inputs.row_form``); ``tokenizer`` (optional) gives
    the model's template family and token lengths; ``answerless``: the rows no-assistant-turns reports."""
    if form == "tokenized":  # token ids: nothing of the text is left to read
        return []
    turns = [_turns(r, form) for r in rows]
    return (markers_findings(rows, form, _family(getattr(tokenizer, "chat_template", None)))
            + schema_findings(rows, form, answerless)
            + duplicate_findings(rows, form, getattr(rows, "counts", None))
            + response_findings(rows, turns, tokenizer) + reasoning_findings(rows, turns))


def sharegpt_hint(row) -> str:
    """A sentence naming the ShareGPT format when ``row`` is in it (``conversations`` of ``from`` /
    ``value``), for the bad-input message; "" otherwise. TRL 1.16 fails on such a file as a whole with
    ``KeyError: 'text'``."""
    if not isinstance(row, dict):
        return ""
    lists = [v for v in row.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
    if any("from" in m and "value" in m for v in lists for m in v if isinstance(m, dict)):
        return (" (ShareGPT format: turns of from/value with roles human/gpt, which TRL does not map — "
                "SFTTrainer fails on the whole file with KeyError: 'text'; write {\"messages\": [{\"role\": "
                "\"user\", \"content\": ...}, {\"role\": \"assistant\", ...}]}, human->user, gpt->assistant)")
    return ""


# --- reading a row ----------------------------------------------------------------------------------------
def _strings(row, form) -> list[str]:
    """Every text of the row the template or tokenizer will read."""
    if form == "messages":
        return [m["content"] for m in row["messages"] if isinstance(m.get("content"), str)]
    if form == "text":
        return [row["text"]] if isinstance(row.get("text"), str) else []
    out = []
    for key in ("prompt", "completion"):
        value = row.get(key)
        out += [value] if isinstance(value, str) else [
            m["content"] for m in value or [] if isinstance(m, dict) and isinstance(m.get("content"), str)]
    return out


def _turns(row, form):
    """``(prompt, answer, answer message)``: the text before the last answer, and the answer (None: none)."""
    if form == "messages":
        messages = row["messages"]
        last = max((i for i, m in enumerate(messages) if trl_role(m.get("role")) == "assistant"),
                   default=None)
        if last is None:
            return _text(messages), None, None
        return _text(messages[:last]), _content(messages[last]), messages[last]
    if form == "text":
        return None, None, None
    prompt, completion = row.get("prompt"), row.get("completion")
    said = [m for m in completion if isinstance(m, dict) and trl_role(m.get("role")) == "assistant"] \
        if isinstance(completion, list) else []
    # the assistant's own words: "assistant: " in front would make an empty answer look written
    answer = completion if isinstance(completion, str) else \
        "\n".join(_content(m) for m in said) if said else _text(completion or [])
    message = completion[-1] if isinstance(completion, list) and completion else None
    return prompt if isinstance(prompt, str) else _text(prompt or []), answer, message


def _content(message) -> str:
    content = message.get("content")
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _text(messages) -> str:
    return "\n".join(f"{m.get('role')}: {_content(m)}" for m in messages if isinstance(m, dict))


_PUNCTUATION = str.maketrans(dict.fromkeys(string.punctuation, " "))


def _normal(text: str) -> str:
    """Lower case, punctuation as spaces, single spaces (ASCII by a table, the rest by the regex)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join((text if text.isascii() else re.sub(r"[^\w\s]", " ", text)).split())


def _rows(ids) -> str:
    ids = list(ids)
    return f"row ids {ids[:EXAMPLES]}" + (f" and {len(ids) - EXAMPLES} more" if len(ids) > EXAMPLES else "")


def _severity(k: int, n: int) -> str:
    return "error" if k >= SEVERE * n else "warning"


# --- rendered markers -------------------------------------------------------------------------------------
def _family(text) -> str | None:
    """The family whose turn markers ``text`` holds most of (None: none)."""
    # every marker holds "<" or "[": one scan for them spares most rows the ~30 marker searches (--all)
    if not isinstance(text, str) or ("<" not in text and "[" not in text):
        return None
    counts = {family: sum(marker in text for marker in markers) for family, markers in FAMILY_MARKERS.items()}
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def markers_findings(rows, form, model_family) -> list[Finding]:
    found = defaultdict(list)
    for row in rows:
        family = _family("\n".join(_strings(row, form)))
        if family:
            found[family].append(row["_doctor_row"])
    findings = []
    for family, ids in found.items():
        foreign = model_family is not None and family != model_family
        where = "'text'" if form == "text" else "message content"
        few = len(ids) < SEVERE * len(rows)  # a few rows may be about the format (a tutorial), not rendered
        severity = ("error", "warning", "info")[(not foreign) + few]
        findings.append(Finding(
            severity, "rendered-markers",
            f"{share_of(len(ids), len(rows))} hold {family} turn markers in their {where}: text already "
            "rendered with a chat template" + (", or text about the format" if few else ""),
            f"{_rows(ids)}; markers {list(FAMILY_MARKERS[family][:2])}; the model's template is "
            + (f"{model_family}: the rows teach a format the model is never prompted with" if foreign else
               f"{model_family or 'not known here (no --model)'}: rendered again, each row holds the markers "
               "twice (and a second bos where the template writes one)")
            + (f"; under {SEVERE:.0%} of the rows: read them — a row that explains the markers is fine"
               if few else ""),
            "store the raw conversation ({\"messages\": [{\"role\", \"content\"}]}) and let TRL apply the "
            "model's own template; strip the markers from content", "04"))
    return findings


# --- schema traps -----------------------------------------------------------------------------------------
def trl_role(role) -> str | None:
    """The role of TRL's (``CHAT_ROLES``) that ``role`` stands for: itself, its lower case, or a stand-in
    (ShareGPT's human / gpt, Gemini's model); None when there is no guess."""
    if role in CHAT_ROLES:
        return role
    low = str(role).strip().lower()
    return low if low in CHAT_ROLES else ROLE_STAND_INS.get(low)


def schema_findings(rows, form, answerless=()) -> list[Finding]:
    """``answerless``: ids of rows the set-up check no-assistant-turns reports (under ``diagnose``); a row
    whose only unknown roles stand for the assistant is left to it (one finding per failure)."""
    unknown, structured, numbers, unread = defaultdict(list), [], [], defaultdict(list)
    keys = {"messages": {"messages"}, "text": {"text"}}.get(form, {"prompt", "completion"})
    answerless = set(answerless)
    for row in rows:
        messages = _messages(row, form)
        bad = sorted({m.get("role") for m in messages} - set(CHAT_ROLES), key=str)
        if bad and not (row["_doctor_row"] in answerless and all(trl_role(r) == "assistant" for r in bad)):
            for role in bad:
                unknown[role].append(row["_doctor_row"])
        contents = [m.get("content") for m in messages]
        if any(isinstance(c, dict) or (isinstance(c, list) and not _parts(c)) for c in contents):
            structured.append(row["_doctor_row"])
        elif any(isinstance(c, (int, float, bool)) for c in contents):
            numbers.append(row["_doctor_row"])
        for key in UNREAD_KEYS:
            if key not in keys and row.get(key) not in (None, "", [], {}):
                unread[key].append(row["_doctor_row"])
    n, findings = len(rows), []
    if unknown:
        findings.append(_roles_finding(unknown, n))
    if structured or numbers:
        findings.append(Finding(
            "error" if structured else "warning", "content-not-string",
            f"{share_of(len(structured) + len(numbers), n)} have message content that is not a string",
            f"{_rows(structured + numbers)}: a dict or list becomes Python text under the template (Llama 3: "
            "{'name': ...}, single quotes), so the model learns Python syntax instead of JSON; numbers "
            "become "
            "str() and mix types in the column datasets' loader builds",
            "write every content as a string: json.dumps(structure), str(number)", "04"))
    for key, ids in unread.items():
        home = _UNREAD_HOME.get(key) or ("the messages (an assistant turn)" if form == "messages" else
                                         sorted(keys))
        findings.append(Finding(
            "warning", "unread-keys", f"{share_of(len(ids), n)} carry content in {key!r}, a key the trainer "
            f"never reads beside {sorted(keys)}", f"{_rows(ids)}: SFTTrainer trains on {sorted(keys)} only; "
            f"what is in {key!r} is silently left out",
            f"move it into {home}, or drop the key", "04"))
    return findings


_UNREAD_HOME = {"system": "a first message {'role': 'system', 'content': ...} (no top-level system is read)",
                **{k: "the assistant message: its reasoning_content (or the field the family's template "
                      "reads) or the answer itself" for k in ("reasoning", "thinking", "rationale",
                                                               "explanation", "solution")}}


def _roles_finding(unknown: dict, n: int) -> Finding:
    """One error for every role outside ``CHAT_ROLES`` (``unknown``: role -> row ids): counts, example rows,
    and the renaming to TRL's roles."""
    ids = sorted({i for rows in unknown.values() for i in rows})
    sharegpt = set(unknown) <= set(SHAREGPT_ROLES)
    mapping = {role: trl_role(role) for role in unknown}
    counts = "; ".join(f"{role!r} in {len(rows)} rows (row ids {rows[:3]})" for role, rows in unknown.items())
    renames = ", ".join(f"{role!r} -> {to!r}" if to else f"{role!r} -> one of {list(CHAT_ROLES)}"
                        for role, to in mapping.items())
    table = {role: to for role, to in mapping.items() if to}
    measured = ("; on Qwen2.5's template a row of human/gpt turns renders nothing but the default system "
                "prompt (TRL 1.16, measured), and the run trains on that" if sharegpt else "")
    what = f"{share_of(len(ids), n)} use roles TRL's chat templates do not know: {sorted(unknown, key=str)}"
    evidence = (f"{counts}; templates compare the role with exact strings {list(CHAT_ROLES)} (case matters: "
                f"'USER' is not 'user'), so those turns render as nothing, as the wrong side, or raise"
                f"{measured}")
    fix = f"rename the roles: {renames} — e.g. m['role'] = {table}.get(m['role'], m['role']) for each message"
    if sharegpt:
        return Finding("error", "sharegpt-roles", what, evidence, fix, "04")
    return Finding("error", "unknown-roles", what, evidence, fix, "04")


def _messages(row, form) -> list[dict]:
    if form == "messages":
        return row["messages"]
    if form == "prompt_completion":
        return [m for key in ("prompt", "completion") for m in row.get(key) or [] if isinstance(m, dict)]
    return []


def _parts(content: list) -> bool:
    """A multimodal content list ([{"type": "text", "text": ...}, ...]): a form templates read."""
    return all(isinstance(p, dict) and "type" in p for p in content)


# --- duplicates and contradictions ------------------------------------------------------------------------
class RowCounts:
    """Each row's hashes as the file streams by (``inputs._read_jsonl`` adds every row, sampled or not): exact
    copies, copies up to case, spacing and punctuation, and prompts answered differently — counted over the
    whole file. A sample cannot give these: a pair statistic is not binomial (12 % copies in 5,000 rows
    look like 4.5 % in a sample of 2,000, a copy's twin being rarely drawn with it)."""

    def __init__(self):
        self.total = self.extra_exact = self.extra_near = 0
        self.exact, self.near, self.groups = {}, {}, {}  # hash -> first row id; near hash -> a few row ids
        self.prompts, self.clashes = {}, {}  # prompt hash -> (answer hash, first row id, rows); -> row ids

    def add(self, row: dict, form: str, row_id: int) -> None:
        self.total += 1
        if form == "tokenized":
            return
        text = json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)
        prompt, answer, message = _turns(row, form)
        if prompt is None or answer is None:  # text, or no answer: the whole row, normalised
            near, key = hash(_normal(text)), None
        else:  # the prompt and answer normalised, the rest of the row (other keys, later turns) as it is
            key, value = hash(_normal(prompt)), hash(_normal(answer))
            turns = row.get("messages") if form == "messages" else None
            rest = {k: v for k, v in row.items() if k not in ("messages", "prompt", "completion")}
            later = turns[next(i for i, m in enumerate(turns) if m is message) + 1:] if turns else []
            near = hash((key, value, json.dumps([rest, later], sort_keys=True, default=str)))
        exact = hash(text)
        self.extra_exact += exact in self.exact
        self.exact.setdefault(exact, row_id)
        if near in self.near:
            self.extra_near += 1
            if near in self.groups or len(self.groups) < 3:
                ids = self.groups.setdefault(near, [self.near[near]])
                ids += [row_id] if len(ids) < 6 else []
        self.near.setdefault(near, row_id)
        if key is not None and prompt:
            first, first_id, seen = self.prompts.get(key, (value, row_id, 0))
            self.prompts[key] = (first, first_id, seen + 1)
            if value != first or key in self.clashes:
                ids = self.clashes.setdefault(key, [first_id])
                ids += [row_id] if len(ids) < 4 else []


def duplicate_findings(rows, form: str, counts: RowCounts | None = None) -> list[Finding]:
    """Copies and contradictions: over every row of the file (``counts``, ``RowCounts``) when ``rows`` are a
    sample of it, else over ``rows``. Counts only: a pair statistic has no binomial interval."""
    sampled = SAMPLED.get() is not None
    # counts made while the file was read hold every row: with all of them checked (--all, a small file) they
    # are these rows' own counts, and are not made twice
    if counts is None or counts.total < len(rows):
        counts = RowCounts()
        for row in rows:
            clean = {k: v for k, v in row.items() if not k.startswith("_doctor")}
            counts.add(clean, form, row["_doctor_row"])
    elif sampled:
        sampled = False  # the file's own counts
    n = counts.total
    note = ("in the sample: copies whose twin was not drawn are missed (--all counts every row)" if sampled
            else "every row counted" if SAMPLED.get() is not None else "")

    def share(k: int, n: int) -> str:
        return f"{k:,} of {n:,} rows ({k / n:.1%}{'; ' + note if note else ''})"

    return (_duplicates(counts.extra_exact, counts.extra_near - counts.extra_exact,
                        list(counts.groups.values()), n, share)
            + _clashes(list(counts.clashes.values()), sum(counts.prompts[k][2] for k in counts.clashes), n,
                       share))


def _duplicates(extra_exact: int, extra_near: int, groups, n: int, share) -> list[Finding]:
    if not (extra_exact or extra_near):
        return []
    # a few copies are what a small or templated set holds by chance (the course's own arithmetic chats
    # repeat 0.4-2.5 % of their rows): info; from SEVERE on they reweigh the data (warning)
    return [Finding(
        "warning" if extra_exact + extra_near >= SEVERE * n else "info", "duplicate-rows",
        f"{share(extra_exact + extra_near, n)} repeat another row ({extra_exact} exact copies, {extra_near} "
        "that differ only in case, spacing or punctuation)",
        f"groups (row ids): {[ids[:6] for ids in groups[:3]]}; a repeated row weighs that many times in the "
        "loss, and a copy across the train/eval split inflates the eval score",
        "deduplicate: keep one row of each group", "08")]


def _clashes(groups, rows_in: int, n: int, share) -> list[Finding]:
    if not groups:
        return []
    return [Finding(
        "warning", "contradicting-answers", f"{len(groups)} prompt(s) are answered differently in "
        f"{share(rows_in, n)}", f"groups of row ids with the same prompt and different answers: "
        f"{[ids[:4] for ids in groups[:3]]}; the model learns the average of the answers",
        "keep one answer per prompt, or make the prompts say what decides the answer", "08")]


# --- damaged responses ------------------------------------------------------------------------------------
def response_findings(rows, turns, tokenizer=None) -> list[Finding]:
    answered = [(row["_doctor_row"], prompt, answer, message) for row, (prompt, answer, message)
                in zip(rows, turns) if answer is not None]
    empty = [i for i, _, answer, message in answered
             if not answer.strip() and not (message or {}).get("tool_calls")
             and not _reasoning(message, answer)]
    looping = [i for i, _, answer, _ in answered if _loops(answer)]
    normal = {i: _normal(answer) for i, _, answer, _ in answered}  # once each: the copy and cap checks use it
    copies = [i for i, prompt, answer, _ in answered if _copies(prompt, answer, normal[i])]
    n, findings = len(answered), []
    if empty:
        findings.append(Finding(
            _severity(len(empty), n), "response-empty", f"{share_of(len(empty), n)} have an empty answer",
            f"{_rows(empty)}: the answer is only the stop token, so the model learns to stop at once",
            "drop those rows or write their answers", "02"))
    if looping:
        findings.append(Finding(
            _severity(len(looping), n), "response-looping",
            f"{share_of(len(looping), n)} have an answer that repeats itself",
            f"{_rows(looping)}: fewer than {LOOP_DISTINCT:.0%} of the answer's 4-word sequences "
            f"(4-character, in text without spaces) are distinct, or most of its {LOOP_CHUNK}-word chunks "
            "recur 3+ times (a generation loop in synthetic data); the model learns to loop",
            "drop or regenerate those answers", "02"))
    if copies:
        findings.append(Finding(
            _severity(len(copies), n), "response-copies-prompt", f"{share_of(len(copies), n)} answer with "
            "the prompt itself", f"{_rows(copies)}: the answer repeats the last user turn (or starts with "
                                 f"the "
            "whole prompt); the model learns to echo", "drop or fix those rows", "04"))
    if tokenizer is not None and n:
        findings += _length_cap_findings(answered, tokenizer, normal)
    return findings


def _loops(answer: str) -> bool:
    """Words — or characters, in text written without spaces (Chinese, Japanese) — of 40+ units: 4-grams
    < 30 % distinct (a phrase looping), or a chunk of 8 units that recurs 3+ times over half the answer (a
    paragraph repeated)."""
    units = answer.split()
    if len(units) * 8 < len(answer):  # few spaces: characters are the units
        units = [c for c in answer if not c.isspace()]
    if len(units) < LOOP_MIN_WORDS:
        return False
    # the windows as zips of shifted lists, not a slice per position: the same tuples, ~3x faster (--all
    # runs this on every answer)
    grams = list(zip(*(units[k:] for k in range(4))))
    if len(set(grams)) < LOOP_DISTINCT * len(grams):
        return True
    chunks = Counter(zip(*(units[k:] for k in range(LOOP_CHUNK))))
    recurring = sum(count for count in chunks.values() if count >= 3)  # chunk positions whose chunk recurs 3+
    return recurring >= 0.5 * (len(units) - LOOP_CHUNK + 1)


def _copies(prompt, answer: str, clean: str) -> bool:
    """``clean``: ``_normal(answer)``."""
    if not prompt or len(answer.strip()) < 10:
        return False
    last_turn = prompt.rsplit("\nuser: ", 1)[-1].removeprefix("user: ")
    turn = _normal(last_turn)
    return clean == turn or (len(last_turn) >= 60 and clean.startswith(turn))


def _length_cap_findings(answered, tokenizer, normal: dict) -> list[Finding]:
    """A generation cap: many distinct answers of one length (tokens of the model's tokenizer, or words for a
    cap in another tokenizer's tokens), either the longest length, or a length far above what the lengths
    around it hold, whose answers end mid-sentence. ``normal``: each answer ``_normal``-ised, by row id."""
    # one batch call; the ids alone (no attention mask built for each answer: only the lengths are read)
    ids = tokenizer([a for _, _, a, _ in answered], add_special_tokens=False,
                    return_attention_mask=False)["input_ids"]
    tokens = {i: len(row) for (i, _, _, _), row in zip(answered, ids)}
    words = {i: len(a.split()) for i, _, a, _ in answered}
    found = [f for f in (_cap(answered, tokens, "tokens", normal), _cap(answered, words, "words", normal))
             if f]
    return [max(found, key=lambda f: f[0])[1]] if found else []


def _cap(answered, lengths: dict, unit: str, normal: dict):
    """``(rows, finding)`` for the most-held capped length in ``unit``, or None."""
    n, distinct = len(lengths), defaultdict(set)  # copies of one answer share its length: distinct ones count
    for i, _, _, _ in answered:
        distinct[lengths[i]].add(normal[i])
    counts = {length: len(answers) for length, answers in distinct.items()}
    if len(counts) < CAP_MIN_LENGTHS:
        return None
    floor, longest, best = max(3, CAP_MIN_SHARE * n), max(counts), None
    for length, held in counts.items():
        if length < CAP_MIN_TOKENS or held < floor:
            continue
        around = [counts.get(length + d, 0) for d in range(-CAP_WINDOW, CAP_WINDOW + 1) if d]
        expected = max(sum(around) / len(around), 0.5)
        cut = [a for i, _, a, _ in answered if lengths[i] == length and a.rstrip()[-1:] not in ENDINGS]
        peak = (_poisson_tail(held, expected) < CAP_P / len(counts)
                and len(cut) >= 0.5 * sum(lengths[i] == length for i in lengths))
        if ((length == longest and unit == "tokens") or peak) and (best is None or held > best[1]):
            best = (length, held, expected, length == longest)
    if best is None:
        return None
    length, held, expected, is_longest = best
    capped = [i for i, value in lengths.items() if value == length]
    where = ("the longest length: answers of natural length rarely share it" if is_longest else
             f"{held / expected:.0f}x the ~{expected:.1f} distinct answers each length within {CAP_WINDOW} "
             f"{unit} of it holds, and most of them end mid-sentence")
    return len(capped), Finding(
        _severity(len(capped), n), "response-length-cap",
        f"{share_of(len(capped), n)} have answers of exactly {length} {unit} ({held} distinct answers)",
        f"{_rows(capped)}; {where}: these were cut by a generation cap "
        + (f"(max_new_tokens={length}?)" if unit == "tokens" else "(in another tokenizer's tokens, or words)")
        + " and end mid-sentence — the model learns to stop there",
        "drop or regenerate the capped answers (a larger max_new_tokens)", "02")


def _poisson_tail(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean): how unlikely a length holding k answers is when its neighbours hold
    ``mean`` each."""
    import math

    return sum(math.exp(-mean + j * math.log(mean) - math.lgamma(j + 1))
               for j in range(k, k + 60 + int(mean)))


# --- reasoning present in only some rows ------------------------------------------------------------------
def _reasoning(message, answer) -> bool:
    fields = any(isinstance((message or {}).get(k), str) and message[k].strip() for k in REASONING_KEYS)
    return fields or any(part.strip() for part in THINK.findall(answer or ""))


def reasoning_findings(rows, turns) -> list[Finding]:
    answered = [(row["_doctor_row"], _reasoning(message, answer)) for row, (_, answer, message)
                in zip(rows, turns) if answer is not None]
    with_reasoning = [i for i, has in answered if has]
    without = [i for i, has in answered if not has]
    if not with_reasoning or not without:
        return []
    return [Finding(
        "warning", "reasoning-partial",
        f"reasoning is in {share_of(len(with_reasoning), len(answered))}, not in the others",
        f"without reasoning: {_rows(without)} (<think>…</think> in the answer or a "
        f"{'/'.join(REASONING_KEYS)} "
        "field); the model learns to reason sometimes, at random, and the template may write an empty "
        "<think></think> into the others",
        "give every answer its reasoning, or none; a deliberate hybrid (thinking on and off): say so with "
        "--ignore reasoning-partial", "09")]

