"""Reference answers of lesson 12 (packing on new architectures), and the generator of exercise 2's set-ups,
whose verdict it *measures* with the probe (the truth is never a name list). The notebook never imports this
module; ``course_utils.exercises.lesson12`` does."""

from __future__ import annotations

import functools
import random

import torch

from ...checks import Diagnosis
from ...packing_arch import pack, packing_leak, tiny_model, tiny_vl_model, with_position_rows

VERDICTS = ("clean", "leaks", "raises")

# Exercise 1's architectures: families the notebook's table does not show (each with an attention
# implementation it supports), healthy and leaking, standard and hybrid.
PROBE_ARCHITECTURES = (("mistral", "sdpa"), ("olmo2", "eager"), ("mpt", "eager"), ("afmoe", "sdpa"),
                       ("falcon_h1", "eager"), ("granitemoehybrid", "sdpa"), ("qwen3_5_text", "eager"))

# Exercise 2's set-ups: (family, attention implementation, collator, mRoPE rows). Look-alikes on purpose: the
# same family clean unpacked and leaking packed, Qwen2.5-VL clean with 4 rows and leaking with 2 or 3,
# Qwen3-VL the other way round for 2-D positions, hybrids leaking with position_ids only and raising with
# metadata.
SETUPS = (
    ("mistral", "sdpa", "flattening", None), ("olmo2", "eager", "trl", None),
    ("qwen2_5_vl", "sdpa", "padded", None), ("qwen2_5_vl", "sdpa", "trl", 4),
    ("qwen3_vl", "sdpa", "flattening", None), ("mpt", "eager", "padded", None),
    ("falcon_h1", "sdpa", "padded", None),
    ("mpt", "eager", "trl", None), ("afmoe", "sdpa", "flattening", None),
    ("qwen2_5_vl", "sdpa", "flattening", None),
    ("qwen3_vl", "sdpa", "trl", 3), ("falcon_h1", "eager", "flattening", None),
    ("granitemoehybrid", "sdpa", "flattening", None), ("qwen3_5_text", "sdpa", "flattening", None),
    ("qwen3_5_text", "eager", "trl", None), ("granitemoehybrid", "eager", "trl", None),
    ("falcon_h1", "sdpa", "trl", None), ("bamba", "sdpa", "trl", None),
)


def _model(family: str, attn: str, seed: int):
    if family in ("qwen2_5_vl", "qwen3_vl"):
        return tiny_vl_model(family, seed=seed)
    return tiny_model(family, attn, seed=seed)


def _samples(rng: random.Random, vocab: int) -> tuple[list[int], list[int]]:
    a = [rng.randrange(5, vocab - 10) for _ in range(rng.randint(12, 40))]
    b = [rng.randrange(5, vocab - 10) for _ in range(rng.randint(8, 30))]
    return a, b


def probe_case(seed: int) -> tuple[object, list[int], list[int], float]:
    """Exercise 1's case of ``seed``: ``(model, a, b, expected max |Δlogit|)`` on an unshown family."""
    rng = random.Random(f"probe-{seed}")
    family, attn = PROBE_ARCHITECTURES[seed % len(PROBE_ARCHITECTURES)]
    model = tiny_model(family, attn, seed=rng.randrange(10_000))
    a, b = _samples(rng, model.config.vocab_size)
    return model, a, b, packed_b_drift(model, a, b)


@torch.no_grad()
def packed_b_drift(model, a: list[int], b: list[int]) -> float:
    """Exercise 1: max |Δlogit| of sample ``b`` packed after ``a`` (positions restarting at 0, no mask, no
    cache: how SFTTrainer calls the model on a padding-free batch) against ``b`` run alone."""
    ids = torch.tensor([a + b])
    positions = torch.tensor([list(range(len(a))) + list(range(len(b)))])
    packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, len(a):]
    alone = model(input_ids=torch.tensor([b]), use_cache=False).logits[0]
    return float((packed - alone).abs().max())


def setup_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """Exercise 2's set-up of ``seed`` and its measured verdict. ``graded`` picks the stream: the shown and
    the graded set-ups draw their weights and samples apart. The artefact: ``model`` (a tiny random model of
    the family), ``features`` (samples A and B, as token-id dicts) and ``batch`` (what the collator built, as
    the trainer would pass it; mRoPE positions already in their rows)."""
    rng = random.Random(f"{'graded' if graded else 'shown'}-setup-{seed}")
    family, attn, collator, rows = SETUPS[seed % len(SETUPS)]
    model = _model(family, attn, rng.randrange(10_000))
    a, b = _samples(rng, model.config.get_text_config().vocab_size)
    features = [{"input_ids": a}, {"input_ids": b}]
    batch = pack(features, collator)
    if rows is not None:
        batch = with_position_rows(batch, rows)
    truth = packing_leak(model, collator, features=features, position_rows=rows).verdict  # measured
    artefact = {"model": model, "features": [{"input_ids": a}, {"input_ids": b}], "batch": batch}
    return artefact, Diagnosis(truth)


@torch.no_grad()
def setup_verdict(setup: dict) -> Diagnosis:
    """Exercise 2: run the set-up's batch as the trainer would; compare sample B with B alone."""
    model, batch = setup["model"], setup["batch"]
    a, b = (f["input_ids"] for f in setup["features"])
    try:
        logits = model(**batch, use_cache=False).logits
    except ValueError:  # transformers refuses boundary metadata it cannot use
        return Diagnosis("raises")
    got = logits[1, :len(b)] if logits.shape[0] == 2 else logits[0, len(a):]
    alone = model(input_ids=torch.tensor([b]), use_cache=False).logits[0]
    drift = float((got - alone).abs().max())
    return Diagnosis("leaks" if drift > 1e-3 * float(alone.abs().max()) else "clean")


# ------------------------------------------------------------------------------------------------
# The self-test (lesson 11): a packed run's evidence as a practitioner gathers it, the cause to name
# ------------------------------------------------------------------------------------------------

SELF_TEST_CAUSES = {
    "mask_without_positions": "the attention mask never saw the packed positions: samples attend across "
                              "the boundary",
    "mixer_ignores_boundaries": "linear-attention / Mamba / conv layers mix tokens across the boundary "
                                "(their torch fallback ignores it)",
    "kernel_refuses_metadata": "the layers refuse TRL's boundary metadata without their CUDA kernels",
    "healthy": "nothing: packed samples stay apart",
}
# (family, attention implementation, collator): each cause's set-ups, look-alikes across causes on purpose
_SELF_TEST_SETUPS = {
    "mask_without_positions": (("gpt_oss", "eager", "trl"), ("opt", "sdpa", "flattening"),
                               ("afmoe", "sdpa", "trl"), ("qwen2_5_vl", "sdpa", "trl")),
    "mixer_ignores_boundaries": (("qwen3_next", "sdpa", "flattening"), ("lfm2", "sdpa", "flattening"),
                                 ("bamba", "eager", "flattening")),
    "kernel_refuses_metadata": (("qwen3_next", "sdpa", "trl"), ("lfm2", "sdpa", "trl"),
                                ("falcon_h1", "eager", "trl")),
    "healthy": (("qwen3", "sdpa", "trl"), ("llama", "eager", "flattening"), ("gpt_oss", "eager", "padded")),
}


@functools.cache
def _self_test_model(family: str, attn: str):
    """One tiny model per (family, attention) for the quiz: built once (a build takes up to a second), each
    draw then costs one probe; the samples vary per draw."""
    return _model(family, attn, 0)


_COLLATOR_NAMES = {"trl": "SFTTrainer padding-free", "flattening": "DataCollatorWithFlattening()",
                   "padded": "right-padded (unpacked)"}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: what a practitioner measures on a packed set-up (the two-sample probe and the
    positions the mask builder received, or the error), its true cause as a plain phrase, and the phrases to
    choose from. The cause is measured by the probe, not assumed."""
    causes = tuple(SELF_TEST_CAUSES)
    cause = causes[seed % len(causes)]
    setups = _SELF_TEST_SETUPS[cause]
    family, attn, collator = setups[(seed // len(causes)) % len(setups)]
    for other in {(f, a) for setups_ in _SELF_TEST_SETUPS.values() for f, a, _ in setups_}:
        _self_test_model(*other)  # the first draw builds them all (a few seconds): every later draw is fast
    model = _self_test_model(family, attn)
    rng = random.Random(f"self-test-{seed}")  # two samples of their own lengths: no two draws alike
    a, b = _samples(rng, model.config.get_text_config().vocab_size)
    result = packing_leak(model, collator, features=[{"input_ids": a}, {"input_ids": b}])
    expected = {"healthy": "clean", "kernel_refuses_metadata": "raises"}.get(cause, "leaks")
    if result.verdict != expected:  # the set-up table is checked against the measurement on every draw
        raise RuntimeError(f"self-test set-up {family}/{attn}/{collator} measured {result.verdict!r}, "
                           f"listed as {cause!r}: move it in _SELF_TEST_SETUPS")
    lines = [f"model_type={family!r}, attn_implementation={attn!r}, batches built by the "
             f"{_COLLATOR_NAMES[collator]} collator.",
             f"Sample B ({len(b)} tokens) after sample A ({len(a)} tokens), against B alone, no cache:"]
    if result.raised:
        lines.append(f"the packed forward raised: {result.raised[:160]}")
    else:
        seen = "None" if result.positions is None else "restarting at 0 for B"
        lines += [f"max |Δlogit| of B = {result.max_delta:.3g} (logit scale ~{result.threshold / 1e-4:.1f}); "
                  f"next-token argmax unchanged on {result.argmax_agreement:.0%} of B's positions",
                  f"position_ids received by the causal-mask builder: {seen}"]
    return "\n".join(lines), SELF_TEST_CAUSES[cause], tuple(SELF_TEST_CAUSES.values())
