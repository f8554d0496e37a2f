"""Tests for course_utils.watch.SFTWatch on real tiny SFTTrainer runs of the course model (slow), and its
arguments (fast)."""

import contextlib
import io
import math
import re

import pytest
import torch
from datasets import Dataset
from trl import SFTTrainer

from course_utils import load_course_model, make_chat_dataset, make_sft_trainer
from course_utils import watch as watch_module
from course_utils.data import IGNORE_INDEX
from course_utils.training import logged
from course_utils.watch import SFTWatch

slow = pytest.mark.slow  # real SFTTrainer runs: `make test-slow` (and CI) run them
WHAT_WHY_FIX = r".+ — .+ — .+"


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

