"""Lesson 12's helpers (``course_utils.packing_arch``): the tiny models build offline, the collators are the
real ones, ``positions_seen`` reports what the model used, and the probe the doctor will call
(``packing_leak``, ``trl_packing_raises``) is right on healthy and leaking set-ups, fast; bad input is refused
with what/why/fix."""

import pytest
import torch

from course_utils import packing_arch as P


@pytest.fixture(scope="module")
def qwen3():
    return P.tiny_model("qwen3", "sdpa")


def test_healthy_decoders_stay_clean_packed_with_either_collator(qwen3):
    for model in (qwen3, P.tiny_model("llama", "eager")):
        for collator in ("flattening", "trl"):
            result = P.packing_leak(model, collator)
            assert result.verdict == "clean" and result.max_delta < 1e-5 and result.argmax_agreement == 1.0
            assert result.positions is not None, "the mask builder received the positions"


def test_mask_ignoring_families_leak_and_unpacked_rows_do_not():
    for family, attn in (("gpt_oss", "eager"), ("opt", "sdpa")):
        model = P.tiny_model(family, attn)
        leak = P.packing_leak(model, "trl")
        assert leak.verdict == "leaks" and leak.max_delta > 100 * leak.threshold
        assert leak.positions is None, "their mask builder never sees position_ids"
        assert P.packing_leak(model, "padded").verdict == "clean"


def test_hybrids_leak_silently_without_metadata_and_raise_with_it():
    model = P.tiny_model("qwen3_next", "sdpa")
    assert P.packing_leak(model, "flattening").verdict == "leaks"
    raised = P.trl_packing_raises(model)
    assert raised and "can't keep packed sequences apart" in raised
    assert P.packing_leak(model, "trl").verdict == "raises"
    assert P.trl_packing_raises(P.tiny_model("qwen3", "sdpa")) is None


def test_mrope_rows_decide_qwen2_5_vl_and_qwen3_vl():
    vl = P.tiny_vl_model("qwen2_5_vl")
    feats = P.two_samples(240)
    verdict = {rows: P.packing_leak(vl, "flattening", features=feats, position_rows=rows).verdict
               for rows in (None, 3, 4)}
    assert verdict == {None: "leaks", 3: "leaks", 4: "clean"}
    assert P.packing_leak(vl, "padded", features=feats).verdict == "clean", "unpacked Qwen2.5-VL stays clean"
    q3 = P.tiny_vl_model("qwen3_vl")
    assert P.packing_leak(q3, "flattening", features=feats).verdict == "clean"
    assert P.packing_leak(q3, "flattening", features=feats, position_rows=3).verdict == "leaks"


def test_course_weights_in_qwen2_5_vl_are_identical_alone_and_leak_packed(course):
    model, _ = course
    vl = P.in_qwen2_5_vl(model)
    ids = torch.tensor([P.two_samples(model.config.vocab_size)[1]["input_ids"]])
    with torch.no_grad():
        alone, wrapped = (m(input_ids=ids, use_cache=False).logits for m in (model, vl))
        same = torch.equal(alone, wrapped)
    assert same, "identical alone"
    assert P.packing_leak(model, "trl").verdict == "clean"
    assert P.packing_leak(vl, "trl").verdict == "leaks"
    seen = P.positions_seen(vl, P.pack(P.two_samples(model.config.vocab_size), "flattening"))
    assert seen["rotary"].shape[0] == 3 and seen["mask"] is None and seen["mask_called"]


def test_the_llama_course_model_fits_qwen2_5_vl_too():
    from course_utils import load_course_model

    llama, _ = load_course_model("tiny-llama")
    vl = P.in_qwen2_5_vl(llama)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        gap = (llama(input_ids=ids, use_cache=False).logits - vl(input_ids=ids, use_cache=False).logits)
    gap = gap.abs().max()
    assert gap < 1e-5


def test_the_mask_builder_wrapper_is_removed_after_the_call(qwen3):
    import transformers.models.qwen3.modeling_qwen3 as modelling

    before = modelling.create_causal_mask
    P.positions_seen(qwen3, P.pack(P.two_samples(256), "trl"))
    assert modelling.create_causal_mask is before, "nothing changed by a measurement"


def test_the_collators_are_the_real_ones():
    feats = P.two_samples(256, (5, 3))
    flat, trl, padded = (P.pack(feats, c) for c in ("flattening", "trl", "padded"))
    assert flat["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]] and "seq_idx" not in flat
    assert trl["seq_idx"].tolist() == [[0] * 5 + [1] * 3] and trl["cu_seq_lens_q"].tolist() == [0, 5, 8]
    assert padded["attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0]]


@pytest.mark.parametrize("bad_call, phrase", [
    (lambda: P.tiny_model("qwen9"), "is not one of"),
    (lambda: P.tiny_model("qwen3", "flash_attention_2"), "CPU attention"),
    (lambda: P.tiny_vl_model("llava"), "multimodal-RoPE"),
    (lambda: P.two_samples(256, (5,)), "two lengths"),
    (lambda: P.two_samples(8), ">= 16"),
    (lambda: P.pack([{"input_ids": [1, 2]}], "trl"), "at least two"),
    (lambda: P.pack(P.two_samples(256), "wrapped"), "is not one of"),
    (lambda: P.with_position_rows(P.pack(P.two_samples(256), "trl"), 2), "is not one of"),
    (lambda: P.packing_leak("a model"), "model"),
    (lambda: P.positions_seen(P.tiny_model("qwen3"), {"ids": 1}), "input_ids"),
])
def test_bad_input_is_refused_with_what_why_fix(bad_call, phrase):
    with pytest.raises((ValueError, TypeError), match=phrase) as error:
        bad_call()
    assert " — " in str(error.value), "what — why — fix"


def test_in_qwen2_5_vl_refuses_a_model_it_cannot_copy():
    with pytest.raises(ValueError, match="copy one to one") as error:
        P.in_qwen2_5_vl(P.tiny_model("opt", "eager"))
    assert " — " in str(error.value)


def test_position_rows_on_a_padded_batch_is_refused(qwen3):
    with pytest.raises(ValueError, match="for packed batches"):
        P.packing_leak(qwen3, "padded", position_rows=4)


def test_the_display_helpers_refuse_bad_input_and_show_what_they_measure(qwen3):
    feats = P.two_samples(256, (6, 4))
    call = {k: v for k, v in P.pack(feats, "flattening").items()}
    drift = P.drift_by_token(qwen3, call, feats[1]["input_ids"])
    assert drift.shape == (4,) and float(drift.max()) < 1e-5, "B's tokens, each against B alone"
    table = {("qwen3", "sdpa", "flattening"): 1e-6, ("bamba", "sdpa", "trl"): "ValueError: x"}
    text = P.leak_table_text(table)
    assert "ok" in text and "raises" in text
    frame = P.packing_frame("gpt_oss", "sdpa", "flattening")
    assert isinstance(frame, str) and "cannot be built" in frame, "no SDPA path: said, not raised"
    for bad_call, phrase in ((lambda: P.drift_by_token(qwen3, [1, 2], [1]), "call must be"),
                             (lambda: P.drift_by_token(qwen3, call, list(range(5, 20))), "last sample"),
                             (lambda: P.plot_drift_by_token({}, 1e-3), "non-empty dict"),
                             (lambda: P.leak_table_text({"qwen3": 1.0}), "must map"),
                             (lambda: P.packing_frame("qwen9", "sdpa", "trl"), "is not one of")):
        with pytest.raises((ValueError, TypeError), match=phrase) as error:
            bad_call()
        assert " — " in str(error.value)


def test_fits_qwen2_5_vl_says_which_decoders_copy_into_its_language_model():
    """Lesson 12 falls back to tiny-qwen where the course model does not fit (the held-out GPT-NeoX)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from course_utils.packing_arch import fits_qwen2_5_vl

    shape = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                 num_attention_heads=2)
    fits = {kind: fits_qwen2_5_vl(AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **shape)))
            for kind in ("qwen2", "llama", "gpt_neox")}
    assert fits == {"qwen2": True, "llama": True, "gpt_neox": False}
    biased = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", attention_bias=True, **shape))
    assert not fits_qwen2_5_vl(biased), "a Llama with q/k/v/o biases has an o_proj bias Qwen2 lacks"
    with pytest.raises(TypeError, match="torch model"):
        fits_qwen2_5_vl("qwen2")


# ---- issue 42, part 3: the display helpers' remaining silent or raw answers -----------------------------
@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), True, -1.0, None, "0.5"])
def test_leak_table_text_refuses_a_threshold_it_cannot_compare_with(threshold):
    with pytest.raises((TypeError, ValueError), match="threshold=.* — .+ — ") as caught:
        P.leak_table_text({("qwen3", "sdpa", "flattening"): 1e-6}, threshold)
    assert "threshold" in str(caught.value)
    assert "LEAK" in P.leak_table_text({("qwen3", "sdpa", "flattening"): 1e-6}, 0), "0: any drift is a leak"


@pytest.mark.parametrize("b_ids, phrase", [([9, 9], "are not the last 2 tokens"),
                                           ([10 ** 6, 3], "only 256 embeddings")])
def test_drift_by_token_refuses_ids_that_are_not_the_rows_last_sample(qwen3, b_ids, phrase):
    call = {"input_ids": torch.tensor([[1, 2, 3, 4, 5, 6]])}
    with pytest.raises(ValueError, match=phrase) as caught:
        P.drift_by_token(qwen3, call, b_ids)
    assert str(caught.value).count(" — ") >= 2, "what — why — fix"
    assert P.drift_by_token(qwen3, call, [5, 6]).shape == (2,)
