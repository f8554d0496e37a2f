"""Every exercise checker in one place (issue 18): three tables, each row spelling out its answer.

``CHECKERS``      one row per exercise checker: its reference answer passes, the stub a learner's cell
                  holds before they write anything (``conftest.stub``) is reported as not implemented.
``ALSO_CORRECT``  a second correct answer per checker: a checker must grade the behaviour, not the text.
``WRONG``         (checker, wrong answer, phrase): each known wrong answer fails, and the message names
                  its misconception. Each wrong answer is a named function below, grouped by lesson,
                  whose docstring says the misconception it pins.

``test_every_exercise_checker_is_in_the_table`` finds the ``check_*`` functions of course_utils by
inspection, so a new checker cannot be left out. Tests of a checker's graded hints, and of the
generators behind the diagnosis exercises, stay in the lesson's own test file.
"""

import importlib
import inspect
import math
import pkgutil
from pathlib import Path

import pytest
import torch
from conftest import stub
from trl.chat_template_utils import get_training_chat_template, has_generation_markers

import course_utils
from course_utils import accumulation as acc
from course_utils import capstone, eos, padding, templates, tour
from course_utils import nan_detective as nd
from course_utils import token_weighting as tw
from course_utils import truncation as T
from course_utils.checks import Diagnosis
from course_utils.data import IGNORE_INDEX
from course_utils.exercises.answers import (
    lesson00,
    lesson01,
    lesson02,
    lesson03,
    lesson04,
    lesson05,
    lesson06,
    lesson07,
)
from course_utils.losses import count_supervised
from course_utils.templates import QWEN2_CHAT_TEMPLATE, assistant_mask, masked_tokens
from course_utils.training import token_losses

M = IGNORE_INDEX
NOT_IMPLEMENTED = "⏳ not implemented yet: replace the `raise NotImplementedError`"  # checks.run_check


# =================================================================================================
# Lesson 00 (tour): assistant_only_labels, label_diagnosis
# =================================================================================================

def _without_newlines(tokenizer, input_ids):
    """A second correct answer: the answer tokens and <|im_end|>, but not the whitespace around them."""
    labels = lesson00.assistant_only_labels(tokenizer, input_ids)
    return [IGNORE_INDEX if lab != IGNORE_INDEX and tokenizer.decode([lab]).strip() == "" else lab
            for lab in labels]


def _whole(tokenizer, input_ids):
    """Grades the whole sequence: the prompt and the system text carry loss too."""
    return list(input_ids)


def _no_stop(tokenizer, input_ids):
    """Leaves <|im_end|> out of the labels: the model never learns to stop."""
    labels = lesson00.assistant_only_labels(tokenizer, input_ids)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [IGNORE_INDEX if lab == eot else lab for lab in labels]


def _shifted(tokenizer, input_ids):
    """Shifts the labels by hand (labels[i] = input_ids[i + 1]): the model shifts them again."""
    labels = lesson00.assistant_only_labels(tokenizer, input_ids)
    return [input_ids[i + 1] if lab != IGNORE_INDEX and i + 1 < len(input_ids) else IGNORE_INDEX
            for i, lab in enumerate(labels)]


def _first_turn_only(tokenizer, input_ids):
    """Grades the first assistant turn only: later turns of a multi-turn chat are not trained."""
    labels, seen_end = lesson00.assistant_only_labels(tokenizer, input_ids), False
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for lab in labels:
        out.append(IGNORE_INDEX if seen_end else lab)
        seen_end = seen_end or lab == eot
    return out


def _diagnose_other_order(example):
    """A second correct diagnosis: counts first, then looks at the stop token and the header."""
    n = sum(label != IGNORE_INDEX for label in example["labels"])
    rows = zip(example["tokens"], example["labels"], example["input_ids"])
    pairs = [(tok, lab == i) for tok, lab, i in rows if lab != IGNORE_INDEX]
    if n == 0:
        cause = "nothing_graded"
    elif not all(same for _, same in pairs):
        cause = "shifted_labels"
    elif "<|im_start|>" in [tok for tok, _ in pairs]:
        cause = "whole_sequence"
    elif "<|im_end|>" in [tok for tok, _ in pairs]:
        cause = "correct"
    else:
        cause = "stop_token_not_graded"
    return Diagnosis(cause, n)


def always_correct(example):
    """Memorised: every example is "correct" (with the right count), whatever its labels show."""
    return Diagnosis("correct", sum(lab != IGNORE_INDEX for lab in example["labels"]))


def cause_without_diagnosis(example):
    """Returns the cause as a bare string instead of a Diagnosis(cause, evidence)."""
    return lesson00.diagnose_labels(example).cause


def counts_every_token(example):
    """Right cause, but the evidence counts every label, -100 included, not the graded tokens."""
    return Diagnosis(lesson00.diagnose_labels(example).cause, len(example["labels"]))


# =================================================================================================
# Lesson 01 (accumulation): accumulation_step, diagnose_run
# =================================================================================================

def _params(model):
    return [p for p in model.parameters() if p.requires_grad]


def zero_at_the_end(model, optimizer, micro_batches, max_grad_norm):
    """Correct too: zeroing after the step leaves .grad empty for the next call."""
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
    norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    model.zero_grad()
    return norm.item()


def missing_division(model, optimizer, micro_batches, max_grad_norm):
    """Sums the K micro-batch means: the gradient is K times the big batch's."""
    optimizer.zero_grad()
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n).backward()  # the bug: K micro-batch means are summed
    norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(norm)


def divided_twice(model, optimizer, micro_batches, max_grad_norm):
    """Token-weighted AND divided by K: the gradient is K times too small."""
    optimizer.zero_grad()
    total = sum(count_supervised(b["labels"]) for b in micro_batches)
    for batch in micro_batches:
        summed, _ = token_losses(model, batch)
        (summed / total / len(micro_batches)).backward()  # token-weighted AND / K
    norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(norm)


def never_zeroes(model, optimizer, micro_batches, max_grad_norm):
    """Never zeroes .grad: step 2 adds onto step 1's gradient (stale gradients)."""
    k = len(micro_batches)
    for batch in micro_batches:  # no zero_grad anywhere: step 2 adds onto step 1's gradient
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
    norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(norm)


def clips_per_micro_batch(model, optimizer, micro_batches, max_grad_norm):
    """Clips inside the loop: each partial sum is clipped, not the step's gradient."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
        norm = torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)  # inside the loop
    optimizer.step()
    return float(norm)


def returns_post_clip_norm(model, optimizer, micro_batches, max_grad_norm):
    """Returns the norm after clipping: the log never shows how large the gradient was."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
    torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm)
    optimizer.step()
    return float(torch.nn.utils.get_total_norm([p.grad for p in _params(model)]))


def clips_after_the_step(model, optimizer, micro_batches, max_grad_norm):
    """Clips after optimizer.step(): the update used the unclipped gradient."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for batch in micro_batches:
        summed, n = token_losses(model, batch)
        (summed / n / k).backward()
    optimizer.step()  # the update used the unclipped gradient
    return float(torch.nn.utils.clip_grad_norm_(_params(model), max_grad_norm))


def by_median_and_k(artefact):
    """A second correct reading: reports K itself as the evidence of a missing division."""
    answer = lesson01.diagnose_run(artefact)
    if answer.cause == "missing_division":
        return Diagnosis(answer.cause, artefact["config"]["accum_steps"])
    return answer


def memorised_missing_division(artefact):
    """Memorised: every run is a missing division, whatever its log shows."""
    return Diagnosis("missing_division", 4.0)


def by_clip_rate(artefact):
    """The threshold-dependent reading: a clip that fires on every step must be a missing / K."""
    log, c = artefact["log"], artefact["config"]["max_grad_norm"]
    rate = sum(r["grad_norm"] > c for r in log) / len(log)
    if rate > 0.9:
        return Diagnosis("missing_division", artefact["config"]["accum_steps"])
    return lesson01.diagnose_run(artefact)


def ratio_is_not_one(artefact):
    """Any change under the split is taken for a missing / K (misses lesson 07's look-alike)."""
    k = artefact["config"]["accum_steps"]
    ratio = artefact["split_test"][k] / artefact["split_test"][1]
    if abs(ratio - 1) > 0.1:
        return Diagnosis("missing_division", ratio)
    return lesson01.diagnose_run(artefact)


def cause_without_evidence(artefact):
    """Right cause, no evidence: the checker wants what shows it."""
    return Diagnosis(lesson01.diagnose_run(artefact).cause, None)


# =================================================================================================
# Lesson 02 (eos): stop_token_ids, diagnosis_exercise, collate_keep_eos
# =================================================================================================

def stop_ids_by_token_scan(tokenizer):
    """A second correct answer: tokenize the whole rendering and scan from the answer's last token."""
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "zebra"},
                {"role": "user", "content": "b"}]
    enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    answer = tokenizer("zebra", add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(enc)) if enc[i:i + len(answer)] == answer) + len(answer)
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    eot = next(t for t in enc[start:] if t in special)
    return list(dict.fromkeys([tokenizer.eos_token_id, eot]))


def only_the_eos(tokenizer):
    """Stops on the tokenizer's eos only: a chat model ends its turn with another token."""
    return [tokenizer.eos_token_id]


def hard_coded_im_end(tokenizer):
    """Hard-codes <|im_end|>: right for Qwen, wrong for a family with another end-of-turn token."""
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]


def only_the_end_of_turn(tokenizer):
    """Drops the tokenizer's eos: a plain-text continuation no longer stops."""
    return [tokenizer.convert_tokens_to_ids(lesson02.end_of_turn_token(tokenizer))]


def the_turn_opener(tokenizer):
    """Takes <|im_start|>, the turn *opener*, for the token that ends a turn."""
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")]


def diagnose_generations_other_order(artefact):
    """A second correct answer: graded span first, padding look-alike by the rows, all rows as evidence."""
    gens, cfg = artefact["generations"], artefact["generate_config"]
    stop = artefact["end_of_turn_token"] if artefact["format"] == "chat" else artefact["eos_token"]
    if not any(stop in row for row in artefact["graded_span"]):
        cause = "pad_equals_eos" if artefact["pad_token"] == stop and artefact["format"] == "plain" \
            else "stop_token_not_graded"
        return Diagnosis(cause, stop)
    if not cfg["attention_mask_passed"]:
        longest = max(len(g["prompt_tokens"]) for g in gens)
        return Diagnosis("left_padding_without_mask",
                         [i for i, g in enumerate(gens) if len(g["prompt_tokens"]) < longest])
    if stop not in cfg["eos_tokens"]:
        return Diagnosis("wrong_stop_ids", stop)
    return Diagnosis("max_new_tokens_too_small", cfg["max_new_tokens"])


def always_wrong_stop_ids(artefact):
    """Memorised: every run that does not stop has the wrong stop ids."""
    return Diagnosis("wrong_stop_ids", artefact["end_of_turn_token"])


def always_stop_token_not_graded(artefact):
    """Memorised: every run that does not stop never saw its stop token graded."""
    return Diagnosis("stop_token_not_graded", artefact["end_of_turn_token"])


def _never_pad_eos(artefact):
    """Never suspects pad == eos: takes that look-alike for an ungraded stop token."""
    truth = lesson02.diagnose_generations(artefact)
    if truth.cause == "pad_equals_eos":
        return Diagnosis("stop_token_not_graded", truth.evidence)
    return truth


def _ignores_padding(artefact):
    """Calls every run that does not stop a graded-span bug: misses lesson 03's look-alike."""
    truth = lesson02.diagnose_generations(artefact)
    if truth.cause == "left_padding_without_mask":
        return Diagnosis("stop_token_not_graded", artefact["end_of_turn_token"])
    return truth


def _wrong_evidence(artefact):
    """Right cause, but "row 0" as the evidence, whatever the run shows."""
    truth = lesson02.diagnose_generations(artefact)
    return Diagnosis(truth.cause, "row 0")


def collate_left(examples, pad_token_id):
    """A second correct answer: left padding."""
    width = max(len(e["input_ids"]) for e in examples)
    rows = [(width - len(e["input_ids"]), list(e["input_ids"]), list(e.get("labels", e["input_ids"])))
            for e in examples]
    return {"input_ids": torch.tensor([[pad_token_id] * k + ids for k, ids, _ in rows]),
            "attention_mask": torch.tensor([[0] * k + [1] * len(ids) for k, ids, _ in rows]),
            "labels": torch.tensor([[IGNORE_INDEX] * k + labels for k, _, labels in rows])}


def collate_pad_id_then_first_eos(examples, pad_token_id):
    """A third correct answer, the common fix: mask by pad id, then restore the first eos of each row."""
    batch = lesson02.collate_keep_eos(examples, pad_token_id)
    labels = batch["input_ids"].clone()
    for i, e in enumerate(examples):
        if "labels" in e:
            labels[i, :len(e["labels"])] = torch.tensor(e["labels"])
    labels[batch["input_ids"] == pad_token_id] = IGNORE_INDEX
    for i, e in enumerate(examples):
        eos_id = e["input_ids"][-1]
        first = int((batch["input_ids"][i] == eos_id).nonzero()[0, 0])
        labels[i, first] = eos_id
        labels[i, first + 1:] = IGNORE_INDEX
    batch["labels"] = labels
    return batch


def _pad_id_masking(examples, pad):
    """Masks by pad id, as transformers' collator does: with pad == eos, the eos is masked too."""
    batch = lesson02.collate_keep_eos(examples, pad)
    batch["labels"] = batch["input_ids"].clone()
    batch["labels"][batch["input_ids"] == pad] = IGNORE_INDEX  # transformers' collator: by id
    return batch


def _ignores_prompt_mask(examples, pad):
    """Builds labels from input_ids: the example's own prompt mask is overwritten."""
    return lesson02.collate_keep_eos([{"input_ids": e["input_ids"]} for e in examples], pad)


def _trains_padding(examples, pad):
    """Labels the padding positions: the model is trained to write pad after pad."""
    batch = lesson02.collate_keep_eos(examples, pad)
    batch["labels"] = torch.where(batch["attention_mask"] == 1, batch["labels"], batch["input_ids"])
    return batch


def _keeps_last_eos(examples, pad):
    """Keeps the row's *last* eos (a pad, when pad == eos) instead of its first."""
    batch = lesson02.collate_keep_eos(examples, pad)
    batch["labels"][:, -1] = batch["input_ids"][:, -1]
    return batch


def _all_ones_mask(examples, pad):
    """An all-ones attention mask: the real tokens attend to the padding."""
    batch = lesson02.collate_keep_eos(examples, pad)
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    return batch


# =================================================================================================
# Lesson 03 (padding): padding_diagnosis, block_mask
# =================================================================================================

def _diagnosis_variant(artefact):
    """A second correct diagnosis: reads the attention mask's first column and the pad positions."""
    batch = artefact["batch"]
    ids, pad = batch["input_ids"], artefact["pad_token_id"]
    if "generated" in artefact:
        short = [r for r in range(len(ids)) if int(ids[r, -1]) == pad]
        if short:
            return Diagnosis("right_padded_generation", short)
        return Diagnosis("never_stops", [r for r, g in enumerate(artefact["generated"])
                                         if not any(t in artefact["stop_ids"] for t in g)])
    if ids.shape[0] == 1:
        pos = batch["position_ids"][0].tolist()
        if pos == list(range(len(pos))):
            cause = "packing_without_position_reset"
        elif "attention_mask" in batch:
            cause = "packing_with_all_ones_mask"
        else:
            cause = "packing_with_cache"
        return Diagnosis(cause, pos.index(0, 1) if 0 in pos[1:] else artefact["cu_seq_lens"][1])
    rows = sorted({int(r) for r in (ids[:, 0] == pad).nonzero().flatten()})
    return Diagnosis("left_padding_without_mask", rows) if rows else Diagnosis("no_leak", None)


def _always_left_padding(artefact):
    """Memorised: every incident is left padding without a mask, row 0."""
    return Diagnosis("left_padding_without_mask", [0])


def _mask_means_safe(artefact):
    """Misconception: 'the attention_mask was passed, so generation is fine' -> blames the model."""
    truth = lesson03.diagnose_padding_incident(artefact)
    if truth.cause == "right_padded_generation":
        return Diagnosis("never_stops", [])
    return truth


def _any_pad_leaks(artefact):
    """Misconception: any pad without a mask leaks, whichever side it is on."""
    truth = lesson03.diagnose_padding_incident(artefact)
    if truth.cause == "no_leak":
        ids = artefact["batch"]["input_ids"]
        return Diagnosis("left_padding_without_mask",
                         [r for r in range(len(ids)) if int(ids[r, -1]) == artefact["pad_token_id"]])
    return truth


def _cache_is_harmless(artefact):
    """Misconception: restarted position_ids are enough, whatever the call."""
    truth = lesson03.diagnose_padding_incident(artefact)
    if truth.cause == "packing_with_cache":
        return Diagnosis("no_leak", None)
    return truth


def _mask_by_position_difference(position_ids):
    """A second correct answer: a query at position p sees the p keys before it and itself."""
    batch, length = position_ids.shape
    out = torch.zeros(batch, 1, length, length, dtype=torch.bool)
    for b in range(batch):
        for i in range(length):
            out[b, 0, i, i - int(position_ids[b, i]): i + 1] = True
    return out


def _causal_only(position_ids):
    """A plain causal mask: packed examples attend to the ones before them."""
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return causal.expand(position_ids.shape[0], 1, length, length)


def _blocks_without_causal(position_ids):
    """Blocks only: a token attends to the later tokens of its own example."""
    example = (position_ids == 0).cumsum(-1)
    return (example[:, :, None] == example[:, None, :])[:, None]


def _inverted(position_ids):
    """True where attention is forbidden (the additive-mask reading): the mask is inverted."""
    return ~lesson03.block_mask_from_position_ids(position_ids)


def _boundary_off_by_one(position_ids):
    """Each example's first token joins the previous example: the block boundaries are off by one."""
    example = (position_ids == 0).cumsum(-1)
    example = torch.cat([example[:, :1], example[:, :-1]], dim=-1)  # a first token joins the previous example
    causal = torch.ones(position_ids.shape[-1], position_ids.shape[-1], dtype=torch.bool).tril()
    return ((example[:, :, None] == example[:, None, :]) & causal)[:, None]


def _three_dims(position_ids):
    """[B, T, T] without the head dimension the model expects."""
    return lesson03.block_mask_from_position_ids(position_ids)[:, 0]


# =================================================================================================
# Lesson 04 (templates): generation_template, template_diagnosis
# =================================================================================================

# The same text as Qwen2's template, different marker placement.
_HEAD = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
         "{% if message['role'] == 'assistant' %}")
_TAIL = ("{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
         "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
REFERENCE = (_HEAD + "{{ '<|im_start|>assistant' }}{% generation %}"
             "{{ '\\n' + message['content'] + '<|im_end|>\\n' }}{% endgeneration %}" + _TAIL)
EOT_OUTSIDE = (_HEAD + "{{ '<|im_start|>assistant' }}{% generation %}{{ '\\n' + message['content'] }}"
               "{% endgeneration %}{{ '<|im_end|>\\n' }}" + _TAIL)
HEADER_INSIDE = (_HEAD + "{% generation %}{{ '<|im_start|>assistant\\n' + message['content'] + "
                 "'<|im_end|>\\n' }}{% endgeneration %}" + _TAIL)
AFTER_NEWLINE = (_HEAD + "{{ '<|im_start|>assistant\\n' }}{% generation %}"
                 "{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}" + _TAIL)


def whitespace_control_template():
    """A second correct answer: the same mask, written with whitespace control and a loop-level role test."""
    return (
        "{%- for message in messages %}{%- if loop.first and messages[0]['role'] != 'system' %}"
        "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
        "{%- set is_assistant = message['role'] == 'assistant' %}"
        "{{- '<|im_start|>' + message['role'] }}"
        "{%- if is_assistant %}{% generation %}{{- '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endgeneration %}"
        "{%- else %}{{- '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def unmarked_template():
    """Qwen2's template unchanged: without markers the assistant mask is all zeros."""
    return QWEN2_CHAT_TEMPLATE


def eot_outside():
    """<|im_end|> left outside the markers: the model is never trained to end its turn."""
    return EOT_OUTSIDE


def header_inside():
    """The '<|im_start|>assistant' header inside the markers: the model is trained to write it."""
    return HEADER_INSIDE


def after_newline():
    """The markers open after the header's '\\n': that newline, which TRL's convention trains, is left out."""
    return AFTER_NEWLINE


def content_only():
    """A template that drops the role headers: the text no longer matches the original."""
    return "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def markers_only():
    """A bare {% generation %} tag: the template does not render at all."""
    return "{% generation %}"


def _diagnose_by_rendering_first(setup):
    """A second correct diagnosis: renders with TRL's patched template inside a try, masks first."""
    tok, conv = setup["tokenizer"], setup["conversation"]
    if not setup["assistant_only_loss"]:
        return Diagnosis("whole_sequence_graded", len(tok.apply_chat_template(conv, tokenize=True,
                                                                               return_dict=True)["input_ids"]))
    try:
        template = tok.chat_template if has_generation_markers(tok.chat_template) else \
            get_training_chat_template(tok)
    except ValueError:
        return Diagnosis("refused_exact_match", 0)
    out = assistant_mask(tok, conv, chat_template=template)
    kept = masked_tokens(tok, out["input_ids"], out["assistant_masks"])
    cause = ("markers_mark_nothing" if not kept else
             "trains_correctly" if "<|im_end|>" in kept else "stop_token_not_graded")
    return Diagnosis(cause, len(kept))


def _eyeballs_the_template(setup):
    """Judges by eye: anything that looks like Qwen's template trains correctly."""
    looks_like_qwen = "<|im_start|>" in setup["tokenizer"].chat_template
    return Diagnosis("trains_correctly" if looks_like_qwen else "refused_exact_match", 0)


def _trusts_markers(setup):
    """Trusts any {% generation %} markers, without checking what they mark."""
    if has_generation_markers(setup["tokenizer"].chat_template):
        return Diagnosis("trains_correctly", 0)
    return lesson04.diagnose_template(setup)


def template_cause_as_a_string(setup):
    """Returns a bare cause string instead of a Diagnosis."""
    return "trains_correctly"


def template_evidence_minus_one(setup):
    """Right cause, evidence -1 instead of the number of tokens that carry loss."""
    return Diagnosis(lesson04.diagnose_template(setup).cause, -1)


# =================================================================================================
# Lesson 05 (truncation): diagnose_log, prepare_for_packer
# =================================================================================================

def diagnose_by_lookahead(log):
    """A second correct answer: read `consumed` and `grad_norm` instead of the targets after the NaN."""
    bad = next(i for i, r in enumerate(log) if r["loss"] != r["loss"])
    step = log[bad]["step"]
    if math.isfinite(log[bad]["grad_norm"]) and log[bad]["grad_norm"] == 0.0:
        frozen = len({r["consumed"] for r in log[bad:]}) == 1
        return Diagnosis("clogged_packer" if frozen else "truncated_examples", step)
    if log[bad]["targets"] == 0:
        return Diagnosis("mask_multiplication", step)
    return Diagnosis("learning_rate", step)


def first_nan(log):
    return next(r["step"] for r in log if not math.isfinite(r["loss"]))


def always_clog(log):
    """Memorised: every NaN log is a clogged packer."""
    return Diagnosis("clogged_packer", first_nan(log))


def no_consumed(log):
    """Treats every empty step as truncation: ignores that `consumed` froze."""
    d = lesson05.diagnose_log(log)
    return Diagnosis("truncated_examples" if d.cause == "clogged_packer" else d.cause, d.evidence)


def nan_means_lr(log):
    """Every NaN is a divergence (lesson 06's reflex), even a 0/0 in the loss."""
    d = lesson05.diagnose_log(log)
    return Diagnosis("learning_rate" if d.cause == "mask_multiplication" else d.cause, d.evidence)


def wrong_evidence(log):
    """Right cause, evidence one step late."""
    d = lesson05.diagnose_log(log)
    return Diagnosis(d.cause, d.evidence + 1)


def drop_oversized(examples, row_capacity):
    """A second correct answer: drop what does not fit instead of cropping it."""
    return [e for e in examples if len(e["input_ids"]) <= row_capacity
            and any(label != M for label in e["labels"][1:])]


def crop_only(examples, row_capacity):
    """Crops to the row but keeps the crops that lost every target."""
    return [{"input_ids": e["input_ids"][:row_capacity], "labels": e["labels"][:row_capacity]}
            for e in examples]


def filter_only(examples, row_capacity):
    """Drops the rows without targets but keeps the oversized ones that clog the buffer."""
    return [e for e in examples if any(label != M for label in e["labels"])]


def too_strict(examples, row_capacity):
    """Keeps only short conversations: throws away training data that fits."""
    return [e for e in examples
            if len(e["input_ids"]) < row_capacity // 2 and any(x != M for x in e["labels"])]


def check_before_crop(examples, row_capacity):
    """Checks for targets before cropping: a crop can still lose every target."""
    return [{"input_ids": e["input_ids"][:row_capacity], "labels": e["labels"][:row_capacity]}
            for e in examples if any(label != M for label in e["labels"])]


# =================================================================================================
# Lesson 06 (nan_detective): diagnosis_run, guard
# =================================================================================================

def diagnose_variant(run):
    """A second correct answer: find the first bad step first, then classify it."""
    log = run["log"]
    odd = next(i for i, r in enumerate(log) if r["n_tokens"] == 0 or not math.isfinite(r["grad_norm"])
               or any(not math.isfinite(v[i]) for v in run["activation_max"].values()))
    row = log[odd]
    if row["n_tokens"] == 0:
        return Diagnosis("all_masked_labels" if math.isnan(row["grad_norm"]) else "silent_zero_loss", odd + 1)
    infs = [m for m, v in run["activation_max"].items() if math.isinf(v[odd])]
    return Diagnosis("fp16_overflow", infs[0]) if infs else Diagnosis("learning_rate_too_high", odd + 1)


def zero_loss_means_empty(run):
    """'loss 0.0 = no tokens': every zero or non-finite step is all-masked labels."""
    step = next(r["step"] for r in run["log"] if r["loss"] == 0.0 or not math.isfinite(r["grad_norm"]))
    return Diagnosis("all_masked_labels", step)


def dtype_means_fp16(run):
    """'the config says float16, so it is float16': blames overflow on the dtype alone."""
    if run["config"]["dtype"] == "float16":
        return Diagnosis("fp16_overflow", next(iter(run["activation_max"])))
    return lesson06.diagnose_run(run)


def every_nan_is_the_lr(run):
    """'NaN? lower the learning rate', even when the bad step has no token."""
    step = next(r["step"] for r in run["log"] if r["loss"] == 0.0 or not math.isfinite(r["grad_norm"]))
    return Diagnosis("learning_rate_too_high", step)


def index_not_step(run):
    """Right cause, evidence off by one: the log's index instead of its step."""
    d = lesson06.diagnose_run(run)
    return Diagnosis(d.cause, d.evidence - 1 if isinstance(d.evidence, int) else d.evidence)


def largest_module_not_first(run):
    """The module with the largest value instead of the first one that became inf."""
    d = lesson06.diagnose_run(run)
    if d.cause == "fp16_overflow":
        return Diagnosis(d.cause, list(run["activation_max"])[-1])
    return d


def guard_zeroes(model, control):
    """A second correct answer: zero every gradient in place (AdamW then applies a finite update)."""
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if not bad:
        return None
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    control.should_training_stop = True
    return bad[0].rsplit(".", 1)[0]  # the module's name is accepted too


def isnan_only(model, control):
    """Looks for NaN only: an inf gradient passes the guard."""
    for name, p in model.named_parameters():
        if p.grad is not None and p.grad.isnan().any():
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None


def stops_but_keeps_gradients(model, control):
    """Stops training but keeps the bad gradients: the optimizer still applies them."""
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            control.should_training_stop = True
            return name
    return None


def drops_but_goes_on(model, control):
    """Drops the bad gradients but never stops training."""
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            model.zero_grad(set_to_none=True)
            return name
    return None


def checks_weights(model, control):
    """Checks the weights, still finite before the step: the bad values are in .grad."""
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None


def names_the_last(model, control):
    """Names the last bad parameter instead of the first."""
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad:
        model.zero_grad(set_to_none=True)
        control.should_training_stop = True
        return bad[-1]
    return None


# =================================================================================================
# Lesson 07 (token_weighting): trace_diagnosis, sequence_weighted
# =================================================================================================

def _diagnose_by_ratios(trace):
    """A second correct diagnosis: compares each row's weight with 1/N instead of with each other."""
    rows, world, k = trace["rows"], trace["world_size"], trace["accum_steps"]
    bad = [r for r in rows if not math.isfinite(r["backward_loss"])]
    if bad:
        return Diagnosis("empty_micro_batch", bad[0]["micro_step"])
    n_total = sum(r["n_tokens"] for r in rows)
    ratio = [r["backward_loss"] / r["summed_loss"] / world * n_total for r in rows]  # 1.0 when healthy
    if all(abs(x - 1) < 1e-6 for x in ratio):
        return Diagnosis("token_weighted", None)
    if all(abs(x - ratio[0]) < 1e-6 * ratio[0] for x in ratio):
        return Diagnosis("missing_division_by_k", k)
    worst = rows[ratio.index(max(ratio))]
    return Diagnosis("per_rank_mean", worst["rank"]) if world > 1 else Diagnosis("per_micro_batch_mean",
                                                                                  worst["micro_step"])


def _ignores_world_size(trace):
    """Misconception: forgets DDP's average, so a correct multi-rank step looks W times too large."""
    truth = lesson07.diagnose_accumulation_trace(trace)
    if truth.cause == "token_weighted" and trace["world_size"] > 1:
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _ranks_are_micro_batches(trace):
    """Misconception: a DDP step is just accumulation, so per-rank means are 'per_micro_batch_mean'."""
    truth = lesson07.diagnose_accumulation_trace(trace)
    if truth.cause == "per_rank_mean":
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _unequal_blamed_on_k(trace):
    """Misconception: any too-large step is the missing / K of lesson 01."""
    truth = lesson07.diagnose_accumulation_trace(trace)
    if truth.cause == "missing_division_by_k":
        return Diagnosis("per_micro_batch_mean", 0)
    return truth


def _sequence_weighted_loop(model, micro_batches):
    """A second correct fix: a loop over rows, each row's mean / S."""
    import torch.nn.functional as F

    rows = [(b, r) for b in micro_batches for r in range(len(b["labels"]))
            if (b["labels"][r, 1:] != -100).any()]
    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        loss = 0.0
        for r in range(len(b["labels"])):
            labels = b["labels"][r, 1:]
            if (labels != -100).any():
                loss = loss + F.cross_entropy(logits[r, :-1].float(), labels, ignore_index=-100)
        (loss / len(rows)).backward()


def _token_weighted(model, micro_batches):
    """Per-token weighting (summed / the step's tokens) where per-sequence weighting was asked."""
    n = sum(count_supervised(b) for b in micro_batches)
    for b in micro_batches:
        summed, _ = token_losses(model, b)
        (summed / n).backward()


def _per_micro_batch_sequence_mean(model, micro_batches):
    """Averages sequences inside each micro-batch, then / K: small micro-batches weigh more."""
    import torch.nn.functional as F

    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        labels = b["labels"][:, 1:]
        nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
        n = (labels != -100).sum(1)
        keep = n > 0
        ((nll.sum(1)[keep] / n[keep]).mean() / len(micro_batches)).backward()


def _counts_empty_rows(model, micro_batches):
    """Counts the rows without a supervised token among the sequences: the right direction, too small."""
    import torch.nn.functional as F

    s = sum(len(b["labels"]) for b in micro_batches)
    for b in micro_batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        labels = b["labels"][:, 1:]
        nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
        n = (labels != -100).sum(1)
        (torch.where(n > 0, nll.sum(1) / n.clamp(min=1), 0.0).sum() / s).backward()


def _no_backward(model, micro_batches):
    """Computes nothing and never calls .backward(): no parameter gets a .grad."""
    return None


# =================================================================================================
# Lesson 08 (capstone): fix_setup. Its checker's oracle is the doctor, so course_utils/answers holds no
# reference for it: the reference is the solution notebook's fix_setup.
# =================================================================================================

def fix_setup_reference(config, rows, tokenizer):
    """The reference (solutions/08_capstone.ipynb): TRL's training template, eos, fp32, packing off;
    rename 'gpt' rows and drop the rows whose prompt leaves no room for an answer."""
    config = dict(config, chat_template_path=capstone.trl_training_template_path(), eos_token="<|im_end|>",
                  fp16=False, learning_rate=min(config["learning_rate"], 3e-3), packing=False)
    template = Path(config["chat_template_path"]).read_text(encoding="utf-8")
    fixed = []
    for row in rows:
        messages = [dict(m, role="assistant" if m["role"] == "gpt" else m["role"]) for m in row["messages"]]
        prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True,
                                               chat_template=template, return_dict=True)["input_ids"]
        if len(prompt) < config["max_length"] - 8:
            fixed.append({"messages": messages})
    return config, fixed


def fix_setup_bfd_whole_conversation(config, rows, tokenizer):
    """A second correct answer: keeps packing on with bfd (boundaries kept), drops the fp16 key, sets the
    base rate, and keeps a row only when its whole conversation fits max_length."""
    config = dict(config, chat_template_path=capstone.trl_training_template_path(), eos_token="<|im_end|>",
                  learning_rate=3e-3)
    config.pop("fp16", None)
    if config.get("packing"):
        config["packing_strategy"] = "bfd"
    template = Path(config["chat_template_path"]).read_text(encoding="utf-8")
    fixed = []
    for row in rows:
        messages = [dict(m, role="assistant" if m["role"] == "gpt" else m["role"]) for m in row["messages"]]
        ids = tokenizer.apply_chat_template(messages, chat_template=template, return_dict=True)["input_ids"]
        if len(ids) <= config["max_length"]:
            fixed.append({"messages": messages})
    return config, fixed


def changes_nothing(config, rows, tokenizer):
    """Hands the set-up back unchanged: the doctor's first finding is the rows that say 'gpt'."""
    return config, rows


def assistant_only_loss_off(config, rows, tokenizer):
    """Turns assistant_only_loss off to silence the template error (then trains on the prompts)."""
    return fix_setup_reference(dict(config, assistant_only_loss=False), rows, tokenizer)[:1] + \
        (fix_setup_reference(config, rows, tokenizer)[1],)


def raises_max_length(config, rows, tokenizer):
    """Raises max_length so long prompts fit: breaks the set-up's memory budget."""
    fixed_config, fixed_rows = fix_setup_reference(config, rows, tokenizer)
    return dict(fixed_config, max_length=512), fixed_rows


def keeps_only_100_good_rows(config, rows, tokenizer):
    """Drops the renamed rows and all but 100 of the rest: throws good data away with the broken rows."""
    return fix_setup_reference(config, rows, tokenizer)[0], \
        [x for x in rows if x["messages"][1]["role"] == "assistant"][:100]


def keeps_wrapped_packing(config, rows, tokenizer):
    """Keeps wrapped packing: examples in a packed row attend to each other."""
    fixed_config, fixed_rows = fix_setup_reference(config, rows, tokenizer)
    return dict(fixed_config, packing=True, packing_strategy="wrapped"), fixed_rows


# =================================================================================================
# The tables
# =================================================================================================

def _check_diagnosis_run_twice(fn):
    """Lesson 06's diagnosis on seeds 0-39 first (fixed, whatever COURSE_SEED: the wrong answers below
    were pinned on them), then on the checker's default seeds (what the notebook grades)."""
    result = nd.check_diagnosis_run(fn, seeds=list(range(40)))
    return nd.check_diagnosis_run(fn) if result else result


# id: "<lesson> <checker name without check_>"; run(fn, fx): calls the checker with fn, and fx(name) for each
# pytest fixture it needs (request.getfixturevalue); the reference answer.
CHECKERS = [
    ("00 assistant_only_labels", lambda fn, fx: tour.check_assistant_only_labels(fn, fx("tokenizer")),
     lesson00.assistant_only_labels),
    ("00 label_diagnosis", lambda fn, fx: tour.check_label_diagnosis(fn, fx("tokenizer")),
     lesson00.diagnose_labels),
    ("01 accumulation_step", lambda fn, fx: acc.check_accumulation_step(fn), lesson01.accumulation_step),
    ("01 diagnose_run", lambda fn, fx: acc.check_diagnose_run(fn), lesson01.diagnose_run),
    ("02 stop_token_ids", lambda fn, fx: eos.check_stop_token_ids(fn, fx("tokenizer")),
     lesson02.stop_token_ids),
    ("02 diagnosis_exercise", lambda fn, fx: eos.check_diagnosis_exercise(fn), lesson02.diagnose_generations),
    ("02 collate_keep_eos", lambda fn, fx: eos.check_collate_keep_eos(fn), lesson02.collate_keep_eos),
    ("03 padding_diagnosis", lambda fn, fx: padding.check_padding_diagnosis(fn),
     lesson03.diagnose_padding_incident),
    ("03 block_mask", lambda fn, fx: padding.check_block_mask(fn), lesson03.block_mask_from_position_ids),
    ("04 generation_template", lambda fn, fx: templates.check_generation_template(fn, fx("tokenizer")),
     lesson04.qwen2_training_template),
    ("04 template_diagnosis", lambda fn, fx: templates.check_template_diagnosis(fn, fx("tokenizer")),
     lesson04.diagnose_template),
    ("05 diagnose_log", lambda fn, fx: T.check_diagnose_log(fn), lesson05.diagnose_log),
    ("05 prepare_for_packer", lambda fn, fx: T.check_prepare_for_packer(fn), lesson05.prepare_for_packer),
    ("06 diagnosis_run", lambda fn, fx: _check_diagnosis_run_twice(fn), lesson06.diagnose_run),
    ("06 guard", lambda fn, fx: nd.check_guard(fn), lesson06.guard),
    ("07 trace_diagnosis", lambda fn, fx: tw.check_trace_diagnosis(fn), lesson07.diagnose_accumulation_trace),
    ("07 sequence_weighted", lambda fn, fx: tw.check_sequence_weighted(fn),
     lesson07.accumulate_sequence_weighted),
    ("08 fix_setup", lambda fn, fx: capstone.check_fix_setup(fn), fix_setup_reference),
]
RUN = {name: run for name, run, _ in CHECKERS}
LESSON_MODULES = {"00": tour, "01": acc, "02": eos, "03": padding, "04": templates, "05": T, "06": nd,
                  "07": tw, "08": capstone}

ALSO_CORRECT = [
    ("00 assistant_only_labels", _without_newlines),
    ("00 label_diagnosis", _diagnose_other_order),
    ("01 accumulation_step", lesson01.accumulation_step_token_weighted),
    ("01 accumulation_step", zero_at_the_end),
    ("01 diagnose_run", by_median_and_k),
    ("02 stop_token_ids", stop_ids_by_token_scan),
    ("02 diagnosis_exercise", diagnose_generations_other_order),
    ("02 collate_keep_eos", collate_left),
    ("02 collate_keep_eos", collate_pad_id_then_first_eos),
    ("03 padding_diagnosis", _diagnosis_variant),
    ("03 block_mask", _mask_by_position_difference),
    ("04 generation_template", whitespace_control_template),
    ("04 template_diagnosis", _diagnose_by_rendering_first),
    ("05 diagnose_log", diagnose_by_lookahead),
    ("05 prepare_for_packer", drop_oversized),
    ("06 diagnosis_run", diagnose_variant),
    ("06 guard", guard_zeroes),
    ("07 trace_diagnosis", _diagnose_by_ratios),
    ("07 sequence_weighted", _sequence_weighted_loop),
    ("08 fix_setup", fix_setup_bfd_whole_conversation),
]

WRONG = [
    ("00 assistant_only_labels", _whole, "whole sequence"),
    ("00 assistant_only_labels", _no_stop, "never learn to stop"),
    ("00 assistant_only_labels", _shifted, "shifted by one"),
    ("00 assistant_only_labels", _first_turn_only, "every assistant turn"),
    ("00 label_diagnosis", always_correct, "is not what broke"),
    ("00 label_diagnosis", cause_without_diagnosis, "expected a Diagnosis"),
    ("00 label_diagnosis", counts_every_token, "evidence"),
    ("01 accumulation_step", missing_division, "missing division"),
    ("01 accumulation_step", divided_twice, "divided twice"),
    ("01 accumulation_step", never_zeroes, "stale gradients"),
    ("01 accumulation_step", clips_per_micro_batch, "clipping per micro-batch"),
    ("01 accumulation_step", returns_post_clip_norm, "AFTER clipping"),
    ("01 accumulation_step", clips_after_the_step, "clip once"),
    ("01 diagnose_run", memorised_missing_division, "is not what broke this run"),
    ("01 diagnose_run", by_clip_rate, "the split test"),
    ("01 diagnose_run", ratio_is_not_one, "lesson 07"),
    ("01 diagnose_run", cause_without_evidence, "does not show it"),
    ("02 stop_token_ids", only_the_eos, "you returned only the tokenizer's eos"),
    ("02 stop_token_ids", hard_coded_im_end, "you hard-coded <|im_end|>"),
    ("02 stop_token_ids", only_the_end_of_turn, "keep the tokenizer's eos"),
    ("02 stop_token_ids", the_turn_opener, "turn *opener*"),
    ("02 diagnosis_exercise", always_wrong_stop_ids, "no reply contains the end-of-turn token"),
    ("02 diagnosis_exercise", always_stop_token_not_graded, "the model DOES write the end-of-turn token"),
    ("02 diagnosis_exercise", _never_pad_eos, "which collator built the labels"),
    ("02 diagnosis_exercise", _ignores_padding, "only padded rows are garbled"),
    ("02 diagnosis_exercise", _wrong_evidence, "does not show it"),
    ("02 collate_keep_eos", _pad_id_masking, "you masked by pad *id*"),
    ("02 collate_keep_eos", _ignores_prompt_mask, "overwrote the example's prompt mask"),
    ("02 collate_keep_eos", _trains_padding, "the padding carries labels"),
    ("02 collate_keep_eos", _keeps_last_eos, "you kept the row's *last* eos"),
    ("02 collate_keep_eos", _all_ones_mask, "the attention mask is all ones"),
    ("03 padding_diagnosis", _always_left_padding, "is not what broke this run"),
    ("03 padding_diagnosis", _mask_means_safe, "generate() reads the first new token"),
    ("03 padding_diagnosis", _any_pad_leaks, "causal mask already hides them"),
    ("03 padding_diagnosis", _cache_is_harmless, "is not what broke this run"),
    ("03 block_mask", _causal_only, "plain causal mask"),
    ("03 block_mask", _blocks_without_causal, "AND with the causal mask"),
    ("03 block_mask", _inverted, "True must mean"),
    ("03 block_mask", _boundary_off_by_one, "block boundaries are off"),
    ("03 block_mask", _three_dims, "add the head dimension"),
    ("04 generation_template", unmarked_template, "all zeros"),
    ("04 generation_template", eot_outside, "never be trained to end its turn"),
    ("04 generation_template", header_inside, "header"),
    ("04 generation_template", after_newline, "opens after the '\\n'"),
    ("04 generation_template", content_only, "render the original text exactly"),
    ("04 generation_template", markers_only, "does not render"),
    ("04 template_diagnosis", _eyeballs_the_template, "is not what broke"),
    ("04 template_diagnosis", _trusts_markers, "is not what broke"),
    ("04 template_diagnosis", template_cause_as_a_string, "expected a Diagnosis"),
    ("04 template_diagnosis", template_evidence_minus_one, "evidence"),
    ("05 diagnose_log", always_clog, "is not what broke this run"),
    ("05 diagnose_log", no_consumed, "targets never return"),
    ("05 diagnose_log", nan_means_lr, "0/0 in the loss"),
    ("05 diagnose_log", wrong_evidence, "does not show it"),
    ("05 prepare_for_packer", crop_only, "cropping alone is not the fix"),
    ("05 prepare_for_packer", filter_only, "still there"),
    ("05 prepare_for_packer", too_strict, "training data"),
    ("05 prepare_for_packer", check_before_crop, "cropping alone is not the fix"),
    ("06 diagnosis_run", zero_loss_means_empty, "logged loss of 0.0 is what the Trainer shows"),
    ("06 diagnosis_run", dtype_means_fp16, "float16 storage alone is not evidence"),
    ("06 diagnosis_run", every_nan_is_the_lr, "n_tokens"),
    ("06 diagnosis_run", index_not_step, "does not show it"),
    ("06 diagnosis_run", largest_module_not_first, "does not show it"),
    ("06 guard", isnan_only, "`isnan` misses it"),
    ("06 guard", stops_but_keeps_gradients, "stopping is not enough"),
    ("06 guard", drops_but_goes_on, "should_training_stop = True"),
    ("06 guard", checks_weights, "look at each parameter's .grad"),
    ("06 guard", names_the_last, "name the first one"),
    ("07 trace_diagnosis", _ignores_world_size, "this step is the big batch"),
    ("07 trace_diagnosis", _ranks_are_micro_batches, "DDP averages the ranks' means"),
    ("07 trace_diagnosis", _unequal_blamed_on_k, "the step counts K times"),
    ("07 sequence_weighted", _token_weighted, "long answers dominate"),
    ("07 sequence_weighted", _per_micro_batch_sequence_mean, "a sequence in a small micro-batch counts more"),
    ("07 sequence_weighted", _counts_empty_rows, "right direction"),
    ("07 sequence_weighted", _no_backward, ".backward()"),
    ("08 fix_setup", changes_nothing, "'gpt' is not 'assistant'"),
    ("08 fix_setup", assistant_only_loss_off, "hides the template error"),
    ("08 fix_setup", raises_max_length, "memory budget"),
    ("08 fix_setup", keeps_only_100_good_rows, "only the broken rows"),
    ("08 fix_setup", keeps_wrapped_packing, "attend to each other"),
]

# check_* functions of course_utils that are not exercise checkers.
NOT_EXERCISES = {
    "course_utils.checks.check_diagnosis": "the generic engine every diagnosis checker calls",
    "course_utils.tour.check_environment": "lesson 00's set-up check, not an exercise",
    "course_utils.validate.check_arguments_by_name": "argument validation of the public helpers",
    "course_utils.validate.check_module_arguments": "argument validation of the public helpers",
}
NOT_EXERCISE_MODULES = {"course_utils.doctor": "its check_* are the doctor's checks of a real set-up"}


# =================================================================================================
# The tests
# =================================================================================================

@pytest.fixture
def fx(request):
    """fx(name): the pytest fixture called name, for the checkers that need one (the tokenizer)."""
    return request.getfixturevalue


@pytest.mark.parametrize("name, run, reference", CHECKERS, ids=[row[0] for row in CHECKERS])
def test_reference_is_accepted(name, run, reference, fx, capsys):
    result = run(reference, fx)
    assert result, result.message


@pytest.mark.parametrize("name, run, reference", CHECKERS, ids=[row[0] for row in CHECKERS])
def test_stub_is_rejected_as_not_implemented(name, run, reference, fx, capsys):
    result = run(stub, fx)
    assert not result
    assert result.message.startswith(NOT_IMPLEMENTED), result.message
    assert NOT_IMPLEMENTED in capsys.readouterr().out, "the learner must see it"


@pytest.mark.parametrize("name, answer", ALSO_CORRECT,
                         ids=[f"{name} {answer.__name__}" for name, answer in ALSO_CORRECT])
def test_another_correct_answer_is_accepted(name, answer, fx, capsys):
    result = RUN[name](answer, fx)
    assert result, result.message


@pytest.mark.parametrize("name, wrong, phrase", WRONG,
                         ids=[f"{name} {wrong.__name__}" for name, wrong, _ in WRONG])
def test_wrong_answer_is_rejected_with_its_misconception(name, wrong, phrase, fx, capsys):
    result = RUN[name](wrong, fx)
    assert not result
    assert phrase in result.message, result.message
    assert phrase in capsys.readouterr().out, "the learner must see it"


def test_generation_template_reference_is_the_hand_written_one():
    assert lesson04.qwen2_training_template() == REFERENCE


def test_every_exercise_checker_is_in_the_table():
    found = set()
    for info in pkgutil.iter_modules(course_utils.__path__, "course_utils."):
        if info.name in NOT_EXERCISE_MODULES:
            continue
        module = importlib.import_module(info.name)
        found |= {f"{module.__name__}.{name}" for name, obj in vars(module).items()
                  if name.startswith("check_") and inspect.isfunction(obj)
                  and obj.__module__ == module.__name__}
    assert set(NOT_EXERCISES) <= found, "a skipped name no longer exists: drop it from NOT_EXERCISES"
    listed = {f"{LESSON_MODULES[name[:2]].__name__}.check_{name[3:]}" for name, _, _ in CHECKERS}
    assert found - set(NOT_EXERCISES) == listed
    assert len(listed) == len(CHECKERS), "one row per checker"


def test_every_checker_has_a_second_correct_answer_and_a_wrong_one():
    assert {name for name, _ in ALSO_CORRECT} == set(RUN)
    assert {name for name, _, _ in WRONG} == set(RUN)
    named = [fn for _, fn in ALSO_CORRECT] + [fn for _, fn, _ in WRONG]
    assert all(fn.__name__ != "<lambda>" and fn.__doc__ for fn in named), "each answer says what it pins"
