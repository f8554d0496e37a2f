"""Deterministic toy chat data, and the tokenization that decides which tokens carry loss.

Every lesson trains on the same two tiny tasks, so that the *failure* is the only thing that
changes between lessons:

- ``"add"``:     ``What is 23 + 58?``                  -> ``81``
- ``"reverse"``: ``Reverse the words: red cat blue``   -> ``blue cat red``

``context_words`` prepends a filler paragraph to the user turn, which makes prompts long; with
``long_tail=True`` its length is heavy-tailed, so a few prompts are far longer than the rest
(lesson 05 needs those to fill ``max_length``).

The same generators write the plain-text pretraining corpus of the course model
(``build_course_model``): the model learns the *tasks* in prose there, and the *chat format*
only during SFT in the lessons, which is why SFT visibly converges in a few seconds.
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Sequence

import torch

from . import validate

IGNORE_INDEX = -100  # the label value that torch's cross-entropy (and transformers) skip

WORDS = (
    "red blue green black white pink gray gold cat dog fox owl bee cow pig hen "
    "box cup hat key map pen bag car sun moon star tree rock lake hill road "
    "big small fast slow warm cold soft loud old new happy quiet bright dark "
    "apple bread milk rice tea cake soup salt"
).split()

TASKS = ("add", "reverse", "mixed")


def is_graded(label):
    """Whether a label carries loss — it is not ``IGNORE_INDEX`` (-100): the one rule the course uses.

    Unshifted: it reads a label at its own position (TRL's prepared rows, a viewer marking the tokens
    a row trains, "the stop token carries loss"); ``graded`` applies it to ``labels[1:]``, the targets
    of the logits. One label gives a bool; a tensor or array gives its mask, element by element.
    """
    if type(label) is int:  # the common case, first: the doctor reads millions of labels
        return label != IGNORE_INDEX
    if isinstance(label, bool) or not (isinstance(label, numbers.Real) or hasattr(label, "dtype")):
        raise TypeError(f"label={label!r:.60} is a {type(label).__name__}, not a token id — a label is a "
                        f"token id or {IGNORE_INDEX} (ignored) — pass an element of example['labels'], or a "
                        "tensor of them.")
    dtype = getattr(label, "dtype", None)
    floating = getattr(dtype, "is_floating_point", False) or getattr(dtype, "kind", None) in ("f", "c")
    if floating or (dtype is None and not isinstance(label, numbers.Integral)):
        raise TypeError(f"label={label!r:.60} is not an integer — a label is a token id or {IGNORE_INDEX} "
                        "(ignored), and a fraction is neither — pass an element of example['labels'], or an "
                        "integer tensor of them.")
    return label != IGNORE_INDEX


def graded(labels):
    """Which labels are *targets* of the next-token loss: the one definition the course uses.

    Labels are aligned with ``input_ids`` (the transformers convention); the loss shifts them by one —
    the logit at position t predicts the label at t+1 — so column 0 is never a target, and a label of
    -100 (``IGNORE_INDEX``) is skipped. Returns a boolean mask one shorter than ``labels`` along the
    last axis: a ``torch.Tensor`` for a tensor (``[seq]`` or ``[batch, seq]``), a list for a list.
    Count with ``n_graded``.
    """
    if hasattr(labels, "ndim") and hasattr(labels, "dtype"):  # a torch tensor (numpy arrays work too)
        if labels.ndim not in (1, 2):
            raise ValueError(f"labels has {labels.ndim} dimensions but must have 1 ([seq]) or 2 "
                             "([batch, seq]) — a label belongs to one position of one row — "
                             "pass example['labels'] or batch['labels'].")
        if labels.shape[-1] == 0 or (labels.ndim == 2 and labels.shape[0] == 0):
            raise ValueError(f"labels has shape {tuple(labels.shape)}: no position — an example has at least "
                             "one token — pass the labels of a real example or batch.")
        return is_graded(labels[..., 1:])
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence) or (
            labels and not all(isinstance(label, int) for label in labels)):
        raise TypeError(f"labels must be a list of ints or a tensor, got {type(labels).__name__}"
                        f"{' of ' + type(labels[0]).__name__ if labels else ''} — one label per position — "
                        "pass example['labels'], or a batch's labels as a tensor (batch['labels']).")
    if not labels:
        raise ValueError("labels is empty — an example has at least one token, and one label per token — "
                         "pass example['labels'] of a tokenized example.")
    return [is_graded(label) for label in labels[1:]]


def graded_positions(labels) -> list[int]:
    """The positions whose label carries loss, unshifted (``is_graded`` at each position): what a report
    quotes of one of TRL's prepared label lists — the first is the prompt's length in tokens. One pass,
    no call per token, for the doctor's ``--all`` over thousands of rows."""
    if hasattr(labels, "tolist"):
        labels = labels.tolist()
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence) or (
            labels and not isinstance(labels[0], int)):
        raise TypeError(f"labels must be a list of ints or a 1-D tensor, got {type(labels).__name__} — one "
                        "label per position — pass example['labels'].")
    if not labels:
        raise ValueError("labels is empty — a row has at least one token, and one label per token — pass "
                         "example['labels'] of a tokenized row.")
    return [i for i, label in enumerate(labels) if label != IGNORE_INDEX]  # is_graded, inlined


def n_graded(labels) -> int:
    """How many tokens carry loss in ``labels`` (one row or a batch): see ``graded`` for the rule."""
    mask = graded(labels)
    return int(mask.sum()) if hasattr(mask, "sum") else sum(mask)


_TOY = "the course only ships these toy tasks and forms, so it can build them offline and deterministically"


def filler_text(rng: random.Random, n_words: int) -> str:
    """A paragraph of ``n_words`` random course words: the distractor context of long prompts."""
    if not isinstance(rng, random.Random):
        raise TypeError(f"rng must be a random.Random, got {type(rng).__name__} — the filler must repeat for "
                        "a seed — pass random.Random(seed).")
    validate.integer("n_words", n_words, minimum=0, why="it counts words")
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _task_pair(task: str, rng: random.Random) -> tuple[str, str]:
    if task == "mixed":
        task = rng.choice(("add", "reverse"))
    if task == "add":
        a, b = rng.randrange(50), rng.randrange(50)
        return f"What is {a} + {b}?", str(a + b)
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
    return "Reverse the words: " + " ".join(words), " ".join(reversed(words))


def _context_length(rng: random.Random, context_words: int, long_tail: bool) -> int:
    if not long_tail:
        return context_words
    # Pareto with shape 1.5: most prompts near context_words, a few 10x longer (a real long tail).
    return int(context_words * rng.paretovariate(1.5))


def make_messages(
    task: str = "mixed",
    n: int = 200,
    seed: int = 0,
    context_words: int = 0,
    long_tail: bool = False,
) -> list[list[dict]]:
    """``n`` single-turn conversations as lists of ``{"role", "content"}`` dicts.

    Deterministic in ``seed``; no system message, so the Qwen2.5 template adds its default one.
    """
    validate.choice("task", task, TASKS, why=_TOY)
    validate.positive_int("n", n, why="it counts conversations", example=200)
    validate.integer("context_words", context_words, minimum=0, why="it counts filler words", example=20)
    validate.seed("seed", seed)
    validate.flag("long_tail", long_tail, why="it switches the heavy-tailed prompt lengths on or off")
    if long_tail and context_words == 0:
        raise ValueError(
            "long_tail=True with context_words=0 gives every prompt a zero-length context — the "
            "tail is a multiple of context_words — pass e.g. context_words=20."
        )
    rng = random.Random(seed)
    conversations = []
    for _ in range(n):
        question, answer = _task_pair(task, rng)
        n_context = _context_length(rng, context_words, long_tail)
        if n_context:
            question = f"Context: {filler_text(rng, n_context)}.\n{question}"
        conversations.append(
            [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        )
    return conversations


def make_chat_dataset(task: str = "mixed", n: int = 200, seed: int = 0, *, form: str = "messages",
                      context_words: int = 0, long_tail: bool = False):
    """A ``datasets.Dataset`` of toy chats, in one of TRL's two conversational forms.

    ``form="messages"`` gives a ``messages`` column (TRL trains on the full sequence, or on the
    assistant turns with ``assistant_only_loss``); ``form="prompt_completion"`` gives ``prompt``
    and ``completion`` columns (TRL then trains on the completion only, by default).
    """
    from datasets import Dataset

    validate.choice("form", form, ("messages", "prompt_completion"), why=_TOY)
    conversations = make_messages(task, n, seed, context_words, long_tail)
    if form == "messages":
        return Dataset.from_dict({"messages": conversations})
    return Dataset.from_dict(
        {"prompt": [c[:-1] for c in conversations], "completion": [c[-1:] for c in conversations]}
    )


def pretraining_corpus(n_docs: int = 4000, seed: int = 0) -> list[str]:
    """Plain-text documents for the course model's pretraining: the tasks in prose, no chat markup.

    The model thereby knows numbers, words and both tasks, but has never seen ``<|im_start|>`` or
    ``<|im_end|>``: like a base model, it has to learn the chat format (and when to stop) in SFT.
    """
    validate.positive_int("n_docs", n_docs, why="it counts documents", example=4000)
    validate.seed("seed", seed)
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        kind = rng.random()
        if kind < 0.35:
            a, b = rng.randrange(50), rng.randrange(50)
            docs.append(f"{a} plus {b} is {a + b}.")
        elif kind < 0.7:
            words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
            docs.append(f"the words {' '.join(words)} reversed are {' '.join(reversed(words))}.")
        else:
            docs.append(f"the {filler_text(rng, rng.randint(3, 12))}.")
    return docs


# ---------------------------------------------------------------------------------------------
# Tokenization with labels: which tokens carry loss
# ---------------------------------------------------------------------------------------------

def assistant_char_spans(tokenizer, messages: list[dict], train_on_eos: bool = True):
    """Character spans of the rendered conversation that the assistant "says".

    Exactly like TRL's ``{% generation %}`` training template for Qwen2.5, each span starts at the
    newline after ``<|im_start|>assistant`` and ends after ``<|im_end|>\\n``; with
    ``train_on_eos=False`` it ends before ``<|im_end|>`` (lesson 02's untrained stop token).
    Found by rendering prefixes, so it works with any template that renders a conversation as a
    prefix of its continuation.
    """
    validate.tokenizer("tokenizer", tokenizer)
    validate.chat("messages", messages)
    validate.flag("train_on_eos", train_on_eos, why="it decides whether the end-of-turn token carries loss")
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    closing = None if train_on_eos else end_of_turn_token(tokenizer)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        start = len(prompt.rstrip())  # TRL's generation block opens before the role's newline
        end = len(tokenizer.apply_chat_template(messages[: i + 1], tokenize=False))
        if not text.startswith(tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)):
            raise ValueError(
                "the chat template does not render a conversation as a prefix of its continuation — "
                "assistant spans cannot be located by prefix — use a template like Qwen2.5's."
            )
        if not train_on_eos:
            end = text.rindex(closing, start, end)
        spans.append((start, end))
    return text, spans


_PROBE_USER, _PROBE_ANSWER = "probe question", "probe answer"


def end_of_turn_token(tokenizer) -> str:
    """The first special token the chat template writes after an assistant message (lesson 02; the
    doctor checks it is graded).

    A user turn follows the assistant's, because some templates only close a turn when another
    one starts. Plain text before any special token means the template ends turns with text.
    """
    validate.tokenizer("tokenizer", tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat_template — the end-of-turn token is defined by the "
                         "template — set tokenizer.chat_template (or load an instruct tokenizer).")
    messages = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ANSWER},
                {"role": "user", "content": _PROBE_USER}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    after = text[text.index(_PROBE_ANSWER) + len(_PROBE_ANSWER):]
    token = first_special_after(tokenizer, after)
    if token is not None:
        return tokenizer.convert_ids_to_tokens(token)
    raise ValueError(f"no special token follows the assistant message in {after[:40]!r} — this template "
                     "ends turns with plain text, so there is no single stop id — pass stop strings to "
                     "generate() instead (stop_strings=..., tokenizer=...).")


def first_special_after(tokenizer, text: str) -> int | None:
    """The id of the first added (special) token of ``text`` when only whitespace comes before it, else
    ``None``: what a template writes right after an answer, if it closes the turn with a token."""
    validate.tokenizer("tokenizer", tokenizer)
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__} — it is the rendered text after "
                        "an answer — pass the part of apply_chat_template(..., tokenize=False) after it.")
    added = set(tokenizer.get_added_vocab().values())
    for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
        if token in added:
            return token
        if tokenizer.decode([token]).strip():
            break
    return None


def end_of_turn_id(tokenizer) -> int:
    """The id of ``end_of_turn_token``: what closes every turn of the template (Qwen2.5: ``<|im_end|>``)."""
    validate.tokenizer("tokenizer", tokenizer)
    return tokenizer.convert_tokens_to_ids(end_of_turn_token(tokenizer))


def tokenize_chat(tokenizer, messages: list[dict], max_length: int | None = None,
                  train_on_eos: bool = True) -> dict:
    """Token ids and labels for one conversation: ``labels`` is ``-100`` outside assistant turns.

    Returns ``input_ids``, ``labels``, ``attention_mask`` (all ones) and ``assistant_mask``
    (1 where a token carries loss). ``max_length`` truncates from the right, as TRL does, so a
    prompt longer than ``max_length`` loses its whole answer: every label becomes ``-100``.
    """
    validate.tokenizer("tokenizer", tokenizer)
    validate.chat("messages", messages)
    if max_length is not None:
        validate.positive_int("max_length", max_length, why="it is the truncation length in tokens",
                              fix="pass an integer >= 1, e.g. max_length=512, or None: no truncation")
    validate.flag("train_on_eos", train_on_eos, why="it decides whether the end-of-turn token carries loss")
    text, spans = assistant_char_spans(tokenizer, messages, train_on_eos)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = encoding["input_ids"]
    # A token carries loss when it lies inside an assistant span (offsets are character ranges).
    mask = [int(any(s <= a and b <= e for s, e in spans)) for a, b in encoding["offset_mapping"]]
    if max_length is not None:
        input_ids, mask = input_ids[:max_length], mask[:max_length]
    labels = [t if m else IGNORE_INDEX for t, m in zip(input_ids, mask)]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids),
            "assistant_mask": mask}


def collate_right(examples: list[dict], pad_token_id: int):
    """Right-pad tokenized examples into tensors; padded positions get label ``-100``.

    The ``-100`` comes from here, from knowing where each example ends, not from the attention mask.
    """
    if not isinstance(examples, (list, tuple)) or not examples:
        raise ValueError("collate_right got no examples — a batch needs at least one — pass a "
                         "non-empty list of tokenize_chat() outputs.")
    # only ids at hand: an id no vocabulary holds is refused; one beyond this model's vocabulary but
    # within another's cannot be told apart (the model's forward pass refuses it)
    validate.vocab_id("pad_token_id", pad_token_id, why="it is the token id written at the padded positions")
    for i, e in enumerate(examples):
        if not isinstance(e, dict) or "input_ids" not in e or "labels" not in e:
            raise TypeError(f"examples[{i}] is a {type(e).__name__}, not a tokenized example — the collate "
                            "pads its 'input_ids' and 'labels' — pass tokenize_chat() outputs.")
        if len(e["input_ids"]) != len(e["labels"]) or not len(e["input_ids"]):
            raise ValueError(f"examples[{i}] has {len(e['input_ids'])} input_ids and {len(e['labels'])} "
                             "labels — every token needs one label, and an example at least one token — "
                             "tokenize it with tokenize_chat().")
    width = max(len(e["input_ids"]) for e in examples)
    batch = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        pad = width - len(e["input_ids"])
        batch["input_ids"].append(list(e["input_ids"]) + [pad_token_id] * pad)
        batch["attention_mask"].append([1] * len(e["input_ids"]) + [0] * pad)
        batch["labels"].append(list(e["labels"]) + [IGNORE_INDEX] * pad)
    return {k: torch.tensor(v) for k, v in batch.items()}


def make_batches(tokenizer, conversations: list[list[dict]], batch_size: int,
                 max_length: int | None = None, train_on_eos: bool = True) -> list[dict]:
    """Tokenize conversations and cut them, in order, into right-padded micro-batches."""
    validate.positive_int("batch_size", batch_size, why="it counts conversations per micro-batch", example=8)
    validate.flag("train_on_eos", train_on_eos, why="it decides whether the end-of-turn token carries loss")
    validate.non_empty("conversations", conversations, what="conversations (lists of messages)",
                       fix="pass e.g. make_messages('add', 8).")
    examples = [tokenize_chat(tokenizer, m, max_length, train_on_eos) for m in conversations]
    return [collate_right(examples[i: i + batch_size], tokenizer.pad_token_id)
            for i in range(0, len(examples), batch_size)]


def all_masked(batch: dict) -> dict:
    """A copy of a collated ``batch`` whose labels are all -100: no token carries loss — what truncation
    or a clogged packer produces in real data (lesson 05), and where a masked mean turns NaN (lesson 06)."""
    validate.batch("batch", batch)
    return {**batch, "labels": torch.full_like(batch["labels"], IGNORE_INDEX)}
