"""Lesson 00 (tour): the environment check, which tokens carry loss under each of TRL's loss modes
(``graded_labels``, ``loss_mode_explorer``), and the exercises' checkers."""

from __future__ import annotations

import os
import platform
import random
import re
from importlib import metadata

from .data import IGNORE_INDEX, make_messages, tokenize_chat

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


def check_environment(load_model: bool = True) -> list[tuple[str, bool, str]]:
    """Print one ``[OK]``/``[FAIL]`` line per check and return ``(name, ok, detail)`` rows.

    Checks: the Python version, each pinned package at its pinned version, the device torch will
    use, that the hub is off (nothing will download), that imports are cached, and that the course
    model loads.
    """
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
    # shipped models (local files) any HF_HUB_OFFLINE works; importing course_utils defaults it to 1.
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    source = os.environ.get("COURSE_MODEL") or "the shipped model"
    local = source == "the shipped model" or os.path.isdir(os.path.expanduser(source)) or "/" not in source
    rows.append(("nothing downloads at run time", offline or local,
                 f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')}, model: {source}"))
    rows.append(_bytecode_row(torch))
    if load_model:
        from .model import load_course_model

        try:
            model, _ = load_course_model()
            rows.append(("course model loads", True,
                         f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters"))
        except Exception as exc:  # report, don't crash the tour
            rows.append(("course model loads", False, str(exc)[:200]))
    for name, ok, detail in rows:
        print(f"[{'OK' if ok else 'FAIL'}] {name:<32} {detail}")
    return rows


def _bytecode_row(module) -> tuple[str, bool, str]:
    """The environment check's row: will this kernel's imports (of ``module``'s library) be cached?

    ``make install`` does not byte-compile the packages: Python writes each module's bytecode at its
    first import. Where ``PYTHONDONTWRITEBYTECODE`` is set (some containers) and nothing was compiled
    yet, every kernel compiles the ~3,500 modules it imports again: ~15 s more per lesson.
    """
    import importlib.util
    import sys

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


def graded_labels(tokenizer, messages: list[dict], mode: str = "assistant only") -> dict:
    """``input_ids`` and ``labels`` (``-100``: no loss) of one conversation as TRL labels it in ``mode``.

    ``"full sequence"``: every token; ``"completion only"``: what follows the longest common prefix of the
    prompt (all turns but the last, with the generation prompt) and the whole chat, as SFTTrainer's
    prompt-completion tokenization does; ``"assistant only"``: ``tokenize_chat`` (equal to TRL's
    ``assistant_only_loss`` labels, section 4).
    """
    from trl.data_utils import common_prefix_length

    from . import validate
    from .data import _check_messages

    validate.tokenizer("tokenizer", tokenizer)
    _check_messages(messages)
    validate.choice("mode", mode, tuple(LOSS_MODES), why="they are TRL's three ways to pick graded tokens")
    if mode == "assistant only":
        example = tokenize_chat(tokenizer, messages)
        return {"input_ids": example["input_ids"], "labels": example["labels"]}
    ids = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    if mode == "full sequence":
        return {"input_ids": ids, "labels": list(ids)}
    if len(messages) < 2 or messages[-1].get("role") != "assistant":
        raise ValueError("completion only needs a prompt and an assistant completion — the last message is "
                         "the completion — pass a conversation that ends with an assistant turn.")
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=True, return_dict=True,
                                           add_generation_prompt=True)["input_ids"]
    start = common_prefix_length(list(prompt), ids)
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * start + ids[start:]}


def graded_text(tokenizer, input_ids, labels, width: int = 100) -> list[str]:
    """The token viewer as text: every token in order, the graded ones in ``[brackets]``, in lines of
    about ``width`` characters broken between tokens (``\\n`` is a newline token)."""
    from . import validate
    from .viz import token_strings

    validate.tokenizer("tokenizer", tokenizer)
    for name, seq in (("input_ids", input_ids), ("labels", labels)):
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__len__") or len(seq) == 0:
            raise ValueError(f"{name} must be a non-empty sequence of token ids, got {type(seq).__name__} "
                             f"— one value per token — pass graded_labels(...)['{name}'].")
    validate.positive_int("width", width, why="it is the line length in characters")
    if len(input_ids) != len(labels):
        raise ValueError(f"{len(input_ids)} input_ids but {len(labels)} labels — one label per token — pass "
                         "both from graded_labels() or tokenize_chat().")
    lines, line = [], ""
    for piece, label in zip(token_strings(tokenizer, input_ids), labels):
        piece = f"[{piece}]" if label != IGNORE_INDEX else piece
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        line += piece
    return lines + [line]


def example_chats(seed: int | None = None) -> dict[str, list[dict]]:
    """Three conversations that tell the loss modes apart: one exchange, one with its own system prompt,
    and two exchanges (only the last answer is a "completion")."""
    from .model import course_seed

    seed = course_seed() if seed is None else seed
    first, second = make_messages("add", 1, seed=seed + 1)[0], make_messages("reverse", 1, seed=seed + 2)[0]
    return {"one exchange": make_messages("reverse", 1, seed=seed)[0],
            "own system prompt": [{"role": "system", "content": "You answer briefly."}] + first,
            "two exchanges": first + second}


def loss_mode_frame(tokenizer, messages: list[dict], mode: str) -> str:
    """One setting as text: the mode and how to ask TRL for it, the graded count, the tokens with the
    graded ones in brackets, and the graded text."""
    out = graded_labels(tokenizer, messages, mode)
    ids, labels = out["input_ids"], out["labels"]
    graded = [label for label in labels if label != IGNORE_INDEX]
    turns = sum(m.get("role") == "assistant" for m in messages)
    return "\n".join([
        f"{mode}: {LOSS_MODES[mode]}",
        f"graded tokens: {len(graded)} of {len(ids)} ({len(graded) / len(ids):.0%}); assistant turns in the "
        f"chat: {turns}",
        *graded_text(tokenizer, ids, labels),
        f"graded text: {_shortened(repr(tokenizer.decode(graded)))}",
    ])


def _shortened(text: str, width: int = 100) -> str:
    half = (width - 5) // 2
    return text if len(text) <= width else f"{text[:half]} ... {text[-half:]}"


def loss_mode_explorer(tokenizer, chats: dict[str, list[dict]] | None = None):
    """What if: the loss mode × an example chat → ``loss_mode_frame`` (tokenizing only: instant).

    ``chats``: ``{label: conversation}``; default ``example_chats()``. Starts on TRL's default for a
    messages dataset, the full sequence.
    """
    from . import validate
    from .viz import what_if

    validate.tokenizer("tokenizer", tokenizer)
    from .data import _check_messages

    chats = example_chats() if chats is None else chats
    if not isinstance(chats, dict) or not chats:
        raise ValueError(f"chats must be a non-empty dict {{label: conversation}}, got "
                         f"{type(chats).__name__} — each label is one stop of the slider — pass e.g. "
                         "example_chats().")
    for conversation in chats.values():
        _check_messages(conversation)
    return what_if(lambda mode, chat: loss_mode_frame(tokenizer, chats[chat], mode),
                   {"mode": list(LOSS_MODES), "chat": list(chats)},
                   descriptions={"mode": "loss mode", "chat": "example chat"})


# ------------------------------------------------------------------------------------------------
# Exercise 1 (diagnosis): which tokens carry loss in a labelled example you have not seen?
# ------------------------------------------------------------------------------------------------

LABEL_CAUSES = ("correct", "whole_sequence", "stop_token_not_graded", "nothing_graded", "shifted_labels")
LABEL_MISCONCEPTIONS = {
    ("correct", "stop_token_not_graded"): "every assistant word is graded, but is <|im_end|>? Without it "
                                          "the model never learns to stop (lesson 02).",
    ("correct", "shifted_labels"): "a label must be the token at its own position; compare labels with "
                                   "input_ids where both are set (the model shifts internally).",
    ("whole_sequence", "shifted_labels"): "many tokens carry a label, but do the labels equal the tokens "
                                          "at their positions?",
    ("correct", "whole_sequence"): "look at the system and user turns: do they carry labels?",
    ("stop_token_not_graded", "correct"): "find <|im_end|> right after the answer: it is graded here.",
    ("nothing_graded", "correct"): "count again: labels that are not -100 exist here.",
}


def _messages_for(seed: int) -> list[dict]:
    rng = random.Random(seed)
    task = rng.choice(("add", "reverse"))
    conversation = make_messages(task, 1, seed=seed)[0]
    if rng.random() < 0.5:  # some examples carry their own system prompt
        conversation = [{"role": "system", "content": "You answer briefly."}] + conversation
    return conversation


def _labelled_case(tokenizer, seed: int):
    """A labelled example broken in one of ``LABEL_CAUSES`` ways, and its true ``Diagnosis``."""
    from .checks import Diagnosis

    cause = LABEL_CAUSES[seed % len(LABEL_CAUSES)]
    messages = _messages_for(seed)
    example = tokenize_chat(tokenizer, messages, train_on_eos=cause != "stop_token_not_graded")
    ids, labels = list(example["input_ids"]), list(example["labels"])
    if cause == "whole_sequence":
        labels = list(ids)
    elif cause == "nothing_graded":
        labels = [IGNORE_INDEX] * len(ids)
    elif cause == "shifted_labels":  # "I shift the labels myself": each label is the *next* token
        labels = [ids[i + 1] if i + 1 < len(ids) and lab != IGNORE_INDEX else IGNORE_INDEX
                  for i, lab in enumerate(labels)]
    artefact = {"input_ids": ids, "labels": labels, "tokens": tokenizer.convert_ids_to_tokens(ids)}
    graded = sum(label != IGNORE_INDEX for label in labels)
    return artefact, Diagnosis(cause, graded)


def unseen_labelled_example(tokenizer, seed: int) -> dict:
    """An example labelled by a data pipeline you have not seen — possibly broken (exercise 1).

    Returns ``input_ids``, ``labels`` and ``tokens`` (the token strings). The checker grades your
    diagnosis on other seeds, so look at the labels, not at this function.
    """
    from . import validate

    validate.integer("seed", seed, minimum=0, why="it picks the example")
    return _labelled_case(tokenizer, seed)[0]


def check_label_diagnosis(fn, tokenizer):
    """Checker for exercise 1: ``fn(example) -> Diagnosis(cause, evidence)`` with ``cause`` one of
    ``LABEL_CAUSES`` and ``evidence`` the number of tokens that carry loss."""
    from .checks import Hints, check_diagnosis, fresh_seeds

    return check_diagnosis(
        "diagnose_labels", fn, lambda seed: _labelled_case(tokenizer, seed), seeds=fresh_seeds(10),
        misconceptions=LABEL_MISCONCEPTIONS,
        hint=Hints("Which positions have a label that is not -100, and is each label the token at its own "
                   "position? Is <|im_end|> among them?",
                   "Compare example['labels'] with example['input_ids'] position by position; the token "
                   "viewer of §2 shows what a correct example looks like.",
                   "graded = [i for i, l in enumerate(labels) if l != -100]; no graded -> nothing_graded; "
                   "a graded label != input_ids[i] -> shifted_labels; a graded <|im_start|> -> "
                   "whole_sequence; <|im_end|> after the answer not graded -> stop_token_not_graded; "
                   "else correct. Evidence: len(graded)."))


# ------------------------------------------------------------------------------------------------
# Exercise 2 (fix): label an example yourself, assistant tokens only
# ------------------------------------------------------------------------------------------------

def _whitespace(tokenizer, token_id: int) -> bool:
    return tokenizer.decode([token_id]).strip() == ""


def _label_cases(tokenizer) -> list:
    from .checks import Case

    cases = []
    for seed, extra_turn in ((2001, False), (2002, True), (2003, False), (2004, True)):
        messages = _messages_for(seed)
        if extra_turn:  # a second exchange: every assistant turn carries loss
            messages = messages + make_messages("add", 1, seed=seed + 7)[0]
        example = tokenize_chat(tokenizer, messages)
        tag = "multi_turn" if extra_turn else "single_turn"
        ids = list(example["input_ids"])
        label = f"{'two exchanges' if extra_turn else 'one exchange'}, seed {seed}"
        cases.append(Case((tokenizer, ids), (ids, list(example["labels"])), label=label, tag=tag))
    return cases


def _compare_labels(tokenizer):
    """Accept every correct variant: the graded set must hold each answer token and its <|im_end|>,
    may add or leave out the whitespace around them, and nothing else; labels equal the tokens."""
    def compare(got, expected) -> str | None:
        ids, expected = expected
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"expected a list of {len(expected)} labels (one per token), got {got!r:.120}"
        graded = {i for i, label in enumerate(got) if label != IGNORE_INDEX}
        reference = {i for i, label in enumerate(expected) if label != IGNORE_INDEX}
        core = {i for i in reference if not _whitespace(tokenizer, ids[i])}
        wrong = [i for i in graded if int(got[i]) != ids[i]]
        if wrong:
            return f"position {wrong[0]}: label {got[wrong[0]]} but the token there is {ids[wrong[0]]}"
        if not core <= graded:
            missing = tokenizer.decode([ids[min(core - graded)]])
            return f"{len(core - graded)} assistant token(s) carry no loss, e.g. {missing!r}"
        if graded - reference:
            extra = tokenizer.decode([ids[min(graded - reference)]])
            n_extra = len(graded - reference)
            return f"{n_extra} token(s) outside the assistant's answers carry loss, e.g. {extra!r}"
        return None
    return compare


def _diagnose_labels(tokenizer):
    eot = None

    def diagnose(got, case) -> str | None:
        nonlocal eot
        from .data import end_of_turn_id

        eot = eot if eot is not None else end_of_turn_id(tokenizer)
        ids = case.args[1]
        if not isinstance(got, (list, tuple)) or len(got) != len(ids):
            return None
        graded = [i for i, label in enumerate(got) if label != IGNORE_INDEX]
        if graded and all(int(got[i]) == ids[i + 1] for i in graded if i + 1 < len(ids)) and \
                any(int(got[i]) != ids[i] for i in graded):
            return ("your labels are shifted by one: don't shift them, the model does "
                    "(logit t predicts label t+1).")
        if len(graded) == len(ids):
            return "you graded the whole sequence: system and user tokens would carry loss too."
        if all(ids[i] != eot for i in graded):
            return ("<|im_end|> after each answer carries no loss: the model would never learn to stop "
                    "(lesson 02).")
        if case.tag == "multi_turn" and any(
                int(e) != IGNORE_INDEX and int(g) == IGNORE_INDEX for g, e in zip(got, case.expected[1])):
            return "only part of the conversation's answers is graded: every assistant turn carries loss."
        return None
    return diagnose


def check_assistant_only_labels(fn, tokenizer):
    """Checker for exercise 2: ``fn(tokenizer, input_ids) -> labels`` grades exactly the assistant's
    answers and their ``<|im_end|>`` (whitespace around them either way), -100 elsewhere."""
    from .checks import Hints, run_check

    return run_check(
        "assistant_only_labels", lambda tok, ids: fn(tok, list(ids)), _label_cases(tokenizer),
        compare=_compare_labels(tokenizer), diagnose=_diagnose_labels(tokenizer),
        hint=Hints("Which token opens an assistant turn, and which one closes it? What should a label be at "
                   "a position that carries loss?",
                   "Print tokenizer.convert_ids_to_tokens(input_ids) for one example, find '<|im_start|>' "
                   "followed by 'assistant', and the next '<|im_end|>'.",
                   "walk the tokens; after <|im_start|> + assistant (+ newline) set labels[i] = input_ids[i] "
                   "up to and including the next <|im_end|>; -100 everywhere else."))
