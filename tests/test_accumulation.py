"""Lesson 01's learner tools (course_utils.accumulation). The exercises' checkers and their generator are
tested in test_exercises_lesson01.py."""

import copy

import pytest
import torch

from course_utils import accumulation as acc
from course_utils import make_messages


@pytest.fixture(scope="module")
def split(course):
    model, tok = course
    chats = make_messages("mixed", n=16, seed=3)
    by_k = {k: acc.split_micro_batches(tok, chats, group_size=8, k=k) for k in (1, 2, 4)}
    return copy.deepcopy(model), by_k


# ---- the lesson's measurements --------------------------------------------------------------------

def test_split_norms_grow_exactly_k_times_without_the_division(split):
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    bug = acc.split_norms(model, start, by_k, divide_by_accum=False)
    div = acc.split_norms(model, start, by_k)
    token = acc.split_norms(model, start, by_k, normalise="token")
    for k in by_k:
        assert bug[k] / div[k] == pytest.approx(k, rel=1e-4)
        assert token[k] == pytest.approx(token[1], rel=1e-4)


def test_undivided_adamw_equals_divided_with_eps_over_k(split):
    """The identity the lesson asserts: scaling every gradient by K only rescales epsilon."""
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    kw = dict(steps=2, accum_steps=2, lr=1e-3)
    _, undivided = acc.run_from(model, start, by_k[2], divide_by_accum=False, eps=1e-8, **kw)
    _, divided = acc.run_from(model, start, by_k[2], eps=1e-8 / 2, **kw)
    assert torch.allclose(undivided, divided, rtol=0, atol=1e-7)


def test_clip_grid_reuses_known_runs_and_shares_k1(split):
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    sentinel = [{"step": 1, "grad_norm": 1.0, "clipped": False, "loss": 1.0}]
    grid = acc.clip_grid(model, start, {1: by_k[1]}, thresholds=[None], steps=1, lr=1e-3,
                         known={(2, None, True): sentinel})
    assert grid[(2, None, True)] is sentinel
    assert grid[(1, None, True)] is grid[(1, None, False)]


def test_explorer_builds_without_a_frontend():
    records = [{"step": 1, "grad_norm": 2.0, "clipped": True, "loss": 1.0}]
    grid = {(k, t, d): records for k in (1, 2) for t in (1.0, None) for d in (True, False)}
    widget = acc.clip_explorer(grid)
    assert len(widget.children) >= 2


def test_threshold_between_lies_between_the_medians():
    assert 2 < acc.threshold_between([1, 2, 3], [7, 8, 9]) < 8


# ---- bad input raises ValueError with what / why / fix --------------------------------------------

def test_threshold_between_rejects_unseparated_norms():
    with pytest.raises(ValueError, match="no threshold between them"):
        acc.threshold_between([5.0, 6.0], [1.0, 2.0])


def test_split_micro_batches_rejects_a_k_that_does_not_divide_the_group(tokenizer):
    with pytest.raises(ValueError, match="not divisible"):
        acc.split_micro_batches(tokenizer, make_messages("add", n=8), group_size=8, k=3)
    with pytest.raises(ValueError, match="fewer than group_size"):
        acc.split_micro_batches(tokenizer, make_messages("add", n=4), group_size=8, k=2)
    with pytest.raises(ValueError, match="k=0"):
        acc.split_micro_batches(tokenizer, make_messages("add", n=8), group_size=8, k=0)


def test_split_norms_and_clip_grid_reject_a_list_instead_of_a_dict(split):
    model, by_k = split
    with pytest.raises(ValueError, match="dict"):
        acc.split_norms(model, model.state_dict(), by_k[1])
    with pytest.raises(ValueError, match="dict"):
        acc.clip_grid(model, model.state_dict(), by_k[1], thresholds=[None], steps=1, lr=1e-3)


def test_relative_difference_rejects_bad_shapes_and_zero_reference():
    with pytest.raises(ValueError, match="same model"):
        acc.relative_difference(torch.zeros(3), torch.zeros(4), torch.ones(3))
    with pytest.raises(ValueError, match="norm 0"):
        acc.relative_difference(torch.zeros(3), torch.ones(3), torch.zeros(3))


def test_custom_loss_trainer_and_sft_run_log_reject_bad_arguments(course):
    with pytest.raises(ValueError, match="not one of"):
        acc.custom_loss_trainer("mean")
    with pytest.raises(ValueError, match="accum_steps=0"):
        acc.sft_run_log(course[0], course[1], None, accum_steps=0, batch_size=2)


def test_plot_clip_setting_rejects_an_empty_grid():
    with pytest.raises(TypeError, match="non-empty dict clip_grid"):
        acc.plot_clip_setting({}, 4, 1.0)


# ---- bad input, second pass (issue 36): no silent result, what / why / fix --------------------------

RECORDS = [{"step": 1, "grad_norm": 2.0, "clipped": True, "loss": 1.0}]
FULL_GRID = {(k, t, d): RECORDS for k in (1, 2) for t in (1.0, None) for d in (True, False)}


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(step=3), ValueError, "did you mean 'steps'"),                 # a typo'd setting of train()
    (dict(accum_steps=2), ValueError, "needs steps="),
    (dict(steps=1, seed=-1), ValueError, "seed=-1"),
    (dict(steps=1, accum_steps=0), ValueError, "accum_steps=0"),        # gradient_accumulation_steps=0
    (dict(steps=1, lr=-1e-3), ValueError, "lr=-0.001"),                 # a negative learning rate
])
def test_run_from_refuses_bad_settings(split, kwargs, error, words):
    model, by_k = split
    with pytest.raises(error, match=words) as info:
        acc.run_from(model, copy.deepcopy(model.state_dict()), by_k[1], **kwargs)
    assert " — " in str(info.value)


def test_load_flat_puts_a_runs_final_weights_back_exactly(split):
    model, by_k = split
    start = {k: v.clone() for k, v in model.state_dict().items()}
    _, final = acc.run_from(model, start, by_k[1], steps=2, lr=1e-2)
    model.load_state_dict(start)
    assert not torch.equal(acc.flat_params(model), final), "the reset model is not the trained one"
    assert torch.equal(acc.flat_params(acc.load_flat(model, final)), final), "the snapshot comes back exactly"
    with pytest.raises(ValueError, match="only the model it was taken from") as info:
        acc.load_flat(model, final[:-1])
    assert " — " in str(info.value)


def test_run_from_refuses_a_start_state_that_is_not_this_models(split):
    model, by_k = split
    with pytest.raises(TypeError, match="state dict"):
        acc.run_from(model, list(model.state_dict().values()), by_k[1], steps=1)
    with pytest.raises(ValueError, match="lacks"):
        acc.run_from(model, {"lm_head.weight": torch.zeros(1)}, by_k[1], steps=1)


@pytest.mark.parametrize("call, error, words", [
    (lambda: acc.flat_params(None), TypeError, "must be a torch model"),
    (lambda: acc.relative_difference(torch.ones(3), torch.tensor([1.0, float("nan"), 1.0]), torch.ones(3)),
     ValueError, "NaN or inf"),
    (lambda: acc.median_norm([], 0), ValueError, "non-empty list"),
    (lambda: acc.median_norm([{"step": 1, "loss": 2.0}]), TypeError, "grad_norm"),
    (lambda: acc.median_norm(RECORDS, -1), ValueError, "skip=-1"),
    (lambda: acc.threshold_between([1.0, "2"], [5.0, 6.0]), ValueError, "each of low_norms"),
    (lambda: acc.threshold_between([1.0, float("nan")], [5.0, 6.0]), ValueError, "finite"),
    (lambda: acc.clip_title(2, 0), ValueError, "threshold=0"),
    (lambda: acc.clip_frame(FULL_GRID, 3, 1.0), ValueError, "not in the grid"),
    (lambda: acc.clip_explorer(FULL_GRID, start_threshold=17.3), ValueError, "not a threshold of the grid"),
    (lambda: acc.clip_explorer({k: v for k, v in FULL_GRID.items() if k != (2, None, False)}), ValueError,
     "not in the grid"),
    (lambda: acc.clip_explorer({1: RECORDS}), ValueError, "is not .K, max_grad_norm, divided."),
    (lambda: acc.custom_loss_trainer("micro_mean", loss_is_scaled_for_ga="False"), TypeError,
     "True or False"),
    (lambda: acc.custom_loss_trainer("micro-mean"), ValueError, "did you mean 'micro_mean'"),
])
def test_bad_input_is_refused_with_what_why_fix(call, error, words):
    with pytest.raises(error, match=words) as info:
        call()
    assert " — " in str(info.value), "the message should say what, why and how to fix"


_LOG = [{"step": 1, "loss": 2.0, "grad_norm": 3.0}]
_ARGS = {"gradient_accumulation_steps": 4, "max_grad_norm": 1.0, "learning_rate": 1e-3}


@pytest.mark.parametrize("log, args, error, words", [
    ([1, 2, 3], _ARGS, ValueError, r"log\[0\] is a int"),
    ([{"x": 1}], _ARGS, ValueError, r"log\[0\] has no \['step', 'loss', 'grad_norm'\]"),
    ([{"step": 1, "loss": "2.0", "grad_norm": 3.0}], _ARGS, TypeError,
     r"log\[0\]\['loss'\]='2.0' is not a number"),
    ([{"step": 0, "loss": 2.0, "grad_norm": 3.0}], _ARGS, ValueError, r"log\[0\]\['step'\]=0"),
    (_LOG, {"gradient_accumulation_steps": "four"}, ValueError,
     r"args\['gradient_accumulation_steps'\]='four' must be an integer >= 1"),
    (_LOG, {"max_grad_norm": 1.0}, ValueError, r"args\['gradient_accumulation_steps'\]=None"),
    (_LOG, {**_ARGS, "learning_rate": -1.0}, ValueError, r"args\['learning_rate'\]=-1.0"),
])
def test_mystery_run_refuses_a_log_or_args_it_cannot_read(log, args, error, words):
    """Each was kept as it came: the diagnosis then read KeyErrors or text for numbers."""
    with pytest.raises(error, match=words) as info:
        acc.MysteryRun(log, args, lambda k: 1.0)
    assert " — " in str(info.value)
    assert acc.MysteryRun(_LOG, {"gradient_accumulation_steps": 1}, lambda k: 1.0).args  # the rest: optional


def test_split_norms_refuses_entries_that_hold_other_examples(split):
    """K=2 holding other examples than K=1 compared two data sets, not two cuts of one step."""
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"micro_batches_by_k\[2\] trains other examples"):
        acc.split_norms(model, start, {1: by_k[1], 2: by_k[2][:1] * 2})
    with pytest.raises(ValueError, match="trains other examples"):
        acc.clip_grid(model, start, {1: by_k[1], 4: by_k[4][4:]}, thresholds=[None], steps=1, lr=1e-3)


def test_clip_explorer_opens_off_on_request():
    box = acc.clip_explorer(FULL_GRID, start_threshold="off")
    assert box.children[1].value == "off"


def test_split_norms_refuses_a_string_for_a_switch_and_a_typo_in_normalise(split):
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    with pytest.raises(TypeError, match="divide_by_accum='no'"):
        acc.split_norms(model, start, by_k, divide_by_accum="no")  # "no" is truthy: it would have divided
    with pytest.raises(ValueError, match="did you mean 'token'"):
        acc.split_norms(model, start, by_k, normalise="tokens")
    with pytest.raises(ValueError, match="a key K"):
        acc.split_norms(model, start, {0: by_k[1]})


def test_clip_grid_refuses_bad_thresholds_steps_and_learning_rates(split):
    model, by_k = split
    start = copy.deepcopy(model.state_dict())
    for kwargs, words in ((dict(thresholds=[]), "non-empty list"), (dict(thresholds=[0.0]), "thresholds"),
                          (dict(thresholds=[None], steps=0), "steps=0"),
                          (dict(thresholds=[None], lr=-1.0), "lr=-1.0")):
        kwargs = {"steps": 1, "lr": 1e-3, **kwargs}
        with pytest.raises(ValueError, match=words):
            acc.clip_grid(model, start, {1: by_k[1]}, **kwargs)


def test_sft_run_log_refuses_an_empty_or_too_small_dataset_and_a_negative_clip(course):
    from course_utils import make_chat_dataset

    model, tok = course
    with pytest.raises(ValueError, match="has 0 rows"):
        acc.sft_run_log(model, tok, make_chat_dataset("add", n=4).select([]), accum_steps=2, batch_size=2)
    with pytest.raises(ValueError, match="has 4 rows but one optimizer step needs"):
        acc.sft_run_log(model, tok, make_chat_dataset("add", n=4), accum_steps=4, batch_size=2)
    with pytest.raises(ValueError, match="max_grad_norm=-1"):
        acc.sft_run_log(model, tok, make_chat_dataset("add", n=4), accum_steps=1, batch_size=2,
                        max_grad_norm=-1)
    with pytest.raises(TypeError, match="datasets.Dataset"):
        acc.sft_run_log(model, tok, [{"messages": []}], accum_steps=1, batch_size=1)


def test_sft_run_log_refuses_a_tokenizer_from_another_model(course):
    from course_utils import make_chat_dataset

    model, tok = course
    bigger = copy.deepcopy(tok)
    bigger.add_tokens([f"<extra_{i}>" for i in range(model.get_input_embeddings().num_embeddings)])
    with pytest.raises(ValueError, match="different checkpoints"):
        acc.sft_run_log(model, bigger, make_chat_dataset("add", n=4), accum_steps=1, batch_size=2)
