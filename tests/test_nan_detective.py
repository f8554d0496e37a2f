"""Unit tests for lesson 06's module (course_utils.nan_detective): the guard callback, the tools, and bad
input (the exercises' generator and checkers: test_exercises_lesson06.py)."""

import math

import pytest
import torch

import course_utils.nan_detective as nd
from course_utils.exercises.answers import lesson06 as ref

WHAT_WHY_FIX = r".+ — .+ — .+"

# ---- the guard callback (exercise 2 writes its guard) ------------------------------------------

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


def test_guard_callback_hands_the_guard_the_optimizers_scaler():
    """accelerate's AcceleratedOptimizer keeps the GradScaler as .scaler: with one, an inf is a skipped
    step."""
    callback = nd.GuardCallback(ref.guard)
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.full_like(model.weight, float("inf"))

    class State:
        global_step = 0

    class Control:
        should_training_stop = False

    class Optimizer:
        scaler = torch.amp.GradScaler("cpu")

    control = callback.on_pre_optimizer_step(None, State(), Control(), model=model, optimizer=Optimizer())
    assert not control.should_training_stop and callback.stopped_at is None and model.weight.grad is not None


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
    with pytest.raises(ValueError, match="not one of .* a frame only shows runs already made"):
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


def test_records_must_be_training_records():
    for bad in ([{"loss": 1.0}], [3.0], "records", [], None):
        with pytest.raises((TypeError, ValueError), match=WHAT_WHY_FIX):
            nd.nonfinite_steps(bad)
    with pytest.raises(ValueError, match="'step', 'loss' and 'grad_norm'"):
        nd.first_nonfinite_step([{"step": 1, "loss": 1.0}])


def test_lowest_diverging_lr_refuses_a_bad_grid_before_any_run():
    calls = []

    def fake(lr):
        calls.append(lr)
        return _records([1.0, 1.0], [1.0, 1.0])

    for lrs in ([0.1, -1.0], [0.1, float("nan")], [], "0.1", [0.1, None]):
        with pytest.raises(ValueError, match=WHAT_WHY_FIX):
            nd.lowest_diverging_lr(fake, lrs)
    assert calls == [], "nothing ran: the grid is checked first"
    with pytest.raises(TypeError, match="must be a function"):
        nd.lowest_diverging_lr("run", [0.1])
    with pytest.raises(ValueError, match=r"run\(0.1\)"):
        nd.lowest_diverging_lr(lambda lr: [{"lr": lr}], [0.1])  # a run that returns no records


def test_explorer_refuses_an_unhealthy_reference_and_an_unknown_start():
    runs = {0.1: _records([5.0, 4.0], [2.0, 3.0]), 3.0: _records([5.0, float("nan")], [2.0, float("inf")])}
    healthy = _records([5.0, 4.2], [2.0, 2.5])
    with pytest.raises(ValueError, match="not a healthy run"):
        nd.lr_explorer(runs, _records([5.0, float("nan")], [2.0, float("nan")]), 0.01)
    with pytest.raises(ValueError, match="not a healthy run"):
        nd.lr_frame(runs, 0.1, _records([5.0, 4.0], [0.0, 0.0]), 0.01)  # no gradient to divide by
    with pytest.raises(ValueError, match="not one of"):
        nd.lr_explorer(runs, healthy, 0.01, start=0.5)
    with pytest.raises(ValueError, match="finite number > 0"):
        nd.lr_explorer(runs, healthy, -0.01)
    with pytest.raises(ValueError, match="lr_runs"):
        nd.lr_explorer({0.1: []}, healthy, 0.01)


def test_forward_tools_refuse_what_cannot_run(course):
    model, _ = course
    vocab = model.get_input_embeddings().num_embeddings
    beyond = {"input_ids": torch.tensor([[1, vocab + 5]])}
    for tool in (nd.forward_watch, nd.first_nonfinite_module, nd.debug_underflow_overflow):
        with pytest.raises(ValueError, match="embeddings"):  # a tokenizer of another model: not an IndexError
            tool(model, beyond)
        with pytest.raises(TypeError, match="torch model"):
            tool("model", {"input_ids": torch.ones(1, 2, dtype=torch.long)})
        with pytest.raises(TypeError, match="not a tensor|torch.Tensor"):
            tool(model, {"input_ids": [[1, 2]]})
    with pytest.raises(TypeError, match="torch model"):
        nd.watch_activations("model")
    with pytest.raises(ValueError, match="embeddings"):
        nd.overflow_scale(model, beyond)
    with pytest.raises(ValueError, match="no LoRA adapter"):  # refused before the first forward
        nd.overflow_scale(model, {"input_ids": torch.ones(1, 2, dtype=torch.long)})
    with pytest.raises(TypeError, match="torch model"):
        nd.first_norm("model")
    with pytest.raises(TypeError, match="batches"):
        nd.batch_at_step({"input_ids": torch.ones(1, 2, dtype=torch.long)}, 1)


def test_norm_on_inf_refuses_a_position_or_width_that_does_not_fit():
    with pytest.raises(ValueError, match="outside a hidden vector of 8"):
        nd.norm_on_inf(torch.nn.LayerNorm(8), 8, position=8)
    with pytest.raises(ValueError, match="the layer's width"):
        nd.norm_on_inf(torch.nn.LayerNorm(8), 4)
    with pytest.raises(TypeError, match="normalisation layer"):
        nd.norm_on_inf("norm", 8)


def test_anomaly_report_needs_a_scalar_loss_with_a_gradient():
    w = torch.ones(2, requires_grad=True)
    for not_a_loss in (lambda: 1.0, lambda: (w * 2).sum().item(), lambda: w * 2, lambda: torch.ones(())):
        with pytest.raises(TypeError, match="not a scalar loss with a gradient"):
            nd.anomaly_report(not_a_loss)
    with pytest.raises(TypeError, match="no arguments"):
        nd.anomaly_report(math.nan)


def test_qlora_model_and_sft_run_refuse_bad_arguments_before_loading(course):
    with pytest.raises(ValueError, match="seed"):
        nd.qlora_model(seed=-1)
    with pytest.raises(ValueError, match="seed"):
        nd.qlora_model(seed=True)
    with pytest.raises(ValueError, match="LoRA rank"):
        nd.qlora_model(r=0)
    model, tok = course
    with pytest.raises(TypeError, match="TrainerCallback"):
        nd.sft_run(model, tok, None, callback=ref.guard)  # the guard itself, not GuardCallback(guard)
    with pytest.raises(TypeError, match="tokenizer"):
        nd.sft_run(model, "tok", None)
    with pytest.raises(TypeError, match="matplotlib Axes"):
        nd.plot_checklist(ax="left")


def test_largest_finite_ignores_inf_and_nan():
    """The watch's |activation| record: the largest finite magnitude, whatever else the tensor holds."""
    inf, nan = float("inf"), float("nan")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.tensor([[-3.0, inf], [nan, -inf], [2.0, 1.0]], dtype=dtype)
        assert nd._largest_finite(t) == 3.0, dtype
    assert nd._largest_finite(torch.tensor([nan, inf])) == 0.0, "nothing finite: 0"
    assert nd._largest_finite(torch.zeros(0)) == 0.0


def test_learned_vs_control_scores_the_untrained_model_on_the_run_batches(course):
    from course_utils import make_batches, make_messages
    from course_utils.losses import mean_ignore_index, model_logits

    model, tok = course
    batches = make_batches(tok, make_messages(n=12, seed=0), batch_size=4)
    with torch.no_grad():
        control = [mean_ignore_index(model_logits(model, b), b["labels"]).item() for b in batches]
    learned, noise = nd.learned_vs_control(model, batches, [c - 1.0 for c in control])  # a run 1 nat below
    assert math.isclose(learned, 1.0, rel_tol=1e-6)
    steps = (abs(control[0] - control[1]) + abs(control[1] - control[2])) / 2
    assert math.isclose(noise, steps, rel_tol=1e-6)
    with pytest.raises(ValueError, match=WHAT_WHY_FIX):
        nd.learned_vs_control(model, batches, control[:2])  # one loss per batch


def test_learned_vs_control_averages_the_last_half_so_one_late_spike_does_not_erase_what_was_learned(course):
    from course_utils import make_batches, make_messages
    from course_utils.losses import mean_ignore_index, model_logits

    model, tok = course
    batches = make_batches(tok, make_messages(n=24, seed=0), batch_size=4)
    assert len(batches) == 6
    with torch.no_grad():
        control = [mean_ignore_index(model_logits(model, b), b["labels"]).item() for b in batches]
    run = [c - 1.0 for c in control[:5]] + [control[5] + 0.5]  # 1 nat below, then a spike at the last step
    learned, _ = nd.learned_vs_control(model, batches, run)
    assert math.isclose(learned, (1.0 + 1.0 - 0.5) / 3, rel_tol=1e-6)  # the last 3 of 6 steps


@pytest.mark.parametrize("losses, error, says", [
    (None, ValueError, "losses must be a non-empty list"),
    ("0.5 0.4", ValueError, "losses must be a non-empty list"),
    ([1.0, "0.4", 0.3], TypeError, r"losses\[1\] is '0.4' \(str\), not a number"),
])
def test_learned_vs_control_refuses_losses_that_are_not_numbers(course, losses, error, says):
    from course_utils import make_batches, make_messages

    model, tok = course
    batches = make_batches(tok, make_messages(n=12, seed=0), batch_size=4)
    with pytest.raises(error, match=says):
        nd.learned_vs_control(model, batches, losses)


def test_sft_run_refuses_no_step_count_before_training(course):
    from course_utils import make_chat_dataset

    model, tok = course
    with pytest.raises(ValueError, match="max_steps=None must be an integer >= 1"):
        nd.sft_run(model, tok, make_chat_dataset("add", n=4), max_steps=None)


# ---- load dtype: a bf16 checkpoint fully fine-tuned has no float32 master weights ---------------

def test_a_bf16_checkpoint_loads_in_bf16_and_small_updates_round_away(tmp_path):
    from transformers import AutoModelForCausalLM

    from course_utils import load_course_model, make_batches
    from course_utils.data import make_messages

    model, tok = load_course_model()
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    batch = make_batches(tok, make_messages(n=4, seed=1), batch_size=4)[0]
    as_saved = AutoModelForCausalLM.from_pretrained(tmp_path)          # transformers 5: dtype="auto"
    in_fp32 = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    n_weights = sum(p.numel() for p in in_fp32.parameters())
    expected = {"dtype": "bfloat16", "share": 1.0, "trainable": n_weights}
    assert nd.low_precision_master_weights(as_saved) == expected
    assert nd.low_precision_master_weights(in_fp32)["share"] == 0.0
    kept, moved = nd.fraction_updated(as_saved, batch, lr=1e-5), nd.fraction_updated(in_fp32, batch, lr=1e-5)
    assert moved > 0.9 and kept < moved / 2, (kept, moved)


def test_load_dtype_helpers_refuse_bad_input():
    model = torch.nn.Linear(2, 2)
    with pytest.raises((TypeError, ValueError), match=WHAT_WHY_FIX):
        nd.fraction_updated(model, {"input_ids": torch.zeros(1, 2)})
    with pytest.raises((TypeError, ValueError), match=WHAT_WHY_FIX):
        nd.low_precision_master_weights("model")


def test_first_norm_skips_qk_norms():
    """Qwen3 builds q_norm / k_norm (one head wide) before its input_layernorm; OLMo 2's q_norm is as wide as
    the hidden state. Neither is the norm an inf in the hidden state meets."""
    from transformers import Olmo2Config, Olmo2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    shape = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=2)
    for model in (Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=4)), Olmo2ForCausalLM(Olmo2Config(**shape))):
        norm = nd.first_norm(model)
        name = next(n for n, m in model.named_modules() if m is norm)
        assert name.rsplit(".", 1)[-1] not in ("q_norm", "k_norm") and norm.weight.shape[-1] == 16, name
        assert nd.norm_on_inf(norm, 16)["nan"] == 1


def test_qk_norms_found_and_removed_only_where_they_exist():
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    shape = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1)
    qwen3 = Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=8))
    names = nd.qk_norms(qwen3)
    assert sorted(n.rsplit(".", 1)[-1] for n in names) == ["k_norm", "k_norm", "q_norm", "q_norm"]
    ids = torch.tensor([[1, 2, 3]])
    assert nd.without_qk_norm(qwen3) is qwen3 and nd.qk_norms(qwen3) == []
    assert torch.isfinite(qwen3(input_ids=ids).logits).all()   # an identity keeps every shape
    qwen2 = Qwen2ForCausalLM(Qwen2Config(**shape))
    assert nd.qk_norms(qwen2) == []
    with pytest.raises(ValueError, match="no query or key norms"):
        nd.without_qk_norm(qwen2)
    with pytest.raises(TypeError, match="torch model"):
        nd.qk_norms("model")
