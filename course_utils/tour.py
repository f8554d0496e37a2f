"""Lesson 00 (tour): the environment report, and which tokens carry loss under each of TRL's loss modes.

- ``environment_report`` / ``pinned_versions``: one ``[OK]``/``[FAIL]`` line per thing a lesson needs;
- ``graded_labels`` / ``graded_text`` / ``loss_mode_frame``: one conversation labelled as TRL labels it in
  each loss mode, as text with the graded tokens in brackets;
- ``example_chats`` / ``loss_mode_explorer``: the lesson's "what if" over the loss mode and the chat.

The exercises' checkers and the labelled examples they grade are in ``course_utils.exercises.lesson00``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import sys
from importlib import metadata

from . import validate
from .data import IGNORE_INDEX, is_graded, make_messages, tokenize_chat
from .model import course_seed, load_course_model
from .viz import token_strings, what_if

# torch and trl are imported inside the functions that use them: the environment report must print its
# rows (a missing or broken pinned package among them) instead of failing at `import course_utils.tour`.

DISTRIBUTION = "sft-failure-lab"


def pinned_versions() -> dict[str, str]:
    """``{package: version}`` for every ``==`` pin of the installed course (from pyproject.toml)."""
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"the course package {DISTRIBUTION!r} is not installed in this Python "
            f"({platform.python_version()}) "
            "— the check compares installed versions with its pins — run `make lab` (or "
            "`pip install -e .`) and pick the .venv kernel."
        ) from exc
    pins = {}
    for req in requirements:
        if "extra ==" in req:  # optional extras (the browser test's playwright): no lesson needs them
            continue
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^;\s]+)", req)
        if match:
            pins[match.group(1)] = match.group(2)
    return pins


def _flag(name: str, value) -> bool:
    """A yes/no switch: ``True`` or ``False`` (a string such as ``"no"`` would count as true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be True or False — it switches a step on or off, and any "
                        f"non-empty value would count as True — pass {name}=True or {name}=False.")
    return value


def environment_report(load_model: bool = True) -> list[tuple[str, bool, str]]:
    """Print one ``[OK]``/``[FAIL]`` line per requirement and return ``(name, ok, detail)`` rows.

    Rows: the Python version, each pinned package at its pinned version, the device torch will use,
    that the hub is off (nothing will download), that imports are cached, and (``load_model=True``)
    that the course model loads. Uncached imports (``PYTHONDONTWRITEBYTECODE``, common in Docker images)
    only make kernels start slower: that row prints ``[WARN]`` and counts as ok.
    """
    _flag("load_model", load_model)
    rows = [("python 3.11 or 3.12", platform.python_version_tuple()[:2] in (("3", "11"), ("3", "12")),
             platform.python_version())]
    for package, wanted in pinned_versions().items():
        try:
            found = metadata.version(package)
        except metadata.PackageNotFoundError:
            found = "missing"
        rows.append((f"{package}=={wanted}", found.split("+")[0] == wanted, found))
    import torch

    device = os.environ.get("COURSE_DEVICE") or "cpu"
    rows.append(("device", device == "cpu" or torch.cuda.is_available(),
                 f"{device} (CUDA available: {torch.cuda.is_available()})"))
    # What breaks a lesson is a model that must be downloaded, not the variable itself: with the
    # shipped models (local files) any HF_HUB_OFFLINE works; use_course_defaults() sets it to 1.
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    source = os.environ.get("COURSE_MODEL") or "the shipped model"
    local = source == "the shipped model" or os.path.isdir(os.path.expanduser(source)) or "/" not in source
    rows.append(("nothing downloads at run time", offline or local,
                 f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')}, model: {source}"))
    speed = _bytecode_row(torch)  # a speed hint, not a requirement: printed as [WARN], never a failure
    rows.append((speed[0], True, speed[2]))
    if load_model:
        try:
            model, _ = load_course_model()
            rows.append(("course model loads", True,
                         f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters"))
        except Exception as exc:  # report, don't crash the tour
            rows.append(("course model loads", False, str(exc)[:200]))
    for name, ok, detail in rows:
        label = "WARN" if name == speed[0] and not speed[1] else "OK" if ok else "FAIL"
        print(f"[{label}] {name:<32} {detail}")
    return rows


def _bytecode_row(module) -> tuple[str, bool, str]:
    """The environment report's row: will this kernel's imports (of ``module``'s library) be cached?

    ``make install`` does not byte-compile the packages: Python writes each module's bytecode at its
    first import. Where ``PYTHONDONTWRITEBYTECODE`` is set (some containers) and nothing was compiled
    yet, every kernel compiles the ~3,500 modules it imports again: ~15 s more per lesson.
    """
    compiled = os.path.exists(importlib.util.cache_from_source(module.__file__))
    ok = compiled or not sys.dont_write_bytecode
    if not sys.dont_write_bytecode:
        detail = "Python caches each module's bytecode at its first import"
    elif compiled:
        detail = f"PYTHONDONTWRITEBYTECODE is set, and {module.__name__} is compiled already"
    else:
        detail = (f"PYTHONDONTWRITEBYTECODE is set and {module.__name__} is not compiled — every kernel "
                  "compiles the libraries again (~15 s) — start JupyterLab with `make lab` (it clears the "
                  "variable), or unset it for one run")
    return "imports are cached (bytecode)", ok, detail


# ------------------------------------------------------------------------------------------------
# Which tokens carry loss: TRL's three loss modes on one conversation
# ------------------------------------------------------------------------------------------------

LOSS_MODES = {
    "full sequence": "SFTConfig() on a messages dataset: TRL's default",
    "completion only": "a prompt-completion dataset (the last turn is the completion): completion_only_loss, "
                       "TRL's default for that form",
    "assistant only": "SFTConfig(assistant_only_loss=True): the {% generation %} spans",
}


def _check_mode_args(tokenizer, messages, mode: str) -> None:
    validate.tokenizer("tokenizer", tokenizer)
    validate.messages("messages", messages)
    for message in messages:
        if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            raise ValueError(f"message {message!r:.80} has no 'role' and 'content' strings — the chat "
                             "template renders each turn from them — pass e.g. {'role': 'user', 'content': "
                             "'hi'}.")
    validate.choice("mode", mode, tuple(LOSS_MODES), why="they are TRL's three ways to pick graded tokens")
    if mode == "completion only" and (len(messages) < 2 or messages[-1].get("role") != "assistant"):
        raise ValueError("completion only needs a prompt and an assistant completion — the last message is "
                         "the completion — pass a conversation that ends with an assistant turn.")


def graded_labels(tokenizer, messages: list[dict], mode: str = "assistant only") -> dict:
    """``input_ids`` and ``labels`` (``-100``: no loss) of one conversation as TRL labels it in ``mode``.

    ``"full sequence"``: every token; ``"completion only"``: what follows the longest common prefix of the
    prompt (all turns but the last, with the generation prompt) and the whole chat, as SFTTrainer's
    prompt-completion tokenization does; ``"assistant only"``: ``tokenize_chat`` (equal to TRL's
    ``assistant_only_loss`` labels, section 4).
    """
    _check_mode_args(tokenizer, messages, mode)
    return _graded_labels(tokenizer, messages, mode)


def _graded_labels(tokenizer, messages: list[dict], mode: str) -> dict:
    from trl.data_utils import common_prefix_length  # trl: see the note on imports at the top

    if mode == "assistant only":
        example = tokenize_chat(tokenizer, messages)
        return {"input_ids": example["input_ids"], "labels": example["labels"]}
    ids = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    if mode == "full sequence":
        return {"input_ids": ids, "labels": list(ids)}
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=True, return_dict=True,
                                           add_generation_prompt=True)["input_ids"]
    start = common_prefix_length(list(prompt), ids)
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * start + ids[start:]}


def graded_text(tokenizer, input_ids, labels, width: int = 100) -> list[str]:
    """The token viewer as text: every token in order, the graded ones in ``[brackets]``, in lines of
    about ``width`` characters broken between tokens (``\\n`` is a newline token)."""
    validate.tokenizer("tokenizer", tokenizer)
    for name, seq in (("input_ids", input_ids), ("labels", labels)):
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__len__") or len(seq) == 0:
            raise ValueError(f"{name} must be a non-empty sequence of token ids, got {type(seq).__name__} "
                             f"— one value per token — pass graded_labels(...)['{name}'].")
    validate.positive_int("width", width, why="it is the line length in characters")
    if len(input_ids) != len(labels):
        raise ValueError(f"{len(input_ids)} input_ids but {len(labels)} labels — one label per token — pass "
                         "both from graded_labels() or tokenize_chat().")
    return _graded_text(tokenizer, input_ids, labels, width)


def _graded_text(tokenizer, input_ids, labels, width: int = 100) -> list[str]:
    lines, line = [], ""
    # a token is shown graded where its own label is set, as TRL writes the label array (unshifted): the
    # viewer shows labels position by position; data.graded would drop column 0 (never a target)
    for piece, label in zip(token_strings(tokenizer, input_ids), labels):
        piece = f"[{piece}]" if is_graded(label) else piece
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        line += piece
    return lines + [line]


def example_chats(seed: int | None = None) -> dict[str, list[dict]]:
    """Three conversations that tell the loss modes apart: one exchange, one with its own system prompt,
    and two exchanges (only the last answer is a "completion"). ``seed=None``: the course seed."""
    seed = course_seed() if seed is None else validate.seed("seed", seed)
    first, second = make_messages("add", 1, seed=seed + 1)[0], make_messages("reverse", 1, seed=seed + 2)[0]
    return {"one exchange": make_messages("reverse", 1, seed=seed)[0],
            "own system prompt": [{"role": "system", "content": "You answer briefly."}] + first,
            "two exchanges": first + second}


def loss_mode_frame(tokenizer, messages: list[dict], mode: str) -> str:
    """One setting as text: the mode and how to ask TRL for it, the graded count, the tokens with the
    graded ones in brackets, and the graded text."""
    _check_mode_args(tokenizer, messages, mode)
    return _loss_mode_frame(tokenizer, messages, mode)


def _loss_mode_frame(tokenizer, messages: list[dict], mode: str) -> str:
    out = _graded_labels(tokenizer, messages, mode)
    ids, labels = out["input_ids"], out["labels"]
    # the labels TRL writes, counted as the viewer shows them (unshifted: "full sequence" is 100 %)
    graded = [label for label in labels if is_graded(label)]
    turns = sum(m.get("role") == "assistant" for m in messages)
    return "\n".join([
        f"{mode}: {LOSS_MODES[mode]}",
        f"graded tokens: {len(graded)} of {len(ids)} ({len(graded) / len(ids):.0%}); assistant turns in the "
        f"chat: {turns}",
        *_graded_text(tokenizer, ids, labels),
        f"graded text: {_shortened(repr(tokenizer.decode(graded)))}",
    ])


def _shortened(text: str, width: int = 100) -> str:
    half = (width - 5) // 2
    return text if len(text) <= width else f"{text[:half]} ... {text[-half:]}"


def loss_mode_explorer(tokenizer, chats: dict[str, list[dict]] | None = None):
    """What if: the loss mode × an example chat → ``loss_mode_frame`` (tokenizing only: instant).

    ``chats``: ``{label: conversation}``; default ``example_chats()``. Starts on TRL's default for a
    messages dataset, the full sequence. Every chat must end with an assistant turn (the completion).
    """
    validate.tokenizer("tokenizer", tokenizer)
    chats = example_chats() if chats is None else chats
    if not isinstance(chats, dict) or not chats:
        raise ValueError(f"chats must be a non-empty dict {{label: conversation}}, got "
                         f"{type(chats).__name__} — each label is one stop of the slider — pass e.g. "
                         "example_chats().")
    for conversation in chats.values():
        for mode in LOSS_MODES:  # every frame the control can show: refused now, not at a later move
            _check_mode_args(tokenizer, conversation, mode)
    return what_if(lambda mode, chat: _loss_mode_frame(tokenizer, chats[chat], mode),
                   {"mode": list(LOSS_MODES), "chat": list(chats)},
                   descriptions={"mode": "loss mode", "chat": "example chat"})


# ------------------------------------------------------------------------------------------------
# Whole-sequence loss: the prompt's share of the tokens is not its share of the gradient
# ------------------------------------------------------------------------------------------------

def prompt_shares(model, tokenizer, conversations: list) -> dict:
    """Under whole-sequence loss (TRL's default for ``messages``), what the prompt and markup take:
    ``token_share`` (of the graded tokens), ``loss_share`` (of the summed loss) and ``gradient_ratio``
    (the norm of the prompt tokens' gradient over the answers'), measured on ``conversations``.

    Token share is fixed by the data; the other two change as the model trains: a fixed system prompt and
    the chat markup are learned within a few steps and then ask for little (lesson 00, section 4)."""
    import torch
    import torch.nn.functional as F

    validate.model("model", model)
    validate.tokenizer("tokenizer", tokenizer)
    if not isinstance(conversations, list) or not conversations:
        raise ValueError("conversations must be a non-empty list of conversations — the shares are measured "
                         "on them — pass e.g. make_messages('mixed', 32, seed=1).")
    rows = [tokenize_chat(tokenizer, validate.messages(f"conversations[{i}]", c))
            for i, c in enumerate(conversations)]
    was_training = model.training
    model.eval()
    summed, norms, counts = {}, {}, {}
    for part, graded in (("prompt", 0), ("answer", 1)):
        model.zero_grad()
        loss, count = 0.0, 0
        for row in rows:  # the target at t+1 is graded by the mask at t+1 (the shift is explicit)
            ids = torch.tensor([row["input_ids"]])
            chosen = torch.tensor(row["assistant_mask"][1:]) == graded
            nll = F.cross_entropy(model(input_ids=ids).logits[0, :-1], ids[0, 1:], reduction="none")
            loss = loss + nll[chosen].sum()
            count += int(chosen.sum())
        loss.backward()
        grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        summed[part], counts[part], norms[part] = float(loss.detach()), count, float(torch.cat(grads).norm())
    model.zero_grad()
    model.train(was_training)
    return {"token_share": counts["prompt"] / (counts["prompt"] + counts["answer"]),
            "loss_share": summed["prompt"] / (summed["prompt"] + summed["answer"]),
            "gradient_ratio": norms["prompt"] / max(norms["answer"], 1e-30)}
