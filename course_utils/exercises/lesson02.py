"""Lesson 02's exercises: their checkers, and the broken runs of the diagnosis exercise.

1. ``check_stop_token_ids(fn, tokenizer)``: ``fn(tokenizer, generation_config)``, the stop ids for
   ``generate()``, on tokenizers and generation configs of four chat families the notebook never shows.
2. ``broken_generation_run(seed)`` (the artefact a learner reads: replies, the generate() call, training
   rows; ``show_run`` prints it) + ``check_diagnosis_exercise(fn)``: ``fn(artefact) -> Diagnosis(cause,
   evidence)``, one of ``CAUSES``, graded on fresh runs. No setting alone decides a cause.
3. ``check_collate_keep_eos(fn)``: ``fn(examples, pad_token_id, eos_token_id)``, a collator that ends every
   row with its graded eos (appended where the row has none) and keeps that label when pad == eos, checked
   by properties.

The generator that knows a run's cause lives with the reference answers: the notebook shows the
artefact only. Reference answers: ``answers/lesson02.py``.
"""

from __future__ import annotations

import copy
import random

import torch
from transformers import GenerationConfig
from trl.chat_template_utils import gemma_chat_template, llama3_chat_template, phi3_chat_template

from .. import validate
from ..checks import Case, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import IGNORE_INDEX, collate_right, end_of_turn_id, is_graded
from ..eos import stop_token_ids
from ..padding import collate_padded
from .answers import lesson02 as answers

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
    llama = _variant(tokenizer, llama3_chat_template, ["<|start_header_id|>", "<|end_header_id|>",
                                                       "<|eot_id|>", "<|eom_id|>", "<|begin_of_text|>"])
    llama.bos_token = "<|begin_of_text|>"
    gemma = _variant(tokenizer, gemma_chat_template, ["<start_of_turn>", "<end_of_turn>", "<bos>"])
    gemma.bos_token = "<bos>"
    phi = _variant(tokenizer, phi3_chat_template, ["<|user|>", "<|assistant|>", "<|end|>"])
    eos_is_eot = _variant(tokenizer, tokenizer.chat_template, [], eos="<|im_end|>")
    # Gemma's template copied onto a tokenizer that never got its turn tokens (no setup_chat_format, no
    # add_special_tokens): "<end_of_turn>" is plain text here, split into pieces, so no single id closes a
    # turn — the course's end_of_turn_token refuses such a template, and the answer is the config's ids alone.
    untokenized = _variant(tokenizer, gemma_chat_template, [])
    def config(tok, *tokens):  # a generation_config.json as a checkpoint ships it (no ids: none written)
        ids = tok.convert_tokens_to_ids(list(tokens))
        return GenerationConfig(eos_token_id=ids[0] if len(ids) == 1 else (ids or None))

    eos = tokenizer.eos_token
    sets = (("course tokenizer (Qwen2.5 template), a base model's generation_config", "qwen", tokenizer,
             config(tokenizer, eos)),
            ("Qwen2.5 template, an instruct generation_config that already lists <|im_end|>", "qwen_instruct",
             tokenizer, config(tokenizer, "<|im_end|>", eos)),
            ("Llama 3 template, generation_config stops on eos and <|eom_id|>", "llama3", llama,
             config(llama, eos, "<|eom_id|>")),
            ("Gemma template, no generation_config eos", "gemma", gemma, config(gemma)),
            ("Phi-3 template", "phi3", phi, config(phi, eos)),
            ("eos already set to <|im_end|>", "eos_is_eot", eos_is_eot, config(eos_is_eot, "<|im_end|>")),
            ("Gemma's template on a tokenizer without its turn tokens (<end_of_turn> is plain text here)",
             "no_turn_token", untokenized, config(untokenized, eos)))
    return [Case((tok, gen), answers.stop_ids_for_generate(tok, gen), label=label, tag=tag)
            for label, tag, tok, gen in sets]


def _compare_stop_ids(got, expected) -> str | None:
    if not isinstance(got, (list, tuple)) or not all(isinstance(g, int) and not isinstance(g, bool)
                                                      for g in got):
        return f"expected a list of int token ids, got {got!r:.120}"
    if len(set(got)) != len(got):
        return f"{list(got)} lists an id twice"
    return None if sorted(got) == sorted(expected) else f"expected the ids {expected}, got {list(got)}"


def _diagnose_stop_ids(got, case: Case) -> str | None:
    tok, gen = case.args
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
    if case.tag == "no_turn_token" and got != case.expected:
        return ("this tokenizer has no single token for the template's end of turn: '<end_of_turn>' is "
                "split into plain-text pieces, so no id can stop the turn — return generation_config's ids "
                "alone (and stop on the text with generate(stop_strings=..., tokenizer=...), or add the "
                "token and train it).")
    listed = gen.eos_token_id if isinstance(gen.eos_token_id, list) else []
    if any(i not in got for i in listed):
        names = tok.convert_ids_to_tokens(listed)
        return (f"generation_config already stops on {names} — keep every id it lists (a checkpoint may "
                "stop on several, e.g. Llama 3.1's <|eom_id|> after a tool call) and add the end-of-turn "
                "token.")
    extra = [t for t in got if t not in case.expected]
    if extra:
        return (f"{tok.convert_ids_to_tokens(extra)} is not what follows the assistant's text — that is "
                "probably a turn *opener*; the stop token comes right after the assistant's content.")
    return None


STOP_IDS_HINTS = Hints(
    question="Which token does the chat template write right after the assistant's text — and which ids "
             "does generate() already stop on for this checkpoint?",
    pointer="Render [user, assistant, user] with tokenizer.apply_chat_template(..., tokenize=False), "
            "tokenize what follows the assistant's text, and look at its first token that is not whitespace: "
            "is it in tokenizer.get_added_vocab().values()? A template copied onto a tokenizer that lacks "
            "its turn tokens writes them as plain text.",
    answer="ids = generation_config.eos_token_id as a list (or [tokenizer.eos_token_id] when it is None); "
           "eot = the first non-whitespace token after the answer if it is an added-vocab id, else None "
           "(nothing to add); return ids if eot is None or eot in ids else ids + [eot]")


def check_stop_token_ids(fn, tokenizer):
    """Checker for exercise 1: ``fn(tokenizer, generation_config) -> list[int]``, the stop ids to pass to
    ``generate()``: what the checkpoint's generation_config already stops on, plus the end-of-turn token.

    ``tokenizer``: a chat tokenizer (the course's); the cases are copies of it with the templates and
    turn tokens of Llama 3, Gemma and Phi-3, one whose eos already is the end-of-turn token, and one with
    Gemma's template but not its tokens (no id closes a turn: nothing to add), each with a
    generation_config as such a checkpoint ships it (several ids, one, none).
    """
    validate.tokenizer("tokenizer", tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat_template — the first case is this tokenizer's own chat "
                         "format — pass the course tokenizer (load_course_model()[1]).")
    return run_check("stop_token_ids", fn, lambda: _stop_cases(tokenizer), compare=_compare_stop_ids,
                     diagnose=_diagnose_stop_ids, hint=STOP_IDS_HINTS,
                     out_of_reach=(end_of_turn_id, stop_token_ids))


# ------------------------------------------------------------------------------------------------
# Exercise 2 (diagnosis): why does this fine-tune not stop?
# ------------------------------------------------------------------------------------------------

CAUSES = answers.CAUSES  # what can stop a fine-tune from stopping (the learner picks one)


def broken_generation_run(seed: int) -> dict:
    """A fine-tune that does not stop as it should, as a learner would meet it: exercise 2's artefact.

    ``generations`` (``prompt_tokens``, the reply's ``tokens``, ``stopped``, the ``reference`` answer),
    ``generate_call`` (``max_new_tokens``), ``training_rows`` (three rows of a training batch: ``tokens`` and
    ``graded``, True where the token carries loss), ``special_tokens`` (``eos``, ``pad``, ``end_of_turn``)
    and ``format`` ("chat" or "plain"). ``show_run(artefact)`` prints it as a practitioner reads it. Its
    cause is one of ``CAUSES``: finding it is the exercise (the checker grades on other seeds).
    """
    validate.seed("seed", seed)
    return answers.broken_run_case(seed, graded=False)[0]


def show_run(artefact: dict) -> None:
    """Print exercise 2's artefact as a practitioner reads it: the generate() call, each prompt and its
    reply, and three training rows with the tokens that carry no loss in (parentheses)."""
    need = ("generations", "generate_call", "training_rows", "special_tokens", "format")
    if not isinstance(artefact, dict) or not set(need) <= set(artefact):
        got = sorted(artefact) if isinstance(artefact, dict) else type(artefact).__name__
        raise ValueError(f"artefact must be the dict broken_generation_run(seed) returns, got {got!r:.80} — "
                         f"show_run reads its keys {list(need)} — pass broken_generation_run(seed).")
    print(answers.show_run(artefact))


DIAGNOSIS_MISCONCEPTIONS = {  # (your cause, the true cause): the look-alike you took it for
    ("stop_token_not_graded", "wrong_stop_ids"):
        "the model DOES write the end-of-turn token and keeps going: training taught it to stop; "
        "generate() is not watching that token",
    ("pad_equals_eos", "wrong_stop_ids"):
        "the model DOES write its stop token and keeps going: generate() is not watching that token",
    ("wrong_stop_ids", "stop_token_not_graded"):
        "no reply contains the end-of-turn token, so no eos list can stop it; look at the training rows",
    ("stop_token_not_graded", "pad_equals_eos"):
        "the stop token here is the eos and pad is the same token: a collator that masks labels by pad id "
        "masks the real eos too",
    ("pad_equals_eos", "stop_token_not_graded"):
        "pad is not the stop token here, so no pad-id collator erased it: the template left it ungraded",
    ("wrong_stop_ids", "max_new_tokens_too_small"):
        "these replies do not ramble — they are cut mid-answer; compare their length with max_new_tokens",
    ("stop_token_not_graded", "max_new_tokens_too_small"):
        "the training rows grade the stop token; the replies are cut before the answer is complete",
    ("pad_equals_eos", "max_new_tokens_too_small"):
        "the training rows grade the eos; the replies are cut before the answer is complete",
    ("max_new_tokens_too_small", "stop_token_not_graded"):
        "the replies finish the answer and go on: the budget is not what ends them",
    ("max_new_tokens_too_small", "pad_equals_eos"):
        "the replies finish the answer and go on: the budget is not what ends them",
}

DIAGNOSIS_HINTS = Hints(
    question="Where does each reply end: inside its answer, or after it? And what did the model write "
             "after the answer?",
    pointer="show_run(artefact); then compare each reply with its 'reference' and look for the stop token "
            "(the end-of-turn token for chat, the eos for plain text) in the replies and in the graded "
            "tokens — sections 3 (generate's stop list), 5c (graded span) and 5d (pad == eos).",
    answer="writes the stop token and goes on -> wrong_stop_ids (the token); a reply cut inside its "
           "answer -> max_new_tokens_too_small (max_new_tokens); never writes it and the rows never grade "
           "it -> pad_equals_eos if pad is that token, else stop_token_not_graded (the token).")


def check_diagnosis_exercise(fn):
    """Checker for exercise 2: ``fn(artefact) -> Diagnosis`` on fresh broken runs.

    Every cause once, then 12 runs drawn fresh on every run, in a shuffled order (no keyword fixes them:
    see ``checks.fresh_seeds``).
    """
    validate.function("fn", fn)  # check_diagnosis wraps fn, so run_check's own test would not see it
    return check_diagnosis("diagnose_generations", fn, answers.broken_run_case,
                           seeds=lambda: [*range(len(CAUSES)), *fresh_seeds(12)],  # each cause, then fresh
                           misconceptions=DIAGNOSIS_MISCONCEPTIONS,
                           hint=DIAGNOSIS_HINTS)


# ------------------------------------------------------------------------------------------------
# Exercise 3 (fix): a collator that keeps the row's own eos when pad == eos
# ------------------------------------------------------------------------------------------------

def _collate_cases(n_cases: int = 6) -> list[Case]:
    """Batches the notebook never shows: random ids, pad == eos (and one pad != eos). Some rows end with
    their eos, some were tokenized without it (the tokenizer appends none): TRL appends it while it prepares
    a non-conversational dataset (``add_eos``), its collator does not — so the collator must."""
    rng = random.Random(4242)
    cases = []
    for k in range(n_cases):
        eos = rng.randint(0, 9)
        pad = eos if k < n_cases - 1 else eos + 10  # the last case: a distinct pad token
        examples = []
        for i in range(rng.randint(3, 5)):
            body = [rng.randint(20, 400) for _ in range(rng.randint(3, 12))]
            ex = {"input_ids": body + [eos] if (i + k) % 3 else body}  # every batch: rows with and without
            if k % 2:  # a prompt mask, as a chat or prompt-completion example carries
                n_prompt = rng.randint(1, len(body) - 1)
                ex["labels"] = [IGNORE_INDEX] * n_prompt + ex["input_ids"][n_prompt:]
            examples.append(ex)
        expected = {"reference": answers.collate_keep_eos(examples, pad, eos), "examples": examples,
                    "complete": [answers.with_eos(e, eos) for e in examples]}
        cases.append(Case((examples, pad, eos), expected,
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
    examples, reference = expected["complete"], expected["reference"]
    if not isinstance(got, dict) or not all(isinstance(got.get(k), torch.Tensor)
                                            for k in ("input_ids", "attention_mask", "labels")):
        return "expected a dict with tensors 'input_ids', 'attention_mask' and 'labels'"
    shapes = {tuple(got[k].shape) for k in ("input_ids", "attention_mask", "labels")}
    if shapes != {tuple(reference["input_ids"].shape)}:
        return f"expected three tensors of shape {tuple(reference['input_ids'].shape)}, got {shapes}"
    for i, (ids, labels, real_ids, real_labels, pad_labels) in enumerate(_rows(got, examples)):
        if real_ids != ids:
            return (f"row {i}: the attention mask does not mark exactly the example's own tokens, ending "
                    "with one eos")
        if real_labels != labels:
            return f"row {i}: labels on the example's own tokens differ from its labels"
        if any(is_graded(x) for x in pad_labels):
            return f"row {i}: a padding position carries a label"
    return None


def _diagnose_collate(got, case: Case) -> str | None:
    examples, pad, eos = case.args
    if not isinstance(got, dict) or "labels" not in got or "attention_mask" not in got:
        return None
    try:
        rows = list(_rows(got, examples))
    except (IndexError, RuntimeError):  # fewer rows than examples, or tensors of another shape
        return None
    for ids, _, real_ids, _, _ in rows:
        if ids[-1] != eos and real_ids == ids:
            return ("a row that came without its eos still has none: nothing in it teaches the model to stop "
                    "(lesson 02's 'never appended'). TRL appends eos_token while it prepares a "
                    "non-conversational dataset (add_eos), not in its collator: append it here, with its "
                    "label.")
        if ids[-1] == eos and real_ids == ids + [eos]:
            return ("this row already ended with its eos and you appended another: check the last id "
                    "before you append (with pad == eos, the row's own eos is not padding).")
    for ids, labels, real_ids, real_labels, pad_labels in _rows(got, case.expected["complete"]):
        if real_ids != ids and len(real_ids) == len(got["input_ids"][0]):
            return "the attention mask is all ones: the model would attend to (and the labels see) padding."
        if real_ids != ids:
            return None
        if not is_graded(real_labels[-1]) and is_graded(labels[-1]) and ids[-1] == pad:
            return ("the row's own eos lost its label: you masked by pad *id*, and with pad == eos that "
                    "erases every eos — mask by position (where the example ends) instead.")
        if real_labels == ids and labels != ids:
            return ("the prompt tokens carry labels: you cloned input_ids into labels and overwrote the "
                    "example's prompt mask — start from the example's own labels.")
        if pad_labels and all(x == pad for x in pad_labels):
            return ("the padding carries labels (pad ids): the model is trained to write eos/pad again and "
                    "again after the answer — padding positions must be -100.")
        if pad_labels and is_graded(pad_labels[-1]):
            return ("you kept the row's *last* eos — with pad == eos that is a pad; keep the first one "
                    "(the example's own) and mask everything after it.")
    return None


COLLATE_HINTS = Hints(
    question="Does every row end with the token that teaches the model to stop? And with pad == eos, what "
             "does the collator know about each example that the id cannot tell it?",
    pointer="Section 4 lists 'never appended' among the training-time causes; section 5d: TRL's collator "
            "masks by position (where each example ends), transformers' by pad id. TRL appends the eos while "
            "it prepares the dataset, not in the collator.",
    answer="for each example: ids, labels = e['input_ids'], e.get('labels', e['input_ids']); if ids[-1] != "
           "eos: append eos to both; then ids + [pad]*k, mask [1]*len + [0]*k, labels + [-100]*k; return "
           "torch tensors")


def check_collate_keep_eos(fn):
    """Checker for exercise 3: ``fn(examples, pad_token_id, eos_token_id) -> {input_ids, attention_mask,
    labels}``.

    Property checks, so every correct collator passes (right or left padding, masking by length or by
    keeping the first eos): each row holds the example's own tokens ending with exactly one eos (appended,
    graded, where the example had none), their labels are its labels, padding positions are -100.
    """
    validate.function("fn", fn)
    return run_check("collate_keep_eos", fn, _collate_cases, compare=_compare_collate,
                     diagnose=_diagnose_collate, hint=COLLATE_HINTS,
                     out_of_reach=(collate_right, collate_padded))
