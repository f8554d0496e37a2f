"""Unit tests for lesson 06's module (course_utils.nan_detective): checkers, tools, input errors."""

import math

import pytest
import torch

import course_utils.nan_detective as nd
from course_utils import make_batches, make_messages


def _stub(*args, **kwargs):
    raise NotImplementedError


# ---- exercise 1: first_nonfinite_step -------------------------------------------------------

def test_first_step_checker_accepts_reference():
    assert nd.check_first_nonfinite_step(nd.first_nonfinite_step)


def test_first_step_checker_rejects_stub(capsys):
    assert not nd.check_first_nonfinite_step(_stub)
    assert "not implemented yet" in capsys.readouterr().out


def test_first_step_checker_names_loss_only_mistake():
    def loss_only(records):
        return next((r["step"] for r in records if not math.isfinite(r["loss"])), None)

    result = nd.check_first_nonfinite_step(loss_only)
    assert not result and "you only checked the loss" in result.message


def test_first_step_checker_names_off_by_one():
    def index_not_step(records):
        return next((i for i, r in enumerate(records)
                     if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]))), None)

    result = nd.check_first_nonfinite_step(index_not_step)
    assert not result and "off by one" in result.message


# ---- exercise 2: the mystery diagnosis ------------------------------------------------------

def test_mystery_checker_accepts_right_cause():
    assert nd.check_mystery_diagnosis(lambda: nd.MYSTERY_CAUSE)


def test_mystery_checker_rejects_stub():
    assert not nd.check_mystery_diagnosis(_stub)


@pytest.mark.parametrize("wrong, words", [("fp16_overflow", "no float16"),
                                          ("learning_rate_too_high", "stays diverged"),
                                          ("gradient_explosion", "nothing to clip")])
def test_mystery_checker_explains_wrong_causes(wrong, words):
    result = nd.check_mystery_diagnosis(lambda: wrong)
    assert not result and words in result.message


def test_mystery_checker_rejects_unknown_label():
    result = nd.check_mystery_diagnosis(lambda: "bad luck")
    assert not result and "expected one of" in result.message


# ---- tools ------------------------------------------------------------------------------------

def test_first_nonfinite_module_finds_first_in_execution_order():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.fill_(float("inf"))

    class Wrapper(torch.nn.Module):  # the helpers call model(input_ids=..., attention_mask=...)
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, input_ids, attention_mask=None):
            return self.net(input_ids.float())

    found = nd.first_nonfinite_module(Wrapper(), {"input_ids": torch.ones(1, 2)})
    assert found["module"] == "net.0" and found["forward"] == 1


def test_all_masked_and_drop():
    batch = {"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.ones(2, 4, dtype=torch.long)}
    empty = nd.all_masked(batch)
    assert bool((empty["labels"] == -100).all())
    assert nd.drop_fully_masked([empty, batch]) == [batch]


def test_qlora_model_trains_finite_and_mixed_masked_loss_is_nan():
    model, tok = nd.qlora_model()
    assert any(type(m).__module__.startswith("bitsandbytes") for m in model.modules())
    batches = make_batches(tok, make_messages(n=8, seed=0), 8)
    model.train()
    loss = nd.masked_mean_loss(model, nd.all_masked(batches[0]))
    assert math.isnan(loss.item())
    report = nd.anomaly_report(lambda: nd.masked_mean_loss(model, nd.all_masked(batches[0])))
    assert "returned nan" in report["error"]
    assert nd.first_nonfinite_module(model, batches[0]) is None


def test_stop_callback_drops_nonfinite_gradients():
    callback = nd.StopOnNonFinite()
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.full_like(model.weight, float("nan"))

    class State:
        global_step = 3

    class Control:
        should_training_stop = False

    control = callback.on_pre_optimizer_step(None, State(), Control(), model=model)
    assert control.should_training_stop and callback.stopped_at == 4
    assert model.weight.grad is None  # the optimizer will skip the step


# ---- bad input -------------------------------------------------------------------------------

def test_bad_dtype_raises_with_fix():
    with pytest.raises(ValueError, match="float32.*pass e.g."):
        nd.qlora_model(compute_dtype="fp8")


def test_bad_step_raises():
    with pytest.raises(ValueError, match="counts steps from 1"):
        nd.batch_at_step([{}], 0)
    with pytest.raises(ValueError, match="optimizer steps"):
        nd.mystery_run(steps=-1)
