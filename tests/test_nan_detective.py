"""Unit tests for lesson 06's module (course_utils.nan_detective): checkers, tools, input errors."""

import math

import pytest
import torch

import course_utils.nan_detective as nd
from course_utils.answers import lesson06 as ref
from course_utils.checks import Diagnosis


def stub(*args, **kwargs):
    raise NotImplementedError


# ---- exercise 1: the diagnosis of a generated run ----------------------------------------------

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


def zero_loss_means_empty(run):  # "loss 0.0 = no tokens"
    step = next(r["step"] for r in run["log"] if r["loss"] == 0.0 or not math.isfinite(r["grad_norm"]))
    return Diagnosis("all_masked_labels", step)


def dtype_means_fp16(run):  # "the config says float16, so it is float16"
    if run["config"]["dtype"] == "float16":
        return Diagnosis("fp16_overflow", next(iter(run["activation_max"])))
    return ref.diagnose_run(run)


def every_nan_is_the_lr(run):  # "NaN? lower the learning rate"
    step = next(r["step"] for r in run["log"] if r["loss"] == 0.0 or not math.isfinite(r["grad_norm"]))
    return Diagnosis("learning_rate_too_high", step)


def index_not_step(run):  # right cause, evidence off by one
    d = ref.diagnose_run(run)
    return Diagnosis(d.cause, d.evidence - 1 if isinstance(d.evidence, int) else d.evidence)


def largest_module_not_first(run):  # the module with the largest value instead of the first inf one
    d = ref.diagnose_run(run)
    if d.cause == "fp16_overflow":
        return Diagnosis(d.cause, list(run["activation_max"])[-1])
    return d


def test_diagnosis_checker_accepts_reference_and_variant():
    assert nd.check_diagnosis_run(ref.diagnose_run)
    assert nd.check_diagnosis_run(diagnose_variant)


@pytest.mark.parametrize("wrong, phrase", [
    (stub, "not implemented yet"),
    (zero_loss_means_empty, "logged loss of 0.0 is what the Trainer shows"),
    (dtype_means_fp16, "float16 storage alone is not evidence"),
    (every_nan_is_the_lr, "n_tokens"),
    (index_not_step, "does not show it"),
    (largest_module_not_first, "does not show it"),
])
def test_diagnosis_checker_rejects_wrong_answers(wrong, phrase):
    result = nd.check_diagnosis_run(wrong, seeds=list(range(40)))
    assert not result and phrase in result.message


def test_generator_covers_every_cause_and_is_seeded():
    causes = {nd.broken_run(s)[1].cause for s in range(8)}
    assert causes == set(nd.CAUSES)
    assert repr(nd.broken_run(5)) == repr(nd.broken_run(5))  # NaN != NaN: compare the text
    assert nd.broken_run(5)[0]["log"] != nd.broken_run(9)[0]["log"]
    for seed in range(200):  # the reference diagnoses every generated case
        run, truth = nd.broken_run(seed)
        assert ref.diagnose_run(run) == truth, seed


def test_show_run_prints_and_rejects_wrong_input(capsys):
    nd.show_run(nd.broken_run(3)[0])
    assert "grad_norm" in capsys.readouterr().out
    with pytest.raises(TypeError, match="broken_run"):
        nd.show_run([1, 2])


# ---- exercise 2: the guard ---------------------------------------------------------------------

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
    for name, p in model.named_parameters():
        if p.grad is not None and p.grad.isnan().any():
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None


def stops_but_keeps_gradients(model, control):
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            control.should_training_stop = True
            return name
    return None


def drops_but_goes_on(model, control):
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            model.zero_grad(set_to_none=True)
            return name
    return None


def checks_weights(model, control):
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            model.zero_grad(set_to_none=True)
            control.should_training_stop = True
            return name
    return None


def names_the_last(model, control):
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad:
        model.zero_grad(set_to_none=True)
        control.should_training_stop = True
        return bad[-1]
    return None


def test_guard_checker_accepts_reference_and_variant():
    assert nd.check_guard(ref.guard)
    assert nd.check_guard(guard_zeroes)


@pytest.mark.parametrize("wrong, phrase", [
    (stub, "not implemented yet"),
    (isnan_only, "`isnan` misses it"),
    (stops_but_keeps_gradients, "stopping is not enough"),
    (drops_but_goes_on, "should_training_stop = True"),
    (checks_weights, "look at each parameter's .grad"),
    (names_the_last, "name the first one"),
])
def test_guard_checker_rejects_wrong_answers(wrong, phrase):
    result = nd.check_guard(wrong)
    assert not result and phrase in result.message


def test_guard_callback_records_step_and_culprit():
    callback = nd.GuardCallback(ref.guard)
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.full_like(model.weight, float("nan"))

    class State:
        global_step = 3

    class Control:
        should_training_stop = False

    control = callback.on_pre_optimizer_step(None, State(), Control(), model=model)
    assert control.should_training_stop and callback.stopped_at == 4 and callback.culprit == "weight"
    assert model.weight.grad is None  # the optimizer will skip the step
    with pytest.raises(TypeError, match="guard"):
        nd.GuardCallback("not a function")


# ---- tools: searches raise instead of returning None ------------------------------------------

def _records(losses, norms):
    return [{"step": i + 1, "loss": lo, "grad_norm": g} for i, (lo, g) in enumerate(zip(losses, norms))]


def test_step_search():
    nan, inf = float("nan"), float("inf")
    assert nd.nonfinite_steps(_records([5.0, 4.0, 3.9, nan], [2.0, 3.0, inf, nan])) == [3, 4]
    assert nd.first_nonfinite_step(_records([5.0, 4.0, 3.9, nan], [2.0, 3.0, inf, nan])) == 3
    with pytest.raises(nd.NotFound, match="no non-finite step"):
        nd.first_nonfinite_step(_records([5.0, 4.0], [1.0, 1.0]))
    with pytest.raises(ValueError, match="non-empty"):
        nd.nonfinite_steps([])


def test_lowest_diverging_lr_search():
    def fake(lr):
        return _records([1.0, float("nan") if lr >= 1 else 1.0], [1.0, 1.0])

    lr, runs = nd.lowest_diverging_lr(fake, [3.0, 0.1, 1.0])
    assert lr == 1.0 and list(runs) == [0.1, 1.0]
    with pytest.raises(nd.NotFound, match="extend lrs"):
        nd.lowest_diverging_lr(fake, [0.1, 0.3])


def test_lr_explorer_browses_the_search_runs():
    nan, inf = float("nan"), float("inf")
    runs = {0.1: _records([5.0, 4.0, 3.0], [2.0, 3.0, 2.5]),
            1.0: _records([5.0, 4.5, 4.8], [2.0, 40.0, 8e3]),
            3.0: _records([5.0, 9.0, nan], [2.0, 6e4, inf])}
    healthy = _records([5.0, 4.2, 3.5, 3.0], [2.0, 2.5, 2.2, 2.1])
    w = nd.lr_explorer(runs, healthy, 0.01)
    start = w._repr_mimebundle_()["text/plain"]  # starts on the lowest diverging run
    assert "lr = 3" in start and "first non-finite step 3" in start and "300× the healthy" in start
    assert "before the break / the healthy run's largest: 2.4e+04" in start  # 6e4 / 2.5, the step before
    assert "highest finite lr 1, lowest diverging 3" in start
    w.children[0].value = "1"
    assert "finite for all 3 steps" in w.text and "8e+03" in w.text and "3.2e+03" in w.text  # 8e3 / 2.5
    w.children[0].value = "0.1"
    assert "finite for all 3 steps" in w.text and "largest: 1.2" in w.text
    with pytest.raises(ValueError, match="lr_runs"):
        nd.lr_explorer({}, healthy, 0.01)
    with pytest.raises(ValueError, match="not one of the runs"):
        nd.lr_frame(runs, 0.5, healthy, 0.01)


class _Wrapper(torch.nn.Module):  # the helpers call model(input_ids=..., attention_mask=...)
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, input_ids, attention_mask=None):
        return self.net(input_ids.float())


def test_first_nonfinite_module_finds_first_in_execution_order_or_raises():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    batch = {"input_ids": torch.ones(1, 2, dtype=torch.long)}
    with pytest.raises(nd.NotFound, match="forward is finite"):
        nd.first_nonfinite_module(_Wrapper(net), batch)
    with torch.no_grad():
        net[0].weight.fill_(float("inf"))
    found = nd.first_nonfinite_module(_Wrapper(net), batch)
    assert found["module"] == "net.0" and found["forward"] == 1


def test_norm_on_inf_rmsnorm_and_layernorm():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    rms = nd.norm_on_inf(Qwen2RMSNorm(8), 8)
    assert rms["nan"] == 1 and rms["zero"] == 7  # inf * rsqrt(inf) = inf * 0; the rest become 0
    assert nd.norm_on_inf(torch.nn.LayerNorm(8), 8)["nan"] == 8  # inf - inf


def test_anomaly_report_raises_when_backward_is_finite():
    w = torch.ones(2, requires_grad=True)
    with pytest.raises(nd.NotFound, match="no NaN"):
        nd.anomaly_report(lambda: (w * 2).sum())


def test_all_masked():
    batch = {"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.ones(2, 4, dtype=torch.long)}
    assert bool((nd.all_masked(batch)["labels"] == -100).all())


def test_qlora_model_any_architecture_and_overflow_search(tmp_path):
    model, tok = nd.qlora_model()
    n_lora = sum(name.endswith("lora_A") for name, _ in model.named_modules())
    assert n_lora == sum(type(m).__module__.startswith("bitsandbytes") for m in model.modules()) > 0
    from course_utils import make_batches, make_messages

    batch = make_batches(tok, make_messages(n=8, seed=0), 8)[0]
    assert nd.forward_watch(model, batch).first_nonfinite is None
    value = nd.overflow_scale(model, batch)
    assert nd.forward_watch(model, batch).max_abs[0] > nd.FP16_MAX
    m16, _ = nd.qlora_model(compute_dtype=torch.float16, dtype=torch.float16)
    nd.plant_large_update(m16, 4 * value)
    assert ".mlp." in nd.first_nonfinite_module(m16, batch)["module"]


# ---- bad input -------------------------------------------------------------------------------

def test_bad_input_raises_with_fix():
    with pytest.raises(ValueError, match="float32.*pass e.g."):
        nd.qlora_model(compute_dtype="fp8")
    with pytest.raises(ValueError, match="counts steps from 1"):
        nd.batch_at_step([{"input_ids": torch.ones(1, 2, dtype=torch.long)}], 0)
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        nd.plant_large_update(torch.nn.Linear(2, 2), -1)
    with pytest.raises(ValueError, match="no LoRA adapter inside an MLP"):
        nd.plant_large_update(torch.nn.Linear(2, 2), 2.0)
    with pytest.raises(ValueError, match="seed"):
        nd.broken_run(-1)
