"""Myth vs measurement: the fine-tuning claims the course touches, each re-measured by code.

Fine-tuning advice travels as claims ("one empty micro-batch makes everything NaN", "set the EOS in
two places"); many hold only for some versions, some models, or not at all. Each entry of
``CLAIMS`` is a short function that runs a small measurement (well under a second or two) on a
shipped course model and returns a ``Result``: the verdict (``true`` / ``false`` / ``depends``),
the numbers it measured, and the condition it holds under. ``CLAIMS.md`` (generated) is the table;
``CLAIMS.json`` holds the committed verdicts per shipped model, and ``tests/test_claims.py`` fails
naming the claim whose verdict moved — a library bump that changes behaviour must be noticed, then
taught.

    python -m tools.claims                 # the current COURSE_MODEL; rewrites CLAIMS.md/.json
    python -m tools.claims --models tiny-qwen tiny-llama

The core helpers are used (losses, training, data, model, quiet), and lesson 05's packer
(``truncation.bestfit_rows``) for the packing claim, so the table measures the packer the lesson
teaches; the lesson named in each row is where the mechanism is taught.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from course_utils import use_course_defaults
from course_utils.data import IGNORE_INDEX, all_masked, collate_right, make_messages, tokenize_chat
from course_utils.losses import (
    count_supervised,
    mean_ignore_index,
    mean_times_mask_all_positions,
    mean_times_mask_ignore_index,
    model_logits,
    params_finite,
)
from course_utils.model import DEFAULT_MODEL, course_model_name, course_seed, load_course_model
from course_utils.quiet import captured_log, quiet_libraries
from course_utils.training import logged, make_sft_trainer, set_seed, train
from course_utils.truncation import bestfit_rows, clog_by_batch_size, percentile, trl_logged_on_pretokenised
from tools import ROOT

VERDICTS = ("true", "false", "depends")
TABLE_MD = ROOT / "CLAIMS.md"
TABLE_JSON = ROOT / "CLAIMS.json"
SITE = "site-packages/"  # citations are paths inside the installed packages


@dataclass
class Result:
    """What one claim's measurement found: ``verdict``, the ``numbers`` behind it, the ``condition``."""

    verdict: str
    numbers: dict
    condition: str


@dataclass
class Claim:
    """One row of the table: the claim as people repeat it, where the course teaches it, and how to
    measure it (``measure(ctx) -> Result``)."""

    number: int
    key: str
    text: str
    lesson: str
    measure: Callable
    source: str = ""  # the library file + function the verdict comes from, when it is the library's


CLAIMS: list[Claim] = []


def claim(number: int, key: str, text: str, lesson: str, source: str = ""):
    """Register ``fn`` as claim ``number`` (a decorator)."""

    def register(fn):
        CLAIMS.append(Claim(number, key, text, lesson, fn, source))
        return fn

    return register


# ---------------------------------------------------------------------------------------------
# Shared, cached inputs: one model load and one set of batches per model per process
# ---------------------------------------------------------------------------------------------


@dataclass
class Context:
    """The shipped model a table is measured on; ``model()`` is a fresh copy each call."""

    model_name: str
    seed: int = 0  # COURSE_SEED: data, LoRA init and Trainer seed move with it; verdicts must not
    _cache: dict = field(default_factory=dict)

    def _base(self):
        if "base" not in self._cache:
            from transformers.utils import logging as hf_logging

            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # "Loading weights" bar: not the table's business
            try:
                self._cache["base"] = load_course_model(self.model_name)
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
        return self._cache["base"]

    def model(self):
        set_seed(self.seed)
        model = copy.deepcopy(self._base()[0])
        model.train()
        return model

    @property
    def tokenizer(self):
        return self._base()[1]

    def examples(self, n: int = 16, seed: int = 0, **kw) -> list[dict]:
        key = ("examples", n, seed, tuple(sorted(kw.items())))
        if key not in self._cache:
            self._cache[key] = [
                tokenize_chat(self.tokenizer, m) for m in make_messages("mixed", n, self.seed + seed, **kw)
            ]
        return self._cache[key]

    def batches(self, batch_size: int = 4, n: int = 16) -> list[dict]:
        ex = self.examples(n)
        return [
            collate_right(ex[i : i + batch_size], self.tokenizer.pad_token_id)
            for i in range(0, n, batch_size)
        ]

    def once(self, key: str, fn: Callable):
        """``fn()`` computed once per context: two claims read the same Trainer run."""
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]


def _grads(model) -> list[torch.Tensor]:
    return [
        p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()
    ]


def _grad_of(model, loss_fn, batch) -> torch.Tensor:
    """The flat gradient of ``loss_fn(logits, labels)`` on ``batch`` (and the model's grads cleared)."""
    model.zero_grad(set_to_none=True)
    loss_fn(model_logits(model, batch), batch["labels"]).backward()
    flat = torch.cat([g.flatten() for g in _grads(model)])
    model.zero_grad(set_to_none=True)
    return flat


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten().float() for p in model.parameters()])


def _distance(a, b) -> float:
    return float((_flat(a) - _flat(b)).norm())


def _error(fn) -> str:
    """``"TypeError: first words…"`` when ``fn()`` raises, else ``"ok"``."""
    try:
        fn()
    except Exception as exc:  # the claim is about which error, so every error is an answer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    return "ok"


def _both(a: bool, b: bool, *, when_a: str = "true", otherwise: str = "false") -> str:
    return when_a if a and b else otherwise


# ---------------------------------------------------------------------------------------------
# The claims (lesson numbers: 00 tour, 01 accumulation/clipping, 02 EOS, 03 padding/packing,
# 04 chat templates, 05 truncation/NaN, 06 NaN detective, 07 token-weighted loss)
# ---------------------------------------------------------------------------------------------


@claim(
    1,
    "all_ignored_mean_is_nan",
    "Mean cross-entropy over a batch whose targets are all ignored is NaN.",
    "05",
    "torch.nn.functional.cross_entropy",
)
def _all_ignored_nan(ctx):
    model, batch = ctx.model(), all_masked(ctx.batches()[0])
    with torch.no_grad():
        logits = model_logits(model, batch)
    loss = float(mean_ignore_index(logits, batch["labels"]))
    # nanochat marks ignored targets -1; torch's default ignore_index is -100
    mismatched = {**batch, "labels": torch.full_like(batch["labels"], -1)}
    err = _error(lambda: F.cross_entropy(logits[:, :-1].flatten(0, 1), mismatched["labels"][:, 1:].flatten()))
    verdict = "true" if math.isnan(loss) and err.startswith("IndexError") else "false"
    return Result(
        verdict,
        {"loss": loss, "labels -1 with default ignore_index": err},
        "F.cross_entropy(reduction='mean') with the matching ignore_index; a mismatched ignore "
        "value is an IndexError instead",
    )


@claim(
    2,
    "one_empty_batch_nan_for_good",
    "One micro-batch with no target makes gradients and weights NaN for good.",
    "05",
    "torch.nn.functional.cross_entropy / nll_loss backward (ignored positions get exact zeros)",
)
def _nan_for_good(ctx):
    healthy, empty = ctx.batches()[0], all_masked(ctx.batches()[1])
    numbers = {}
    model = ctx.model()
    g = _grad_of(model, mean_ignore_index, empty)
    numbers["ignore_index mean: max |grad|"] = float(g.abs().max())
    compiled = torch.compile(mean_ignore_index, backend="aot_eager")  # AOT autograd, no C++ build
    numbers["ignore_index mean compiled (aot_eager): max |grad|"] = float(
        _grad_of(model, compiled, empty).abs().max()
    )
    # the loop people write: cross_entropy(reduction="none", ignore_index) * mask, / mask.sum() = 0
    g = _grad_of(model, mean_times_mask_ignore_index, empty)
    numbers["ignore_index per token x mask: max |grad|"] = float(g.abs().max())
    # the per-token loss at every position (labels clamped to a stand-in id), then the same mask
    g = _grad_of(model, mean_times_mask_all_positions, empty)
    numbers["all positions x mask: NaN grad entries %"] = 100 * float(g.isnan().float().mean())
    runs = {}
    for name, fn in (
        ("ignore_index mean", mean_ignore_index),
        ("ignore_index per token x mask", mean_times_mask_ignore_index),
        ("all positions x mask", mean_times_mask_all_positions),
    ):
        m = ctx.model()
        rec = train(m, [empty, healthy, healthy], steps=3, lr=1e-3, loss_fn=fn, progress=False)
        runs[name] = rec[-1]["weights_finite"]
        numbers[f"{name}: weights finite after 2 healthy steps"] = runs[name]
    ok = (
        numbers["ignore_index mean: max |grad|"] == 0
        and numbers["ignore_index mean compiled (aot_eager): max |grad|"] == 0
        and numbers["ignore_index per token x mask: max |grad|"] == 0
        and runs["ignore_index mean"]
        and runs["ignore_index per token x mask"]
        and not runs["all positions x mask"]
    )
    return Result(
        "depends" if ok else "true",
        numbers,
        "what decides it is the per-token loss's backward at ignored positions, not the mask: false for "
        "F.cross_entropy(ignore_index), its mean or reduction='none' times the mask and / mask.sum() = 0 "
        "(NaN loss, gradients exactly 0; also torch.compile(backend='aot_eager')); true for a per-token loss "
        "computed at every position (log_softmax().gather() on labels.clamp(min=0)) then masked: s/0's "
        "backward sends 0 * inf = NaN, which that loss passes on; AdamW lr 1e-3",
    )


@claim(
    3,
    "packed_nan_small_batch",
    'NaN "from step 1" in a packed SFT run is caused by a small device batch size.',
    "05",
)
def _packed_nan(ctx):
    # nanochat's set-up (lesson 05, Optional: nanochat's best-fit packer): rows of max_seq_len + 1 tokens,
    # conversations cut only at a render cap 4x the row, a best-fit buffer of 100, a fixed number of rows
    # per optimizer step (total_batch_size) with gradient accumulation, and the log showing the last
    # micro-batch of each step
    with captured_log("transformers"):  # "longer than the model's maximum": only tokenized, never run here
        examples = ctx.examples(400, seed=1, context_words=20, long_tail=True)
    lengths = [len(e["input_ids"]) for e in examples]
    max_seq_len = percentile(lengths, 60)  # ~40 % of conversations longer than a row, as in issue 590
    rows_per_step = 32  # runcpu.sh: total_batch_size 16384 / max_seq_len 512
    packed = bestfit_rows(examples, row_capacity=max_seq_len + 1, n_rows=512,
                          pad_id=ctx.tokenizer.pad_token_id, render_cap=4 * max_seq_len, buffer_size=100)
    numbers = {
        "row capacity": max_seq_len + 1,
        "longer than a row %": 100 * sum(n > max_seq_len + 1 for n in lengths) / len(lengths),
        "rows per step": rows_per_step,
    }
    first_nan, clog_rows = {}, set()
    for batch_size in (1, 2, 4, 8, 16):
        m = clog_by_batch_size(packed, device_batch_size=batch_size, rows_per_step=rows_per_step)
        first_nan[batch_size] = m["first_nan_step"]
        clog_rows.add(m["first_empty_row"])
        numbers[f"device batch {batch_size}: first logged NaN step"] = m["first_nan_step"]
    numbers["first all-padding row (every batch size)"] = clog_rows.pop() if len(clog_rows) == 1 else None
    same = numbers["first all-padding row (every batch size)"] is not None and (
        max(first_nan.values()) - min(first_nan.values()) <= 1
    )
    return Result(
        "false" if same else "depends",
        numbers,
        "nanochat's best-fit packer (no cropping, buffer 100, render cap 4x the row), 32 rows per step, "
        "device "
        "batch 1..16 with accumulation, the log showing the last micro-batch: the buffer clogs at the same "
        "row "
        "for every batch size and the first logged NaN moves by at most one step; what decides it is "
        "max_seq_len below the render cap (and NaN from step 1 when one step holds the clog row)",
    )


def _accum_runs(
    ctx, *, optimizer: str, lr_divided: float, lr_undivided: float, steps=3, k=4, max_grad_norm=None
):
    batches = ctx.batches(batch_size=2, n=2 * k)  # the same K micro-batches every step: only the weights move
    out = []
    for divide, lr in ((True, lr_divided), (False, lr_undivided)):
        m = ctx.model()
        rec = train(
            m,
            batches,
            steps=steps,
            accum_steps=k,
            lr=lr,
            optimizer=optimizer,
            divide_by_accum=divide,
            max_grad_norm=max_grad_norm,
            progress=False,
        )
        out.append((m, rec))
    return out


@claim(
    4,
    "missing_div_k_is_k_lr",
    "Forgetting `loss / K` under gradient accumulation equals a K-times learning rate.",
    "01",
)
def _k_lr(ctx):
    k, lr, base = 4, 1e-2, ctx.model()
    (a, _), (b, _) = _accum_runs(ctx, optimizer="sgd", lr_divided=k * lr, lr_undivided=lr, k=k)
    sgd_rel = _distance(a, b) / _distance(a, base)
    (a, _), (b, _) = _accum_runs(ctx, optimizer="adamw", lr_divided=k * 1e-3, lr_undivided=1e-3, k=k)
    adam_rel = _distance(a, b) / _distance(a, base)
    numbers = {"SGD: distance / update": sgd_rel, "AdamW: distance / update": adam_rel, "K": k}
    verdict = "depends" if sgd_rel < 1e-4 and adam_rel > 0.3 else "true" if adam_rel < 1e-4 else "false"
    return Result(
        verdict,
        numbers,
        "true for SGD (identical weights), false for AdamW (Adam divides the "
        "gradient's scale away; a K-times lr moves the weights about K times as far); 3 steps, K=4",
    )


@claim(
    5,
    "clip_threshold_sets_update",
    "Under gradient clipping the update size is set by the threshold, not by the learning rate.",
    "01",
)
def _clip_sets_update(ctx):
    batches, base = ctx.batches(batch_size=4), ctx.model()
    moved, rates = {}, {}
    for lr in (1e-3, 2.5e-4):
        m = ctx.model()
        rec = train(m, batches, steps=4, lr=lr, max_grad_norm=1e-3, progress=False)  # clips on every step
        moved[lr], rates[lr] = _distance(m, base), sum(r["clipped"] for r in rec) / len(rec)
    ratio = moved[1e-3] / moved[2.5e-4]
    numbers = {
        "moved at lr": moved[1e-3],
        "moved at lr/4": moved[2.5e-4],
        "ratio": ratio,
        "clip rate": min(rates.values()),
    }
    verdict = "false" if min(rates.values()) == 1 and ratio > 2 else "true"
    return Result(
        verdict,
        numbers,
        "AdamW, max_grad_norm far below the gradient norm (clips 100 %), 4 steps: "
        "the distance moved scales with the learning rate",
    )


@claim(
    6,
    "missing_div_k_clips_every_step",
    "With `max_grad_norm=1.0` a missing `/K` shows as a clip that fires on every step.",
    "01",
)
def _clip_every_step(ctx):
    k = 4
    probe = train(ctx.model(), ctx.batches(batch_size=2, n=2 * k), steps=3, accum_steps=k, lr=1e-5,
                  progress=False)
    norms = [r["grad_norm"] for r in probe]  # the correct (divided) gradient norms of this run
    numbers = {"correct grad norm, min..max": (min(norms), max(norms))}
    # below every correct norm / above every correct norm but below every undivided (K x) one
    low, mid = min(1.0, min(norms) / 2), math.sqrt(max(norms) * k * min(norms))
    for name, t in (("threshold below the correct norm", low), ("threshold between norm and K x norm", mid)):
        (a, ra), (b, rb) = _accum_runs(
            ctx, optimizer="adamw", lr_divided=1e-5, lr_undivided=1e-5, k=k, max_grad_norm=t
        )
        numbers[f"{name}: clip rate /K, no /K"] = (
            sum(r["clipped"] for r in ra) / len(ra),
            sum(r["clipped"] for r in rb) / len(rb),
        )
        numbers[f"{name}: weight distance"] = _distance(a, b)
    low_rates = numbers["threshold below the correct norm: clip rate /K, no /K"]
    mid_rates = numbers["threshold between norm and K x norm: clip rate /K, no /K"]
    # "depends" needs a threshold that separates the two runs: only possible when max/min < K
    verdict = "depends" if low_rates == (1.0, 1.0) and mid_rates == (0.0, 1.0) else "true"
    return Result(
        verdict,
        numbers,
        "AdamW lr 1e-5, K=4, the same 4 micro-batches for 3 steps: when the correct gradient norm "
        "already exceeds the threshold "
        "both runs clip on 100 % of steps and end (nearly) identical; only a threshold between the "
        "correct and the undivided norm tells them apart",
    )


def _keep_first_targets(batch: dict, m: int) -> dict:
    """The batch with only its first ``m`` targets kept (in reading order), the rest -100."""
    labels = batch["labels"].clone()
    flat = labels[:, 1:].flatten()
    idx = (flat != IGNORE_INDEX).nonzero().flatten()[m:]
    flat[idx] = IGNORE_INDEX
    labels[:, 1:] = flat.view(labels.shape[0], -1)
    return {**batch, "labels": labels}


@claim(
    7,
    "div_k_equals_big_batch",
    "Dividing each micro-batch's mean loss by K makes accumulation equal one big batch.",
    "07",
)
def _div_k_big_batch(ctx):
    model, micro = ctx.model(), ctx.batches(batch_size=2, n=8)

    def compare(batches):
        accumulated = sum(_grad_of(model, mean_ignore_index, b) for b in batches) / len(batches)
        width = max(b["input_ids"].shape[1] for b in batches)
        big = {
            k: torch.cat([F.pad(b[k], (0, width - b[k].shape[1]), value=v) for b in batches])
            for k, v in (
                ("input_ids", ctx.tokenizer.pad_token_id),
                ("attention_mask", 0),
                ("labels", IGNORE_INDEX),
            )
        }
        full = _grad_of(model, mean_ignore_index, big)  # token-weighted mean over the whole step
        return float((accumulated - full).norm() / full.norm())

    counts = [count_supervised(b["labels"]) for b in micro]
    if len(set(counts)) == 1:  # a seed that happens to balance the counts: unbalance one micro-batch
        micro[0] = _keep_first_targets(micro[0], counts[0] // 2)
        counts[0] = counts[0] // 2
    unequal = compare(micro)
    equal = compare([_keep_first_targets(b, min(counts)) for b in micro])
    numbers = {
        "targets per micro-batch": counts,
        "relative gradient difference, these counts": unequal,
        "same with equal counts": equal,
    }
    verdict = "depends" if unequal > 1e-3 and equal < 1e-4 else "true" if unequal < 1e-4 else "false"
    return Result(
        verdict,
        numbers,
        "only when every micro-batch has the same number of target tokens; "
        "otherwise token-weight by the step's total (lesson 07), as transformers >= 4.46 does",
    )


@claim(
    8,
    "eos_in_config_and_generate",
    "The end-of-turn token must be set both in `SFTConfig(eos_token=...)` and in `generate()`.",
    "02",
    "trl/trainer/sft_trainer.py SFTTrainer.__init__ (eos_token -> generation_config.eos_token_id)",
)
def _eos_both(ctx):
    from datasets import Dataset
    from transformers import LogitsProcessor, LogitsProcessorList

    tok = ctx.tokenizer
    end_id = tok.convert_tokens_to_ids("<|im_end|>")

    class ForceEndAt(LogitsProcessor):  # the "model" says <|im_end|> as its 3rd new token
        def __init__(self, start):
            self.start = start

        def __call__(self, input_ids, scores):
            if input_ids.shape[1] - self.start == 2:
                scores[:] = -float("inf")
                scores[:, end_id] = 0
            return scores

    prompt = tok.apply_chat_template(
        make_messages("add", 1)[0][:1], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )

    def new_tokens(model):
        start = prompt["input_ids"].shape[1]
        with torch.no_grad():
            out = model.generate(
                **prompt,
                max_new_tokens=12,
                do_sample=False,
                logits_processor=LogitsProcessorList([ForceEndAt(start)]),
                pad_token_id=tok.pad_token_id,
            )
        return out.shape[1] - start

    model = ctx.model()
    model.eval()
    before = new_tokens(model)
    eos_before = model.generation_config.eos_token_id
    tok_copy = copy.deepcopy(tok)
    trainer = make_sft_trainer(
        model,
        tok_copy,
        Dataset.from_dict({"messages": make_messages("add", 8)}),
        eos_token="<|im_end|>",
        max_steps=1,
        progress=False,
    )
    after = new_tokens(trainer.model.eval())
    numbers = {
        "generation_config eos before": eos_before,
        "after SFTConfig(eos_token='<|im_end|>')": trainer.model.generation_config.eos_token_id,
        "new tokens, generate() without eos: before": before,
        "after": after,
    }
    ids = trainer.model.generation_config.eos_token_id
    wrote = end_id in (ids if isinstance(ids, list) else [ids])
    # the other side: the same run as a LoRA adapter, saved by trainer.save_model() and reloaded on its base
    from peft import LoraConfig, PeftModel, get_peft_model

    lora = get_peft_model(ctx.model(), LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"))
    adapter_trainer = make_sft_trainer(lora, copy.deepcopy(tok), Dataset.from_dict(
        {"messages": make_messages("add", 8)}), eos_token="<|im_end|>", max_steps=1, progress=False)
    directory = tempfile.mkdtemp(prefix="claim8-")
    adapter_trainer.save_model(directory)
    reloaded = PeftModel.from_pretrained(ctx.model(), directory).eval()
    numbers["LoRA adapter: generation_config.json saved"] = os.path.exists(
        os.path.join(directory, "generation_config.json"))
    numbers["reloaded base + adapter: eos"] = reloaded.generation_config.eos_token_id
    numbers["new tokens, generate() without eos: reloaded adapter"] = adapter_after = new_tokens(reloaded)
    full_ok = wrote and after == 3 and before == 12
    return Result(
        "depends" if full_ok and adapter_after == before else "false" if full_ok else "true",
        numbers,
        "TRL 1.16 writes eos_token into the generation config, so after the run a plain generate() stops at "
        "<|im_end|> (a <|im_end|> forced as the 3rd token), and a full-model save or a merge keeps it; a "
        "LoRA adapter saved by trainer.save_model() has no generation_config.json, and base + adapter "
        "reloaded generate with the base's eos again (lesson 10)",
    )


@claim(
    9,
    "right_pad_no_mask_harmless",
    "Right padding without an attention mask is harmless for a training forward.",
    "03",
)
def _right_pad(ctx):
    model, tok = ctx.model().eval(), ctx.tokenizer
    ids = torch.tensor([ctx.examples()[0]["input_ids"]])
    pad = torch.full((1, 6), tok.pad_token_id)
    with torch.no_grad():
        alone = model(input_ids=ids).logits
        right = model(input_ids=torch.cat([ids, pad], 1)).logits[:, : ids.shape[1]]
        left = model(input_ids=torch.cat([pad, ids], 1)).logits[:, pad.shape[1] :]
        left_mask = torch.cat([torch.zeros_like(pad), torch.ones_like(ids)], 1)
        left_masked = model(input_ids=torch.cat([pad, ids], 1), attention_mask=left_mask).logits[
            :, pad.shape[1] :
        ]
    numbers = {
        "right pad, no mask: max |dlogit|": float((right - alone).abs().max()),
        "left pad, no mask": float((left - alone).abs().max()),
        "left pad with mask": float((left_masked - alone).abs().max()),
    }
    harmless = numbers["right pad, no mask: max |dlogit|"] < 1e-4 and numbers["left pad, no mask"] > 1e-2
    return Result(
        "true" if harmless else "false",
        numbers,
        "causal attention: real tokens never see pads on their right (labels of pads must still be "
        "-100); left padding without a mask is not harmless",
    )


def _collate_hf(collator, examples):
    feats = [
        {"input_ids": e["input_ids"], "attention_mask": e["attention_mask"], "labels": e["labels"]}
        for e in examples
    ]
    return collator(feats)


@claim(
    10,
    "lm_collator_fixes_masked_labels",
    "`DataCollatorForLanguageModeling` fixes all-`-100` labels.",
    "02",
    "transformers/data/data_collator.py DataCollatorForLanguageModeling.torch_call",
)
def _lm_collator(ctx):
    from transformers import DataCollatorForLanguageModeling

    ex = ctx.examples()[0]
    masked = {**ex, "labels": [IGNORE_INDEX] * len(ex["labels"])}
    out = _collate_hf(DataCollatorForLanguageModeling(ctx.tokenizer, mlm=False), [ex, masked])
    numbers = {
        "normal example: targets before": count_supervised(torch.tensor([ex["labels"]])),
        "after": count_supervised(out["labels"][:1]),
        "all-masked example: after": count_supervised(out["labels"][1:]),
        "tokens in the example": len(ex["input_ids"]),
    }
    discards = (
        numbers["after"] > numbers["normal example: targets before"]
        and numbers["all-masked example: after"] > 0
    )
    return Result(
        "false" if discards else "true",
        numbers,
        "mlm=False rebuilds labels from input_ids: the prompt (and the template's system text) "
        "carries loss again; the all-masked row 'trains' only by discarding the labels",
    )


@claim(
    11,
    "seq2seq_collator_fixes_masked_labels",
    "`DataCollatorForSeq2Seq` fixes all-`-100` labels.",
    "05",
    "transformers/data/data_collator.py DataCollatorForSeq2Seq.__call__",
)
def _seq2seq_collator(ctx):
    from transformers import DataCollatorForSeq2Seq

    ex = ctx.examples()[0]
    masked = {**ex, "labels": [IGNORE_INDEX] * len(ex["labels"])}
    out = dict(_collate_hf(DataCollatorForSeq2Seq(ctx.tokenizer, return_tensors="pt"), [masked]))
    with torch.no_grad():
        loss = float(mean_ignore_index(model_logits(ctx.model(), out), out["labels"]))
    numbers = {"targets after collation": count_supervised(out["labels"]), "loss": loss}
    return Result(
        "false" if numbers["targets after collation"] == 0 and math.isnan(loss) else "true",
        numbers,
        "it pads the labels it is given with -100 and keeps them: nothing to learn, loss NaN",
    )


def _qlora(ctx, compute_dtype=torch.float32):
    from transformers import BitsAndBytesConfig
    from transformers.utils import logging as hf_logging

    set_seed(ctx.seed)
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype
    )
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with quiet_libraries(capture_output=True, python_warnings=False):
            model, _ = load_course_model(ctx.model_name, quantization_config=quant)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model


@claim(12, "qlora_lr_1e3_nan", "A learning rate of 1e-3 or more almost guarantees NaN in a QLoRA run.", "06")
def _qlora_lr(ctx):
    from peft import LoraConfig, get_peft_model

    batches = ctx.batches(batch_size=4)
    numbers, finite_at = {}, {}
    for dtype_name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        base = ctx.once(f"qlora_{dtype_name}", functools.partial(_qlora, ctx, dtype))
        breaks = None
        for lr in (1e-3, 1e-2, 1e-1, 1.0, 10.0):
            with quiet_libraries(capture_output=True, python_warnings=False):
                m = get_peft_model(
                    copy.deepcopy(base),
                    LoraConfig(
                        r=8,
                        lora_alpha=16,
                        lora_dropout=0.0,
                        target_modules="all-linear",
                        task_type="CAUSAL_LM",
                    ),
                )
            rec = train(m, batches, steps=4, lr=lr, progress=False)
            ok = all(math.isfinite(r["loss"]) for r in rec) and params_finite(m, trainable_only=True)
            finite_at[(dtype_name, lr)] = ok
            if not ok:
                breaks = lr
                break
        numbers[f"{dtype_name} compute: finite at 1e-3, 1e-2"] = (
            finite_at[(dtype_name, 1e-3)],
            finite_at.get((dtype_name, 1e-2)),
        )
        numbers[f"{dtype_name}: first lr with NaN in 4 steps (of 1e-3..10)"] = breaks
    # as people state it, over a run rather than 4 steps: lr 1e-3 for 30 steps in fp32 and bf16 compute
    # (fp16 compute runs ~15x slower on a CPU; its 4-step grid above stands for it)
    long_run_ok = True
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        base = ctx.once(f"qlora_{dtype_name}", functools.partial(_qlora, ctx, dtype))
        with quiet_libraries(capture_output=True, python_warnings=False):
            m = get_peft_model(copy.deepcopy(base), LoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"))
        rec = train(m, batches, steps=30, lr=1e-3, progress=False)
        finite = all(math.isfinite(r["loss"]) for r in rec) and params_finite(m, trainable_only=True)
        learned = finite and rec[-1]["loss"] < rec[0]["loss"]
        numbers[f"{dtype_name} compute, lr 1e-3, 30 steps: finite, loss first -> last"] = (
            finite, round(rec[0]["loss"], 2), round(rec[-1]["loss"], 2))
        long_run_ok = long_run_ok and learned
    finite_short = all(finite_at.get((d, lr)) for d in ("fp32", "fp16") for lr in (1e-3, 1e-2))
    return Result(
        "depends" if finite_short and long_run_ok else "true",
        numbers,
        "not on the course models: nf4 QLoRA (bitsandbytes CPU), LoRA r=8 on every linear layer, AdamW, "
        "batch 4 — "
        "lr 1e-3 and 1e-2 stay finite for 4 steps in fp32 and fp16 compute, and lr 1e-3 trains 30 steps in "
        "fp32 "
        "and bf16 compute with the loss falling. What decides it is the model (scale, outlier "
        "activations, and its attention: query and key norms, QK-norm as in Qwen3, bound the attention "
        "logits, and lesson 06 then searches without them), the "
        "dtypes and the run's length; the advice comes from billion-parameter fp16/bf16 runs the course "
        "cannot "
        "run: a threshold to measure on your model (lesson 06 §2b), not a constant",
    )


@claim(13, "fp16_overflows_65504", "`fp16` overflows at 65,504.", "06")
def _fp16_max(ctx):
    values = {v: float(torch.tensor(v).half()) for v in (65504.0, 65519.0, 65520.0)}
    numbers = {f"{v:,.0f} in fp16": values[v] for v in values} | {
        "finfo(float16).max": torch.finfo(torch.float16).max
    }
    ok = values[65519.0] == 65504.0 and math.isinf(values[65520.0])
    return Result(
        "true" if ok else "false",
        numbers,
        "round to nearest: 65,519 rounds down to 65,504, 65,520 and above become inf",
    )


@claim(
    14,
    "checkpointing_reduces_fp16_overflow",
    "Gradient checkpointing reduces fp16 overflow.",
    "06",
    "transformers/modeling_utils.py PreTrainedModel.activation_checkpointing_enable",
)
def _checkpointing(ctx):
    batch = ctx.batches()[0]
    out = {}
    for scale in (1.0, 1e4):  # 1e4: the output layer scaled until logits pass fp16's 65,504
        for ckpt in (False, True):
            m = ctx.model().half()
            m.config.use_cache = False  # a cache is meaningless here, and checkpointing would warn about it
            with torch.no_grad():
                m.get_output_embeddings().weight.mul_(scale)  # tied models scale the input too
            if ckpt:
                m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            loss = mean_ignore_index(model_logits(m, batch), batch["labels"])
            loss.backward()
            out[scale, ckpt] = (float(loss.detach()), torch.cat([g.flatten().float() for g in _grads(m)]))
    numbers, same = {}, True
    for scale, arm in ((1.0, "healthy"), (1e4, "overflowing")):
        (loss0, g0), (loss1, g1) = out[scale, False], out[scale, True]
        bad0, bad1 = int((~g0.isfinite()).sum()), int((~g1.isfinite()).sum())
        diff = float((g0 - g1).nan_to_num(0, 0, 0).abs().max())
        numbers[f"{arm}: fp16 loss without / with"] = (loss0, loss1)
        numbers[f"{arm}: non-finite grads without / with"] = (bad0, bad1)
        numbers[f"{arm}: max |dgrad|"] = diff
        same &= (loss0 == loss1 or (math.isnan(loss0) and math.isnan(loss1))) and bad0 == bad1 and diff == 0
    return Result(
        "false" if same else "true",
        numbers,
        "fp16 weights, one forward+backward, healthy and with "
        "lm_head scaled 1e4: checkpointing recomputes the same activations in the same dtype, so "
        "the same values overflow; it saves memory, not range",
    )


@claim(
    15,
    "bnb_unknown_kwarg_reported",
    "An unknown keyword in a quantisation config is reported.",
    "06",
    "transformers/utils/quantization_config.py BitsAndBytesConfig.__init__ (logger.info 'Unused kwargs')",
)
def _bnb_kwarg(ctx):
    from transformers import BitsAndBytesConfig

    name = "transformers.utils.quantization_config"
    with captured_log(name, level=logging.WARNING) as warned:
        cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_type=torch.float16)  # misspelt: _dtype
    with captured_log(name, level=logging.INFO) as info:
        BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_type=torch.float16)
    numbers = {
        "warnings": len(warned),
        "INFO messages": len(info),
        "compute dtype it holds": str(cfg.bnb_4bit_compute_dtype),
    }
    silent = not warned and info and cfg.bnb_4bit_compute_dtype != torch.float16
    return Result(
        "false" if silent else "true",
        numbers,
        "a misspelt BitsAndBytesConfig field "
        "(bnb_4bit_compute_type) raises nothing and warns nothing: one INFO line, hidden at the "
        "default verbosity; print the config to see what it holds",
    )


def _trainer_run(ctx, nan_inf_filter: bool):
    """A plain transformers Trainer, step 1 fully masked, steps 2-4 healthy.

    Returns the logged losses, the logged grad norms and whether the weights ended finite."""
    from transformers import Trainer, TrainingArguments

    batches = ctx.batches(batch_size=4)
    rows = []
    for b in [all_masked(batches[0])] + batches[1:4]:
        rows += [
            {k: b[k][r] for k in ("input_ids", "attention_mask", "labels")}
            for r in range(b["input_ids"].shape[0])
        ]
    model = ctx.model()
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="claims-"),
        report_to="none",
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=ctx.seed,
        train_sampling_strategy="sequential",
        logging_nan_inf_filter=nan_inf_filter,
    )
    collate = lambda feats: {k: torch.stack([f[k] for f in feats]) for k in feats[0]}  # noqa: E731
    with quiet_libraries(capture_output=True):
        trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collate)
        trainer.train()
    return logged(trainer, "loss"), logged(trainer, "grad_norm"), params_finite(model)


def _fmt_list(xs):
    return [round(x, 3) if math.isfinite(x) else x for x in xs]


@claim(
    16,
    "masked_labels_log_nan_step1",
    "All-`-100` labels make the logged loss NaN from step 1.",
    "05",
    "transformers/trainer.py Trainer._run_epoch (logging_nan_inf_filter) and _maybe_log_save_evaluate "
    "(`tr_loss -= tr_loss`: NaN - NaN stays NaN)",
)
def _log_nan(ctx):
    default = ctx.once("trainer_filter", lambda: _trainer_run(ctx, True))
    unfiltered = ctx.once("trainer_nofilter", lambda: _trainer_run(ctx, False))
    numbers = {
        "default: logged loss": _fmt_list(default[0]),
        "default: grad_norm": _fmt_list(default[1]),
        "logging_nan_inf_filter=False: logged loss": _fmt_list(unfiltered[0]),
    }
    ok = (
        default[0][0] == 0.0
        and default[1][0] == 0.0
        and all(map(math.isfinite, default[0]))
        and all(math.isnan(x) for x in unfiltered[0])
    )
    return Result(
        "depends" if ok else "true",
        numbers,
        "plain transformers Trainer, step 1 all -100, steps 2-4 healthy, logging_steps=1: false with the "
        "defaults (logged 0.0, grad_norm 0.0); with logging_nan_inf_filter=False NaN from step 1 and on "
        "every later healthy step, because the loss accumulator is reset by subtraction. At a larger "
        "logging_steps (SFTConfig's default 10) the logged loss is the window's mean: no 0.0 shows "
        "(lesson 05 measures it)",
    )


@claim(17, "nan_loss_means_nan_weights", "A NaN loss means the weights are NaN.", "06")
def _nan_weights(ctx):
    losses, norms, finite = ctx.once("trainer_nofilter", lambda: _trainer_run(ctx, False))
    healthy, empty = ctx.batches()[0], all_masked(ctx.batches()[1])
    m = ctx.model()
    rec = train(m, [empty, healthy], steps=2, lr=1e-3, loss_fn=mean_times_mask_all_positions, progress=False)
    numbers = {
        "empty batch, Trainer (ignore_index): logged losses": _fmt_list(losses),
        "empty batch, Trainer: weights finite": finite,
        "empty batch, loss at all positions x mask: losses": _fmt_list([r["loss"] for r in rec]),
        "empty batch, loss at all positions x mask: weights finite": params_finite(m),
    }
    # fp16=True mixed precision: a GradScaler step whose gradient holds an inf is skipped, not applied
    scaled = ctx.model()
    params = [p for p in scaled.parameters() if p.requires_grad]
    opt, scaler = torch.optim.AdamW(params, lr=1e-3), torch.amp.GradScaler("cpu")
    before = _flat(scaled)
    scaler.scale(mean_ignore_index(model_logits(scaled, healthy), healthy["labels"])).backward()
    params[0].grad.view(-1)[0] = float("inf")  # the overflow a float16 backward meets
    scaler.step(opt)
    scaler.update()
    numbers["inf gradient under a GradScaler: weights unchanged"] = bool(torch.equal(before, _flat(scaled)))
    masked_label_nan_is_harmless = math.isnan(losses[-1]) and finite
    other_nan_kills = math.isnan(rec[-1]["loss"]) and not params_finite(m)
    scaler_skips = numbers["inf gradient under a GradScaler: weights unchanged"]
    return Result(
        "depends" if masked_label_nan_is_harmless and other_nan_kills and scaler_skips else "false",
        numbers,
        "false for a masked-label NaN in transformers' Trainer (the loss 0/0 of an empty micro-batch, logged "
        "without the filter, gradients exactly 0: the weights stay finite) and for an overflow under "
        "fp16=True mixed precision (the GradScaler skips the step: the float32 weights stay as they were); "
        "true when the NaN reaches the gradients of a loop without a GradScaler — a per-token loss at every "
        "position times a mask (claim 2), float16 storage with fp16=False (lesson 06, section 1) or a "
        "diverging learning rate: one AdamW step and the weights are NaN",
    )


@claim(18, "grad_norm_spikes_before_nan", "`grad_norm` spikes before a NaN.", "06")
def _grad_spike(ctx):
    losses, norms, _ = ctx.once("trainer_nofilter", lambda: _trainer_run(ctx, False))
    first = next(i for i, x in enumerate(losses) if math.isnan(x))
    numbers = {"masked labels: grad_norm per step": _fmt_list(norms),
               "masked labels: first NaN step": first + 1}
    # a learning-rate divergence: the lowest rate of a grid that turns a 6-step run non-finite
    batches = ctx.batches(batch_size=4)
    healthy_max = max(r["grad_norm"] for r in train(ctx.model(), batches, steps=6, lr=1e-3, progress=False))
    climbed = None
    for lr in (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0):
        rec = train(ctx.model(), batches, steps=6, lr=lr, progress=False)
        finite = [math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rec]
        bad = finite.index(False) if False in finite else None
        if bad is not None:
            before = [r["grad_norm"] for r in rec[:bad]]
            climbed = bool(before) and max(before) > healthy_max
            norms_lr = _fmt_list([r["grad_norm"] for r in rec])
            numbers[f"lr {lr:g} (first diverging): grad_norm per step"] = norms_lr
            numbers["lr 1e-3: largest grad_norm in 6 steps"] = round(healthy_max, 3)
            break
    return Result(
        "depends" if norms[first] == 0.0 and climbed else ("false" if norms[first] == 0.0 else "true"),
        numbers,
        "true for a learning-rate divergence (the norm climbs above the healthy run's largest before the "
        "first "
        "NaN); false for a masked-label NaN (the step with no target has grad_norm exactly 0, the lowest "
        "of the "
        "run) and for an fp16 overflow that is non-finite from its first step (lesson 06, Optional: does the "
        "gradient norm warn you?)",
    )


@claim(
    19,
    "nan_check_trainer_subclass_works",
    'The widely copied "NaN-check Trainer" subclass (override `training_step(model, inputs)`) works.',
    "06",
    "transformers/trainer.py Trainer.__init__ (no `tokenizer=`), Trainer.training_step(model, "
    "inputs, num_items_in_batch)",
)
def _nan_check_trainer(ctx):
    from transformers import Trainer, TrainingArguments

    class NaNCheckTrainer(Trainer):  # as copied from forum answers written for transformers 4.x
        def training_step(self, model, inputs):
            loss = super().training_step(model, inputs)
            if torch.isnan(loss):
                raise RuntimeError("NaN loss")
            return loss

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="claims-"),
        report_to="none",
        max_steps=1,
        per_device_train_batch_size=4,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    b = ctx.batches(batch_size=4)[0]
    rows = [{k: b[k][r] for k in ("input_ids", "attention_mask", "labels")} for r in range(4)]
    collate = lambda feats: {k: torch.stack([f[k] for f in feats]) for k in feats[0]}  # noqa: E731
    numbers = {}
    with quiet_libraries(capture_output=True):
        numbers["1. tokenizer="] = _error(
            lambda: NaNCheckTrainer(model=ctx.model(), args=args, tokenizer=ctx.tokenizer)
        )
        quantised = ctx.once("qlora_fp32", lambda: _qlora(ctx))
        numbers["2. a 4-bit model without adapters"] = _error(
            lambda: NaNCheckTrainer(model=quantised, args=args, processing_class=ctx.tokenizer)
        )
        numbers["3. training_step(model, inputs)"] = _error(
            lambda: NaNCheckTrainer(
                model=ctx.model(),
                args=args,
                processing_class=ctx.tokenizer,
                train_dataset=rows,
                data_collator=collate,
            ).train()
        )
    broken = all(v != "ok" for v in numbers.values())
    return Result(
        "false" if broken else "true",
        numbers,
        "transformers 5.24: three errors in a row; a "
        "TrainerCallback (on_pre_optimizer_step) does the same check and composes with SFTTrainer",
    )


@claim(
    20,
    "trl_template_exact_match",
    "TRL recognises a chat template it can patch for training by exact string match.",
    "04",
    "trl/chat_template_utils.py get_training_chat_template",
)
def _template_exact(ctx):
    from trl.chat_template_utils import get_training_chat_template

    tok = copy.deepcopy(ctx.tokenizer)
    exact = get_training_chat_template(tok)
    tok.chat_template = tok.chat_template + "\n"  # one trailing newline: the same template to a reader
    newline = _error(lambda: get_training_chat_template(tok))
    numbers = {
        "course template: patched": exact is not None and "generation" in exact,
        "with one trailing newline": newline,
    }
    return Result(
        "true" if numbers["course template: patched"] and newline.startswith("ValueError") else "false",
        numbers,
        "TRL 1.16, the Qwen2.5 template (both shipped models use it)",
    )


@claim(
    21,
    "masked_example_contributes_nothing",
    "A fully masked example inside a healthy batch contributes nothing.",
    "05",
)
def _masked_example(ctx):
    model, batch = ctx.model(), ctx.batches()[0]
    extra = {k: torch.cat([v, v[:1]]) for k, v in batch.items()}  # row 0 again, same width…
    extra["labels"][-1] = IGNORE_INDEX  # …with every label masked
    with torch.no_grad():
        loss_a = float(mean_ignore_index(model_logits(model, batch), batch["labels"]))
        loss_b = float(mean_ignore_index(model_logits(model, extra), extra["labels"]))
    ga, gb = _grad_of(model, mean_ignore_index, batch), _grad_of(model, mean_ignore_index, extra)
    numbers = {"|dloss|": abs(loss_a - loss_b), "relative |dgrad|": float((ga - gb).norm() / ga.norm())}
    same = numbers["|dloss|"] < 1e-5 and numbers["relative |dgrad|"] < 1e-5
    return Result(
        "true" if same else "false",
        numbers,
        "a token-weighted mean (ignore_index or TRL's sum / "
        "count): the example adds no target and no count; a per-example mean would dilute the batch",
    )


# --- claims the lessons make beyond the list -----------------------------------------


@claim(
    22,
    "trl_empty_batch_loss_nan",
    "In TRL's `SFTTrainer`, a micro-batch with no trainable token gives a NaN loss.",
    "05",
    "trl/trainer/sft_trainer.py SFTTrainer.compute_loss (`num_items_in_batch` ... `.clamp(min=1)`, "
    "l.1616-1618); "
    "transformers/trainer.py Trainer._get_num_items_in_batch (every micro-batch, l.2343; every rank, "
    "l.2347-2349)",
)
def _trl_clamp(ctx):
    from datasets import Dataset

    # as people meet it: 2 micro-batches per step, one row each — step 1 a full row and an empty one, step 2
    # two empty ones (a pre-tokenised dataset with max_length=None: TRL's drop of fully masked rows does not
    # run)
    full = ctx.examples(4)[0]
    empty_row = {**full, "labels": [IGNORE_INDEX] * len(full["labels"])}
    with quiet_libraries(capture_output=True, python_warnings=False):
        rows = [full, empty_row, empty_row, empty_row]
        run = trl_logged_on_pretokenised(ctx.model(), copy.deepcopy(ctx.tokenizer), rows,
                                         nan_inf_filter=False, accum_steps=2)
    row = collate_right([full], ctx.tokenizer.pad_token_id)
    with torch.no_grad():
        full_mean = float(mean_ignore_index(model_logits(ctx.model(), row), row["labels"]))

    trainer = make_sft_trainer(
        ctx.model(),
        copy.deepcopy(ctx.tokenizer),
        Dataset.from_dict({"messages": make_messages("add", 8)}),
        max_steps=1,
        progress=False,
    )
    b = all_masked(ctx.batches()[0])
    model = trainer.model
    loss = trainer.compute_loss(model, {k: b[k] for k in ("input_ids", "attention_mask", "labels")})
    loss.backward()
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
    numbers = {
        "all-masked batch: loss": float(loss.detach()),
        "all-masked batch: grad norm": norm,
        "step of a full + an empty micro-batch: logged loss": round(run["logged"][0], 4),
        "mean loss of the full row's graded tokens": round(full_mean, 4),
        "step of two empty micro-batches: logged loss, grad_norm": (run["logged"][1], run["grad_norms"][1]),
    }
    # a model class with accepts_loss_kwargs=False (Gemma 4, Qwen2.5-VL, Qwen3-VL): no step count, each
    # micro-batch its own
    flag_off = ctx.model()
    flag_off.accepts_loss_kwargs = False
    with quiet_libraries(capture_output=True, python_warnings=False):
        off = trl_logged_on_pretokenised(flag_off, copy.deepcopy(ctx.tokenizer), rows, nan_inf_filter=False,
                                         accum_steps=2)
    numbers["accepts_loss_kwargs=False: step of a full + an empty micro-batch: logged loss"] = \
        round(off["logged"][0], 4)
    step_mean = math.isclose(run["logged"][0], full_mean, rel_tol=1e-4)
    halved = math.isclose(off["logged"][0], full_mean / 2, rel_tol=1e-4)  # (mean + 0) / K, K = 2
    silent_zero = numbers["all-masked batch: loss"] == 0.0 and norm == 0.0 and run["logged"][1] == 0.0
    return Result(
        "false" if step_mean and silent_zero and halved else "true",
        numbers,
        "for a model class that accepts loss kwargs (Qwen2, Llama, Qwen3 ...) TRL 1.16 divides the "
        "summed loss "
        "by num_items_in_batch — the graded tokens of the whole optimizer step (every micro-batch; "
        "every rank "
        "with average_tokens_across_devices, the default) — clamped to 1: an empty micro-batch inside a step "
        "adds 0 and the step logs the correct mean; only a step with no graded token anywhere logs a silent "
        "0.0 with zero gradients (the plain transformers Trainer gives NaN: claim 16). For a class with "
        "accepts_loss_kwargs=False (Gemma4ForConditionalGeneration, Qwen2_5_VL/Qwen3VL "
        "ForConditionalGeneration) the "
        "Trainer counts nothing: each micro-batch is divided by its own count (clamped: still no "
        "NaN) and the "
        "step by K, so the full + empty step logs half the mean (claim 26)",
    )


@claim(
    23,
    "packing_needs_attention_mask",
    "Packed sequences without an attention mask attend across example boundaries.",
    "03",
    "transformers/masking_utils.py _preprocess_mask_arguments -> find_packed_sequence_indices "
    "(only with no attention_mask and no cache)",
)
def _packing(ctx):
    model = ctx.model().eval()
    a, b = (torch.tensor([e["input_ids"]]) for e in ctx.examples()[:2])
    packed = torch.cat([a, b], 1)
    pos = torch.cat([torch.arange(a.shape[1]), torch.arange(b.shape[1])])[None]
    with torch.no_grad():
        alone = model(input_ids=b).logits
        reset = model(input_ids=packed, position_ids=pos, use_cache=False).logits[:, a.shape[1] :]
        ones = model(
            input_ids=packed, position_ids=pos, attention_mask=torch.ones_like(packed), use_cache=False
        ).logits[:, a.shape[1] :]
    numbers = {
        "reset position_ids, no mask: max |dlogit|": float((reset - alone).abs().max()),
        "reset position_ids, all-ones mask": float((ones - alone).abs().max()),
    }
    ok = (
        numbers["reset position_ids, no mask: max |dlogit|"] < 1e-4
        and numbers["reset position_ids, all-ones mask"] > 1e-2
    )
    return Result(
        "depends" if ok else "true",
        numbers,
        "false with reset position_ids, no attention_mask and no "
        "cache (transformers infers block-diagonal attention); true with an all-ones mask. Measured on "
        "SDPA/eager and a standard decoder: under FlashAttention 2/3 the restarted position_ids are enough "
        "whatever the mask (not measurable on CPU); mRoPE, eager-only and linear-attention / Mamba models "
        "leak whatever the positions (lesson 12)",
    )


@claim(
    24,
    "lm_collator_pad_eos_masks_stop",
    "With `pad_token == eos_token`, `DataCollatorForLanguageModeling` still trains the model to stop.",
    "02",
    "transformers/data/data_collator.py DataCollatorForLanguageModeling.torch_call "
    "(labels[labels == pad_token_id] = -100)",
)
def _pad_eos(ctx):
    from transformers import DataCollatorForLanguageModeling

    tok = ctx.tokenizer
    ids = tok("the words red cat reversed are cat red.", add_special_tokens=False)["input_ids"] + [
        tok.eos_token_id
    ]
    out = DataCollatorForLanguageModeling(tok, mlm=False)([{"input_ids": ids}])
    numbers = {
        "pad == eos": tok.pad_token_id == tok.eos_token_id,
        "label at the final eos": int(out["labels"][0, -1]),
    }
    masked = numbers["pad == eos"] and numbers["label at the final eos"] == IGNORE_INDEX
    return Result(
        "false" if masked else "true",
        numbers,
        "the collator masks every pad id, so the eos that ends "
        "each text is never a target when pad == eos (both shipped tokenizers): "
        "the model never learns to stop",
    )


@claim(
    25,
    "sftconfig_fp32_default",
    "`SFTConfig` trains in full fp32 precision unless told otherwise.",
    "06",
    "trl/trainer/sft_config.py SFTConfig (bf16 default); transformers/training_args.py (bf16 without a GPU)",
)
def _sft_bf16(ctx):
    from trl import SFTConfig

    with quiet_libraries(capture_output=True, python_warnings=False):
        plain = _error(lambda: SFTConfig(output_dir=tempfile.mkdtemp(prefix="claims-"), report_to="none"))
        cfg = SFTConfig(output_dir=tempfile.mkdtemp(prefix="claims-"), report_to="none", use_cpu=True)
    numbers = {f"SFTConfig() here (GPU: {torch.cuda.is_available()})": plain,
               "SFTConfig(use_cpu=True): bf16, fp16": (cfg.bf16, cfg.fp16)}
    return Result(
        "false" if cfg.bf16 else "true",
        numbers,
        "TRL 1.16 defaults bf16=True: bf16 autocast on a GPU; on a machine without one, SFTConfig() "
        "refuses to "
        "build (ValueError: 'Your setup doesn't support bf16/gpu') unless use_cpu=True, which then means CPU "
        "bf16 autocast (~1e-2 relative gradient noise); the course passes bf16=False",
    )


@claim(
    26,
    "sft_accumulation_equals_big_batch",
    "`SFTTrainer`'s gradient accumulation gives the same gradient as one big batch.",
    "07",
    "transformers/trainer.py Trainer.__init__ (model_accepts_loss_kwargs), Trainer._get_num_items_in_batch; "
    "trl/trainer/sft_trainer.py SFTTrainer.compute_loss",
)
def _sft_accumulation(ctx):
    from datasets import Dataset

    from course_utils import token_weighting as tw

    data = Dataset.from_dict({"messages": tw.multi_turn_conversations(8, seed=ctx.seed + 3)})
    step = functools.partial(tw.trainer_step_grad, data, seed=ctx.seed, name_or_path=ctx.model_name)
    with quiet_libraries(capture_output=True, python_warnings=False):
        big = step(per_device_train_batch_size=8, gradient_accumulation_steps=1)
        on = step(per_device_train_batch_size=2, gradient_accumulation_steps=4)
        off = step(per_device_train_batch_size=2, gradient_accumulation_steps=4, accepts_loss_kwargs=False)
    numbers = {
        "2 x 4 vs 8 x 1, relative gradient difference": tw.relative_error(on["grad"], big["grad"]),
        "same, model class with accepts_loss_kwargs=False": tw.relative_error(off["grad"], big["grad"]),
        "classes with the flag off (gemma4, qwen2_5_vl)": tuple(
            c for t in ("gemma4", "qwen2_5_vl")
            for c in tw.loss_count_ignored({"model_type": t, "architectures": [
                {"gemma4": "Gemma4ForConditionalGeneration",
                 "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}[t]]}, gradient_accumulation_steps=4)),
    }
    exact = numbers["2 x 4 vs 8 x 1, relative gradient difference"] < 1e-5
    broken = numbers["same, model class with accepts_loss_kwargs=False"] > 1e-2
    return Result(
        "depends" if exact and broken else "true" if exact else "false",
        numbers,
        "true for a model class that accepts loss kwargs (the Trainer counts the step's graded "
        "tokens, TRL divides "
        "by that count); false for a class with accepts_loss_kwargs=False — "
        "Gemma4ForConditionalGeneration (what "
        "AutoModelForCausalLM loads for gemma4), Qwen2_5_VL/Qwen3VL ForConditionalGeneration: each "
        "micro-batch is divided by its own count and the step by K (lesson 07's per-micro-batch mean); "
        "token_weighting.loss_count_ignored(config) reads it from config.json, and "
        "trainer.model_accepts_loss_kwargs = True after building the trainer restores the count",
    )


@claim(
    27,
    "qwen3_template_trains_every_reasoning",
    "Training on multi-turn conversations with Qwen3's chat template trains every turn's reasoning.",
    "09",
    "trl/chat_templates/qwen3.jinja (last_query_index), qwen3_training.jinja (assistant_only_loss)",
)
def _qwen3_reasoning(ctx):
    from trl.chat_template_utils import qwen3_chat_template

    from course_utils.reasoning import load_reasoning_model, reasoning_budget, reasoning_chats, trained_rows

    _, tok = load_reasoning_model(qwen3_chat_template, ctx.model_name)
    rows = [{"messages": c} for c in reasoning_chats(8, ctx.seed, turns=2)]
    with quiet_libraries(capture_output=True, python_warnings=False):
        default = reasoning_budget(tok, trained_rows(tok, rows))
        training = reasoning_budget(tok, trained_rows(tok, rows, assistant_only_loss=True))
    numbers = {
        "reasoning blocks in the data": 2 * len(rows),
        "TRL defaults (original template): blocks rendered, tokens graded":
            (default["reasoning_blocks"], default["graded_reasoning_tokens"]),
        "assistant_only_loss (training template): blocks rendered, tokens graded":
            (training["reasoning_blocks"], training["graded_reasoning_tokens"]),
    }
    dropped = default["reasoning_blocks"] == len(rows)  # only the last turn's block survives the render
    kept = training["reasoning_blocks"] == 2 * len(rows) and \
        training["graded_reasoning_tokens"] == training["reasoning_tokens"]
    return Result(
        "depends" if dropped and kept else "true" if not dropped else "false",
        numbers,
        "false with the original template (TRL's defaults): it renders reasoning only after the last user "
        "message, so every earlier turn's reasoning is gone before tokenisation; true with "
        "assistant_only_loss=True, where TRL swaps in qwen3_training.jinja and grades every block — on "
        "histories a server never shows (lesson 09, exercise 1: one prompt-completion row per turn)",
    )


@claim(
    28,
    "adapter_generation_config_read",
    "A `generation_config.json` saved beside a LoRA adapter is read when the adapter is loaded.",
    "10",
    "peft/peft_model.py PeftModel.from_pretrained; peft/auto.py AutoPeftModelForCausalLM",
)
def _adapter_generation_config(ctx):
    from peft import AutoPeftModelForCausalLM, LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    base_dir, adapter_dir = tempfile.mkdtemp(prefix="claims-"), tempfile.mkdtemp(prefix="claims-")
    ctx.model().save_pretrained(base_dir)
    peft_model = get_peft_model(ctx.model(), LoraConfig(r=2, target_modules="all-linear"))
    peft_model.peft_config["default"].base_model_name_or_path = base_dir
    peft_model.save_pretrained(adapter_dir)
    marker = 7  # an eos id the base's generation config does not hold
    config = copy.deepcopy(peft_model.generation_config)
    config.eos_token_id = marker
    config.save_pretrained(adapter_dir)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with quiet_libraries(capture_output=True, python_warnings=False):
            via_peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir)
            via_auto = AutoPeftModelForCausalLM.from_pretrained(adapter_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    numbers = {
        "eos in the adapter's generation_config.json": marker,
        "PeftModel.from_pretrained(base, adapter): eos": via_peft.generation_config.eos_token_id,
        "AutoPeftModelForCausalLM.from_pretrained(adapter): eos": via_auto.generation_config.eos_token_id,
    }
    read = [numbers[k] == marker for k in list(numbers)[1:]]
    return Result(
        "depends" if any(read) and not all(read) else "true" if all(read) else "false",
        numbers,
        "both peft loaders build the generation config from the base checkpoint's folder: a "
        "generation_config.json next to adapter_config.json is ignored, so an eos fixed only there is lost; "
        "put it in the base's folder, merge and save the full model, or pass eos_token_id to generate() "
        "(lesson 10)",
    )


@claim(
    29,
    "merge_into_4bit_exact",
    "Merging a LoRA adapter into a 4-bit quantised base gives the same model.",
    "10",
    "peft/tuners/lora/bnb.py Linear4bit.merge (dequantise, add, quantise again)",
)
def _merge_4bit(ctx):
    from peft import LoraConfig, get_peft_model

    batch = ctx.batches()[0]
    change = {}
    for name, base in (("4-bit nf4 base", _qlora(ctx)), ("float32 base", ctx.model())):
        set_seed(ctx.seed)
        lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
        model = get_peft_model(base, lora)  # init_lora_weights=False: a non-zero update, as after training
        # train mode (no dropout here): bitsandbytes 0.50.2's CPU inference path (eval mode, on a CPU with
        # avx512-bf16) repacks 4-bit weights and fails when in_features is not a multiple of 64 (tiny-llama)
        with torch.no_grad():
            before = model_logits(model.train(), batch).float()
            with quiet_libraries(capture_output=True, python_warnings=False):
                merged = model.merge_and_unload()
            change[name] = float((model_logits(merged.train(), batch).float() - before).abs().max())
    numbers = {f"{name}: largest |logit change| from merging": v for name, v in change.items()}
    fp32, four_bit = change["float32 base"], change["4-bit nf4 base"]
    exact_fp32 = fp32 < 1e-3
    inexact = four_bit > 100 * max(fp32, 1e-6)
    return Result(
        ("false" if inexact else "true") if exact_fp32 else "depends",
        numbers,
        "merging into a float32 base is exact to round-off; into a 4-bit base peft dequantises each weight, "
        "adds the update and quantises the sum again, so the merged model is another model (its logits move "
        "by the printed amount): merge into a float16/bfloat16/float32 copy of the base and check the "
        "result (lesson 10)",
    )


@claim(
    30,
    "bf16_save_changes_model",
    "Saving a float32 fine-tune in bfloat16 changes the model.",
    "10",
)
def _bf16_save(ctx):
    model = ctx.model().eval()
    rounded = copy.deepcopy(model).to(torch.bfloat16).to(torch.float32)  # what a bf16 save and a reload keep
    batch = ctx.batches()[0]
    with torch.no_grad():
        ref, got = model_logits(model, batch).float(), model_logits(rounded, batch).float()
    graded = batch["labels"][:, 1:] != IGNORE_INDEX
    ref, got = ref[:, :-1][graded], got[:, :-1][graded]
    kl = float(F.kl_div(F.log_softmax(got, -1), F.log_softmax(ref, -1), log_target=True,
                        reduction="batchmean"))
    numbers = {
        "largest |logit change| (graded positions)": float((got - ref).abs().max()),
        "same top-1 token": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
        "KL to the float32 model (nats/token)": kl,
    }
    changed = numbers["largest |logit change| (graded positions)"] > 0
    return Result(
        "depends" if changed else "false",
        numbers,
        "true bit for bit: every weight is rounded to 8 mantissa bits and the logits move; whether that is a "
        "change that matters depends on the yardstick — compare with the run's own noise (another seed, a "
        "reshuffle) and with the greedy replies, not with zero (lesson 10)",
    )


# ---------------------------------------------------------------------------------------------
# Running the table, comparing it with the committed one, writing CLAIMS.md
# ---------------------------------------------------------------------------------------------


def run_claim(c: Claim, ctx: Context) -> dict:
    """Run one claim; a row of the table (an exception becomes verdict ``error`` with its message)."""
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        res = c.measure(ctx)
        if res.verdict not in VERDICTS:
            raise ValueError(
                f"claim {c.number} returned verdict {res.verdict!r} — the table knows "
                f"{VERDICTS} — return one of them."
            )
        row = {"verdict": res.verdict, "numbers": res.numbers, "condition": res.condition}
    except Exception as exc:  # a claim that cannot run is itself news: the table shows it
        row = {
            "verdict": "error",
            "numbers": {"error": f"{type(exc).__name__}: {exc}"[:200]},
            "condition": "",
        }
    row.update(
        number=c.number,
        key=c.key,
        claim=c.text,
        lesson=c.lesson,
        source=c.source,
        wall_s=round(time.perf_counter() - wall, 2),
        cpu_s=round(time.process_time() - cpu, 2),
    )
    return row


def run_all(model_name: str | None = None, only: list[str] | None = None) -> list[dict]:
    """Every registered claim (or those whose key is in ``only``) measured on one shipped model."""
    ctx = Context(course_model_name(model_name), course_seed())
    chosen = [c for c in sorted(CLAIMS, key=lambda c: c.number) if only is None or c.key in only]
    return [run_claim(c, ctx) for c in chosen]


def verdict_changes(rows: list[dict], expected: dict[str, str]) -> list[str]:
    """One message per claim whose measured verdict differs from ``expected`` (key -> verdict)."""
    messages = []
    for row in rows:
        want = expected.get(row["key"])
        if want is None:
            messages.append(
                f"claim {row['number']} ({row['key']}) is not in the committed table — run "
                "`python -m tools.claims` and commit CLAIMS.md / CLAIMS.json."
            )
        elif row["verdict"] != want:
            messages.append(
                f'claim {row["number"]} ({row["key"]}: "{row["claim"]}") moved: committed '
                f"{want!r}, measured {row['verdict']!r} ({_numbers(row['numbers'])}) — a library "
                "or model change altered what the course teaches — re-read the lesson "
                f"{row['lesson']}, then rerun `python -m tools.claims` and commit."
            )
    return messages


def committed_verdicts(model_name: str, path: Path = TABLE_JSON) -> dict[str, str] | None:
    """The committed verdicts for ``model_name`` (key -> verdict), or None when it has none."""
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("verdicts", {}).get(model_name)


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.3g}" if (v == 0 or 1e-3 <= abs(v) < 1e5) else f"{v:.2e}"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    return str(v)


def _numbers(numbers: dict) -> str:
    return "; ".join(f"{k}: {_fmt(v)}" for k, v in numbers.items())


def _versions() -> str:
    import importlib.metadata as md

    names = ("torch", "transformers", "trl", "peft", "bitsandbytes")
    return ", ".join(f"{n} {md.version(n)}" for n in names)


def write_tables(
    results: dict[str, list[dict]], md_path: Path = TABLE_MD, json_path: Path = TABLE_JSON
) -> None:
    """Merge ``results`` (model -> rows) into CLAIMS.json and regenerate CLAIMS.md from it."""
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    data.setdefault("verdicts", {})
    data.setdefault("rows", {})
    for model_name, rows in results.items():
        data["verdicts"][model_name] = {r["key"]: r["verdict"] for r in rows}
        data["rows"][model_name] = [
            {k: r[k] for k in ("number", "key", "verdict", "numbers", "condition")}
            | {"numbers": _numbers(r["numbers"])}
            for r in rows
        ]
    data["versions"] = _versions()
    json_path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    md_path.write_text(render_markdown(data))


def render_markdown(data: dict) -> str:
    models = sorted(data["rows"], key=lambda m: (m != DEFAULT_MODEL, m))  # the default model first
    claims = {c.key: c for c in CLAIMS}
    out = [
        "# Myth vs measurement",
        "",
        "Generated by `python -m tools.claims` (`make claims`); do not edit by hand. Each row is "
        "a claim people repeat about fine-tuning, re-measured by a short function in "
        "`tools/claims.py` on the course's shipped models, with the lesson that teaches it. "
        "`tests/test_claims.py` fails, naming the claim, when a verdict moves.",
        "",
        f"Measured on: {data['versions']}; models: {', '.join(models)}.",
        "",
        "| # | Claim | " + " | ".join(models) + " | Lesson |",
        "|---|---|" + "---|" * len(models) + "---|",
    ]
    first = data["rows"][models[0]]
    for row in first:
        c = claims.get(row["key"])
        text = c.text if c else row["key"]
        verdicts = [data["verdicts"][m].get(row["key"], "–") for m in models]
        out.append(
            f"| {row['number']} | {text} | "
            + " | ".join(f"**{v}**" for v in verdicts)
            + f" | {c.lesson if c else ''} |"
        )
    out += ["", "## What was measured", ""]
    for row in first:
        c = claims.get(row["key"])
        out.append(
            f"**{row['number']}. {c.text if c else row['key']}** — {row['verdict']}: {row['condition']}."
        )
        if c and c.source:
            out.append(f"Source: `{c.source}`.")
        for m in models:
            other = next((r for r in data["rows"][m] if r["key"] == row["key"]), None)
            if other:
                out.append(f"- {m}: {other['numbers']}")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    use_course_defaults()  # offline, no telemetry: as a lesson runs
    parser = argparse.ArgumentParser(
        description="Re-measure every claim; print the table; write CLAIMS.md/.json."
    )
    parser.add_argument(
        "--models", nargs="*", default=None, help="shipped model names (default: $COURSE_MODEL or tiny-qwen)"
    )
    parser.add_argument("--only", nargs="*", default=None, help="claim keys to run (nothing is written)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not rewrite CLAIMS.md/.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread: the claims run beside the tests, two at a time (see the Makefile)
    results, changed = {}, []
    for name in args.models or [course_model_name()]:
        name = course_model_name(name)
        wall, cpu = time.perf_counter(), time.process_time()
        rows = run_all(name, args.only)
        results[name] = rows
        print(
            f"\n{name}: {len(rows)} claims in {time.perf_counter() - wall:.1f} s wall, "
            f"{time.process_time() - cpu:.1f} s CPU"
        )
        for r in rows:
            print(
                f"{r['number']:>3} {r['verdict']:<8} {r['wall_s']:>5.1f}s {r['cpu_s']:>5.1f}s cpu  "
                f"{r['key']}: {_numbers(r['numbers'])}"
            )
        expected = committed_verdicts(name)
        if expected:
            changed += verdict_changes(rows, expected)
    for message in changed:
        print("CHANGED:", message)
    if not args.no_write and args.only is None:
        write_tables(results)
        print(f"wrote {TABLE_MD.name} and {TABLE_JSON.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
