"""Tests for course_utils.watch.SFTWatch on real tiny SFTTrainer runs of the course model (slow), and its
arguments (fast)."""

import contextlib
import io
import math
import re
import sys

import pytest
import torch
from datasets import Dataset
from torch.overrides import TorchFunctionMode
from transformers import TrainerCallback
from trl import SFTTrainer

from course_utils import load_course_model, make_chat_dataset, make_sft_trainer
from course_utils import watch as watch_module
from course_utils.data import IGNORE_INDEX
from course_utils.training import logged
from course_utils.watch import SFTWatch

slow = pytest.mark.slow  # real SFTTrainer runs: `make test-slow` (and CI) run them
WHAT_WHY_FIX = r".+ — .+ — .+"
SYNCS = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
         torch.Tensor.__int__)  # each waits for the device


# ---- arguments (fast) ---------------------------------------------------------------------------

@pytest.mark.parametrize("args", [(True,), (False, True), ("stop",)])
def test_switches_are_by_name_only(args):
    """Issue 36: SFTWatch(True) raised Python's bare 'takes 1 positional argument'."""
    with pytest.raises(TypeError, match="takes its switches by name.*could mean any of") as caught:
        SFTWatch(*args)
    assert re.match(WHAT_WHY_FIX, str(caught.value))


def test_a_misspelt_switch_is_named():
    with pytest.raises(ValueError, match="did you mean 'stop_on_nonfinite'"):
        SFTWatch(stop_on_nonfinit=True)
    for name in SFTWatch.SWITCHES:
        with pytest.raises(ValueError, match="True or False"):
            SFTWatch(**{name: "yes"})
        assert getattr(SFTWatch(**{name: False}), name) is False


def _docstring_example() -> str:
    block = watch_module.__doc__.split("::", 1)[1].split("\nOne watch per run")[0]
    return "\n".join(line[4:] for line in block.strip("\n").splitlines())


def test_the_docstring_example_builds_no_trainer_with_callbacks():
    """make_sft_trainer refuses callbacks= (not an SFTConfig field): the example must not pass it."""
    example = _docstring_example()
    compile(example, "<watch docstring>", "exec")
    assert "callbacks=" not in example and "trainer.add_callback(watch)" in example


# ---- real runs (slow) ---------------------------------------------------------------------------


def watched(dataset, model=None, trainer_cls=None, watch=None, **config):
    if model is None:
        model, tok = load_course_model()
    else:
        tok = load_course_model()[1]
    watch = watch or SFTWatch()
    trainer = make_sft_trainer(model, tok, dataset, trainer_cls=trainer_cls, **config)
    trainer.add_callback(watch)
    trainer.train()
    return watch, trainer


def pretokenized(flags, tok):
    """Rows already tokenized (TRL keeps them as they are): flag True = every label -100 (nothing graded)."""
    ids = tok("the red cat sat on the big blue box", add_special_tokens=False)["input_ids"]
    return Dataset.from_list([{"input_ids": ids, "labels": [IGNORE_INDEX] * len(ids) if masked else ids}
                              for masked in flags])


@slow
@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e6])
def test_clip_rate_matches_the_logged_pre_clip_norms(max_grad_norm):
    watch, trainer = watched(make_chat_dataset(n=48), max_steps=5, max_grad_norm=max_grad_norm)
    norms = logged(trainer, "grad_norm")  # the Trainer logs the norm *before* clipping
    assert [s["clipped"] for s in watch.steps] == [n > max_grad_norm for n in norms]
    assert watch.clip_rate == (1.0 if max_grad_norm < 1 else 0.0)
    assert [s["pre_clip_norm"] for s in watch.steps] == norms


@slow
def test_counts_micro_batches_without_graded_tokens_and_their_silent_zero_loss():
    tok = load_course_model()[1]
    flags = [True, False, False, True, False, True]
    watch, trainer = watched(pretokenized(flags, tok), max_steps=6, per_device_train_batch_size=1,
                             max_length=None, shuffle_dataset=False, train_sampling_strategy="sequential")
    assert len(watch.micro_batches) == 6
    assert watch.empty_micro_batches == sum(flags)
    losses = logged(trainer)
    for step, loss in zip(watch.steps, losses, strict=True):
        # TRL divides by num_tokens.clamp(min=1): an empty micro-batch logs exactly 0.0, not NaN
        assert (loss == 0.0) == (step["empty_micro_batches"] == 1)
    assert "micro-batches with no graded token: 3" in watch.report()


@slow
def test_no_empty_micro_batches_on_a_clean_run_and_accumulation_is_counted_per_micro_batch():
    watch, _ = watched(make_chat_dataset(n=48), max_steps=3, per_device_train_batch_size=4,
                       gradient_accumulation_steps=2, assistant_only_loss=True)
    assert len(watch.steps) == 3 and len(watch.micro_batches) == 6
    assert watch.empty_micro_batches == 0 and watch.nonfinite is None and watch.stopped_because is None
    assert all(s["graded_tokens"] > 0 for s in watch.steps)


@slow
def test_stop_on_empty_micro_batch():
    tok = load_course_model()[1]
    watch, trainer = watched(pretokenized([False, True, False, False], tok),
                             watch=SFTWatch(stop_on_empty=True), max_steps=4, per_device_train_batch_size=1,
                             max_length=None, shuffle_dataset=False, train_sampling_strategy="sequential")
    assert trainer.state.global_step == 2 and "no graded token" in watch.stopped_because


@slow
def test_first_nonfinite_activation_names_the_module_and_stops():
    model, _ = load_course_model()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("inf")
    watch, trainer = watched(make_chat_dataset(n=48), model=model, max_steps=5)
    assert watch.nonfinite["kind"] == "activation"
    assert watch.nonfinite["where"] == "model.layers.1.mlp.down_proj"  # inf*0 = NaN appears right there
    assert trainer.state.global_step == 1 < 5 and watch.stopped_because == "non-finite activation"
    assert "model.layers.1.mlp.down_proj" in watch.report()


class HandwrittenMeanTrainer(SFTTrainer):
    """compute_loss as many loops write it: (nll * mask).sum() / mask.sum() — 0/0 on an empty micro-batch."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # labels go in too, as in most loops: the watch counts graded tokens from the forward's labels
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                       labels=inputs["labels"]).logits
        labels = inputs["labels"][:, 1:]
        mask = labels != IGNORE_INDEX
        logp = logits[:, :-1].log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        return -(logp * mask).sum() / mask.sum()


@slow
def test_a_handwritten_masked_mean_on_an_empty_micro_batch_is_caught_at_its_loss():
    tok = load_course_model()[1]
    watch, trainer = watched(pretokenized([True, False, False], tok), trainer_cls=HandwrittenMeanTrainer,
                             max_steps=3, per_device_train_batch_size=1, max_length=None,
                             shuffle_dataset=False, train_sampling_strategy="sequential")
    # the model's own mean cross-entropy of an all-masked micro-batch is 0/0 = NaN: the first non-finite value
    assert watch.nonfinite == {"kind": "loss", "where": "the model's output", "step": 1, "micro_batch": 1}
    assert watch.empty_micro_batches == 1 and trainer.state.global_step == 1
    assert math.isnan(watch.steps[0]["post_clip_norm"])  # and the hand-written mean's gradients are NaN


@slow
def test_without_locate_a_nonfinite_gradient_still_stops_the_run():
    model, _ = load_course_model()
    model.model.layers[1].mlp.down_proj.weight.register_hook(lambda grad: grad * float("nan"))
    watch, trainer = watched(make_chat_dataset(n=48), model=model, max_steps=4, watch=SFTWatch(locate=False))
    assert watch.nonfinite == {"kind": "gradient", "where": "total norm", "step": 1, "micro_batch": 1}
    assert trainer.state.global_step == 1 and all(bool(torch.isfinite(p).all()) for p in model.parameters())


@slow
def test_first_nonfinite_gradient_with_finite_activations_names_the_parameter():
    model, _ = load_course_model()
    poisoned = model.model.layers[1].mlp.down_proj.weight
    poisoned.register_hook(lambda grad: grad * float("nan"))  # a NaN born in the backward pass only
    watch, trainer = watched(make_chat_dataset(n=48), model=model, max_steps=4)
    assert watch.nonfinite["kind"] == "gradient" and watch.nonfinite["step"] == 1
    assert watch.nonfinite["where"] == "model.layers.1.mlp.down_proj.weight"
    assert trainer.state.global_step == 1 and "stopped the run: non-finite gradient" in watch.report()
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters()), "the NaN step was not applied"


@slow
def test_bad_arguments_and_hooks_removed_after_training():
    with pytest.raises(ValueError, match="True or False"):
        SFTWatch(stop_on_empty="yes")
    model, _ = load_course_model()
    watch, _ = watched(make_chat_dataset(n=16), model=model, max_steps=1)
    assert not watch._handles and not model._forward_pre_hooks and not model.model.layers[0]._forward_hooks


@slow
def test_works_with_a_plain_transformers_trainer():
    """Not only SFTTrainer: the model computes its own loss from `labels`, and the watch sees them."""
    import tempfile

    from transformers import Trainer, TrainingArguments
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model, tok = load_course_model()
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=3, per_device_train_batch_size=1,
                             report_to="none", use_cpu=True, save_strategy="no", logging_steps=1,
                             train_sampling_strategy="sequential", disable_tqdm=True, max_grad_norm=1e-3)
    watch = SFTWatch()
    trainer = Trainer(model=model, args=args, train_dataset=pretokenized([False, True, False], tok),
                      data_collator=DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id),
                      callbacks=[watch])
    trainer.train()
    assert watch.micro_batches[1] == 0 and watch.empty_micro_batches == 1
    # transformers' own mean of an all-masked batch is 0/0: the watch names it and stops after that step
    assert watch.nonfinite["kind"] == "loss" and trainer.state.global_step == 2


@slow
def test_the_docstring_example_runs_and_reports():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_docstring_example(), "<watch docstring>", "exec"), {})
    assert printed.getvalue().startswith("SFTWatch: 5 optimizer steps, 5 micro-batches"), printed.getvalue()


@slow
def test_one_watch_per_run():
    watch, trainer = watched(make_chat_dataset(n=16), max_steps=1)
    with pytest.raises(ValueError, match=r"already watched a run .* would mix .*\(SFTWatch\(\)\)"):
        trainer.train()  # the same trainer, the same watch: a second run
    assert len(watch.steps) == 1



# ---- fp16: a skipped GradScaler step is counted, not a stop (issue 31) ----------------------------

INIT_SCALE = 2.0 ** 30  # far above what fp16 gradients take: the first steps overflow, as a real run's do


class CpuFp16Trainer(SFTTrainer):
    """SFTTrainer(fp16=True) with accelerate's own fp16 machinery switched on, on a CPU.

    accelerate 1.15 builds the GradScaler only off the CPU (accelerate/accelerator.py: Accelerator.__init__,
    ``self.device.type != "cpu"``), so Trainer(fp16=True) on a CPU trains in fp32. Everything else is the
    real path: with ``native_amp`` and the scaler set before ``train()`` prepares the model and the optimizer,
    the forward runs under fp16 autocast, ``Accelerator.backward`` scales the loss, ``clip_grad_norm_``
    unscales the gradients and ``GradScaler.step`` skips an overflowing step and halves the scale."""

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        assert self.accelerator.mixed_precision == "fp16" and self.accelerator.scaler is None
        self.accelerator.native_amp = True
        self.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=10_000)


def fp16_watched(model=None, watch=None, callbacks=(), max_steps=24):
    if model is None:
        model = load_course_model()[0]
    tok = load_course_model()[1]
    trainer = make_sft_trainer(model, tok, make_chat_dataset(n=48), trainer_cls=CpuFp16Trainer, fp16=True,
                               max_steps=max_steps)
    for callback in callbacks:
        trainer.add_callback(callback)
    watch = watch or SFTWatch()
    trainer.add_callback(watch)
    trainer.train()
    return watch, trainer


@slow
@pytest.mark.parametrize("locate", [True, False])
def test_skipped_fp16_steps_are_counted_and_the_run_goes_on(locate):
    model, _ = load_course_model()
    dtypes = set()
    model.model.layers[0].mlp.up_proj.register_forward_hook(lambda module, args, out: dtypes.add(out.dtype))
    watch, trainer = fp16_watched(model=model, watch=SFTWatch(locate=locate))
    assert dtypes == {torch.float16}, "the forward really ran under fp16 autocast"
    assert trainer.state.global_step == 24 and watch.stopped_because is None and watch.nonfinite is None
    skipped = [s["step"] for s in watch.skipped_steps]
    scale = trainer.accelerator.scaler.get_scale()
    # the mechanism, read from the scaler itself: each skip halved the scale (growth_interval is not reached)
    assert skipped and scale == INIT_SCALE / 2 ** len(skipped), (skipped, scale)
    # and from the Trainer's log: the unscaled pre-clip norm is inf/NaN exactly on the skipped steps
    norms = logged(trainer, "grad_norm")
    assert skipped == [step for step, norm in enumerate(norms, 1) if not math.isfinite(norm)]
    assert 0 < len(skipped) < len(norms), "some steps skip, then the smaller scale fits and the run trains"
    assert [s["step"] for s in watch.steps if s["skipped"]] == skipped
    where = {s["where"] for s in watch.skipped_steps}
    # where: the first gradient, in backward order, the scaled backward overflowed (locate=False: the norm)
    names = {name for name, _ in trainer.model.named_parameters()}
    assert where <= names if locate else where == {"total norm"}, where
    assert all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    assert f"steps the fp16 GradScaler skipped (overflow, then a smaller scale; routine): {len(skipped)}" \
        in watch.report()
    assert watch.summary()["skipped_steps"] == len(skipped)


@slow
def test_under_fp16_a_nonfinite_loss_still_stops_the_run():
    model, _ = load_course_model()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("inf")
    watch, trainer = fp16_watched(model=model)
    # the scaler would skip this step too, forever: a NaN born in the forward is no overflow of the scale
    assert trainer.state.global_step == 1 and watch.stopped_because == "non-finite activation"
    assert watch.nonfinite["where"] == "model.layers.1.mlp.down_proj" and not watch.skipped_steps


class BrokenUpdate(TrainerCallback):
    """An update that writes inf into one weight after step 3 (a bad optimizer, a bad lr, an overflow)."""

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == 2:  # the Trainer counts the step after this event
            with torch.no_grad():
                model.model.layers[0].self_attn.q_proj.weight[0, 0] = float("inf")


@slow
def test_under_fp16_weights_an_update_made_nonfinite_stop_the_run():
    watch, trainer = fp16_watched(callbacks=[BrokenUpdate()])
    assert watch.nonfinite == {"kind": "weight", "where": "model.layers.0.self_attn.q_proj.weight", "step": 3,
                               "micro_batch": 3}
    assert trainer.state.global_step == 4 and watch.stopped_because == "non-finite weight"


@slow
def test_the_last_update_is_checked_at_the_end_of_training():
    watch, trainer = fp16_watched(callbacks=[BrokenUpdate()], max_steps=3)
    assert trainer.state.global_step == 3 and watch.nonfinite["kind"] == "weight"
    assert "first non-finite weight at step 3" in watch.report()


@slow
@pytest.mark.parametrize("locate", [True, False])
def test_one_device_sync_per_optimizer_step(locate):
    """The checks stay on the device and are read back once a step (plus once at the end of training)."""
    syncs = []

    class CountSyncs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            caller = sys._getframe(1).f_code.co_filename
            if caller == watch_module.__file__ and func in SYNCS:
                syncs.append(func.__name__)
            return func(*args, **(kwargs or {}))

    model, tok = load_course_model()
    watch = SFTWatch(locate=locate)
    trainer = make_sft_trainer(model, tok, make_chat_dataset(n=48), max_steps=4,
                               gradient_accumulation_steps=2, per_device_train_batch_size=4)
    trainer.add_callback(watch)
    with CountSyncs():
        trainer.train()
    assert syncs == ["tolist"] * (4 + 1), syncs
    assert len(watch.micro_batches) == 8 and watch.nonfinite is None
