"""Lesson 04's exercises (``course_utils.exercises.lesson04``): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: ``tests/test_checkers.py`` runs
them); the diagnosis generator draws every cause; the graders refuse bad set-up arguments.
"""

import pytest
from conftest import Row, graded_on_tokenizer
from trl.chat_template_utils import get_training_chat_template, has_generation_markers

from course_utils.checks import Diagnosis
from course_utils.exercises import lesson04 as ex
from course_utils.exercises.answers import lesson04
from course_utils.templates import QWEN2_CHAT_TEMPLATE, assistant_mask, masked_tokens

# The same text as Qwen2's template, different marker placement.
_HEAD = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
         "{% if message['role'] == 'assistant' %}")
_TAIL = ("{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
         "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
REFERENCE = (_HEAD + "{{ '<|im_start|>assistant' }}{% generation %}"
             "{{ '\\n' + message['content'] + '<|im_end|>\\n' }}{% endgeneration %}" + _TAIL)
EOT_OUTSIDE = (_HEAD + "{{ '<|im_start|>assistant' }}{% generation %}{{ '\\n' + message['content'] }}"
               "{% endgeneration %}{{ '<|im_end|>\\n' }}" + _TAIL)
HEADER_INSIDE = (_HEAD + "{% generation %}{{ '<|im_start|>assistant\\n' + message['content'] + "
                 "'<|im_end|>\\n' }}{% endgeneration %}" + _TAIL)
AFTER_NEWLINE = (_HEAD + "{{ '<|im_start|>assistant\\n' }}{% generation %}"
                 "{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}" + _TAIL)


def whitespace_control_template():
    """A second correct answer: the same mask, written with whitespace control and a loop-level role test."""
    return (
        "{%- for message in messages %}{%- if loop.first and messages[0]['role'] != 'system' %}"
        "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
        "{%- set is_assistant = message['role'] == 'assistant' %}"
        "{{- '<|im_start|>' + message['role'] }}"
        "{%- if is_assistant %}{% generation %}{{- '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endgeneration %}"
        "{%- else %}{{- '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def unmarked_template():
    """Qwen2's template unchanged: without markers the assistant mask is all zeros."""
    return QWEN2_CHAT_TEMPLATE


def eot_outside():
    """<|im_end|> left outside the markers: the model is never trained to end its turn."""
    return EOT_OUTSIDE


def header_inside():
    """The '<|im_start|>assistant' header inside the markers: the model is trained to write it."""
    return HEADER_INSIDE


def after_newline():
    """The markers open after the header's '\\n': that newline, which TRL's convention trains, is left out."""
    return AFTER_NEWLINE


def content_only():
    """A template that drops the role headers: the text no longer matches the original."""
    return "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def markers_only():
    """A bare {% generation %} tag: the template does not render at all."""
    return "{% generation %}"


def _diagnose_by_rendering_first(setup):
    """A second correct diagnosis: renders with TRL's patched template inside a try, masks first."""
    tok, conv = setup["tokenizer"], setup["conversation"]
    if not setup["assistant_only_loss"]:
        return Diagnosis("whole_sequence_graded", len(tok.apply_chat_template(conv, tokenize=True,
                                                                               return_dict=True)["input_ids"]))
    try:
        template = tok.chat_template if has_generation_markers(tok.chat_template) else \
            get_training_chat_template(tok)
    except ValueError:
        return Diagnosis("refused_exact_match", 0)
    out = assistant_mask(tok, conv, chat_template=template)
    kept = masked_tokens(tok, out["input_ids"], out["assistant_masks"])
    cause = ("markers_mark_nothing" if not kept else
             "trains_correctly" if "<|im_end|>" in kept else "stop_token_not_graded")
    return Diagnosis(cause, len(kept))


def _eyeballs_the_template(setup):
    """Judges by eye: anything that looks like Qwen's template trains correctly."""
    looks_like_qwen = "<|im_start|>" in setup["tokenizer"].chat_template
    return Diagnosis("trains_correctly" if looks_like_qwen else "refused_exact_match", 0)


def _trusts_markers(setup):
    """Trusts any {% generation %} markers, without checking what they mark."""
    if has_generation_markers(setup["tokenizer"].chat_template):
        return Diagnosis("trains_correctly", 0)
    return lesson04.diagnose_template(setup)


def template_cause_as_a_string(setup):
    """Returns a bare cause string instead of a Diagnosis."""
    return "trains_correctly"


def template_evidence_minus_one(setup):
    """Right cause, evidence -1 instead of the number of tokens that carry loss."""
    return Diagnosis(lesson04.diagnose_template(setup).cause, -1)




# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

CHECKERS = [
    Row("generation_template", graded_on_tokenizer(ex.check_generation_template),
        lesson04.qwen2_training_template),
    Row("template_diagnosis", graded_on_tokenizer(ex.check_template_diagnosis), lesson04.diagnose_template),
]

ALSO_CORRECT = [
    ("generation_template", whitespace_control_template),
    ("template_diagnosis", _diagnose_by_rendering_first),
]

WRONG = [
    ("generation_template", unmarked_template, "all zeros"),
    ("generation_template", eot_outside, "never be trained to end its turn"),
    ("generation_template", header_inside, "header"),
    ("generation_template", after_newline, "opens after the '\\n'"),
    ("generation_template", content_only, "render the original text exactly"),
    ("generation_template", markers_only, "does not render"),
    ("template_diagnosis", _eyeballs_the_template, "is not what broke"),
    ("template_diagnosis", _trusts_markers, "is not what broke"),
    ("template_diagnosis", template_cause_as_a_string, "expected a Diagnosis"),
    ("template_diagnosis", template_evidence_minus_one, "evidence"),
]


# =================================================================================================
# The reference template, the diagnosis generator, and the graders' own arguments
# =================================================================================================

def test_generation_template_reference_is_the_hand_written_one():
    assert lesson04.qwen2_training_template() == REFERENCE


def test_template_diagnosis_generator_covers_every_cause(tokenizer):
    causes = {ex._template_case(tokenizer, seed)[1].cause for seed in range(3000, 3010)}
    assert causes == set(ex.TEMPLATE_CAUSES)


def test_unseen_setup_is_the_set_up_only(tokenizer):
    setup = ex.unseen_setup(tokenizer, 3)
    assert set(setup) == {"tokenizer", "assistant_only_loss", "conversation"}
    assert setup["tokenizer"].chat_template == ex._template_case(tokenizer, 3)[0]["tokenizer"].chat_template


@pytest.mark.parametrize("tokenizer_arg, seed, phrase", [
    ("tok", -3, "seed=-3 must be an integer"),
    ("tok", None, "seed=None — "),
    (None, 0, "tokenizer must be a transformers tokenizer"),
])
def test_unseen_setup_refuses_bad_arguments(tokenizer, tokenizer_arg, seed, phrase):
    with pytest.raises((TypeError, ValueError), match=phrase):
        ex.unseen_setup(tokenizer if tokenizer_arg == "tok" else tokenizer_arg, seed)


@pytest.mark.parametrize("seeds", [[], (), range(0)])
def test_the_diagnosis_checker_never_passes_with_zero_cases(tokenizer, seeds):
    """A checker given no seeds would grade nothing and report every answer correct."""
    with pytest.raises(ValueError, match="seeds must be a non-empty list .* — .* would pass any answer — "):
        ex.check_template_diagnosis(lesson04.diagnose_template, tokenizer, seeds=seeds)


def test_the_diagnosis_checker_grades_on_the_seeds_it_is_given(tokenizer, capsys):
    assert ex.check_template_diagnosis(lesson04.diagnose_template, tokenizer, seeds=[3000, 3001])
    assert "all 2 cases pass" in capsys.readouterr().out
    with pytest.raises(ValueError, match="seeds\\[0\\]"):
        ex.check_template_diagnosis(lesson04.diagnose_template, tokenizer, seeds=[-1])


@pytest.mark.parametrize("check", [ex.check_generation_template, ex.check_template_diagnosis])
def test_the_checkers_refuse_something_that_is_not_a_tokenizer(check):
    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer, got str — "):
        check(lesson04.diagnose_template, "Qwen/Qwen2.5-0.5B")


@pytest.mark.parametrize("fn", [None, [], "diagnose_template"])
def test_the_diagnosis_checker_refuses_what_is_not_a_function(tokenizer, fn):
    with pytest.raises(TypeError, match="fn must be a function, got .* — the helper calls it — "):
        ex.check_template_diagnosis(fn, tokenizer)
