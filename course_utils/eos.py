"""Lesson 02 (the model that never stops): stop tokens, stop rates and the graded span.

A chat model stops when ``generate()`` sees one of its ``eos_token_id``s. Two things must agree for
that to happen: the *config* (``generate()`` must be told the template's end-of-turn token, e.g.
``<|im_end|>``, not only the tokenizer's ``<|endoftext|>``) and the *training* (the end-of-turn token
must sit inside the graded span, or the model never learns to emit it). This module measures both:

- ``end_of_turn_token`` / ``stop_token_ids``: read the end-of-turn token off the chat template.
- ``generate_greedy`` / ``stop_rate`` / ``answer_accuracy``: batched greedy generation, the fraction
  that stopped (ended on a stop id *without opening a new turn*), and how many answered correctly.
- ``stop_probability`` / ``StopCriterion`` / ``train_until_stops`` / ``stop_criterion_callback``:
  train *until* the model ends its training answers with the stop token and its own replies to
  unseen prompts stop (a measured criterion with a step cap), not for a step count that happens to
  work on one model and one CPU.
- ``graded_text`` / ``graded_span_has_stop``: the tokens of a training batch that carry loss, and
  the pre-flight check "does each row grade its stop token?".
- ``untrained_stop_template``: TRL's Qwen2.5 training template with ``<|im_end|>`` moved out of
  ``{% generation %}`` (the template bug TRL warns about).
- ``plain_text_example``: the plain-text format that appends ``tokenizer.eos_token`` (where the
  pad == eos trap bites).
- exercises: ``check_stop_token_ids`` (1), ``broken_generation_run`` + ``check_diagnosis_exercise``
  (2, diagnosis), ``check_collate_keep_eos`` (3, fix); reference answers in ``answers/lesson02.py``.
"""

from __future__ import annotations

import copy
import random
import time

from . import validate
from .checks import Case, Diagnosis, Hints, run_check

# end_of_turn_token (the first special token a template writes after an assistant message) lives in the
# core, course_utils.data: lesson 02 teaches it here, and the doctor checks it too. One copy of the idea.
from .data import IGNORE_INDEX, end_of_turn_token  # noqa: F401


def stop_token_ids(tokenizer) -> list[int]:
    """The ``eos_token_id`` list for ``generate()``: the tokenizer's eos, then the end-of-turn token.

    Keeping the eos covers plain-text use; adding the end-of-turn token makes a chat turn stop.
    Lesson 00 uses it; lesson 02's exercise 1 asks for it, so lesson 02's notebook never imports it.
    """
    eot = tokenizer.convert_tokens_to_ids(end_of_turn_token(tokenizer))
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    return ids + [eot] if eot not in ids else ids


def chat_prompts(tokenizer, conversations: list[list[dict]]) -> list[str]:
    """Each conversation's user turn rendered with the generation prompt (``<|im_start|>assistant``)."""
    return [tokenizer.apply_chat_template([m for m in c if m["role"] != "assistant"], tokenize=False,
                                          add_generation_prompt=True) for c in conversations]


def _as_list(eos) -> list[int]:
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def generate_greedy(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 40,
                    turn_markers: tuple[str, ...] = (), **generate_kwargs) -> list[dict]:
    """Greedy, batched, left-padded generation; one record per prompt.

    Records: ``ids`` (new tokens, up to and including the stop token), ``text``, ``n_new``,
    ``ended`` (a stop id was generated before ``max_new_tokens``), ``opened_turn`` (the reply
    writes one of ``turn_markers`` — e.g. ``<|im_start|>`` — before it ends: it invented a turn) and
    ``stopped`` = ended without opening a turn, the only stop a user would accept. Without
    ``eos_token_id`` in ``generate_kwargs``, ``generate()`` uses ``model.generation_config`` — the
    default a user meets. Left padding, because a decoder continues from the last position of each row.
    """
    import torch

    if not prompts or not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a non-empty list of strings — generate_greedy tokenizes them — "
                         "build them with chat_prompts(tokenizer, conversations).")
    validate.positive_int("max_new_tokens", max_new_tokens, why="it bounds every generation")
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    encoded = encoded.to(model.device)
    limit = getattr(model.config, "max_position_embeddings", None)
    prompt_len = encoded["input_ids"].shape[1]
    if limit is not None and prompt_len + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={max_new_tokens} plus the {prompt_len}-token prompt exceeds the "
                         f"model's {limit} positions — past them the model has no position to use — pass "
                         f"max_new_tokens <= {limit - prompt_len}.")
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, **generate_kwargs)
    stops = set(_as_list(generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)))
    records = []
    for row in out[:, encoded["input_ids"].shape[1]:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stops), None)
        ids = row[:end] if end else row
        text = tokenizer.decode(ids)
        opened = any(m in text for m in turn_markers)
        records.append({"ids": ids, "text": text, "n_new": len(ids), "ended": end is not None,
                        "opened_turn": opened, "stopped": end is not None and not opened})
    return records


def stop_rate(records: list[dict]) -> float:
    """Fraction of generations that *stopped*: ended on a stop id without inventing a new turn.

    A reply that writes ``<|im_start|>assistant …`` and only then ``<|im_end|>`` ended, but it did
    not stop where the answer did: it is not counted.
    """
    if not records:
        raise ValueError("stop_rate got no records — it is a fraction of generations — pass "
                         "generate_greedy()'s output.")
    return sum(r["stopped"] for r in records) / len(records)


def reply(record: dict, stop_strings: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")) -> str:
    """The reply's text up to the first stop string, stripped: what a chat UI would show."""
    text = record["text"]
    for s in stop_strings:
        text = text.split(s, 1)[0]
    return text.strip()


def answer_accuracy(records: list[dict], conversations: list[list[dict]]) -> float:
    """Fraction of *stopped* generations whose reply equals the reference answer exactly.

    Reported beside the stop rate: a model that stops but answers wrongly has learned to stop, not
    the task — the lesson is about the first, and says so with this number.
    """
    validate.non_empty("records", records, what="generation records", fix="pass generate_greedy()'s output.")
    if len(records) != len(conversations):
        raise ValueError(f"{len(records)} records but {len(conversations)} conversations — each record is "
                         "compared with its own reference — pass the conversations the prompts came from.")
    answers = [next(m["content"] for m in c if m["role"] == "assistant") for c in conversations]
    return sum(r["stopped"] and reply(r) == a.strip() for r, a in zip(records, answers)) / len(records)


def stop_probability(model, batch: dict, stop_id: int):
    """Per row, the probability the model gives ``stop_id`` where the row's text ends with it.

    The position is the row's *last* real ``stop_id`` (``attention_mask == 1``): the ``<|im_end|>``
    that closes the assistant's answer, or the ``<|endoftext|>`` appended to a plain-text example.
    Teacher-forced, so it measures whether the model has learned to stop *after this answer*,
    independent of what it would generate. Above 0.5 it is the greedy choice there, whatever else.
    """
    import torch

    validate.batch("batch", batch, need=("input_ids",))
    ids = batch["input_ids"]
    mask = batch.get("attention_mask", torch.ones_like(ids))
    hits = (ids == stop_id) & (mask == 1)
    if not bool(hits.any(1).all()):
        raise ValueError(f"some rows of the batch contain no token {stop_id} — the probability is read "
                         "where the row's text ends with the stop token — pass rows that end with it "
                         "(a chat rendered with its template, or plain text with the eos appended).")
    cols = torch.arange(ids.shape[1]).expand_as(ids)
    last = torch.where(hits, cols, -1).max(1).values              # the final stop token of each row
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    probs = logits[torch.arange(len(ids)), last - 1].float().softmax(-1)  # predicted one step before
    return probs[:, stop_id]


class StopCriterion:
    """When a run has learned to stop: measured on the run, never a step count fitted to one model.

    Two measurements, each must reach ``level``:

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
        validate.number("level", level, positive=True)
        validate.batch("probe", probe, need=("input_ids",))
        if (tokenizer is None) != (prompts is None):
            raise ValueError("pass tokenizer and prompts together (or neither) — the generation check "
                             "tokenizes the prompts — e.g. tokenizer=tok, prompts=chat_prompts(tok, convs).")
        self.probe, self.stop_id, self.level = probe, int(stop_id), level
        self.tokenizer, self.prompts = tokenizer, prompts
        self.max_new_tokens, self.turn_markers = max_new_tokens, turn_markers

    def measure(self, model, *, lazy: bool = False) -> dict:
        was_training = model.training
        model.eval()
        try:
            p_stop = float(stop_probability(model, self.probe, self.stop_id).mean())
            rate = None
            if self.prompts is not None and not (lazy and p_stop < self.level):
                eos = [self.tokenizer.eos_token_id, self.stop_id]
                rate = stop_rate(generate_greedy(model, self.tokenizer, self.prompts, eos_token_id=eos,
                                                 max_new_tokens=self.max_new_tokens,
                                                 turn_markers=self.turn_markers))
        finally:
            model.train(was_training)
        return {"p_stop": p_stop, "stop_rate": rate}

    def met(self, measured: dict) -> bool:
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
    from .training import train

    _require_criterion(criterion, "train_until_stops")
    validate.positive_int("chunk", chunk, why="it is the steps between two checks of the criterion")
    validate.positive_int("max_steps", max_steps, why="it caps the run when the criterion is never met")
    history, last, start = [], {}, time.perf_counter()

    def check(step, trained):
        if step % chunk and step < max_steps:
            return False
        last.update(criterion.measure(trained, lazy=step < max_steps))  # the last check in full
        history.append((step, last["p_stop"], last["stop_rate"]))
        return criterion.met(last)

    records = train(model, batches, steps=max_steps, lr=lr, on_step=check, progress=False)
    return {"records": records, "steps": len(records), "seconds": time.perf_counter() - start,
            "reached": criterion.met(last), **last, "history": history}


def graded_text(tokenizer, input_ids, labels) -> str:
    """The text of the tokens that carry loss in one row (``labels != -100``), decoded in order."""
    ids = [int(i) for i, label in zip(input_ids, labels) if int(label) != IGNORE_INDEX]
    return tokenizer.decode(ids)


_ASSISTANT_OUT = "{{- '\\n' + message.content + '<|im_end|>\\n' }}"


def untrained_stop_template(training_template: str) -> str:
    """TRL's Qwen2.5 training template with ``<|im_end|>\\n`` moved after ``{% endgeneration %}``.

    It renders the same text, but the end-of-turn token is no longer part of the assistant mask: the
    mistake TRL's ``is_chat_template_stop_token_trained`` warns about. A string edit of the shipped
    template, so the lesson breaks TRL's real template rather than a hand-written one.
    """
    if training_template.count(_ASSISTANT_OUT) != 1 or "{%- endgeneration %}" not in training_template:
        raise ValueError("this is not TRL's qwen2_5 training template (the assistant output line or "
                         "{%- endgeneration %} is missing) — the edit looks for those exact strings — pass "
                         "trl.chat_template_utils.qwen2_5_training_chat_template.")
    moved = "{%- endgeneration %}\n        {%- if not message.tool_calls %}{{- '<|im_end|>\\n' }}{%- endif %}"
    return (training_template.replace(_ASSISTANT_OUT, "{{- '\\n' + message.content }}")
            .replace("{%- endgeneration %}", moved))


def plain_text_example(tokenizer, conversation: list[dict]) -> str:
    """A conversation as plain text ending in ``tokenizer.eos_token``, as pre-chat SFT scripts wrote it.

    The only stop signal is the eos, so whether the model learns to stop depends on its label.
    """
    question = next(m["content"] for m in conversation if m["role"] == "user")
    answer = next(m["content"] for m in conversation if m["role"] == "assistant")
    return f"### Question: {question}\n### Answer: {answer}{tokenizer.eos_token}"


def plain_text_batches(tokenizer, conversations: list[list[dict]], batch_size: int, collator) -> list[dict]:
    """``plain_text_example`` rows, tokenized and cut into batches by ``collator`` (in order).

    The collator decides the labels: that is the point of lesson 02's pad == eos section, which
    passes transformers' ``DataCollatorForLanguageModeling`` (masks by pad *id*) or TRL's (masks by
    *position*).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer — it is the rows per batch "
                         "— pass e.g. batch_size=16.")
    rows = [{"input_ids": tokenizer(plain_text_example(tokenizer, c), add_special_tokens=False)["input_ids"]}
            for c in conversations]
    batches = []
    for i in range(0, len(rows), batch_size):
        batch = collator(rows[i: i + batch_size])
        batches.append({k: batch[k] for k in ("input_ids", "attention_mask", "labels")})
    return batches


def graded_span_has_stop(batch: dict, stop_id: int) -> list[bool]:
    """The pre-flight check: per row, does a token with id ``stop_id`` carry loss?

    Only ``labels`` count: the prompt's ``<|im_end|>`` tokens are in ``input_ids`` but are not trained.
    """
    return [bool((row == stop_id).any()) for row in batch["labels"]]




def stop_criterion_callback(criterion: StopCriterion, *, every: int = 10):
    """A ``TrainerCallback`` that ends ``SFTTrainer`` training once ``criterion`` is met.

    The same ``StopCriterion`` as ``train_until_stops``, checked every ``every`` steps, so the run's
    length is measured on the run, not fitted to one model; ``max_steps`` stays the cap. The
    callback's ``history`` lists ``(step, p_stop, stop_rate)``.
    """
    from transformers import TrainerCallback

    _require_criterion(criterion, "the callback")
    validate.positive_int("every", every, why="it is the steps between two checks of the criterion")

    class StopWhenMet(TrainerCallback):
        history: list[tuple[int, float, float | None]] = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            final = state.global_step >= state.max_steps
            if state.global_step % every == 0 or final:
                measured = criterion.measure(model, lazy=not final)  # the last check in full
                self.history.append((state.global_step, measured["p_stop"], measured["stop_rate"]))
                control.should_training_stop = criterion.met(measured)
            return control

    callback = StopWhenMet()
    callback.history = []
    return callback


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
    from .viz import what_if

    for name, value, example in (("models", models, "{'graded': model}"),
                                 ("eos_choices", eos_choices, "{'generation_config': None, 'end': [id]}")):
        if not isinstance(value, dict) or not value:
            raise ValueError(f"stop_explorer's {name} must be a non-empty dict, got {type(value).__name__} — "
                             f"each entry is one choice of the control — pass e.g. {example}.")
    validate.positive_int("shown", shown, why="it is how many replies each frame prints")

    def frame(model, eos):
        extra = {} if eos_choices[eos] is None else {"eos_token_id": eos_choices[eos]}
        records = generate_greedy(models[model], tokenizer, prompts, max_new_tokens=max_new_tokens,
                                  turn_markers=turn_markers, **extra)
        lines = [f"stop rate {stop_rate(records):.2f} over {len(records)} prompts "
                 f"(max_new_tokens={max_new_tokens})"]
        lines += [f"{'stopped' if r['stopped'] else 'ran on '} | {r['text'][:70]!r}" for r in records[:shown]]
        return "\n".join(lines)

    return what_if(frame, {"model": list(models), "eos": list(eos_choices)},
                   descriptions={"model": "trained model", "eos": "eos_token_id for generate()"},
                   width="620px")


# ------------------------------------------------------------------------------------------------
# Exercise 1: the stop ids for generate()
# ------------------------------------------------------------------------------------------------

def _variant(tokenizer, template: str, extra: list[str], eos: str | None = None):
    """A copy of ``tokenizer`` with another family's chat template and its special tokens."""
    variant = copy.deepcopy(tokenizer)
    variant.add_special_tokens({"additional_special_tokens": extra})
    variant.chat_template = template
    if eos is not None:
        variant.eos_token = eos
    return variant


def _stop_cases(tokenizer) -> list[Case]:
    from trl.chat_template_utils import gemma_chat_template, llama3_chat_template, phi3_chat_template

    llama = _variant(tokenizer, llama3_chat_template, ["<|start_header_id|>", "<|end_header_id|>",
                                                       "<|eot_id|>", "<|begin_of_text|>"])
    llama.bos_token = "<|begin_of_text|>"
    gemma = _variant(tokenizer, gemma_chat_template, ["<start_of_turn>", "<end_of_turn>", "<bos>"])
    gemma.bos_token = "<bos>"
    phi = _variant(tokenizer, phi3_chat_template, ["<|user|>", "<|assistant|>", "<|end|>"])
    eos_is_eot = _variant(tokenizer, tokenizer.chat_template, [], eos="<|im_end|>")
    cases = []
    for label, tag, tok in (("course tokenizer (Qwen2.5 template)", "qwen", tokenizer),
                            ("Llama 3 template", "llama3", llama), ("Gemma template", "gemma", gemma),
                            ("Phi-3 template", "phi3", phi), ("eos already set to <|im_end|>", "eos_is_eot",
                                                              eos_is_eot)):
        cases.append(Case((tok,), stop_token_ids(tok), label=label, tag=tag))
    return cases


def _compare_stop_ids(got, expected) -> str | None:
    if not isinstance(got, (list, tuple)) or not all(isinstance(g, int) and not isinstance(g, bool)
                                                      for g in got):
        return f"expected a list of int token ids, got {got!r:.120}"
    if len(set(got)) != len(got):
        return f"{list(got)} lists an id twice"
    return None if sorted(got) == sorted(expected) else f"expected the ids {expected}, got {list(got)}"


def _diagnose_stop_ids(got, case: Case) -> str | None:
    tok = case.args[0]
    if not isinstance(got, (list, tuple)):
        return "return a list of ids: generate(eos_token_id=[...]) stops on any of them."
    got = list(got)
    eos = tok.eos_token_id
    eot = [i for i in case.expected if i != eos]
    if got == [eos] and eot:
        return ("you returned only the tokenizer's eos: that is the default that never stops a chat turn; "
                "add the token the template writes after an assistant message.")
    if eot and eot[0] in got and eos not in got:
        return "keep the tokenizer's eos in the list too: plain-text generations still end with it."
    if len(set(got)) != len(got):
        return "when the eos already IS the end-of-turn token, list it once."
    course_eot = tok.convert_tokens_to_ids("<|im_end|>")
    if course_eot in got and course_eot not in case.expected:
        return ("you hard-coded <|im_end|>; other families close turns with other tokens — "
                "read the token off the rendered chat template.")
    extra = [t for t in got if t not in case.expected]
    if extra:
        return (f"{tok.convert_ids_to_tokens(extra)} is not what follows the assistant's text — that is "
                "probably a turn *opener*; the stop token comes right after the assistant's content.")
    return None


STOP_IDS_HINTS = Hints(
    question="Which token does the chat template write right after the assistant's text — and is it a "
             "token generate() already stops on?",
    pointer="Render [user, assistant, user] with tokenizer.apply_chat_template(..., tokenize=False), "
            "tokenize what follows the assistant's text, and look for the first id in "
            "tokenizer.get_added_vocab().values().",
    answer="ids = [tokenizer.eos_token_id]; eot = first added-vocab id after the answer; "
           "return ids if eot in ids else ids + [eot]")


def check_stop_token_ids(fn, tokenizer):
    """Checker for exercise 1: ``fn(tokenizer) -> list[int]``, the stop ids to pass to ``generate()``."""
    return run_check("stop_token_ids", fn, _stop_cases(tokenizer), compare=_compare_stop_ids,
                     diagnose=_diagnose_stop_ids, hint=STOP_IDS_HINTS)


# ------------------------------------------------------------------------------------------------
# Exercise 2 (diagnosis): why does this fine-tune not stop?
# ------------------------------------------------------------------------------------------------

CAUSES = ("wrong_stop_ids", "stop_token_not_graded", "pad_equals_eos", "max_new_tokens_too_small",
          "left_padding_without_mask")
# Chat families the generator draws from: (end-of-turn token, turn opener, eos) as their templates write them.
_FAMILIES = (("<|im_end|>", "<|im_start|>", "<|endoftext|>"), ("<|eot_id|>", "<|start_header_id|>",
             "<|end_of_text|>"), ("<end_of_turn>", "<start_of_turn>", "<eos>"), ("<|end|>", "<|user|>",
                                                                                  "<|endoftext|>"))
_WORDS = ("red", "cat", "moon", "road", "big", "box", "green", "cold", "bag", "cow", "sun", "tree")


def _qa(rng: random.Random) -> tuple[list[str], list[str]]:
    """A question and answer as token strings (reverse-the-words: the answer length varies)."""
    words = rng.sample(_WORDS, rng.randint(3, 6))
    return ["Reverse", ":"] + words, list(reversed(words))


def broken_generation_run(seed: int) -> tuple[dict, Diagnosis]:
    """A fine-tune that does not stop as it should — generations, generate() config, graded span.

    The artefact a learner would collect: ``generations`` (token strings per prompt, ``stopped``),
    ``generate_config`` (``eos_tokens``, ``max_new_tokens``, ``padding_side``,
    ``attention_mask_passed``), ``graded_span`` (the tokens that carried loss in three training
    rows), ``format`` ("chat" or "plain"), the template's ``end_of_turn_token``, ``eos_token``,
    ``pad_token``. Five causes, drawn by ``seed``: three from this lesson and two look-alikes (a
    ``max_new_tokens`` too small for the answers; left padding without an attention mask, lesson 03).
    """
    validate.integer("seed", seed, minimum=0, why="it picks the case")
    rng = random.Random(seed)
    cause = CAUSES[seed % len(CAUSES)] if seed < len(CAUSES) else rng.choice(CAUSES)
    eot, opener, eos = rng.choice(_FAMILIES)
    fmt = "plain" if cause == "pad_equals_eos" else "chat"
    stop = eos if fmt == "plain" else eot
    pad = eos if (fmt == "plain" or rng.random() < 0.5) else "<pad>"
    budget = rng.choice((32, 40, 64))
    cfg = {"eos_tokens": [eos, eot], "max_new_tokens": budget, "padding_side": "left",
           "attention_mask_passed": True}
    if cause == "wrong_stop_ids":
        cfg["eos_tokens"] = [eos]
    if cause == "left_padding_without_mask":
        cfg["attention_mask_passed"] = False
    qas = [_qa(rng) for _ in range(rng.randint(4, 6))]
    if cause == "max_new_tokens_too_small":
        cfg["max_new_tokens"] = budget = rng.randint(2, min(len(a) for _, a in qas) - 1)
    longest = max(len(q) for q, _ in qas)
    generations = []
    for q, a in qas:
        gen = _broken_reply(rng, cause, a, stop, opener, len(q) < longest)[:budget]
        stopped = bool(gen) and gen[-1] in cfg["eos_tokens"]
        generations.append({"prompt_tokens": q, "tokens": gen, "stopped": stopped, "reference": a})
    graded = []
    for _, a in qas[:3]:
        span = (["###", "Answer", ":"] if fmt == "plain" else ["\n"]) + a
        closing = [stop] if fmt == "plain" else [stop, "\n"]
        graded.append(span if cause in ("stop_token_not_graded", "pad_equals_eos") else span + closing)
    artefact = {"generations": generations, "generate_config": cfg, "graded_span": graded, "format": fmt,
                "end_of_turn_token": eot, "eos_token": eos, "pad_token": pad,
                "collator": ("transformers DataCollatorForLanguageModeling" if cause == "pad_equals_eos" else
                             rng.choice(("TRL DataCollatorForLanguageModeling", "course collate_right")))}
    if cause == "pad_equals_eos":
        evidence = eos
    elif cause in ("wrong_stop_ids", "stop_token_not_graded"):
        evidence = eot
    elif cause == "max_new_tokens_too_small":
        evidence = budget
    else:
        evidence = tuple(i for i, (q, _) in enumerate(qas) if len(q) < longest)
    return artefact, Diagnosis(cause, evidence)


def _broken_reply(rng: random.Random, cause: str, answer: list[str], stop: str, opener: str,
                  padded: bool) -> list[str]:
    """What the model generates for one prompt under ``cause`` (tokens; cut to the budget later)."""
    ramble = [rng.choice(_WORDS) for _ in range(80)]
    if cause == "wrong_stop_ids":  # writes the end-of-turn token, nobody watches it: invents turns
        return answer + [stop, "\n", opener, "assistant", "\n"] + ramble
    if cause in ("stop_token_not_graded", "pad_equals_eos"):  # never learned the stop: rambles on
        return answer + (["\n", "###", "Question", ":"] if cause == "pad_equals_eos" else ["\n"]) + ramble
    if cause == "left_padding_without_mask" and padded:  # attends to pad columns: garbled from token 1
        return [rng.choice(("##", "ss", "w", "0", "nsw")) for _ in range(80)]
    return answer + [stop]  # stops correctly (the budget may still cut it)


def _evidence_ok(got, truth) -> bool:
    if truth.cause == "left_padding_without_mask":  # any garbled (padded) row, or all of them
        return got in truth.evidence or (isinstance(got, (list, tuple)) and set(got) == set(truth.evidence))
    return got == truth.evidence


DIAGNOSIS_MISCONCEPTIONS = {
    ("stop_token_not_graded", "wrong_stop_ids"):
        "the model DOES write the end-of-turn token and keeps going: training taught it to stop; "
        "generate() is not watching that token — compare eos_tokens with what the replies contain",
    ("wrong_stop_ids", "stop_token_not_graded"):
        "no reply contains the end-of-turn token, so no eos list can stop it; look at the graded span",
    ("stop_token_not_graded", "pad_equals_eos"):
        "the stop token here is the eos and pad is the same token: which collator built the labels?",
    ("wrong_stop_ids", "max_new_tokens_too_small"):
        "these replies do not ramble — they are cut mid-answer; compare their length with max_new_tokens",
    ("stop_token_not_graded", "max_new_tokens_too_small"):
        "the graded span has the stop token; the replies are cut before the answer is complete",
    ("stop_token_not_graded", "left_padding_without_mask"):
        "the longest prompt's reply is fine and stops: only padded rows are garbled (lesson 03)",
    ("wrong_stop_ids", "left_padding_without_mask"):
        "the longest prompt's reply is fine and stops: only padded rows are garbled (lesson 03)",
}

DIAGNOSIS_HINTS = Hints(
    question="Do the replies contain the end-of-turn token at all? If yes, who should have stopped on it; "
             "if no, was it ever in the graded span? And are all rows broken, or only some?",
    pointer="Read artefact['generations'][i]['tokens'] beside artefact['generate_config'] and "
            "artefact['graded_span'] — sections 3 (config), 5c (graded span) and 5d (pad == eos).",
    answer="garbled only on padded rows with no mask -> left_padding_without_mask (evidence: a padded row); "
           "writes eot but eot not in eos_tokens -> wrong_stop_ids (eot); never writes it and it is not "
           "graded -> stop_token_not_graded (eot), or pad_equals_eos if the stop is the eos and pad == eos "
           "(eos); else the replies are cut -> max_new_tokens_too_small (max_new_tokens).")


def check_diagnosis_exercise(fn):
    """Checker for exercise 2: ``fn(artefact) -> Diagnosis`` on fresh ``broken_generation_run`` cases."""
    from .checks import check_diagnosis
    from .model import course_seed

    seeds = [1000 + 7 * course_seed() + i for i in range(12)]
    seeds = list(range(len(CAUSES))) + seeds  # every cause at least once, then fresh draws
    return check_diagnosis("diagnose_generations", fn, broken_generation_run, seeds=seeds,
                           evidence_ok=_evidence_ok, misconceptions=DIAGNOSIS_MISCONCEPTIONS,
                           hint=DIAGNOSIS_HINTS)


# ------------------------------------------------------------------------------------------------
# Exercise 3 (fix): a collator that keeps the row's own eos when pad == eos
# ------------------------------------------------------------------------------------------------

def _collate_cases(n_cases: int = 6) -> list[Case]:
    """Batches the notebook never shows: random ids ending in eos, pad == eos (and one pad != eos)."""
    from .exercises.answers.lesson02 import collate_keep_eos

    rng = random.Random(4242)
    cases = []
    for k in range(n_cases):
        eos = rng.randint(0, 9)
        pad = eos if k < n_cases - 1 else eos + 10  # the last case: a distinct pad token
        examples = []
        for _ in range(rng.randint(2, 5)):
            body = [rng.randint(20, 400) for _ in range(rng.randint(3, 12))]
            ex = {"input_ids": body + [eos]}
            if k % 2:  # a prompt mask, as a chat or prompt-completion example carries
                n_prompt = rng.randint(1, len(body) - 1)
                ex["labels"] = [IGNORE_INDEX] * n_prompt + ex["input_ids"][n_prompt:]
            examples.append(ex)
        expected = {"reference": collate_keep_eos(examples, pad), "examples": examples}
        cases.append(Case((examples, pad), expected,
                          label=f"{len(examples)} rows, {'with' if k % 2 else 'no'} prompt mask, "
                                f"pad {'==' if pad == eos else '!='} eos",
                          tag="prompt_mask" if k % 2 else "plain"))
    return cases


def _rows(batch: dict, examples: list[dict]):
    """Per example: (its ids, its labels, the batch row's real ids, real labels, pad labels)."""
    for i, e in enumerate(examples):
        real = batch["attention_mask"][i] == 1
        yield (list(e["input_ids"]), list(e.get("labels", e["input_ids"])),
               batch["input_ids"][i][real].tolist(), batch["labels"][i][real].tolist(),
               batch["labels"][i][~real].tolist())


def _compare_collate(got, expected: dict) -> str | None:
    import torch

    examples, reference = expected["examples"], expected["reference"]
    if not isinstance(got, dict) or not all(isinstance(got.get(k), torch.Tensor)
                                            for k in ("input_ids", "attention_mask", "labels")):
        return "expected a dict with tensors 'input_ids', 'attention_mask' and 'labels'"
    shapes = {tuple(got[k].shape) for k in ("input_ids", "attention_mask", "labels")}
    if shapes != {tuple(reference["input_ids"].shape)}:
        return f"expected three tensors of shape {tuple(reference['input_ids'].shape)}, got {shapes}"
    for i, (ids, labels, real_ids, real_labels, pad_labels) in enumerate(_rows(got, examples)):
        if real_ids != ids:
            return f"row {i}: the attention mask does not mark exactly the example's own tokens"
        if real_labels != labels:
            return f"row {i}: labels on the example's own tokens differ from its labels"
        if any(x != IGNORE_INDEX for x in pad_labels):
            return f"row {i}: a padding position carries a label"
    return None


def _diagnose_collate(got, case: Case) -> str | None:
    examples, pad = case.args
    if not isinstance(got, dict) or "labels" not in got:
        return None
    first = list(_rows(got, examples))
    for ids, labels, real_ids, real_labels, pad_labels in first:
        if real_ids != ids and len(real_ids) == len(got["input_ids"][0]):
            return "the attention mask is all ones: the model would attend to (and the labels see) padding."
        if real_ids != ids:
            return None
        if real_labels[-1] == IGNORE_INDEX and labels[-1] != IGNORE_INDEX and ids[-1] == pad:
            return ("the row's own eos lost its label: you masked by pad *id*, and with pad == eos that "
                    "erases every eos — mask by position (where the example ends) instead.")
        if real_labels == ids and labels != ids:
            return ("the prompt tokens carry labels: you cloned input_ids into labels and overwrote the "
                    "example's prompt mask — start from the example's own labels.")
        if pad_labels and all(x == pad for x in pad_labels):
            return ("the padding carries labels (pad ids): the model is trained to write eos/pad again and "
                    "again after the answer — padding positions must be -100.")
        if pad_labels and pad_labels[-1] != IGNORE_INDEX:
            return ("you kept the row's *last* eos — with pad == eos that is a pad; keep the first one "
                    "(the example's own) and mask everything after it.")
    return None


COLLATE_HINTS = Hints(
    question="With pad == eos, how can a collator tell the example's own eos from the padding after it, "
             "if not by its id?",
    pointer="Section 5d: TRL's collator masks by position (where each example ends), transformers' "
            "by pad id. Pad with pad_token_id, but decide the -100s from each example's length.",
    answer="for each example: ids + [pad]*k, mask [1]*len + [0]*k, "
           "labels = e.get('labels', ids) + [-100]*k; return torch tensors")


def check_collate_keep_eos(fn):
    """Checker for exercise 3: ``fn(examples, pad_token_id) -> {input_ids, attention_mask, labels}``.

    Property checks, so every correct collator passes (right or left padding, masking by length or
    by keeping the first eos): the masked tokens are the example's own, their labels are its
    labels, padding positions are -100.
    """
    return run_check("collate_keep_eos", fn, _collate_cases(), compare=_compare_collate,
                     diagnose=_diagnose_collate, hint=COLLATE_HINTS)


# Every public function above checks its arguments by their conventional names (model, tokenizer,
# batch, steps, ...) before it runs: one what/why/fix message for the slips learners make most.
validate.check_module_arguments(globals())
