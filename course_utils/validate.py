"""Argument checks shared by every public helper: one message style, what — why — how to fix.

A learner who passes the wrong thing should read one sentence that names the argument, says what
was expected and why, and how to fix it — not a traceback from deep inside torch, and never a
result computed from input that should have been refused. Every public function calls these at its
entry, visibly (TRL's style: a plain ``ValueError`` where the problem arises); one copy of each
check, so the messages agree. Each returns the value it checked:
``steps = positive_int("steps", steps)``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from pathlib import Path


def _did_you_mean(value, known: Iterable) -> str:
    close = difflib.get_close_matches(str(value), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _as_text_number(value):
    """The number a string spells (``"3"``, ``" 0.5 "``), else ``None``: the fix then names it."""
    if not isinstance(value, str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number


def _example(name: str, example) -> str:
    return f", e.g. {name}={example!r}" if example is not None else ""


def integer(name: str, value, *, minimum: int = 1, why: str = "it is a count", fix: str = "",
            example: int | None = None) -> int:
    """``value`` as an ``int`` >= ``minimum`` (bools are refused: ``True`` is not a count). The fix names the
    valid range, and ``example`` where the caller knows a real value (``fix`` replaces it all: a
    command-line flag, a value to look up). A number written as text or an integral float is named as
    such, with the int to pass."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        spelled = _as_text_number(value)
        if not fix and isinstance(spelled, int) and spelled >= minimum:
            fix = f"pass the number itself, {name}={spelled}, not the text {value!r}"
        elif (not fix and isinstance(value, float) and not isinstance(value, bool) and value.is_integer()
              and value >= minimum):
            fix = f"pass an int, {name}={int(value)}"
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum} — {why} — "
                         f"{fix or f'pass an integer >= {minimum}{_example(name, example)}'}.")
    return value


def positive_int(name: str, value, *, why: str = "it is a count", fix: str = "",
                 example: int | None = None) -> int:
    """An integer >= 1 (steps, accumulation steps, batch sizes, ranks…)."""
    return integer(name, value, minimum=1, why=why, fix=fix, example=example)


# No tokenizer ships more than about 262k tokens (Gemma 3: 262,144); an id far beyond that indexes no
# embedding row of any model, whichever tokenizer it was meant for.
MAX_VOCAB = 2 ** 20


def vocab_id(name: str, value, *, vocab_size: int | None = None, owner: str = "the vocabulary",
             why: str = "it is a token id", fix: str = "") -> int:
    """A token id: an int >= 0 and below ``vocab_size`` (``len(tokenizer)``, or the model's embedding rows:
    ``owner`` says which) where the caller has one. Without it only ids no vocabulary holds (>= ``MAX_VOCAB``)
    can be refused: ids alone cannot tell 600 from a real id of a larger vocabulary. A token *string* is
    refused with the call that turns it into an id."""
    spelled = _as_text_number(value)
    if isinstance(value, str) and spelled is None:
        raise TypeError(f"{name}={value!r} is a token string, not an id — ids are what the model reads and "
                        f"writes — pass token_id(tokenizer, {value!r}).")
    from_tokenizer = ("pass an id the tokenizer gives (tokenizer.pad_token_id, "
                      "tokenizer.convert_tokens_to_ids(token))")
    # text that spells an id: integer() names the int to pass
    fix_int = fix or ("" if isinstance(spelled, int) and spelled >= 0 else from_tokenizer)
    integer(name, value, minimum=0, why=why, fix=fix_int)
    limit = vocab_size if vocab_size is not None else MAX_VOCAB
    if value >= limit:
        where = (f"the {vocab_size} token ids of {owner} (0 to {vocab_size - 1})" if vocab_size is not None
                 else f"any vocabulary (no tokenizer has {MAX_VOCAB:,} tokens; the largest ship about 262k)")
        raise ValueError(f"{name}={value!r} is beyond {where} — no token has this id, so nothing can write "
                         f"it, stop on it or embed it — {fix or from_tokenizer}.")
    return value


def number(name: str, value, *, minimum: float | None = None, positive: bool = False,
           allow_none: bool = False, why: str = "", fix: str = "",
           example: float | None = None) -> float | None:
    """A finite real number (``positive``: > 0; ``minimum``: >= it); ``None`` where allowed. NaN and
    infinities are refused: every comparison with NaN is False, so a NaN tolerance passes any check. The
    fix names the valid range, and ``example`` where the caller knows a real value."""
    if value is None and allow_none:
        return None
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (not positive or value > 0) and (minimum is None or value >= minimum))
    if not ok:
        rule = " > 0" if positive else (f" >= {minimum}" if minimum is not None else "")
        none = " or None" if allow_none else ""
        spelled = _as_text_number(value)
        if not fix and spelled is not None and math.isfinite(spelled) and (not positive or spelled > 0) and (
                minimum is None or spelled >= minimum):
            fix = f"pass the number itself, {name}={spelled}, not the text {value!r}"
        raise ValueError(f"{name}={value!r} must be a finite number{rule}{none}"
                         f"{' — ' + why if why else ''} — "
                         f"{fix or f'pass a finite number{rule}{_example(name, example)}'}.")
    return float(value)


def flag(name: str, value, *, why: str = "it switches one behaviour on or off", fix: str = "") -> bool:
    """``True`` or ``False``, nothing else: ``"no"``, ``0`` or ``None`` for a switch is a slip to name, not
    a value to read as true or false."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be True or False — {why} — "
                        f"{fix or f'pass {name}=True or {name}=False'}.")
    return value


def choice(name: str, value, allowed: Sequence, *, why: str = "the helper knows only these") -> object:
    """``value`` if it is one of ``allowed``, else a what/why/fix error listing them (and the closest
    one, for a typo)."""
    try:
        ok = value in allowed
    except TypeError:  # an unhashable value against a set or dict
        ok = False
    if not ok:
        raise ValueError(f"{name}={value!r} is not one of {list(allowed)}{_did_you_mean(value, allowed)} — "
                         f"{why} — pass one of them.")
    return value


def choices(name: str, values, allowed: Sequence, *, why: str = "the helper knows only these") -> list:
    """A list of names, each one of ``allowed`` (a typo is named, with the closest known one). A bare
    string is refused: ``"long_prompts"`` is not ``["long_prompts"]``."""
    strings(name, values, allow_empty=True)
    for value in values:
        choice(f"{name} item", value, allowed, why=why)
    return list(values)


def strings(name: str, value, *, allow_empty: bool = False) -> list[str]:
    """A list or tuple of strings. A single string is refused with the fix: Python would iterate it
    character by character, and the helper would silently use ``"<", "|", "i", …``."""
    if isinstance(value, str):
        raise TypeError(f"{name}={value!r} is one string, not a list of strings — the helper iterates over "
                        f"the items and a string would be read character by character — pass [{value!r}].")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} must be a list of strings, got {type(value).__name__} — the helper reads "
                        f"each item as text — pass e.g. {name}=['<|im_end|>'].")
    if not value and not allow_empty:
        raise ValueError(f"{name} is empty — the helper needs at least one string — pass one or more.")
    return list(value)


def _real(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def fraction(name: str, value, *, why: str = "it is a share of a whole") -> float:
    """A number in [0, 1]. A value in (1, 100] is refused as the percentage it probably is."""
    if not _real(value) or not 0 <= value <= 1:
        spelled = _as_text_number(value)
        hint = (f"it looks like a percentage: pass {name}={value / 100:g}"
                if _real(value) and 1 < value <= 100
                else f"pass the number itself, {name}={spelled:g}, not the text {value!r}"
                if spelled is not None and 0 <= spelled <= 1
                else f"pass a number from 0 to 1, e.g. {name}=0.9")
        raise ValueError(f"{name}={value!r} must be a fraction between 0 and 1 — {why} — {hint}.")
    return float(value)


def percentage(name: str, value, *, why: str = "it is a percentile, 0 to 100") -> float:
    """A number in [0, 100]. A value strictly between 0 and 1 is refused as the fraction it probably is
    (``q=0.85`` for the 85th percentile would silently give the 1st)."""
    if not _real(value) or not 0 <= value <= 100 or 0 < value < 1:
        spelled = _as_text_number(value)
        hint = (f"it looks like a fraction: pass {name}={value * 100:g}" if _real(value) and 0 < value < 1
                else f"pass the number itself, {name}={spelled:g}, not the text {value!r}"
                if spelled is not None and (spelled == 0 or 1 <= spelled <= 100)
                else f"pass a number from 0 to 100, e.g. {name}=90")
        raise ValueError(f"{name}={value!r} must be a percentage between 0 and 100 — {why} — {hint}.")
    return float(value)


def seed(name: str, value) -> int:
    """A seed: an int >= 0. ``None`` is refused: the course's data and cases repeat for a seed by
    design, and ``random.Random(None)`` would draw new ones on every call."""
    if value is None:
        raise ValueError(f"{name}=None — the course's data and cases are deterministic by design, and no "
                         f"seed would give different ones on every call — pass an int, e.g. {name}=0 "
                         "(course_seed() gives the lesson's).")
    return integer(name, value, minimum=0, why="it is a seed")


def token_ids(name: str, ids, *, labels: bool = False) -> list[int]:
    """One sequence of token ids (or, with ``labels=True``, labels) as a list of Python ints: a list, a
    tuple or a 1-D integer tensor or array. Negative ids are refused (labels passed as ids?); a label may
    be -100, the ignore label."""
    import torch

    if isinstance(ids, torch.Tensor):
        if ids.ndim != 1 or ids.is_floating_point():
            raise ValueError(f"{name} is a {ids.ndim}-D {ids.dtype} tensor — one example's tokens are a 1-D "
                             "list of integer ids — pass one example (a row of a collated batch is "
                             "already padded: collate the tokenize_chat() outputs instead).")
        ids = ids.tolist()
    elif hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):  # a numpy array
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"{name} must be a list of token ids, got {type(ids).__name__} — the helper reads "
                        "one id per position — tokenize text first (tokenize_chat, or "
                        "tok(text)['input_ids']).")
    out = []
    for t in ids:
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise TypeError(f"{name} holds {t!r} ({type(t).__name__}), not an integer — ids and labels index "
                            "the vocabulary — pass the tokenizer's integer ids.")
        out.append(t.__index__())
    bad = [x for x in out if x < 0 and not (labels and x == -100)]
    if bad:
        rule = ("a label is a token id, or -100 where the loss ignores the position" if labels else
                "a token id indexes the embedding and cannot be negative (labels passed as input_ids?)")
        raise ValueError(f"{name} holds {bad[0]} — {rule} — pass the ids and labels tokenize_chat() "
                         "returned.")
    return out


def messages(name: str, value) -> list[dict]:
    """One conversation: a non-empty list of ``{"role", "content"}`` dicts (what a chat template renders)."""
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        got = "an empty list" if value == [] else type(value).__name__
        raise ValueError(f"{name} must be a non-empty list of {{'role', 'content'}} dicts, got {got} — the "
                         "chat template renders such a list — pass one conversation: make_messages()[0].")
    return value


# the roles TRL's chat handling knows; a template compares a role with these exact strings
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer", "ipython", "function")
# the usual stand-ins (ShareGPT's, other datasets') and the role of TRL's each means; the doctor uses them too
ROLE_STAND_INS = {"bot": "assistant", "gpt": "assistant", "model": "assistant", "ai": "assistant",
                  "chatbot": "assistant", "human": "user", "person": "user", "prompt": "user",
                  "prompter": "user", "sys": "system", "observation": "tool", "tool_response": "tool",
                  "function_response": "tool"}


def _role_fix(role) -> str:
    if not isinstance(role, str):
        return f"give each message a 'role', one of {list(CHAT_ROLES)}"
    if role.strip().lower() in CHAT_ROLES:
        return f"write it {role.strip().lower()!r} (the comparison is exact)"
    stand_in = ROLE_STAND_INS.get(role.strip().lower())
    return f"rename it {stand_in!r}" if stand_in else f"use one of them{_did_you_mean(role, CHAT_ROLES)}"


def chat(name: str, value) -> list[dict]:
    """One conversation a template can render and grade: ``messages``, and each message a dict with a
    ``role`` among ``CHAT_ROLES`` and a text ``content`` (``None`` only for an assistant turn that makes
    ``tool_calls``). A role the template does not know renders, and its answer is never graded."""
    messages(name, value)
    for i, message in enumerate(value):
        role = message.get("role")
        if role not in CHAT_ROLES:
            got = "no 'role'" if "role" not in message else f"role {role!r}"
            raise ValueError(f"{name}[{i}] has {got}, not one of {list(CHAT_ROLES)} — the chat template "
                             "compares the role with these exact strings, so the turn would render under the "
                             f"wrong markers and an answer in it would never be graded — {_role_fix(role)}.")
        content = message.get("content")
        calls_tools = role == "assistant" and message.get("tool_calls")
        if isinstance(content, str) or (content is None and calls_tools):
            continue
        got = ("no 'content'" if "content" not in message
               else f"content {content!r:.40} ({type(content).__name__})")
        raise ValueError(f"{name}[{i}] ({role}) has {got}, not text — the chat template renders each "
                         "message's content as a string — pass the text, e.g. "
                         f"{{'role': {role!r}, 'content': '...'}}.")
    return value


def seeds(name: str, value) -> list[int]:
    """A diagnosis checker's seeds: a non-empty list (or range) of seeds. None would draw nothing and a
    checker that grades no case passes any answer."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, range)) or len(value) == 0:
        got = "an empty list" if isinstance(value, (list, tuple, range)) else repr(value)
        raise ValueError(f"{name} must be a non-empty list of ints, got {got} — the checker grades one fresh "
                         "case per seed, and with none it would pass any answer — pass e.g. "
                         f"{name}=[0, 1, 2, 3], or leave it out for the checker's own.")
    return [seed(f"{name}[{i}]", s) for i, s in enumerate(value)]


def non_empty_string(name: str, value, *, why: str = "the helper reads it as text") -> str:
    """One non-empty string (a name, a label): not a number, not a list, not blank."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}={value!r:.60} is not a non-empty string — {why} — pass a short text, "
                         f"e.g. {name}='grad-norm ratio'.")
    return value


def function(name: str, value) -> object:
    """A callable (the learner's function, a loss, a hook)."""
    if not callable(value):
        raise TypeError(f"{name} must be a function, got {type(value).__name__} — the helper calls it — pass "
                        "the function itself, without calling it (fn, not fn()).")
    return value


def key(name: str, value, known: Iterable[str], *, where: str = "the records") -> str:
    """One key among ``known`` (e.g. a log key): a typo is refused with the closest known key, instead
    of an empty result."""
    known = sorted(set(known))
    if value not in known:
        raise ValueError(f"{name}={value!r} is not a key of {where}{_did_you_mean(value, known)} — the "
                         f"helper would find nothing — pass one of {known}.")
    return value


def non_empty(name: str, value, *, what: str = "items", fix: str = "") -> Sequence:
    """A non-empty list or tuple (a sequence the helper iterates over)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        got = "an empty sequence" if isinstance(value, Sequence) and not value else type(value).__name__
        raise ValueError(f"{name} must be a non-empty list of {what}, got {got} — the helper iterates "
                         f"over them — {fix or 'pass at least one.'}")
    return value


def tensor(name: str, value, *, ndim: int | None = None, integer_dtype: bool | None = None):
    """A ``torch.Tensor`` of ``ndim`` dimensions (and an integer or floating dtype where asked)."""
    import torch

    if not isinstance(value, torch.Tensor):
        hint = " (a Python list? wrap it in torch.tensor(...))" if isinstance(value, (list, tuple)) else ""
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}{hint} — the helper "
                        "does tensor arithmetic on it — pass a tensor.")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} has shape {tuple(value.shape)} but must have {ndim} dimensions "
                         f"({'[batch, seq]' if ndim == 2 else '[batch, seq, vocab]' if ndim == 3 else ''}) — "
                         "shapes decide which token is which — add or remove the batch dimension.")
    if integer_dtype is True and value.is_floating_point():
        raise TypeError(f"{name} has dtype {value.dtype} but must hold integer token ids or labels — "
                        "ids index the vocabulary — use dtype=torch.long.")
    if integer_dtype is False and not value.is_floating_point():
        raise TypeError(f"{name} has dtype {value.dtype} but must be floating point (logits) — "
                        "a loss needs real numbers — pass the model's .logits.")
    return value


def batch(name: str, value, *, need: Iterable[str] = ("input_ids", "labels")) -> dict:
    """A *collated* batch: a dict of 2-D integer tensors of one shape, holding at least ``need``.

    The most common slip is passing ``tokenize_chat`` outputs (lists of ids) where a collated batch
    is expected: the message says which function collates them.
    """
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], dict):
        raise TypeError(f"{name} is a list of {len(value)} examples, not a collated batch — the helper "
                        "needs [batch, seq] tensors — call collate_right(examples, pad_id) (or "
                        "make_batches) first.")
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict of tensors (input_ids, labels, attention_mask), got "
                        f"{type(value).__name__} — the helper reads those keys — build it with "
                        "collate_right() or make_batches().")
    missing = [k for k in need if k not in value]
    if missing:
        raise ValueError(f"{name} has no {missing} (keys: {sorted(value)}) — the helper needs them — "
                         "collate with labels, e.g. collate_right(tokenize_chat(...) outputs).")
    shape = None
    for key in ("input_ids", "labels", "attention_mask", "position_ids"):
        if key not in value:
            continue
        if isinstance(value[key], list):
            raise TypeError(f"{name}[{key!r}] is a list, not a tensor — the batch is not collated — "
                            "call collate_right(examples, pad_id) first.")
        tensor(f"{name}[{key!r}]", value[key], ndim=2, integer_dtype=True)
        if 0 in value[key].shape:
            raise ValueError(f"{name}[{key!r}] has shape {tuple(value[key].shape)}: no row or no position — "
                             "a batch holds at least one token of one example — collate real examples.")
        if shape is None:
            shape = value[key].shape
        elif value[key].shape != shape:
            raise ValueError(f"{name}[{key!r}] has shape {tuple(value[key].shape)} but input_ids has "
                             f"{tuple(shape)} — each position needs its own label and mask — collate "
                             "them together.")
    return value


def batches(name: str, value, *, need: Iterable[str] = ("input_ids", "labels")) -> Sequence[dict]:
    """A non-empty list of collated batches (each checked by ``batch``)."""
    if isinstance(value, dict):
        raise TypeError(f"{name} is a single batch — the helper takes a list of them — wrap it: [batch].")
    non_empty(name, value, what="collated batches", fix="build them with make_batches().")
    for i, b in enumerate(value):
        batch(f"{name}[{i}]", b, need=need)
    return value


def ids_fit_model(model, input_ids, *, name: str = "input_ids") -> None:
    """Token ids must index the model's embedding: a tokenizer from another model does not fit."""
    _a_model("model", model)
    model = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    tensor(name, input_ids, integer_dtype=True)
    if not hasattr(model, "get_input_embeddings"):
        return
    vocab = model.get_input_embeddings().num_embeddings
    if input_ids.numel() and (int(input_ids.max()) >= vocab or int(input_ids.min()) < 0):
        raise ValueError(f"{name} holds token id {int(input_ids.max())} but the model has only {vocab} "
                         "embeddings — the ids come from a tokenizer that does not belong to this model — "
                         "load model and tokenizer together (load_course_model()).")


def model_and_tokenizer(model, tokenizer) -> None:
    """A tokenizer whose ids the model can embed (the pair came from one checkpoint)."""
    if (not hasattr(model, "get_input_embeddings") or not callable(getattr(tokenizer, "encode", None))
            or not hasattr(tokenizer, "convert_ids_to_tokens")):  # a str has .encode too
        got = f"({type(model).__name__}, {type(tokenizer).__name__})"
        raise TypeError(f"expected (model, tokenizer), got {got}"
                        " — the helper tokenizes text and runs the model — pass load_course_model()'s pair.")
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model only {vocab} embeddings "
                         "— they come from different checkpoints — load them together with "
                         "load_course_model(), or call model.resize_token_embeddings(len(tokenizer)).")


def tokenizer(name: str, value):
    """A transformers tokenizer (the second item of ``load_course_model()``)."""
    if not (callable(getattr(value, "encode", None)) and hasattr(value, "convert_ids_to_tokens")):
        raise TypeError(f"{name} must be a transformers tokenizer, got {type(value).__name__} — the helper "
                        "turns text into token ids with it — pass the tokenizer from load_course_model().")
    return value


def model(name: str, value):
    """A torch model (the first item of ``load_course_model()``, or a peft/DDP wrapper of one)."""
    import torch

    if not isinstance(value, torch.nn.Module):
        raise TypeError(f"{name} must be a torch model, got {type(value).__name__} — the helper runs or "
                        "inspects its parameters — pass the model from load_course_model().")
    return value


_a_model = model  # for checks whose own parameter is called ``model``


def trainer(name: str, value):
    """A transformers ``Trainer`` (e.g. from ``make_sft_trainer``)."""
    if not hasattr(getattr(value, "state", None), "log_history"):
        raise TypeError(f"{name} must be a transformers Trainer, got {type(value).__name__} — the helper "
                        "reads its log history — pass the trainer you called .train() on "
                        "(make_sft_trainer(...)).")
    return value


# SFTConfig fields that count tokens or rows: SFTConfig stores 0 or -5 without a word, and training then cuts
# every row to nothing or builds empty batches
SFT_COUNTS = ("max_length", "per_device_train_batch_size", "gradient_accumulation_steps")


def sft_config(name: str, config: dict) -> dict:
    """``config`` as keyword arguments of ``trl.SFTConfig`` that training can use: every key one of its
    fields (a typo named, with the closest), a boolean field ``True``/``False`` (``"yes"`` is a string
    SFTConfig keeps), a count (``SFT_COUNTS``) an integer >= 1 (``max_length`` may be ``None``: no
    truncation), a ``learning_rate`` > 0. ``SFTConfig`` itself accepts ``max_length=0`` and then every row
    is cut to nothing."""
    from trl import SFTConfig

    if not isinstance(config, dict):
        raise TypeError(f"{name} must be a dict of SFTConfig fields, got {type(config).__name__} — each key "
                        "is a field name — pass e.g. {'max_length': 512}.")
    fields = SFTConfig.__dataclass_fields__
    for key, value in config.items():
        if key not in fields:
            raise ValueError(f"{name} field {key!r} is not an SFTConfig field{_did_you_mean(key, fields)} — "
                             "SFTConfig(**...) raises TypeError on it — fix the spelling against SFTConfig's "
                             "fields, or drop it.")
        if str(fields[key].type) in ("<class 'bool'>", "bool"):
            flag(key, value, why="it is an SFTConfig switch")
        elif key in SFT_COUNTS and not (key == "max_length" and value is None):
            integer(key, value, minimum=1, why="it counts tokens or rows, and nothing trains with fewer than "
                    "one", fix=f"pass e.g. {key}={512 if key == 'max_length' else 8}"
                    + (" (or None: no truncation)" if key == "max_length" else ""))
        elif key == "learning_rate":
            number(key, value, positive=True, why="a rate of 0 or less trains nothing or backwards",
                   fix="pass e.g. learning_rate=2e-5")
    return dict(config)


def new_directory(name: str, value, *, inputs: Iterable = (), what: str = "the helper's files") -> Path:
    """A directory to write ``what`` into that holds nothing yet: absent (it is created by the caller) or
    empty, and neither one of the ``inputs`` paths, inside one, nor around one. Writing into a folder with
    files, or over what is being read, overwrites them for good."""
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise TypeError(f"{name}={value!r} is not a directory path — {what} are written there — pass a new "
                        "directory, e.g. tempfile.mkdtemp().")
    out = Path(value).expanduser()
    for source in inputs:
        mine, theirs = out.resolve(), Path(source).expanduser().resolve()
        if mine == theirs or theirs in mine.parents or mine in theirs.parents:
            raise ValueError(f"{name}={str(value)!r} is {str(source)!r}, inside it or around it — writing "
                             f"{what} there would overwrite what is being read, for good — pass a new "
                             "directory elsewhere, e.g. tempfile.mkdtemp().")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{name}={str(value)!r} is a file — {what} go into a folder, so it must be a folder "
                         "path, and writing there would overwrite the file — pass a new or empty directory, "
                         "e.g. tempfile.mkdtemp().")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{name}={str(value)!r} already holds files — {what} are written there and would "
                         "overwrite them — pass a new or empty directory, e.g. tempfile.mkdtemp().")
    return out
