"""Lesson 02 (the model that never stops): stop tokens, stop rates and the graded span.

A chat model stops when ``generate()`` sees one of its ``eos_token_id``s. Two things must agree for
that to happen: the *config* (``generate()`` must be told the template's end-of-turn token, e.g.
``<|im_end|>``, not only the tokenizer's ``<|endoftext|>``) and the *training* (the end-of-turn token
must sit inside the graded span, or the model never learns to emit it). This module measures both:

- ``end_of_turn_token`` / ``stop_token_ids``: read the end-of-turn token off the chat template.
- ``stop_rate`` / ``answer_accuracy`` on ``generate_greedy``'s records (batched greedy generation, in the
  core: ``course_utils.generation``; re-exported here): the fraction
  that stopped (ended on a stop id *without opening a new turn*), and how many answered correctly.
- ``stop_probability`` / ``StopCriterion`` / ``train_until_stops`` / ``stop_criterion_callback``:
  train *until* the model ends its training answers with the stop token and its own replies to
  unseen prompts stop (a measured criterion with a step cap), not for a step count that happens to
  work on one model and one CPU.
- ``graded_span_text`` / ``graded_span_has_stop``: the text of the tokens of a training row that
  carry loss, and the pre-flight check "does each row grade its stop token?".
- ``untrained_stop_template``: TRL's Qwen2.5 training template with ``<|im_end|>`` moved out of
  ``{% generation %}`` (the template bug TRL warns about).
- ``plain_text_example`` / ``plain_text_batches``: the plain-text format that appends
  ``tokenizer.eos_token`` (where the pad == eos trap bites).
- ``stop_explorer``: the lesson's "what if" control (another eos list, on each trained model).

What decides whether a checkpoint already stops at the end of a turn (its eos *is* the end-of-turn token, as
Qwen2.5-Instruct ships), and the base checkpoint lessons 02, 08, 09 and 10 reproduce their failure on whatever
``COURSE_MODEL`` holds, live in the core: ``course_utils.model.is_instruct_checkpoint`` and
``load_base_checkpoint``.

The exercises' checkers and the broken runs of the diagnosis exercise are in
``course_utils.exercises.lesson02``; the reference answers in ``course_utils.exercises.answers.lesson02``.
"""

from __future__ import annotations

import time

import torch

from . import validate

# end_of_turn_token (the first special token a template writes after an assistant message) lives in the
# core, course_utils.data: lesson 02 teaches it here, and the doctor checks it too. One copy of the idea.
from .data import end_of_turn_token, graded, is_graded
from .generation import (
    _as_list,
    _check_eos_ids,
    _generate,
    _vocab,
    generate_greedy,  # noqa: F401 — lesson 02 teaches it here; it lives in the core
)
from .model import REPLY_ENDS
from .training import train
from .viz import what_if

# ------------------------------------------------------------------------------------------------
# Argument checks this module needs beyond course_utils.validate
# ------------------------------------------------------------------------------------------------

def _check_chat_tokenizer(tokenizer) -> None:
    validate.tokenizer("tokenizer", tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat_template — a chat prompt is rendered with it — load the "
                         "course tokenizer (load_course_model()) or set tokenizer.chat_template.")


def _check_conversation(name: str, conversation, *, need: tuple[str, ...] = ()) -> list[dict]:
    """A conversation: a non-empty list of ``{'role', 'content'}`` dicts, holding a message of each role
    in ``need``."""
    if isinstance(conversation, dict):
        raise TypeError(f"{name} is one message (a dict), not a conversation — a conversation is a list of "
                        "messages — pass the list, e.g. make_messages(...)[0] (and a list of those where "
                        "several conversations are expected).")
    if (not isinstance(conversation, (list, tuple)) or not conversation
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in conversation)):
        got = "an empty list" if conversation in ([], ()) else type(conversation).__name__
        raise ValueError(f"{name} must be a non-empty list of {{'role', 'content'}} messages, got {got} — "
                         "the chat template renders such a list — pass e.g. make_messages('mixed', 4)[0].")
    for role in need:
        if not any(m["role"] == role and isinstance(m.get("content"), str) for m in conversation):
            raise ValueError(f"{name} has no {role!r} message with text content — the helper reads that "
                             f"message — pass a conversation with a {role} turn (make_messages() has both).")
    return list(conversation)


def _check_conversations(conversations, *, need: tuple[str, ...] = ()) -> list[list[dict]]:
    if (isinstance(conversations, (list, tuple)) and conversations
            and isinstance(conversations[0], dict) and "role" in conversations[0]):
        raise TypeError("conversations is one conversation (a list of messages), not a list of conversations "
                        "— each item is rendered as a whole chat — wrap it: [conversation].")
    validate.non_empty("conversations", conversations, what="conversations",
                       fix="pass e.g. make_messages('mixed', 8).")
    return [_check_conversation(f"conversations[{i}]", c, need=need) for i, c in enumerate(conversations)]


def _check_records(records, *, name: str = "records") -> list[dict]:
    validate.non_empty(name, records, what="generation records", fix="pass generate_greedy()'s output.")
    for i, r in enumerate(records):
        if not isinstance(r, dict) or not {"text", "stopped"} <= set(r):
            raise TypeError(f"{name}[{i}] is a {type(r).__name__}, not a generation record (a dict with "
                            "'text' and 'stopped') — the helper reads those fields — pass "
                            "generate_greedy()'s output, one record per prompt.")
    return list(records)


def _check_record(record) -> dict:
    if isinstance(record, list):
        raise TypeError("record is a list (all of generate_greedy()'s records?) — reply() reads one record — "
                        "pass one of them, e.g. records[0], or [reply(r) for r in records].")
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise TypeError("record must be a generation record (a dict with 'text'), got "
                        f"{type(record).__name__} — reply() cuts its text at the first stop string — pass "
                        "one item of generate_greedy()'s output.")
    return record


def _check_stop_strings(stop_strings) -> list[str]:
    stop_strings = validate.strings("stop_strings", stop_strings, allow_empty=True)
    if not stop_strings:
        raise ValueError("stop_strings is empty — reply() cuts the text at the first stop string, and with "
                         "none it would show the stop token and whatever the model wrote after it — pass "
                         "e.g. ('<|im_end|>',), or leave it out for the course's two.")
    if "" in stop_strings:
        raise ValueError("stop_strings holds an empty string — every text 'contains' it, so the cut would be "
                         "meaningless — pass non-empty stop strings, e.g. ('<|im_end|>',).")
    return stop_strings


def _row(name: str, seq) -> list[int]:
    """One row of token ids or labels (a list, or a 1-D tensor) as a list of ints."""
    if isinstance(seq, torch.Tensor):
        if seq.ndim != 1:
            raise ValueError(f"{name} has shape {tuple(seq.shape)} but must be one row ([seq]) — the helper "
                             f"reads a single example — pass one row, e.g. batch['{name}'][0].")
        if seq.is_floating_point():
            raise TypeError(f"{name} has dtype {seq.dtype} — token ids and labels are integers — use "
                            "dtype=torch.long.")
        return seq.tolist()
    if (isinstance(seq, (list, tuple)) and seq
            and all(isinstance(v, int) and not isinstance(v, bool) for v in seq)):
        return list(seq)
    got = "an empty sequence" if isinstance(seq, (list, tuple)) and not seq else type(seq).__name__
    raise TypeError(f"{name} must be a non-empty row of integer token ids or labels, got {got} — one value "
                    f"per token — pass e.g. batch['{name}'][0].")


# ------------------------------------------------------------------------------------------------
# Stop ids and generation
# ------------------------------------------------------------------------------------------------

def stop_token_ids(tokenizer) -> list[int]:
    """The ``eos_token_id`` list for ``generate()``: the tokenizer's eos, then the end-of-turn token.

    Keeping the eos covers plain-text use; adding the end-of-turn token makes a chat turn stop.
    Lesson 00 uses it; lesson 02's exercise 1 asks for it, so lesson 02's notebook never imports it.
    """
    validate.tokenizer("tokenizer", tokenizer)
    eot = tokenizer.convert_tokens_to_ids(end_of_turn_token(tokenizer))
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    return ids + [eot] if eot not in ids else ids


def chat_prompts(tokenizer, conversations: list[list[dict]]) -> list[str]:
    """Each conversation's user turn rendered with the generation prompt (``<|im_start|>assistant``)."""
    _check_chat_tokenizer(tokenizer)
    conversations = _check_conversations(conversations, need=("user",))
    return [tokenizer.apply_chat_template([m for m in c if m["role"] != "assistant"], tokenize=False,
                                          add_generation_prompt=True) for c in conversations]


def stop_rate(records: list[dict]) -> float:
    """Fraction of generations that *stopped*: ended on a stop id without inventing a new turn.

    A reply that writes ``<|im_start|>assistant …`` and only then ``<|im_end|>`` ended, but it did
    not stop where the answer did: it is not counted.
    """
    records = _check_records(records)
    return _stop_rate(records)


def _stop_rate(records: list[dict]) -> float:
    return sum(bool(r["stopped"]) for r in records) / len(records)


def reply(record: dict, stop_strings: tuple[str, ...] = REPLY_ENDS) -> str:
    """The reply's text up to the first stop string, stripped: what a chat UI would show.

    ``stop_strings`` is a list or tuple; a single string is refused, since it would be read character
    by character (``"<|im_end|>"`` would cut at the first ``<``, ``|``, ``i``, …): pass ``("<|im_end|>",)``.
    """
    record = _check_record(record)
    return _reply(record["text"], _check_stop_strings(stop_strings))


def _reply(text: str, stop_strings) -> str:
    for s in stop_strings:
        text = text.split(s, 1)[0]
    return text.strip()


def answer_accuracy(records: list[dict], conversations: list[list[dict]]) -> float:
    """Fraction of *stopped* generations whose reply equals the reference answer exactly.

    Reported beside the stop rate: a model that stops but answers wrongly has learned to stop, not
    the task — the lesson is about the first, and says so with this number.
    """
    records = _check_records(records)
    if not isinstance(conversations, (list, tuple)) or len(records) != len(conversations):
        n = len(conversations) if isinstance(conversations, (list, tuple)) else type(conversations).__name__
        raise ValueError(f"{len(records)} records but {n} conversations — each record is "
                         "compared with its own reference — pass the conversations the prompts came from.")
    conversations = _check_conversations(conversations, need=("assistant",))
    answers = [next(m["content"] for m in c if m["role"] == "assistant") for c in conversations]
    return sum(bool(r["stopped"]) and _reply(r["text"], REPLY_ENDS) == a.strip()
               for r, a in zip(records, answers)) / len(records)


# ------------------------------------------------------------------------------------------------
# Training until the model stops: a measured criterion
# ------------------------------------------------------------------------------------------------

def _last_stop(batch: dict, stop_id: int, name: str):
    """Per row, the column of the row's last real ``stop_id`` (refused where a row has none, or has it
    only at column 0, where no earlier position predicts it)."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask", torch.ones_like(ids))
    hits = (ids == stop_id) & (mask == 1)
    if not bool(hits.any(1).all()):
        raise ValueError(f"some rows of {name} contain no token {stop_id} — the probability is read "
                         "where the row's text ends with the stop token — pass rows that end with it "
                         "(a chat rendered with its template, or plain text with the eos appended).")
    cols = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    last = torch.where(hits, cols, -1).max(1).values              # the final stop token of each row
    if bool((last == 0).any()):
        raise ValueError(f"a row of {name} has its stop token {stop_id} only at position 0 — the probability "
                         "is read at the position before it, and there is none — pass rows with text before "
                         "the stop token.")
    return last


def _stop_probability(model, batch: dict, last, stop_id: int):
    ids = batch["input_ids"]
    mask = batch.get("attention_mask", torch.ones_like(ids))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    probs = logits[torch.arange(len(ids)), last - 1].float().softmax(-1)  # predicted one step before
    return probs[:, stop_id]


def stop_probability(model, batch: dict, stop_id: int):
    """Per row, the probability the model gives ``stop_id`` where the row's text ends with it.

    The position is the row's *last* real ``stop_id`` (``attention_mask == 1``): the ``<|im_end|>``
    that closes the assistant's answer, or the ``<|endoftext|>`` appended to a plain-text example.
    Teacher-forced, so it measures whether the model has learned to stop *after this answer*,
    independent of what it would generate. Above 0.5 it is the greedy choice there, whatever else.
    """
    validate.model("model", model)
    validate.batch("batch", batch, need=("input_ids",))
    validate.vocab_id("stop_id", stop_id, vocab_size=_vocab(model), owner="the model")
    validate.ids_fit_model(model, batch["input_ids"], name="batch['input_ids']")
    return _stop_probability(model, batch, _last_stop(batch, stop_id, "the batch"), stop_id)


class StopCriterion:
    """When a run has learned to stop: measured on the run, never a step count fitted to one model.

    Two measurements, each must reach ``level`` (a fraction, 0 < level <= 1):

    - ``p_stop``: the mean teacher-forced ``stop_probability`` on ``probe`` (rows of the training
      data): the model emits the stop token after an answer it was *given*;
    - ``stop_rate`` (when ``tokenizer`` and ``prompts`` are given): the fraction of greedy
      generations from ``prompts`` (prompts it did not train on) that stop — ``stop_id`` and the
      tokenizer's eos in the eos list, no new turn opened first: it stops after answers it *writes*,
      which is what a user meets. The first does not imply the second: measured on a Phi-style
      model, P = 0.81 after the training answers while only 2 of 16 of its replies to unseen
      prompts stopped (most opened a new ``<|im_start|>`` turn before any ``<|im_end|>``).

    ``measure(model)`` returns both (``stop_rate`` None without prompts) and leaves the model's
    train/eval mode as it found it; ``met(measured)`` says whether both reached ``level``.
    ``measure(model, lazy=True)`` skips the generations while ``p_stop`` is below ``level`` (the
    criterion cannot be met then; ``stop_rate`` is None): the training loops check lazily between
    steps and in full at their last step, since generating is most of a check's cost.
    """

    def __init__(self, probe: dict, stop_id: int, *, level: float = 0.8, tokenizer=None,
                 prompts: list[str] | None = None, max_new_tokens: int = 40,
                 turn_markers: tuple[str, ...] = ("<|im_start|>",)):
        validate.batch("probe", probe, need=("input_ids",))
        validate.vocab_id("stop_id", stop_id)
        level = validate.fraction("level", level, why="both measurements (a mean probability, a stop rate) "
                                  "are fractions of 1")
        if level == 0:
            raise ValueError("level=0 is met by any run, trained or not — the criterion would end training "
                             "at its first check — pass a fraction such as level=0.8.")
        if (tokenizer is None) != (prompts is None):
            raise ValueError("pass tokenizer and prompts together (or neither) — the generation check "
                             "tokenizes the prompts — e.g. tokenizer=tok, prompts=chat_prompts(tok, convs).")
        if tokenizer is not None:
            validate.tokenizer("tokenizer", tokenizer)
            prompts = validate.strings("prompts", prompts)
            validate.vocab_id("stop_id", stop_id, vocab_size=len(tokenizer), owner="the tokenizer")
            if tokenizer.pad_token_id is None and len(prompts) > 1:
                raise ValueError("the tokenizer has no pad token — the prompts are left-padded into one "
                                 "batch — set tokenizer.pad_token (e.g. tokenizer.pad_token = "
                                 "tokenizer.eos_token).")
        validate.positive_int("max_new_tokens", max_new_tokens, why="it bounds every generation of a check")
        turn_markers = validate.strings("turn_markers", turn_markers, allow_empty=True)
        self.last = _last_stop(probe, stop_id, "the probe")
        self.probe, self.stop_id, self.level = probe, int(stop_id), level
        self.tokenizer, self.prompts = tokenizer, prompts
        self.max_new_tokens, self.turn_markers = max_new_tokens, tuple(turn_markers)

    def _check_model(self, model) -> None:
        """The model must be able to read the probe and the prompts and write the stop id."""
        validate.model("model", model)
        validate.vocab_id("the criterion's stop_id", self.stop_id, vocab_size=_vocab(model),
                          owner="the model")
        validate.ids_fit_model(model, self.probe["input_ids"], name="the criterion's probe")
        if self.tokenizer is not None:
            validate.model_and_tokenizer(model, self.tokenizer)

    def measure(self, model, *, lazy: bool = False) -> dict:
        self._check_model(model)
        return self._measure(model, lazy=lazy)

    def _measure(self, model, *, lazy: bool = False) -> dict:
        was_training = model.training
        model.eval()
        try:
            p_stop = float(_stop_probability(model, self.probe, self.last, self.stop_id).mean())
            rate = None
            if self.prompts is not None and not (lazy and p_stop < self.level):
                eos = _as_list(self.tokenizer.eos_token_id) + [self.stop_id]
                rate = _stop_rate(_generate(model, self.tokenizer, self.prompts, self.max_new_tokens,
                                            self.turn_markers, {"eos_token_id": eos}))
        finally:
            model.train(was_training)
        return {"p_stop": p_stop, "stop_rate": rate}

    def met(self, measured: dict) -> bool:
        if not isinstance(measured, dict) or not {"p_stop", "stop_rate"} <= set(measured):
            raise TypeError("measured must be the dict measure(model) returns, got "
                            f"{type(measured).__name__} — met() compares its 'p_stop' and 'stop_rate' with "
                            "the level — pass criterion.measure(model).")
        return measured["p_stop"] >= self.level and (measured["stop_rate"] is None
                                                      or measured["stop_rate"] >= self.level)


def _require_criterion(criterion, who: str) -> None:
    if not isinstance(criterion, StopCriterion):
        raise ValueError(f"criterion is a {type(criterion).__name__} — {who} measures it on the run — pass "
                         "StopCriterion(probe, stop_id, level=..., tokenizer=..., prompts=...).")


def train_until_stops(model, batches: list[dict], criterion: StopCriterion, *, lr: float,
                      chunk: int = 10, max_steps: int = 600) -> dict:
    """Train until ``criterion`` (a ``StopCriterion``) is met, or ``max_steps``.

    The criterion is measured every ``chunk`` steps, not a step count fitted to one model and one
    CPU. One ``train`` run (one AdamW) that ends when the criterion is met. Returns ``records``,
    ``steps``, ``seconds``, ``reached``, ``p_stop`` and ``stop_rate`` (the last measurement) and
    ``history`` (``(step, p_stop, stop_rate)`` at each check).
    """
    validate.model("model", model)
    validate.batches("batches", batches)
    for i, b in enumerate(batches):
        validate.ids_fit_model(model, b["input_ids"], name=f"batches[{i}]['input_ids']")
    _require_criterion(criterion, "train_until_stops")
    criterion._check_model(model)
    validate.number("lr", lr, positive=True, why="a learning rate of 0 or less trains nothing or backwards",
                    example=1e-3)
    validate.positive_int("chunk", chunk, why="it is the steps between two checks of the criterion")
    validate.positive_int("max_steps", max_steps, why="it caps the run when the criterion is never met")
    history, last, start = [], {}, time.perf_counter()

    def check(step, trained):
        if step % chunk and step < max_steps:
            return False
        last.update(criterion._measure(trained, lazy=step < max_steps))  # the last check in full
        history.append((step, last["p_stop"], last["stop_rate"]))
        return criterion.met(last)

    records = train(model, batches, steps=max_steps, lr=lr, on_step=check, progress=False)
    return {"records": records, "steps": len(records), "seconds": time.perf_counter() - start,
            "reached": criterion.met(last), **last, "history": history}


def stop_criterion_callback(criterion: StopCriterion, *, every: int = 10):
    """A ``TrainerCallback`` that ends ``SFTTrainer`` training once ``criterion`` is met.

    The same ``StopCriterion`` as ``train_until_stops``, checked every ``every`` steps, so the run's
    length is measured on the run, not fitted to one model; ``max_steps`` stays the cap. The
    callback's ``history`` lists ``(step, p_stop, stop_rate)``.
    """
    _require_criterion(criterion, "the callback")
    validate.positive_int("every", every, why="it is the steps between two checks of the criterion")
    # Imported here, not at the top: transformers.trainer takes seconds to import and pulls in
    # bitsandbytes (with its CPU-kernel notice); only this callback needs it (measured: ~7 s here
    # after torch and transformers, against 0.2 s for this whole module).
    from transformers import TrainerCallback

    class StopWhenMet(TrainerCallback):
        history: list[tuple[int, float, float | None]] = []

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            criterion._check_model(model)  # once: the trainer's model must read the probe
            return control

        def on_step_end(self, args, state, control, model=None, **kwargs):
            final = state.global_step >= state.max_steps
            if state.global_step % every == 0 or final:
                measured = criterion._measure(model, lazy=not final)  # the last check in full
                self.history.append((state.global_step, measured["p_stop"], measured["stop_rate"]))
                control.should_training_stop = criterion.met(measured)
            return control

    callback = StopWhenMet()
    callback.history = []
    return callback



def sft_until_stops(model, tokenizer, train_dataset, criterion: StopCriterion, *, max_steps: int = 600,
                    batch_size: int = 16, **config):
    """Run TRL's ``SFTTrainer`` on ``train_dataset`` until ``criterion`` is met (``max_steps`` the cap).

    The ``SFTTrainer`` twin of ``train_until_stops`` (lesson 02's run A): returns ``(trainer, (steps,
    p_stop, stop_rate))``, the last check of ``stop_criterion_callback``; the model is left in eval mode.
    ``config`` goes to ``SFTConfig`` (e.g. ``eos_token=...``).
    """
    from .training import make_sft_trainer  # the Trainer's import is slow: only this helper needs it here

    until = stop_criterion_callback(criterion)
    trainer = make_sft_trainer(model, tokenizer, train_dataset, max_steps=max_steps,
                               per_device_train_batch_size=batch_size, **config)
    trainer.add_callback(until)
    trainer.train()
    model.eval()
    return trainer, until.history[-1]

# ------------------------------------------------------------------------------------------------
# The graded span, the template bug and the plain-text format
# ------------------------------------------------------------------------------------------------

def graded_span_text(tokenizer, input_ids, labels) -> str:
    """The text of one row's graded span: its tokens that carry loss (``data.graded``), decoded in order.

    ``input_ids`` and ``labels`` are one row (a list or a 1-D tensor), e.g. ``batch['input_ids'][0]``.
    """
    validate.tokenizer("tokenizer", tokenizer)
    ids, labels = _row("input_ids", input_ids), _row("labels", labels)
    if len(ids) != len(labels):
        raise ValueError(f"{len(ids)} input_ids but {len(labels)} labels — one label per token — pass the "
                         "same row of both, e.g. batch['input_ids'][0] and batch['labels'][0].")
    outside = [i for i in ids if not 0 <= i < len(tokenizer)]
    if outside:
        raise ValueError(f"input_ids holds token id {outside[0]} but the tokenizer has {len(tokenizer)} "
                         "tokens — the row was made by another tokenizer — pass the tokenizer that made it.")
    return tokenizer.decode([t for t, g in zip(ids[1:], graded(labels)) if g])  # graded drops column 0


_ASSISTANT_OUT = "{{- '\\n' + message.content + '<|im_end|>\\n' }}"


def untrained_stop_template(training_template: str) -> str:
    """TRL's Qwen2.5 training template with ``<|im_end|>\\n`` moved after ``{% endgeneration %}``.

    It renders the same text, but the end-of-turn token is no longer part of the assistant mask: the
    mistake TRL's ``is_chat_template_stop_token_trained`` warns about. A string edit of the shipped
    template, so the lesson breaks TRL's real template rather than a hand-written one.
    """
    if not isinstance(training_template, str):
        raise TypeError("training_template must be a chat template string, got "
                        f"{type(training_template).__name__} — the edit is a string replacement — pass "
                        "trl.chat_template_utils.qwen2_5_training_chat_template.")
    if training_template.count(_ASSISTANT_OUT) != 1 or "{%- endgeneration %}" not in training_template:
        raise ValueError("this is not TRL's qwen2_5 training template (the assistant output line or "
                         "{%- endgeneration %} is missing) — the edit looks for those exact strings — pass "
                         "trl.chat_template_utils.qwen2_5_training_chat_template.")
    moved = "{%- endgeneration %}\n        {%- if not message.tool_calls %}{{- '<|im_end|>\\n' }}{%- endif %}"
    return (training_template.replace(_ASSISTANT_OUT, "{{- '\\n' + message.content }}")
            .replace("{%- endgeneration %}", moved))


def _check_eos_tokenizer(tokenizer) -> str:
    validate.tokenizer("tokenizer", tokenizer)
    if not tokenizer.eos_token:
        raise ValueError("the tokenizer has no eos_token — the plain-text format ends each example with it, "
                         "its only stop signal — set tokenizer.eos_token (the course's is '<|endoftext|>').")
    return tokenizer.eos_token


def _plain_text(conversation: list[dict], eos: str) -> str:
    question = next(m["content"] for m in conversation if m["role"] == "user")
    answer = next(m["content"] for m in conversation if m["role"] == "assistant")
    return f"### Question: {question}\n### Answer: {answer}{eos}"


def plain_text_example(tokenizer, conversation: list[dict]) -> str:
    """A conversation as plain text ending in ``tokenizer.eos_token``, as pre-chat SFT scripts wrote it.

    The only stop signal is the eos, so whether the model learns to stop depends on its label.
    """
    eos = _check_eos_tokenizer(tokenizer)
    return _plain_text(_check_conversation("conversation", conversation, need=("user", "assistant")), eos)


def plain_text_batches(tokenizer, conversations: list[list[dict]], batch_size: int, collator) -> list[dict]:
    """``plain_text_example`` rows, tokenized and cut into batches by ``collator`` (in order).

    The collator decides the labels: that is the point of lesson 02's pad == eos section, which
    passes transformers' ``DataCollatorForLanguageModeling`` (masks by pad *id*) or TRL's (masks by
    *position*).
    """
    eos = _check_eos_tokenizer(tokenizer)
    conversations = _check_conversations(conversations, need=("user", "assistant"))
    validate.positive_int("batch_size", batch_size, why="it is the rows per batch")
    validate.function("collator", collator)
    rows = [{"input_ids": tokenizer(_plain_text(c, eos), add_special_tokens=False)["input_ids"]}
            for c in conversations]
    batches = []
    for i in range(0, len(rows), batch_size):
        batch = collator(rows[i: i + batch_size])
        if not hasattr(batch, "keys") or not {"input_ids", "attention_mask", "labels"} <= set(batch.keys()):
            raise ValueError(f"the collator returned {type(batch).__name__} without input_ids, "
                             "attention_mask and labels — the batches are trained on and their labels "
                             "inspected — pass a language-modelling collator, e.g. "
                             "DataCollatorForLanguageModeling(tok, mlm=False).")
        batches.append({k: batch[k] for k in ("input_ids", "attention_mask", "labels")})
    return batches


def graded_span_has_stop(batch: dict, stop_id: int) -> list[bool]:
    """The pre-flight check: per row, does a token with id ``stop_id`` carry loss?

    Only graded labels count (``data.graded``): the prompt's ``<|im_end|>`` tokens are in ``input_ids``
    but are not trained. Without a tokenizer only an id no vocabulary holds is refused; an id of another
    vocabulary, or of a token the rows never hold, reads False for every row — take it from the
    tokenizer: ``end_of_turn_id(tok)`` for a chat, ``tok.eos_token_id`` for plain text.
    """
    validate.batch("batch", batch, need=("labels",))
    validate.vocab_id("stop_id", stop_id)
    labels = batch["labels"]
    return [bool(row.any()) for row in graded(labels) & (labels[:, 1:] == stop_id)]


# ------------------------------------------------------------------------------------------------
# What if: another eos list for generate(), on each trained model
# ------------------------------------------------------------------------------------------------

def stop_explorer(models: dict, tokenizer, prompts: list[str], eos_choices: dict, *, max_new_tokens: int = 40,
                  turn_markers: tuple[str, ...] = ("<|im_start|>",), shown: int = 3):
    """What if ``generate()`` got another eos list? A dropdown over trained models, one over eos lists.

    ``models``: ``{label: model}`` trained in the lesson; ``eos_choices``: ``{label: ids or None}``
    (``None``: the model's ``generation_config``, what a user gets by default). Each frame generates
    greedily for ``prompts`` (a forward pass per token, well under a second on the course model) and
    shows the stop rate and the first ``shown`` replies: a config fix helps only a model that learned
    to emit the token.
    """
    for name, value, example in (("models", models, "{'graded': model}"),
                                 ("eos_choices", eos_choices, "{'generation_config': None, 'end': [id]}")):
        if not isinstance(value, dict) or not value:
            raise ValueError(f"stop_explorer's {name} must be a non-empty dict, got {type(value).__name__} — "
                             f"each entry is one choice of the control — pass e.g. {example}.")
    validate.tokenizer("tokenizer", tokenizer)
    for label, model in models.items():
        validate.model(f"models[{label!r}]", model)
        validate.model_and_tokenizer(model, tokenizer)
        for eos_label, ids in eos_choices.items():
            if ids is not None:
                _check_eos_ids(f"eos_choices[{eos_label!r}]", ids, _vocab(model))
    prompts = validate.strings("prompts", prompts)
    validate.positive_int("max_new_tokens", max_new_tokens, why="it bounds every generation")
    turn_markers = tuple(validate.strings("turn_markers", turn_markers, allow_empty=True))
    validate.positive_int("shown", shown, why="it is how many replies each frame prints")

    def frame(model, eos):
        extra = {} if eos_choices[eos] is None else {"eos_token_id": eos_choices[eos]}
        records = _generate(models[model], tokenizer, prompts, max_new_tokens, turn_markers, extra)
        lines = [f"stop rate {_stop_rate(records):.2f} over {len(records)} prompts "
                 f"(max_new_tokens={max_new_tokens})"]
        lines += [f"{'stopped' if r['stopped'] else 'ran on '} | {r['text'][:70]!r}" for r in records[:shown]]
        return "\n".join(lines)

    return what_if(frame, {"model": list(models), "eos": list(eos_choices)},
                   descriptions={"model": "trained model", "eos": "eos_token_id for generate()"},
                   width="620px")



def plot_stop_rates(rates: dict[str, float], broken: list[str], *, margin: float = 0.5) -> bool:
    """Draw one bar per setup (red: ``broken``) with the claim's threshold (the best broken rate + ``margin``)
    as a dashed line (lesson 02's verify step); returns whether every other setup reaches it."""
    import matplotlib.pyplot as plt

    if not isinstance(rates, dict) or not rates:
        raise TypeError(f"rates must be a non-empty dict {{setup: stop rate}}, got {type(rates).__name__} — "
                        "one bar per setup — pass the rates the lesson measured.")
    for key in validate.strings("broken", broken):
        validate.key("broken item", key, rates, where="rates")
    validate.number("margin", margin, minimum=0, why="the threshold sits this far above the best broken rate")
    threshold = max(rates[k] for k in broken) + margin
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.barh(list(rates), list(rates.values()), color=["#d62828" if k in broken else "#2a9d8f" for k in rates])
    ax.axvline(threshold, color="k", ls="--", lw=1)
    ax.text(threshold + 0.01, -0.75, f"broken + {margin} (threshold)", ha="left", va="center", fontsize=8)
    ax.set_xlim(0, 1.05)
    ax.set_ylim(len(rates) - 0.5, -1.1)
    ax.set_xlabel("stop rate (fraction of 20 generations that stopped without opening a new turn)")
    ax.set_title("Which setups stop: config fixes vs. graded-span bugs (red: broken)")
    plt.tight_layout()
    plt.show()
    for label, rate in rates.items():
        print(f"stop rate {rate:.2f}  {label}")
    return all(rate >= threshold for label, rate in rates.items() if label not in broken)


def lesson_quiet() -> None:
    """Quiet the libraries for a lesson's outputs: no progress bars, no transformers info logs, no
    FutureWarning about SFTConfig's renamed options, no bitsandbytes CPU-kernel notice."""
    import logging
    import warnings

    import datasets
    import transformers

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


def train_mask_arms(load_model, conversations, criterion: StopCriterion, *, lr: float, cap: int = 600,
                    batch_size: int = 16):
    """Lesson 02's 5c: the same model trained twice, same data, seed and ``lr``, once with the end-of-turn
    token graded (until ``criterion`` is met, ``cap`` steps at most) and once without it, for as many steps.

    ``load_model()`` returns ``(model, tokenizer)``, fresh each call. Returns ``[(model, batches, fit)]``,
    graded arm first; ``fit`` is ``train_until_stops``'s record.
    """
    from .data import make_batches
    from .training import set_seed

    validate.function("load_model", load_model)
    validate.non_empty("conversations", conversations, what="conversations (lists of messages)")
    if not isinstance(criterion, StopCriterion):
        raise TypeError(f"criterion must be a StopCriterion, got {type(criterion).__name__} — it decides "
                        "when the graded arm stops training — pass StopCriterion(...).")
    validate.number("lr", lr, positive=True, why="a learning rate of 0 or less trains nothing or backwards",
                    example=1e-3)
    validate.positive_int("cap", cap, why="it bounds the steps of the graded arm")
    validate.positive_int("batch_size", batch_size, why="it is the rows per step")
    arms, steps = [], cap
    for train_on_eos in (True, False):
        set_seed()
        model, tokenizer = load_model()
        batches = make_batches(tokenizer, conversations, batch_size, train_on_eos=train_on_eos)
        fit = train_until_stops(model, batches, criterion, lr=lr, max_steps=steps)
        steps = fit["steps"]      # the ungraded arm gets exactly the graded arm's steps
        arms.append((model, batches, fit))
    return arms


def eos_labels_kept(batch: dict, eos_id: int) -> tuple[int, int]:
    """``(kept, total)``: of the real eos tokens in ``batch`` (attended, not padding), how many carry a label.

    Lesson 02's pad == eos measurement: a collator that masks labels by pad id keeps none of them. Without a
    tokenizer only an id no vocabulary holds is refused; an id the rows never hold gives ``(0, 0)``: pass
    ``tok.eos_token_id``."""
    validate.batch("batch", batch, need=("input_ids", "attention_mask", "labels"))
    validate.vocab_id("eos_id", eos_id, why="it is the eos token's id")
    real_eos = (batch["input_ids"] == eos_id) & (batch["attention_mask"] == 1)
    return int(is_graded(batch["labels"][real_eos]).sum()), int(real_eos.sum())
