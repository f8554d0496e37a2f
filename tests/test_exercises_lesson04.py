"""Lesson 04's exercises (``course_utils.exercises.lesson04``): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: ``tests/test_checkers.py`` runs
them); each shortcut a learner has fails; the rendering generator draws every cause, with healthy look-alikes,
out of the exercise copy's reach; the self-test's cases; the graders refuse bad arguments.
"""

import pytest
from conftest import Row, graded, graded_on_tokenizer
from trl.chat_template_utils import qwen2_5_chat_template

from course_utils.checks import Diagnosis
from course_utils.exercises import lesson04 as ex
from course_utils.exercises.answers import lesson04
from course_utils.templates import (
    QWEN2_CHAT_TEMPLATE,
    QWEN2_ROLE_EXPRESSION,
    add_generation_markers,
    base_variant,
)


def _replace_role(branch: str):
    """An answer to exercise 1 that puts ``branch`` (the assistant's rendering) in place of the role
    expression; ``branch`` sits inside ``{% if message['role'] == 'assistant' %}``."""
    def answer(template):
        return template.replace(QWEN2_ROLE_EXPRESSION, "{% if message['role'] == 'assistant' %}" + branch +
                                "{% else %}" + QWEN2_ROLE_EXPRESSION + "{% endif %}")
    return answer


# ---- exercise 1: a second correct answer and the wrong ones -------------------------------------------

def whitespace_control_template(template):
    """A second correct answer: whitespace control and the role header written once for every role."""
    return template.replace(
        QWEN2_ROLE_EXPRESSION,
        "{{- '<|im_start|>' + message['role'] }}"
        "{%- if message['role'] == 'assistant' %}{% generation %}"
        "{{- '\\n' + message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
        "{%- else %}{{- '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}")


def unmarked_template(template):
    """The template unchanged: without markers the assistant mask is all zeros."""
    return template


eot_outside = _replace_role("{{ '<|im_start|>assistant' }}{% generation %}{{ '\\n' + message['content'] }}"
                            "{% endgeneration %}{{ '<|im_end|>\\n' }}")
eot_outside.__doc__ = "<|im_end|> left outside the markers: never trained to end its turn."
header_inside = _replace_role("{% generation %}{{ '<|im_start|>assistant\\n' + message['content'] + "
                              "'<|im_end|>\\n' }}{% endgeneration %}")
header_inside.__doc__ = "The '<|im_start|>assistant' header inside the markers: trained to write it."
after_newline = _replace_role("{{ '<|im_start|>assistant\\n' }}{% generation %}"
                              "{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}")
after_newline.__doc__ = "The markers open after the header's '\\n', which TRL trains: left out."


def content_only(template):
    """A template that drops the role headers: the text no longer matches the original."""
    return "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def markers_only(template):
    """A bare {% generation %} tag: the template does not render at all."""
    return "{% generation %}"


# ---- exercise 2: a second correct answer and the wrong ones -------------------------------------------

def _diagnose_by_graded_text(rendering):
    """A second correct diagnosis: reads the text of each graded run."""
    tokens, mask = rendering["tokens"], rendering["loss_mask"]
    runs, current = [], ""
    for t, m in zip(tokens, mask):
        if m:
            current += t
        elif current:
            runs.append(current)
            current = ""
    runs += [current] if current else []
    n = sum(mask)
    if not runs:
        return Diagnosis("markers_mark_nothing", 0)
    if runs[0].startswith("<|im_start|>system"):
        return Diagnosis("whole_sequence_graded", n)
    if all("<|im_end|>" in r for r in runs):
        return Diagnosis("trains_correctly", n)
    return Diagnosis("stop_token_not_graded", n)


def _last_token_graded_means_healthy(rendering):
    """Misconception: the turn is trained to its end only if the very last token carries loss."""
    truth = lesson04.diagnose_mask(rendering)
    if truth.cause == "trains_correctly" and not rendering["loss_mask"][-1]:
        return Diagnosis("stop_token_not_graded", truth.evidence)
    return truth


def _any_loss_is_fine(rendering):
    """Misconception: some tokens carry loss, so it trains (the stop token is never looked at)."""
    truth = lesson04.diagnose_mask(rendering)
    if truth.cause == "stop_token_not_graded":
        return Diagnosis("trains_correctly", truth.evidence)
    return truth


def mask_cause_as_a_string(rendering):
    """Returns a bare cause string instead of a Diagnosis."""
    return "trains_correctly"


def mask_evidence_minus_one(rendering):
    """Right cause, evidence -1 instead of the number of tokens that carry loss."""
    return Diagnosis(lesson04.diagnose_mask(rendering).cause, -1)


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

CHECKERS = [
    Row("generation_template", graded_on_tokenizer(ex.check_generation_template),
        lesson04.add_generation_block),
    Row("mask_diagnosis", graded(ex.check_mask_diagnosis), lesson04.diagnose_mask),
]

ALSO_CORRECT = [
    ("generation_template", whitespace_control_template),
    ("mask_diagnosis", _diagnose_by_graded_text),
]

WRONG = [
    ("generation_template", unmarked_template, "all zeros"),
    ("generation_template", eot_outside, "never be trained to end its turn"),
    ("generation_template", header_inside, "header"),
    ("generation_template", after_newline, "opens after the '\\n'"),
    ("generation_template", content_only, "render the original text exactly"),
    ("generation_template", markers_only, "does not render"),
    ("mask_diagnosis", _last_token_graded_means_healthy, "only the newline after it does not"),
    ("mask_diagnosis", _any_loss_is_fine, "does it carry loss"),
    ("mask_diagnosis", mask_cause_as_a_string, "expected a Diagnosis"),
    ("mask_diagnosis", mask_evidence_minus_one, "evidence"),
]


# =================================================================================================
# Shortcuts a learner has at each exercise: each fails the checker (issue 33)
# =================================================================================================

_MARKED_BASE = add_generation_markers(base_variant(qwen2_5_chat_template))  # the notebook's marked_template


def _captured_marked_template(template):
    """Exercise 1: the Fix B cell's marked_template (the base template with markers), whatever is passed."""
    return _MARKED_BASE


def _lesson_marker_helper(template):
    """Exercise 1: templates.add_generation_markers, the Fix B helper (made for Qwen2.5's message loop)."""
    return add_generation_markers(template)


def _trl_training_template(template):
    """Exercise 1: TRL's own patched Qwen2.5 training template, whatever is passed."""
    from trl.chat_template_utils import qwen2_5_training_chat_template

    return qwen2_5_training_chat_template


def _qwen2_marked_once(template):
    """Exercise 1: the marked version of the Qwen2 template the notebook printed, whatever is passed."""
    return lesson04.add_generation_block(QWEN2_CHAT_TEMPLATE)


def _wrap_everything(template):
    """Exercise 1: a blanket fix — one generation block around the whole loop."""
    return "{% generation %}" + template + "{% endgeneration %}"


def _match_shown_examples(rendering):
    """Exercise 2: look the example up among training_example(seed) and read the cause off the seed."""
    for seed in range(400):
        if ex.training_example(seed) == rendering:
            return Diagnosis(ex.MASK_CAUSES[seed % len(ex.MASK_CAUSES)], sum(rendering["loss_mask"]))
    return Diagnosis("trains_correctly", sum(rendering["loss_mask"]))


def _last_token_only(rendering):
    """Exercise 2: judge by the last token alone (graded: healthy; not: the stop token is missing)."""
    mask = rendering["loss_mask"]
    n = sum(mask)
    if n == 0:
        return Diagnosis("markers_mark_nothing", 0)
    if mask[0]:
        return Diagnosis("whole_sequence_graded", n)
    return Diagnosis("trains_correctly" if mask[-1] else "stop_token_not_graded", n)


def _any_im_end_graded(rendering):
    """Exercise 2: a graded <|im_end|> anywhere means healthy, else the stop token is missing."""
    graded = [t for t, m in zip(rendering["tokens"], rendering["loss_mask"]) if m]
    if rendering["loss_mask"][0]:
        return Diagnosis("whole_sequence_graded", len(graded))
    return Diagnosis("trains_correctly" if "<|im_end|>" in graded else "stop_token_not_graded", len(graded))


def _always_healthy(rendering):
    """Exercise 2: a constant answer."""
    return Diagnosis("trains_correctly", sum(rendering["loss_mask"]))


SHORTCUTS = [
    ("generation_template", "the marked_template an earlier cell computed", _captured_marked_template),
    ("generation_template", "templates.add_generation_markers", _lesson_marker_helper),
    ("generation_template", "TRL's Qwen2.5 training template", _trl_training_template),
    ("generation_template", "the printed Qwen2 template, marked once", _qwen2_marked_once),
    ("generation_template", "one block around everything", _wrap_everything),
    ("mask_diagnosis", "match the shown examples over seeds", _match_shown_examples),
    ("mask_diagnosis", "judge by the last token", _last_token_only),
    ("mask_diagnosis", "a graded <|im_end|> anywhere", _any_im_end_graded),
    ("mask_diagnosis", "always healthy", _always_healthy),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, tokenizer, capsys):
    if exercise == "generation_template":
        result = ex.check_generation_template(function, tokenizer)
    else:
        result = ex.check_mask_diagnosis(function)
    assert not result, f"{description} passes exercise {exercise}"


# =================================================================================================
# The generator, the self-test's cases, the graders' own arguments
# =================================================================================================

def test_renderings_cover_every_cause_and_the_public_one_is_the_rendering_only():
    assert {lesson04.rendering_case(s)[1].cause for s in range(8)} == set(ex.MASK_CAUSES)
    shown = ex.training_example(5)
    assert set(shown) == {"tokens", "loss_mask"}, "the public function names no cause"
    assert shown == lesson04.rendering_case(5, graded=False)[0]
    assert shown != lesson04.rendering_case(5, graded=True)[0], "the graded stream is drawn apart"
    assert not hasattr(ex, "rendering_case"), "the generator that knows the truth lives with the answers"


def test_healthy_renderings_include_the_look_alike_with_an_ungraded_last_newline():
    """A healthy template that closes the block right after <|im_end|>: its last token carries no loss,
    as in stop_token_not_graded — but the stop token does."""
    healthy = [r for r, d in map(lesson04.rendering_case, range(3, 60, 4)) if d.cause == "trains_correctly"]
    assert any(not r["loss_mask"][-1] for r in healthy) and any(r["loss_mask"][-1] for r in healthy)


@pytest.mark.parametrize("seed, phrase", [(-3, "seed=-3"), (None, "seed=None — ")])
def test_training_example_refuses_bad_seeds(seed, phrase):
    with pytest.raises((TypeError, ValueError), match=phrase):
        ex.training_example(seed)


# (The diagnosis checker takes no seeds: it draws fresh cases per run; tests/test_checkers.py tries
# the shortcuts.)


def test_the_template_checker_refuses_something_that_is_not_a_tokenizer():
    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer, got str — "):
        ex.check_generation_template(lesson04.add_generation_block, "Qwen/Qwen2.5-0.5B")


@pytest.mark.parametrize("fn", [None, [], "diagnose_mask"])
def test_the_diagnosis_checker_refuses_what_is_not_a_function(fn):
    with pytest.raises(TypeError, match="fn must be a function, got .* — the helper calls it — "):
        ex.check_mask_diagnosis(fn)
