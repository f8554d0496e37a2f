"""The core's promises: one documented behaviour per idea, no lasting global side effects, and
what/why/fix errors for the slips learners make most (un-collated batch, zero steps, wrong pair)."""

import math
import re

import pytest
import torch
from conftest import stub

from course_utils import losses, validate
from course_utils.checks import Case, Diagnosis, Hints, check_diagnosis, close, run_check
from course_utils.data import IGNORE_INDEX, collate_right, make_messages, tokenize_chat
from course_utils.quiet import captured_log, library_state, quiet_libraries
from course_utils.training import make_sft_trainer, train


def _batch(tokenizer, n=2, seed=0):
    examples = [tokenize_chat(tokenizer, m) for m in make_messages("add", n=n, seed=seed)]
    return collate_right(examples, tokenizer.pad_token_id)


def test_masked_means_agree_with_targets_and_differ_without(course):
    model, tokenizer = course
    batch = _batch(tokenizer)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    values = [float(f(logits, batch["labels"])) for f in losses.MASKED_MEANS.values()]
    assert max(values) - min(values) < 1e-5, "the four masked means agree when targets exist"
    empty = torch.full_like(batch["labels"], IGNORE_INDEX)
    grads = {}
    for name, fn in losses.MASKED_MEANS.items():
        leaf = logits.clone().requires_grad_()
        value = fn(leaf, empty)
        value.backward()
        grad = leaf.grad
        grads[name] = (float(value.detach()), bool(torch.isnan(grad).any()), float(grad.abs().max()))
    assert math.isnan(grads["ignore_index"][0]) and grads["ignore_index"][2] == 0.0
    # the mask multiplied in is not what decides: the per-token loss's backward at ignored positions is
    assert math.isnan(grads["times mask, ignore_index"][0]) and grads["times mask, ignore_index"][2] == 0.0
    assert math.isnan(grads["times mask, all positions"][0]) and grads["times mask, all positions"][1]
    assert grads["clamped"][0] == 0.0 and grads["clamped"][2] == 0.0


def test_eval_loss_one_behaviour_for_nothing_to_evaluate(course):
    model, tokenizer = course
    batch = _batch(tokenizer)
    assert math.isfinite(losses.eval_loss(model, [batch]))
    with pytest.raises(ValueError, match="no batch has a supervised token"):
        losses.eval_loss(model, [{**batch, "labels": torch.full_like(batch["labels"], IGNORE_INDEX)}])
    with pytest.raises(ValueError, match="non-empty list"):
        losses.eval_loss(model, [])


def test_count_supervised_takes_labels_or_batch():
    labels = torch.tensor([[IGNORE_INDEX, 5, IGNORE_INDEX, 7], [3, 4, IGNORE_INDEX, IGNORE_INDEX]])
    assert losses.count_supervised(labels) == 3 == losses.count_supervised({"labels": labels})


def test_shape_mismatch_is_an_error_not_a_number():
    with pytest.raises(ValueError, match="every position needs one label"):
        losses.mean_clamped(torch.randn(2, 5, 11), torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"steps": 2, "accum_steps": 0}, {"steps": 2, "lr": 0},
                                    {"steps": 2, "max_grad_norm": -1}, {"steps": True}])
def test_train_rejects_zero_and_negative_settings(course, kwargs):
    model, tokenizer = course
    with pytest.raises(ValueError, match=r" — .* — "):
        train(model, [_batch(tokenizer)], **kwargs)


def test_uncollated_batch_gets_one_clear_sentence(course):
    model, tokenizer = course
    examples = [tokenize_chat(tokenizer, m) for m in make_messages("add", n=2)]
    with pytest.raises(TypeError, match="call collate_right"):
        train(model, [examples], steps=1)


def test_mismatched_model_and_tokenizer_ids(course):
    model, _ = course
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.tensor([[1, vocab + 5]])
    with pytest.raises(ValueError, match="does not belong to this model"):
        losses.model_logits(model, {"input_ids": ids, "labels": ids})


def test_make_sft_trainer_rejects_zero_steps(course):
    model, tokenizer = course
    from course_utils import make_chat_dataset

    with pytest.raises(ValueError, match="max_steps=0"):
        make_sft_trainer(model, tokenizer, make_chat_dataset("add", n=4), max_steps=0)
    with pytest.raises(TypeError, match="datasets.Dataset"):
        make_sft_trainer(model, tokenizer, [{"messages": []}])


def test_helpers_leave_library_state_as_they_found_it(course):
    import copy

    import datasets

    from course_utils import make_chat_dataset
    from course_utils.templates import trl_text_rows

    model, tokenizer = course
    datasets.enable_progress_bars()  # a fresh process's default (this worker's earlier tests may differ)
    before = library_state()
    assert before["datasets_bars"], "progress bars are on by default"
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, make_chat_dataset("add", n=16), max_steps=2)
    trainer.train()
    trl_text_rows(tokenizer, ["some text"])  # it once switched datasets' bars off for good
    with quiet_libraries(capture_output=True):
        assert not datasets.is_progress_bar_enabled()
    with captured_log("transformers") as messages:
        import transformers

        transformers.logging.get_logger("transformers.test").warning("heard")
    assert messages == ["heard"]
    assert library_state() == before


def test_validate_messages_name_the_argument():
    with pytest.raises(ValueError, match=r"^steps=0 must be an integer >= 1 — .* — pass an integer >= 1\.$"):
        validate.positive_int("steps", 0)
    with pytest.raises(ValueError, match="'sum' is not one of"):
        validate.choice("normalise", "sum", ("mean", "token"))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        validate.tensor("labels", [1, 2])


@pytest.mark.parametrize("call, says, never", [
    # the default fix names the valid range, not a made-up value (stop_id=1 is <|im_start|>, lr=1.0 diverges)
    (lambda: validate.integer("stop_id", -3, minimum=0, why="it is a token id"), "pass an integer >= 0",
     "=1"),
    (lambda: validate.number("lr", -1.0, positive=True), "pass a finite number > 0.", "=1.0"),
    (lambda: validate.number("beta", 2.0, minimum=3), "pass a finite number >= 3.", "=1.0"),
    # a caller that knows a real value gives it
    (lambda: validate.number("lr", 0.0, positive=True, example=2e-5),
     "pass a finite number > 0, e.g. lr=2e-05", "=1.0"),
    (lambda: validate.positive_int("steps", 0, example=100), "e.g. steps=100", "=1."),
    # a number written as text, or an integral float, is named with the value to pass
    (lambda: validate.integer("n", "3"), "pass the number itself, n=3, not the text '3'", "e.g."),
    (lambda: validate.integer("n", 4.0), "pass an int, n=4", "e.g."),
    (lambda: validate.number("eps", "1e-8", minimum=0), "eps=1e-08, not the text", "e.g."),
    # no bound: no "finite number finite"
    (lambda: validate.number("x", float("nan"), why="it is a length"),
     "must be a finite number — it is a length", "finite number finite"),
    # NaN, text and bools reach the range's own message and hint
    (lambda: validate.fraction("p", float("nan")),
     "fraction between 0 and 1 — it is a share of a whole — pass a number from 0 to 1", "finite number"),
    (lambda: validate.fraction("p", "0.5"), "pass the number itself, p=0.5", "finite number"),
    (lambda: validate.fraction("p", 50), "looks like a percentage: pass p=0.5", "finite number"),
    (lambda: validate.percentage("q", float("nan")), "percentage between 0 and 100", "finite number"),
    (lambda: validate.percentage("q", True), "pass a number from 0 to 100", "finite number"),
    (lambda: validate.percentage("q", 0.85), "looks like a fraction: pass q=85", "finite number"),
])
def test_validate_fixes_name_the_range_or_a_real_value(call, says, never):
    with pytest.raises(ValueError) as error:
        call()
    assert says in str(error.value) and never not in str(error.value), str(error.value)


@pytest.mark.parametrize("value, vocab_size, says", [
    (10 ** 7, None, "is beyond any vocabulary (no tokenizer has 1,048,576 tokens"),
    (523, 523, "beyond the 523 token ids of the vocabulary (0 to 522)"),
    (-1, None, "must be an integer >= 0"),
    ("5", 523, "pass the number itself, pad_id=5"),
    (True, None, "must be an integer >= 0"),
])
def test_validate_token_id_refuses_ids_no_vocabulary_holds(value, vocab_size, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        validate.vocab_id("pad_id", value, vocab_size=vocab_size)
    assert validate.vocab_id("pad_id", 522, vocab_size=523) == 522
    assert validate.vocab_id("pad_id", 151643) == 151643, "ids alone: a real id of a large vocabulary passes"


@pytest.mark.parametrize("per_token", [losses.per_token_ignore_index, losses.per_token_all_positions])
@pytest.mark.parametrize("flat_logits, flat_labels, says", [
    (torch.zeros(42, 0), torch.zeros(42, dtype=torch.long), "flat_logits has shape \\(42, 0\\)"),
    (torch.zeros(42, 9), torch.zeros(0, dtype=torch.long), "flat_labels \\(0,\\)"),  # tensor([]) before
    (torch.zeros(2, 3, 9), torch.zeros(2, dtype=torch.long), "must have 2 dimensions"),
    (torch.zeros(2, 9), torch.tensor([1, 12]), "labels hold 12"),
])
def test_per_token_losses_refuse_logits_and_labels_that_do_not_pair(per_token, flat_logits, flat_labels,
                                                                    says):
    with pytest.raises(ValueError, match=says):
        per_token(flat_logits, flat_labels)
    assert per_token(torch.zeros(2, 9), torch.tensor([1, IGNORE_INDEX])).shape == (2,)


@pytest.mark.parametrize("value", [None, "yes", 1])
def test_params_finite_trainable_only_is_a_flag(value):
    with pytest.raises(TypeError, match="trainable_only=.* must be True or False"):
        losses.params_finite(torch.nn.Linear(2, 2), trainable_only=value)


def test_graded_hints_give_the_answer_last_and_only_when_asked(capsys):
    hints = Hints("Which labels carry loss?", "Look at the token viewer in §2.",
                  "return int((labels != -100).sum())")
    result = run_check("demo", lambda x: 0, [Case((1,), 1)], hint=hints)
    first = capsys.readouterr().out
    assert not result and "Which labels" in first and "!= -100" not in first
    levels = [result.hint() for _ in range(4)]
    assert "question" in levels[0] and "pointer" in levels[1]
    assert "!= -100" not in "".join(levels) and "opens after 2 failed checks" in capsys.readouterr().out, \
        "one failed check: the answer stays closed, the pointer repeats"
    result = run_check("demo", lambda x: 0, [Case((1,), 1)], hint=hints)  # the second failed try
    levels = [result.hint() for _ in range(4)]
    assert "answer" in levels[2] and "!= -100" in levels[2]
    assert levels[3] == levels[2], "the last level repeats"
    unfinished = run_check("stub", stub, [Case((1,), 1)], hint=hints, quiet=True)
    unfinished2 = run_check("stub", stub, [Case((1,), 1)], hint=hints, quiet=True)
    assert not unfinished and "!= -100" not in "".join(unfinished2.hint() for _ in range(3)), \
        "an untouched stub is not a try: it never opens the answer"


def test_diagnosis_checker_grades_fresh_cases():
    def make_case(seed):
        cause = ("a", "b", "c")[seed % 3]
        return {"cause": cause, "step": seed}, Diagnosis(cause, seed)

    good = check_diagnosis("d", lambda art: Diagnosis(art["cause"], art["step"]), make_case,
                           seeds=lambda: range(6), quiet=True)
    memorised = check_diagnosis("d", lambda art: Diagnosis("a", 0), make_case, seeds=6, quiet=True)
    wrong_evidence = check_diagnosis("d", lambda art: Diagnosis(art["cause"], None), make_case,
                                     seeds=lambda: range(3), quiet=True)
    named = check_diagnosis("d", lambda art: Diagnosis("a", art["step"]), make_case, seeds=lambda: [1, 2],
                            quiet=True, misconceptions={("a", "b"): "a looks like b"})
    assert good and not memorised and not wrong_evidence
    assert "a looks like b" in named.message


def _one_case(seed):
    return {"seed": seed}, Diagnosis("a", seed)


@pytest.mark.parametrize("call, error, says", [
    # tolerances: inf matched anything, NaN nothing, -1 and '0.1' were torch's or math's errors
    (lambda: close(1.0, 2.0, atol=float("inf")), ValueError, "atol=inf must be a finite number >= 0"),
    (lambda: close(1.0, 2.0, rtol=float("nan")), ValueError, "rtol=nan"),
    (lambda: close(1.0, 2.0, rtol=-1.0), ValueError, "rtol=-1.0 must be a finite number >= 0"),
    (lambda: close(1.0, 2.0, rtol="0.1"), ValueError, "pass the number itself, rtol=0.1"),
    # a checker needs a name, a hint it can show, one or more seeds of cases it can open
    (lambda: run_check("", lambda x: x, [Case((1,), 1)]), ValueError, "name=''"),
    (lambda: run_check("c", lambda x: x, [Case((1,), 1)], hint=3), TypeError, "hint=3 is a int"),
    (lambda: run_check("c", lambda x: x, [Case((1,), 1)], quiet="yes"), TypeError, "quiet='yes'"),
    (lambda: run_check("c", lambda x: x, [Case((1,), 1)], compare="close"), TypeError, "compare must be a"),
    (lambda: check_diagnosis("d", lambda a: a, _one_case, seeds=lambda: [1]), ValueError, "draws one case"),
    (lambda: check_diagnosis("d", lambda a: a, _one_case, seeds=1), ValueError, "draws one case"),
    (lambda: check_diagnosis("d", lambda a: a, _one_case, seeds=[1, 2]), ValueError,
     "must be a count or a function that draws them"),
    (lambda: check_diagnosis("d", lambda a: a, lambda s: 3, seeds=lambda: [1, 2]), ValueError,
     "make_case\\([12]\\) returned int, not \\(artefact, Diagnosis\\)"),
    (lambda: check_diagnosis("d", lambda a: a, "make", seeds=2), TypeError, "make_case must be a"),
    (lambda: check_diagnosis("", lambda a: a, _one_case, seeds=2), ValueError, "name=''"),
])
def test_checkers_refuse_arguments_that_grade_nothing_or_everything(call, error, says):
    with pytest.raises(error, match=says) as info:
        call()
    assert " — " in str(info.value)
    assert close(1.0, 1.0 + 1e-9) is None and close(1.0, 2.0, rtol=0, atol=0) == "expected 2, got 1"



def test_generation_past_the_model_positions_is_refused(course):
    from course_utils.data import make_messages
    from course_utils.eos import chat_prompts, generate_greedy

    model, tokenizer = course
    with pytest.raises(ValueError, match="positions"):
        prompts = chat_prompts(tokenizer, make_messages("add", 1))
        generate_greedy(model, tokenizer, prompts, max_new_tokens=100_000)


def _fresh(code: str, **env_changes) -> list[str]:
    """Run ``code`` in a fresh interpreter without HF_HUB_OFFLINE (a `jupyter lab` or script started by
    hand), with ``env_changes``; its printed words."""
    import os
    import subprocess
    import sys

    unset = ("HF_HUB_OFFLINE", "COURSE_MODEL", "HF_HUB_DISABLE_TELEMETRY", "TOKENIZERS_PARALLELISM")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(env_changes)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_importing_the_package_or_the_take_home_tools_changes_nothing():
    """A user's script imports the doctor or the watch: os.environ and huggingface_hub stay as they were."""
    code = ("import os; before = dict(os.environ); "
            "import course_utils, course_utils.doctor, course_utils.watch; "
            "import huggingface_hub.constants as c; print(dict(os.environ) == before, c.HF_HUB_OFFLINE)")
    assert _fresh(code) == ["True", "False"]


def test_a_lesson_opts_in_to_the_course_defaults_and_the_model_loads_offline():
    """The lessons' first cell: offline from there on, whether huggingface_hub was imported before or not;
    a user's explicit choice wins."""
    after = ("import os, course_utils; course_utils.use_course_defaults(); "
             "import huggingface_hub.constants as c; print(os.environ['HF_HUB_OFFLINE'], c.HF_HUB_OFFLINE)")
    assert _fresh(after + "; m, t = course_utils.load_course_model(); print(type(m).__name__)") == [
        "1", "True", "Qwen2ForCausalLM"]
    before = ("import os, huggingface_hub.constants as c, course_utils; course_utils.use_course_defaults(); "
              "print(os.environ['HF_HUB_OFFLINE'], c.HF_HUB_OFFLINE)")
    assert _fresh(before) == ["1", "True"], "huggingface_hub imported first: its constant follows"
    assert _fresh(after, HF_HUB_OFFLINE="0") == ["0", "False"], "a user's explicit choice wins"
