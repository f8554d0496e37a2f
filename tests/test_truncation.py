"""Lesson 05: the packer (nanochat's best fit), nanochat's log, the normalised-update drift, the
truncation counts, and what each public function refuses (issue 36). The exercises' graders:
test_exercises_lesson05.py."""

import math
import signal

import pytest
import torch

from course_utils import truncation as T
from course_utils.data import IGNORE_INDEX
from course_utils.losses import mean_ignore_index

M = IGNORE_INDEX


def conv(n_prompt, n_answer, start=10):
    ids = list(range(start, start + n_prompt + n_answer))
    return {"input_ids": ids, "labels": [M] * n_prompt + ids[n_prompt:]}


# ---------------------------------------------------------------------------- truncation counts


def test_answer_start_and_percentile():
    assert T.answer_start(conv(5, 3)) == 5
    with pytest.raises(ValueError, match="no target"):
        T.answer_start(conv(4, 0))
    assert T.percentile([5, 1, 3, 2, 4], 100) == 5 and T.percentile([5, 1, 3, 2, 4], 0) == 1
    assert T.percentile(list(range(1, 101)), 85) == 85
    with pytest.raises(ValueError, match="non-empty"):
        T.percentile([], 50)
    with pytest.raises(ValueError, match="percentile"):
        T.percentile([1], 101)


def test_truncation_report_and_policies():
    full = [conv(3, 2), conv(8, 2), conv(2, 6)]
    cut = [T.truncated(e, 5) for e in full]
    report = T.truncation_report(cut, 5)
    assert report["fully_masked"] == 1 and report["at_max_length"] == 3
    start = T.kept_by_policy(full, 5, "keep_start")
    end = T.kept_by_policy(full, 5, "keep_end")
    assert (start["examples"], start["graded_tokens"]) == (2, 2 + 3)   # conv(8,2) dropped, conv(2,6) cut to 3
    # every answer end survives; conv(2,6) keeps 5 answer tokens, the first at column 0 (never a target)
    assert (end["examples"], end["graded_tokens"]) == (3, 2 + 2 + 4)
    assert T.kept_by_policy(full, 10)["graded_tokens"] == start["of_graded_tokens"] == 10
    with pytest.raises(ValueError, match="truncation modes"):
        T.truncated(full[0], 5, "middle")


def test_fully_masked_rate_follows_p_to_the_b():
    flags = [True] * 20 + [False] * 80
    one = T.fully_masked_batch_rate(flags, 1, shuffles=50)
    assert abs(one["per_batch"] - 0.2) < 1e-12 and one["per_epoch"] == 1.0
    assert T.fully_masked_batch_rate(flags, 4, shuffles=50)["per_batch"] < one["per_batch"]
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="batch_size"):
            T.fully_masked_batch_rate(flags, bad)
    with pytest.raises(ValueError, match="larger than"):
        T.fully_masked_batch_rate([True], 2)


def test_targets_per_micro_batch_counts_shifted_targets():
    # conv(0, 1): its one target sits at position 0, which no prediction reaches (the loss reads labels[1:])
    assert T.targets_per_micro_batch([conv(2, 3), conv(0, 1), conv(4, 0)], 2) == [3 + 0, 0]
    assert T.targets_per_micro_batch([conv(2, 3), conv(0, 1), conv(4, 0)], 1) == [3, 0, 0]


def test_truncation_explorer_moves_with_max_length_side_and_batch_size():
    full = [conv(9, 2), conv(9, 3), conv(2, 3), conv(3, 2)]  # answers start at 9, 9, 2, 3; 10 targets
    w = T.truncation_explorer(full, percentiles=(50, 100), batch_sizes=(1, 2),
                              start={"max_length": 9, "mode": "keep_start", "batch_size": 1})
    assert list(w.children[0].options) == [3, 9, 12]  # p50, p100 of the answer starts; the longest
    start = w._repr_mimebundle_()["text/plain"]
    assert "rows left with no target: 2 / 4" in start and "(loss NaN): 2 of 4 — #1, #2" in start
    w.children[2].value = 2                             # both cut rows share micro-batch 1
    assert "(loss NaN): 1 of 2 — #1" in w.text
    w.children[1].value = "keep_end"                    # the answers are at the end: nothing is empty
    assert "rows left with no target: 0 / 4" in w.text and "(loss NaN): 0 of 2" in w.text
    w.children[1].value = "keep_start"
    w.children[0].value = 12                            # the longest example: nothing cut
    assert "supervised tokens kept: 10 / 10 (100%)" in w.text and "(loss NaN): 0 of 2" in w.text
    w.children[0].value = 3                             # p50: every prompt of 3+ tokens loses its answer
    assert "rows left with no target: 3 / 4" in w.text
    assert "#1" in start and w._repr_mimebundle_()["text/plain"] != start


def test_truncation_explorer_rejects_bad_choices():
    with pytest.raises(ValueError, match="batch_sizes"):
        T.truncation_explorer([conv(3, 2)], batch_sizes=(0,))
    with pytest.raises(ValueError, match="percentile"):
        T.truncation_explorer([conv(3, 2)], percentiles=(150,))
    with pytest.raises(ValueError, match="full_examples"):
        T.truncation_explorer([])


# ---------------------------------------------------------------------------- the packer


def _stream(**kw):
    # half the conversations are longer than a 16-token row, so a buffer of 4 clogs quickly
    data = [conv(4, 3, 10 * i) if i % 2 else conv(20, 4, 10 * i) for i in range(40)]
    return T.bestfit_rows(data, **{"row_capacity": 16, "n_rows": 60, "pad_id": 0, "render_cap": 64,
                                   "buffer_size": 4, **kw})


def test_packer_clogs_and_freezes_progress():
    rows = _stream()
    clog = T.first_empty_row(rows)
    assert all(r["targets"] == 0 for r in rows[clog - 1:])
    assert rows[-1]["consumed"] == rows[clog - 1]["consumed"]
    assert all(len(r["ids"]) == len(r["labels"]) == 16 for r in rows)


def test_packer_picks_largest_fit_first():
    data = [conv(2, 2, 0), conv(5, 5, 100), conv(3, 3, 200)]
    rows = T.bestfit_rows(data, row_capacity=16, n_rows=1, pad_id=0, render_cap=64, buffer_size=3)
    # 10 tokens first (the largest), then the largest that fits the 6 left: exactly the 6-token one
    assert rows[0]["ids"][:10] == data[1]["input_ids"] and rows[0]["ids"][10:] == data[2]["input_ids"]
    assert rows[0]["consumed"] == 2 and rows[0]["targets"] == 5 + 3


def test_crop_unclogs_but_only_crop_and_drop_has_targets_everywhere():
    cropped = _stream(crop=True)
    assert cropped[-1]["consumed"] > _stream()[-1]["consumed"]
    assert any(r["targets"] == 0 for r in cropped)  # prompt-only crops
    assert all(r["targets"] > 0 for r in _stream(crop=True, drop_untrainable=True))


def test_clog_row_does_not_depend_on_device_batch_size():
    rows = _stream(n_rows=128)
    out = {b: T.clog_by_batch_size(rows, device_batch_size=b, rows_per_step=16) for b in (1, 2, 4, 8, 16)}
    assert len({m["first_empty_row"] for m in out.values()}) == 1
    clog = T.first_empty_row(rows)
    for b, m in out.items():  # the first step whose last micro-batch starts at or after the clog row
        assert m["first_nan_step"] == next(s for s in range(1, 99) if 16 * s - b + 1 >= clog)
    assert T.clog_by_batch_size(rows, device_batch_size=4, rows_per_step=64)["first_nan_step"] == 1
    with pytest.raises(ValueError, match="multiple"):
        T.clog_by_batch_size(rows, device_batch_size=3, rows_per_step=16)


def test_search_helpers_raise_when_nothing_is_found():
    rows = T.bestfit_rows([conv(3, 3)], row_capacity=16, n_rows=4, pad_id=0, render_cap=64, buffer_size=2)
    with pytest.raises(ValueError, match="never clogged"):
        T.first_empty_row(rows)
    with pytest.raises(ValueError, match="no step logs"):
        T.clog_by_batch_size(rows, device_batch_size=1, rows_per_step=2)


def test_packer_rejects_bad_input():
    with pytest.raises(ValueError, match="row_capacity"):
        T.bestfit_rows([conv(2, 2)], row_capacity=1, n_rows=1, pad_id=0, render_cap=8)
    with pytest.raises(ValueError, match="is empty"):
        T.bestfit_rows([], row_capacity=8, n_rows=1, pad_id=0, render_cap=8)
    with pytest.raises(ValueError, match="never refill"):
        T.bestfit_rows([conv(20, 2)], row_capacity=8, n_rows=1, pad_id=0, render_cap=64, crop=True,
                       drop_untrainable=True)


# ---------------------------------------------------------------------------- logging and optimiser


def test_nanochat_log_is_a_debiased_ema_that_keeps_nan():
    logged = T.nanochat_logged([2.0, 2.0, float("nan"), 1.0])
    # step 1: 0.1 * 2 / (1 - 0.9**2): nanochat debiases with step + 1 after the increment
    assert math.isclose(logged[0], 0.2 / (1 - 0.81))
    assert all(math.isnan(v) for v in logged[2:])
    assert T.running_mean([1.0, 3.0]) == [1.0, 2.0]


def test_normalised_momentum_moves_by_a_constant_step_on_zero_grads():
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = T.NormalisedMomentum([w], lr=0.1)
    w.grad = torch.randn(4, 3)
    opt.step()
    moves = []
    for _ in range(3):
        before = w.detach().clone()
        w.grad = torch.zeros(4, 3)
        opt.step()
        moves.append(float((w.detach() - before).norm()))
    assert all(math.isclose(m, 0.1 * 3 ** 0.5, rel_tol=1e-5) for m in moves)


def test_drift_rejects_a_batch_with_targets(course):
    model, _ = course
    batch = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[1, 2, 3]])}
    with pytest.raises(ValueError, match="supervised tokens"):
        T.drift_on_zero_grads(model, [batch], batch, optimizer="sgd", lr=0.1, warm_steps=1, zero_steps=1)


# ---------------------------------------------------------------------------- bad input (issue 36)


def _alarm(*_):
    raise TimeoutError("bestfit_rows did not return: an unbounded loop")


@pytest.fixture
def within_5_seconds():
    """A hang fails the test in seconds instead of blocking the run."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(5)
    yield
    signal.alarm(0)


def test_percentile_refuses_a_fraction_for_a_percentage():
    """issue 36: q=0.85 (meaning the 85th) used to return the 1st percentile's value."""
    with pytest.raises(ValueError, match="pass q=85") as error:
        T.percentile([5, 1, 3, 2, 4], 0.85)
    assert " — " in str(error.value)
    with pytest.raises(ValueError, match="fraction"):
        T.truncation_explorer([conv(3, 2)], percentiles=(0.5, 0.85))


@pytest.mark.parametrize("examples", [
    [{"input_ids": [], "labels": []}],                       # spun forever before issue 36
    [conv(3, 3), {"input_ids": [], "labels": []}],           # returned rows with a phantom pick
])
def test_packer_refuses_an_empty_conversation_instead_of_spinning(examples, within_5_seconds):
    """issue 36: an example whose input_ids is empty always fits and fills nothing: the row never filled."""
    with pytest.raises(ValueError, match="no tokens") as error:
        T.bestfit_rows(examples, row_capacity=16, n_rows=2, pad_id=0, render_cap=64, buffer_size=2)
    assert " — " in str(error.value)


def test_packer_refuses_a_render_cap_that_leaves_nothing_to_train_on(within_5_seconds):
    """The answer lies past render_cap but within the row: the buffer's refill once skipped every
    conversation forever (its check cut at row_capacity, the refill at render_cap)."""
    with pytest.raises(ValueError, match="never refill"):
        T.bestfit_rows([conv(5, 3)], row_capacity=16, n_rows=2, pad_id=0, render_cap=4, crop=True,
                       drop_untrainable=True)


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(buffer_size=10 ** 9), "above"),
    (dict(crop="yes"), "True or False"),
    (dict(pad_id=None), "pad_id=None"),
    (dict(render_cap=0), "render_cap"),
    (dict(n_rows=0), "n_rows"),
])
def test_packer_refuses_settings_that_would_spin_or_mislead(kwargs, phrase, within_5_seconds):
    with pytest.raises((ValueError, TypeError), match=phrase):
        T.bestfit_rows([conv(3, 3)], **{"row_capacity": 16, "n_rows": 2, "pad_id": 0, "render_cap": 64,
                                        **kwargs})


def test_has_targets_is_the_shifted_rule():
    """One rule for "carries loss" (data.graded): a label in column 0 is never a target."""
    assert T.has_targets([M, 5]) and not T.has_targets([5, M]) and not T.has_targets([M, M])
    assert T.has_targets(torch.tensor([M, M, 7]))
    with pytest.raises(ValueError, match="one example's labels"):
        T.has_targets(torch.tensor([[M, 7]]))
    with pytest.raises(TypeError, match="not an integer"):
        T.has_targets([[M, 7]])


@pytest.mark.parametrize("bad_call, phrase", [
    (lambda: T.truncation_report([conv(8, 2)], 5), "more than max_length"),
    (lambda: T.truncated({"input_ids": [1, 2, 3], "labels": [M, 2]}, 2), "3 input_ids but 2 labels"),
    (lambda: T.answer_start([conv(3, 2)]), "must be a dict"),
    (lambda: T.kept_by_policy(conv(3, 2), 4), "one dict"),
    (lambda: T.kept_by_policy([conv(3, 2)], 4, "keep_middle"), "truncation modes"),
    (lambda: T.targets_per_micro_batch([conv(3, 2)], -1), "batch_size"),
    (lambda: T.targets_per_micro_batch([conv(3, 2)], 0), "batch_size"),
    (lambda: T.fully_masked_batch_rate([conv(3, 2), conv(3, 2)], 1), "not True/False"),
    (lambda: T.fully_masked_batch_rate([True, False], 1, seed=None), "deterministic"),
    (lambda: T.truncation_frame([conv(3, 2)], 4, "keep_start", 1, note=5), "string"),
    (lambda: T.truncation_explorer([conv(3, 2)], start={"max_len": 4}), "did you mean 'max_length'"),
    (lambda: T.nanochat_logged([1.0], beta=1), "beta < 1"),
    (lambda: T.nanochat_logged([1.0], beta=90), "percentage"),
    (lambda: T.nanochat_logged([], beta=0.9), "non-empty"),
    (lambda: T.running_mean(None), "non-empty"),
    (lambda: T.running_mean(["2.0"]), "not a number"),
    (lambda: T.render({"input_ids": [1], "labels": [M]}, 0), "render_cap"),
    (lambda: T.stack_rows([{"ids": [1, 2], "labels": [M, 2], "targets": 1},
                           {"ids": [1], "labels": [M], "targets": 0}]), "different lengths"),
    (lambda: T.stack_rows({"ids": [1], "labels": [M], "targets": 0}), "one dict"),
    (lambda: T.first_empty_row([]), "non-empty"),
    (lambda: T.clog_by_batch_size([{"ids": [1]}], device_batch_size=1, rows_per_step=1), "not a row"),
    (lambda: T.NormalisedMomentum([torch.nn.Parameter(torch.ones(2))], momentum=95), "percentage"),
    (lambda: T.NormalisedMomentum([], lr=0.1), "params is empty"),
])
def test_bad_input_is_refused_before_any_result(bad_call, phrase):
    with pytest.raises((ValueError, TypeError), match=phrase) as error:
        bad_call()
    assert " — " in str(error.value), "what — why — fix"


def test_running_mean_keeps_nan_it_is_the_point():
    out = T.running_mean([1.0, float("nan"), 3.0])
    assert out[0] == 1.0 and all(math.isnan(v) for v in out[1:])


@pytest.mark.parametrize("call, phrase", [
    # ids beyond the embedding (torch's IndexError inside the forward), restated at the boundary
    (lambda m, tok, b: T.one_step(m, {**b, "input_ids": b["input_ids"] + 10 ** 6}, mean_ignore_index),
     "embeddings"),
    (lambda m, tok, b: T.one_step(m, b, "mean"), "must be a function"),
    (lambda m, tok, b: T.one_step(m, b, mean_ignore_index, lr=-1e-3), "lr"),
    (lambda m, tok, b: T.drift_on_zero_grads(m, [b], b, optimizer="sgd", lr=-0.1, warm_steps=1, zero_steps=1),
     "lr"),
    (lambda m, tok, b: T.drift_on_zero_grads(m, [b], b, optimizer="adam", lr=0.1, warm_steps=1, zero_steps=1),
     "did you mean 'adamw'"),
    (lambda m, tok, b: T.trl_logged_on_pretokenised(m, tok, [{"input_ids": [10 ** 6], "labels": [M]}]),
     "embeddings"),
    (lambda m, tok, b: T.trl_logged_on_pretokenised(m, tok, []), "is empty"),
    (lambda m, tok, b: T.trl_logged_on_pretokenised(m, tok, [conv(2, 2)], lr=-1.0), "lr"),
    (lambda m, tok, b: T.trl_logged_on_pretokenised(m, tok, [conv(2, 2)], accum_steps=0), "accum_steps"),
    (lambda m, tok, b: T.trl_logged_on_pretokenised(m, tok, [conv(2, 2)] * 3, accum_steps=2), "multiple of"),
    (lambda m, tok, b: T.trainer_logged_losses(m, tok, [conv(2, 2)], nan_inf_filter="no", steps=1),
     "True or False"),
    (lambda m, tok, b: T.trainer_logged_losses(m, tok, [conv(2, 2)], nan_inf_filter=True, steps=0), "steps"),
    (lambda m, tok, b: T.trainer_logged_losses(tok, m, [conv(2, 2)], nan_inf_filter=True, steps=1),
     "model, tokenizer"),
    (lambda m, tok, b: T.trainer_logged_losses(m, "Qwen/Qwen2.5-0.5B", [conv(2, 2)], nan_inf_filter=True,
                                               steps=1), "model, tokenizer"),
    (lambda m, tok, b: T.trl_kept_examples(m, tok, [], max_length=8), "non-empty datasets.Dataset"),
    (lambda m, tok, b: T.trl_kept_examples(m, tok, _dataset(), max_length=8, truncation_mode="keep_begin"),
     "truncation modes"),
])
def test_bad_input_on_the_model_is_refused(course, call, phrase):
    model, tok = course
    batch = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[M, 2, 3]])}
    with pytest.raises((ValueError, TypeError), match=phrase) as error:
        call(model, tok, batch)
    assert " — " in str(error.value), "what — why — fix"


def _dataset():
    from course_utils import make_chat_dataset

    return make_chat_dataset("add", 2, seed=0)


def test_rows_without_targets_and_cut_before_end_of_turn_on_hand_made_rows():
    """Issue 45: the rows TRL packs without a target, and the rows truncation cut before <|im_end|> (id 2)."""
    rows = [{"input_ids": [5, 6, 7, 2], "labels": [-100, 6, 7, 2]},        # healthy: the stop is graded
            {"input_ids": [5, 6, 7, 8], "labels": [-100, -100, -100, -100]},  # fully masked
            {"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]},     # cut inside the answer
            {"input_ids": [5, 6, 2, 9, 7], "labels": [-100, 6, 2, -100, 7]}]  # 2nd answer cut, 1st whole
    assert T.rows_without_targets(rows) == [1]
    assert T.cut_before_end_of_turn(rows, 2) == [2, 3], "the last graded answer decides, not an earlier one"


@pytest.mark.parametrize("call, words", [
    (lambda: T.cut_before_end_of_turn([{"input_ids": [1], "labels": [1]}], -1), "end_of_turn_id"),
    (lambda: T.cut_before_end_of_turn([], 2), "examples"),
    (lambda: T.rows_without_targets([{"input_ids": [1]}]), "labels"),
    # an id no row holds read every graded row as cut; one no vocabulary holds, too
    (lambda: T.cut_before_end_of_turn([conv(2, 2)], 10 ** 7),
     "end_of_turn_id=10000000 is beyond any vocabulary"),
    (lambda: T.cut_before_end_of_turn([conv(2, 2)], 99), "end_of_turn_id=99 occurs in none of the examples"),
    (lambda: T.bestfit_rows([conv(2, 2)], row_capacity=8, n_rows=1, pad_id=10 ** 7, render_cap=8),
     "pad_id=10000000 is beyond any vocabulary"),
    (lambda: T.bestfit_rows([conv(2, 2)], row_capacity=8, n_rows=1, pad_id=0, render_cap=8, crop="yes"),
     "crop='yes' must be True or False"),
    (lambda: T.NormalisedMomentum("some text"), "params is str, not an iterable of parameters"),
    (lambda: T.NormalisedMomentum([3, 4]), r"params\[0\] is 3 \(int\), not a tensor"),
])
def test_the_row_checks_refuse_bad_input(call, words):
    with pytest.raises((TypeError, ValueError), match=words) as error:
        call()
    assert " — " in str(error.value)


@pytest.mark.slow
def test_trl_packs_fully_masked_examples_it_drops_without_packing(course):
    from course_utils import make_chat_dataset

    model, tok = course
    data = make_chat_dataset("mixed", n=24, seed=0, context_words=20, long_tail=True)
    unpacked = T.trl_kept_examples(model, tok, data, max_length=60)
    packed = T.trl_kept_examples(model, tok, data, max_length=60, packing=True)
    assert not T.rows_without_targets(unpacked) and len(packed) == len(data)
    assert len(T.rows_without_targets(packed)) == len(data) - len(unpacked) > 0
