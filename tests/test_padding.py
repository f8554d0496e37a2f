"""Lesson 03 (padding, attention masks, packing): collates, leak measurements, the explorer, and what each
public function refuses (issue 36). The exercises' graders: test_exercises_lesson03.py."""

import pytest
import torch

from course_utils import load_course_model, make_messages, tokenize_chat
from course_utils.padding import (
    allowed_attention,
    alone_logits,
    attention_categories,
    block_causal_mask,
    collate_left,
    collate_packed,
    collate_padded,
    differing_tokens,
    greedy_continuations,
    layout_drifts,
    leak_counts,
    left_padding_drifts,
    packed_drift,
    packed_segments,
    padded_drift,
    padding_explorer,
    padding_frame,
    positions_from_mask,
    tiny_absolute_position_model,
)
from course_utils.quiet import captured_log


@pytest.fixture(scope="module")
def course():
    model, tok = load_course_model()
    convs = make_messages("mixed", n=3, seed=2, context_words=3, long_tail=True)
    return model, tok, [tokenize_chat(tok, m) for m in convs]


# ---- references --------------------------------------------------------------------------------------

def test_collates_layouts():
    ex = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8, 9], "labels": [-100, 9]}]
    right, left = collate_padded(ex, 0, "right"), collate_padded(ex, 0, "left")
    assert right["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert left["input_ids"].tolist() == [[5, 6, 7], [0, 8, 9]]
    assert left["labels"].tolist() == [[-100, 6, 7], [-100, -100, 9]]
    assert collate_left([[1, 2, 3], [4]], 0)["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    packed = collate_packed(ex)
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert packed["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert "attention_mask" not in packed
    assert packed_segments(packed["position_ids"]) == [(0, 3), (3, 5)]
    mask = block_causal_mask([3, 2])[0, 0]
    assert mask.shape == (5, 5) and not mask[3, 2] and mask[4, 3] and not mask[0, 1]


def test_collate_packed_matches_trl(course):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    _, tok, examples = course
    features = [{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples]
    trl_batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id, padding_free=True)(features)
    ours = collate_packed(examples)
    assert all(torch.equal(trl_batch[k], ours[k]) for k in ours)


def test_positions_from_mask_count_real_tokens_as_generate_does():
    mask = torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 1]])
    assert positions_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 1], [0, 0, 0]]


def test_left_padding_needs_positions_exactly_on_learned_absolute_positions(course):
    from course_utils.model import course_model_name
    from course_utils.packing_arch import two_samples

    model, tok, examples = course
    rotary = left_padding_drifts(model, examples, tok.pad_token_id)
    absolute = left_padding_drifts(tiny_absolute_position_model(256), two_samples(256, (9, 5)), 0)
    if course_model_name() in ("tiny-qwen", "tiny-llama"):  # both shipped models are rotary
        assert rotary["mask only"] < 1e-3 and rotary["positions shifted"] < 1e-3, "the mask suffices"
    assert rotary["mask + position_ids"] < 1e-3
    assert absolute["positions shifted"] > 0.1 and absolute["mask only"] > 0.1, "GPT-2 reads its positions"
    assert absolute["mask + position_ids"] < 1e-4, "generate()'s positions make it exact"


def test_model_logits_passes_the_batchs_position_ids():
    from course_utils.losses import model_logits

    model = tiny_absolute_position_model(64)
    ids = torch.tensor([[5, 6, 7]])
    shifted = model_logits(model, {"input_ids": ids, "position_ids": torch.tensor([[4, 5, 6]])})
    assert not torch.allclose(shifted, model_logits(model, {"input_ids": ids})), "the positions reach it"


@pytest.mark.parametrize("bad_call", [
    lambda: positions_from_mask(torch.tensor([[0, 2, 1]])),
    lambda: positions_from_mask(torch.tensor([1, 1])),
    lambda: tiny_absolute_position_model(0),
    lambda: collate_padded([{"input_ids": [1], "labels": [1]}], 0, side="middle"),
    lambda: collate_padded([], 0),
    lambda: collate_padded([{"input_ids": [1, 2]}], 0),
    lambda: collate_packed([{"input_ids": [], "labels": []}]),
    lambda: collate_left([], 0),
    lambda: block_causal_mask([3, 0]),
    lambda: packed_segments(torch.tensor([0, 1, 2])),
    lambda: packed_segments(torch.tensor([[1, 2, 0]])),
    lambda: greedy_continuations(None, [[1, 2]], 0, layout="middle"),
])
def test_bad_input_raises_what_why_fix(bad_call):
    with pytest.raises((ValueError, TypeError), match="—"):
        bad_call()


# ---- measurements on the course model ----------------------------------------------------------------

def test_leaks_are_measured(course):
    model, tok, examples = course
    pad = tok.pad_token_id
    with torch.no_grad():
        right = collate_padded(examples, pad, "right")
        assert padded_drift(model, right, model(input_ids=right["input_ids"]).logits) < 1e-4
        left = collate_padded(examples, pad, "left")
        assert padded_drift(model, left, model(input_ids=left["input_ids"]).logits) > 0.1
        masked = model(input_ids=left["input_ids"], attention_mask=left["attention_mask"]).logits
        assert padded_drift(model, left, masked) < 1e-4
        packed = collate_packed(examples)
        ids, pos = packed["input_ids"], packed["position_ids"]
        no_cache = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        assert packed_drift(model, packed, no_cache) < 1e-4
        with_cache = model(input_ids=ids, position_ids=pos).logits  # config.use_cache=True builds a cache
        assert packed_drift(model, packed, with_cache) > 0.1
        explicit = block_causal_mask([len(e["input_ids"]) for e in examples])
        assert packed_drift(model, packed, model(input_ids=ids, attention_mask=explicit).logits) < 1e-4


def test_allowed_attention_is_what_transformers_builds(course):
    model, tok, examples = course
    packed = collate_packed(examples)
    lengths = [len(e["input_ids"]) for e in examples]
    owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    inferred = allowed_attention(model, packed["input_ids"], position_ids=packed["position_ids"])[0]
    assert torch.equal(inferred, block_causal_mask(lengths)[0, 0])
    ones = torch.ones_like(packed["input_ids"])
    leaky = allowed_attention(model, packed["input_ids"], attention_mask=ones,
                              position_ids=packed["position_ids"])[0]
    assert leak_counts(attention_categories(leaky, owner))["real->other example"] > 0
    left = collate_padded(examples, tok.pad_token_id, "left")
    row = lengths.index(min(lengths))
    cats = attention_categories(allowed_attention(model, left["input_ids"])[row],
                                torch.where(left["attention_mask"][row] == 1, 0, -1))
    assert leak_counts(cats)["real->pad"] > 0


def test_right_padded_generation_warns_and_left_does_not(course):
    model, tok, _ = course
    prompts = [tok.apply_chat_template(c[:1], add_generation_prompt=True, tokenize=True, return_dict=False)
               for c in make_messages("mixed", n=3, seed=99, context_words=2, long_tail=True)]
    alone = greedy_continuations(model, prompts, tok.pad_token_id, "alone", max_new_tokens=4)
    with captured_log("transformers") as right_warnings:
        greedy_continuations(model, prompts, tok.pad_token_id, "right", max_new_tokens=4)
    with captured_log("transformers") as left_warnings:
        left = greedy_continuations(model, prompts, tok.pad_token_id, "left", max_new_tokens=4)
    assert any("right-padding was detected" in w for w in right_warnings)
    assert left_warnings == [] and left == alone


@pytest.mark.parametrize("kwargs", [
    dict(input_ids=torch.ones(2, 42, dtype=torch.long), attention_mask=torch.ones(1, 3, dtype=torch.long)),
    dict(input_ids=torch.ones(42, dtype=torch.long)),
    dict(input_ids=torch.ones(1, 5, dtype=torch.long), position_ids=torch.arange(4)[None]),
    dict(input_ids=torch.ones(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 1, 5, dtype=torch.long)),
])
def test_allowed_attention_rejects_a_mask_of_another_shape(course, kwargs):
    """issue 21: a mask of another batch used to be ignored silently (plain causal mask, no leak)."""
    model, _, _ = course
    with pytest.raises(ValueError, match="—"):
        allowed_attention(model, **kwargs)


def test_generation_beyond_the_position_limit_is_refused(course):
    model, tok, _ = course
    with pytest.raises(ValueError, match="positions"):
        greedy_continuations(model, [[1, 2]], tok.pad_token_id, "alone", max_new_tokens=100_000)


def test_padding_explorer_measures_each_setting(course):
    """Lesson 03's "what if": each slider changes one argument of the forward call, and the measured drift
    follows the mechanism (pads before real tokens need the mask; packing needs reset positions, no mask,
    no cache)."""
    model, tok, examples = course
    box = padding_explorer(model, examples, tok.pad_token_id)
    layout, mask, positions, cache, picture = box.children
    start = box.text
    assert start.startswith("left padding · attention_mask not passed") and "LEAK" in start
    assert "real→pad 0 cells" not in start, "left pads are visible to real tokens without the mask"
    assert start in box._repr_mimebundle_()["text/plain"], "without a frontend: the start frame's text"
    assert 'alt="left padding, mask off, positions default, cache off"' in picture.value

    mask.value = "passed"
    assert "exact" in box.text and "real→pad 0 cells" in box.text, "left padding + mask: no leak"
    layout.value, mask.value = "right padding", "not passed"
    assert "exact" in box.text, "right padding: the causal mask alone hides the pads"
    layout.value = "packed row"
    assert "LEAK" in box.text and "real→other example 0 cells" not in box.text, "packed, plain call: leaks"
    positions.value = "restart per example"
    assert "exact" in box.text, "reset position_ids, no mask, no cache: transformers infers the boundaries"
    cache.value = "True (config default)"
    assert "LEAK" in box.text, "a cache switches the inference off"
    cache.value, mask.value = "False (as SFTTrainer)", "passed"
    assert "LEAK" in box.text and "(all ones)" in box.text, "an all-ones mask switches it off too"


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(layout="middle"), "not one of"),
    (dict(attention_mask="yes"), "True or False"),
    (dict(same=0.5, leak=0.1), "not below"),
    (dict(leak=-1.0), "finite number"),
])
def test_padding_frame_rejects_bad_settings(course, kwargs, phrase):
    model, tok, examples = course
    with pytest.raises(ValueError, match=phrase):
        padding_frame(model, examples, tok.pad_token_id, **kwargs)


def test_differing_tokens():
    assert differing_tokens([[1, 2, 3], [4]], [[1, 9, 3], [4, 5, 6]]) == 3
    with pytest.raises(ValueError, match="—"):
        differing_tokens([[1]], [])


# ---- bad input (issue 36): refused with what/why/fix, never a result from it ------------------------

EX = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8, 9], "labels": [-100, 9]}]


@pytest.mark.parametrize("bad_call, phrase", [
    # a collate of input that is already collated (or one example), or of mismatched ids and labels
    (lambda: collate_padded(collate_padded(EX, 0), 0), "not a list of examples"),
    (lambda: collate_packed(EX[0]), "not a list of examples"),
    (lambda: collate_padded([{"input_ids": [1, 2, 3], "labels": [1, 2]}], 0), "3 input_ids but 2 labels"),
    (lambda: collate_padded([{"input_ids": torch.ones(2, 3, dtype=torch.long), "labels": [1, 2]}], 0), "2-D"),
    (lambda: collate_padded([{"input_ids": [-100, 5], "labels": [-100, 5]}], 0), "cannot be negative"),
    (lambda: collate_padded([{"input_ids": [1.5, 2], "labels": [1, 2]}], 0), "not an integer"),
    (lambda: collate_padded([{"input_ids": "hello", "labels": "hello"}], 0), "tokenize text first"),
    (lambda: collate_padded(EX, None), "pad_token_id=None"),
    (lambda: collate_padded(EX, 0, side="rigth"), "did you mean 'right'"),
    (lambda: collate_left([1, 2, 3], 0), "one prompt"),
    (lambda: collate_left(["hello", "hi"], 0), "tokenize text first"),
    (lambda: collate_left([[1, 2], []], 0), "is empty"),
    (lambda: block_causal_mask([2.5, 3]), "integer"),
    (lambda: block_causal_mask(3), "non-empty list"),
    (lambda: packed_segments([[0, 1, 0]]), "torch.Tensor"),
    (lambda: attention_categories(torch.ones(3, 3, dtype=torch.bool), torch.zeros(4, dtype=torch.long)),
     "names 4 tokens"),
    (lambda: attention_categories(torch.ones(3, 3), torch.zeros(3, dtype=torch.long)), "booleans"),
    (lambda: leak_counts(torch.full((2, 2), 9)), "outside"),
    # nothing to count is no finding of 0 leaks
    (lambda: leak_counts(torch.zeros(83, 0, dtype=torch.long)), "has shape \\(83, 0\\)"),
    (lambda: leak_counts(torch.zeros(2, 3, dtype=torch.long)), "a square"),
    # a pad id no vocabulary holds (only ids at hand)
    (lambda: collate_padded(EX, 10 ** 7), "pad_token_id=10000000 is beyond any vocabulary"),
    (lambda: collate_padded(EX, 10 ** 7, side="left"), "pad_token_id=10000000 is beyond any vocabulary"),
    (lambda: collate_left([[1, 2]], 10 ** 7), "pad_token_id=10000000 is beyond any vocabulary"),
    (lambda: differing_tokens([1, 2], [1, 3]), "one continuation"),
    (lambda: differing_tokens([], []), "non-empty"),
])
def test_bad_input_is_refused_before_any_result(bad_call, phrase):
    with pytest.raises((ValueError, TypeError), match=phrase) as error:
        bad_call()
    assert " — " in str(error.value), "what — why — fix"


def test_plot_needs_panels():
    from course_utils.padding import plot_attention_layouts

    with pytest.raises(TypeError, match="non-empty dict"):
        plot_attention_layouts({})


@pytest.mark.parametrize("call, phrase", [
    # token ids beyond the embedding: torch's IndexError deep in the forward, restated at the boundary
    (lambda m, tok, ex: alone_logits(m, [len(tok) + 5]), "embeddings"),
    (lambda m, tok, ex: padding_frame(m, [{"input_ids": [10 ** 6], "labels": [1]}], tok.pad_token_id),
     "embeddings"),
    (lambda m, tok, ex: greedy_continuations(m, [[10 ** 6]], tok.pad_token_id), "embeddings"),
    (lambda m, tok, ex: greedy_continuations(m, [[1, 2]], tok.pad_token_id, stop_ids=5), "(id,)"),
    (lambda m, tok, ex: alone_logits(m, []), "is empty"),
    (lambda m, tok, ex: allowed_attention(m, torch.ones(0, 3, dtype=torch.long)), "no token"),
    (lambda m, tok, ex: padded_drift(m, ex, m(input_ids=ex["input_ids"]).logits),
     "no \\['attention_mask'\\]"),
    (lambda m, tok, ex: padded_drift(m, {**ex, "attention_mask": torch.zeros_like(ex["input_ids"])},
                                     m(input_ids=ex["input_ids"]).logits), "a real token in every row"),
    (lambda m, tok, ex: packed_drift(
        m, {**collate_padded([EX[0]], 0), "position_ids": torch.tensor([[1, 2, 3]])},
        m(input_ids=torch.tensor([[5, 6, 7]])).logits), "start at 0"),
    (lambda m, tok, ex: padded_drift(m, EX, None), "not a collated batch"),
    # logits without the vocabulary axis (torch's RuntimeError in the comparison before)
    (lambda m, tok, ex: padded_drift(m, collate_padded(EX, 0), torch.zeros(2, 3, 0)),
     "0 scores per token but the model scores 523"),
    (lambda m, tok, ex: packed_drift(m, collate_packed(EX), torch.zeros(1, 5, 0)), "0 scores per token"),
    # the model is at hand: its vocabulary decides (IndexError inside the embedding before)
    (lambda m, tok, ex: layout_drifts(m, EX, 10 ** 7),
     "pad_id=10000000 is beyond the 523 token ids of the model"),
])
def test_bad_input_on_the_model_is_refused(course, call, phrase):
    model, tok, examples = course
    batch = collate_packed(examples[:1])
    batch = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
    with torch.no_grad(), pytest.raises((ValueError, TypeError), match=phrase) as error:
        call(model, tok, batch)
    assert " — " in str(error.value), "what — why — fix"


def test_padding_free_on_sdpa_materialises_a_dense_mask_and_a_plain_call_none():
    from course_utils.padding import materialised_mask_shape

    model, tok = load_course_model()
    examples = [tokenize_chat(tok, m) for m in make_messages("mixed", 3, seed=2)]
    packed = collate_packed(examples)
    ids, pos = packed["input_ids"], packed["position_ids"]
    assert materialised_mask_shape(model, ids[:, :len(examples[0]["input_ids"])]) is None
    assert materialised_mask_shape(model, ids, position_ids=pos) == (1, 1, ids.shape[1], ids.shape[1])
    with pytest.raises(ValueError, match=".+ — .+ — .+"):
        materialised_mask_shape(model, ids, position_ids=pos[:, :-1])


def test_layout_attention_classifies_one_row_of_each_layout(course):
    """Lesson 03's pictures: right padding hides the pads, left padding and an all-ones packed row leak, and
    both fixes leak nothing — the same counts allowed_attention + attention_categories give by hand."""
    from course_utils.padding import layout_attention

    model, tok, examples = course
    panels = layout_attention(model, examples, tok.pad_token_id)
    counts = {title: leak_counts(cats) for title, cats in panels.items()}
    assert sum(counts["right padding, no attention_mask"].values()) == 0
    assert counts["left padding, no attention_mask"]["real->pad"] > 0
    assert counts["packed, all-ones attention_mask"]["real->other example"] > 0
    fixed = [c for title, c in counts.items() if title.startswith("fixed")]
    assert len(fixed) == 2 and all(sum(c.values()) == 0 for c in fixed)
    with pytest.raises(ValueError, match=".+ — .+ — .+"):
        layout_attention(model, examples, -1)


def test_a_4d_mask_replaces_a_sliding_window_models_own_window():
    """Lesson 03, exercise 2: transformers passes a 4-D mask through unchanged, the window too."""
    from course_utils.padding import sliding_window_drift

    drift = sliding_window_drift(sliding_window=4, length=12)
    assert drift["4-D mask with the window"] < 1e-5, "the window in the mask: the model's own call, exactly"
    assert drift["4-D causal mask, no window"] > 1e-2, "without the window queries see too far"
    with pytest.raises(ValueError, match="not above sliding_window.* — .* — "):
        sliding_window_drift(sliding_window=4, length=4)
