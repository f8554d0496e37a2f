"""Unit tests for course_utils.templates (lesson 04): template surgery, probes and both checkers."""

import pytest
from trl.chat_template_utils import get_training_chat_template, has_generation_markers, qwen2_5_chat_template

from course_utils import templates
from course_utils.templates import (
    BASE_SYSTEM,
    INSTRUCT_SYSTEM,
    QWEN2_CHAT_TEMPLATE,
    add_generation_markers,
    assistant_mask,
    base_variant,
    check_can_trl_patch,
    check_generation_template,
    masked_tokens,
    trl_can_train,
)

CONVERSATION = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]

# Exercise 1: reference and known-wrong answers (same text as Qwen2's template, different marker placement)
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


def _stub(*args):
    raise NotImplementedError


# ------------------------------------------------------------------------------------------------
# Template surgery
# ------------------------------------------------------------------------------------------------

def test_base_variant_differs_only_in_the_system_prompt():
    base = base_variant(qwen2_5_chat_template)
    assert base != qwen2_5_chat_template and INSTRUCT_SYSTEM not in base
    assert base.replace(BASE_SYSTEM, INSTRUCT_SYSTEM) == qwen2_5_chat_template


def test_base_variant_rejects_a_foreign_template():
    with pytest.raises(ValueError, match="default system prompt"):
        base_variant(QWEN2_CHAT_TEMPLATE)


def test_add_generation_markers_rejects_a_template_without_the_anchor():
    with pytest.raises(ValueError, match="message loop"):
        add_generation_markers(QWEN2_CHAT_TEMPLATE)


def test_markers_keep_the_text_and_mask_like_trls_patch(tokenizer):
    base = base_variant(qwen2_5_chat_template)
    marked = add_generation_markers(base)
    assert has_generation_markers(marked)
    assert (tokenizer.apply_chat_template(CONVERSATION, tokenize=False, chat_template=marked)
            == tokenizer.apply_chat_template(CONVERSATION, tokenize=False, chat_template=base))
    ours = assistant_mask(tokenizer, CONVERSATION, chat_template=marked)
    trl = assistant_mask(tokenizer, CONVERSATION, chat_template=get_training_chat_template(tokenizer))
    trained = masked_tokens(tokenizer, ours["input_ids"], ours["assistant_masks"])
    assert trained == ["\n", "5", "<|im_end|>", "\n"]
    assert trained == masked_tokens(tokenizer, trl["input_ids"], trl["assistant_masks"])


def test_trl_can_train_is_an_exact_match(tokenizer):
    verdicts = {label: trl_can_train(tok) for label, tok in templates.patch_cases(tokenizer)}
    assert verdicts["Qwen2.5-Instruct template"] and verdicts["Llama-3 template"]
    assert not verdicts["Qwen2.5 base template"] and not verdicts["Instruct template + trailing newline"]
    assert verdicts["base template with our generation markers"]
    assert tokenizer.chat_template == qwen2_5_chat_template, "patch_cases changed the shared tokenizer"


def test_unmarked_template_gives_an_all_zero_mask_and_a_warning(tokenizer):
    with templates.captured_transformers_warnings() as log:
        out = assistant_mask(tokenizer, CONVERSATION, chat_template=base_variant(qwen2_5_chat_template))
    assert sum(out["assistant_masks"]) == 0
    assert any("{% generation %}" in m for m in log)


def test_other_family_tokenizer_leaves_the_shared_one_alone(tokenizer, tmp_path):
    n = len(tokenizer)
    directory = templates.save_other_family_tokenizer(tokenizer, str(tmp_path))
    assert (tmp_path / "tokenizer_config.json").exists() and directory == str(tmp_path)
    assert len(tokenizer) == n and tokenizer.chat_template == qwen2_5_chat_template


# ------------------------------------------------------------------------------------------------
# Exercise 1 checker
# ------------------------------------------------------------------------------------------------

def test_generation_checker_accepts_the_reference(tokenizer):
    assert check_generation_template(lambda: REFERENCE, tokenizer)


def test_generation_checker_rejects_a_stub(tokenizer):
    result = check_generation_template(_stub, tokenizer)
    assert not result and "not implemented" in result.message


@pytest.mark.parametrize("template, hint", [
    (QWEN2_CHAT_TEMPLATE, "all zeros"),
    (EOT_OUTSIDE, "never be trained to end its turn"),
    (HEADER_INSIDE, "header"),
    (AFTER_NEWLINE, "opens after the '\\n'"),
    ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "render the original text exactly"),
    ("{% generation %}", "does not render"),
])
def test_generation_checker_names_the_mistake(tokenizer, template, hint):
    result = check_generation_template(lambda: template, tokenizer)
    assert not result and hint in result.message


# ------------------------------------------------------------------------------------------------
# Exercise 2 checker
# ------------------------------------------------------------------------------------------------

def test_patch_checker_accepts_the_reference(tokenizer):
    assert check_can_trl_patch(trl_can_train, tokenizer)


def test_patch_checker_rejects_a_stub(tokenizer):
    result = check_can_trl_patch(_stub, tokenizer)
    assert not result and "not implemented" in result.message


def test_patch_checker_flags_normalised_comparison(tokenizer):
    def stripped(tok):
        template = tok.chat_template
        return has_generation_markers(template) or template.strip() == qwen2_5_chat_template.strip()
    result = check_can_trl_patch(stripped, tokenizer)
    assert not result and "character for character" in result.message


def test_patch_checker_flags_every_shipped_template(tokenizer):
    import trl.chat_template_utils as ctu

    shipped = {v for k, v in vars(ctu).items()
               if k.endswith("_chat_template") and "training" not in k and isinstance(v, str)}
    result = check_can_trl_patch(lambda tok: has_generation_markers(tok.chat_template)
                                 or tok.chat_template in shipped, tokenizer)
    assert not result and "recognised is not patchable" in result.message


def test_patch_checker_flags_ignoring_markers(tokenizer):
    result = check_can_trl_patch(lambda tok: tok.chat_template == qwen2_5_chat_template, tokenizer)
    assert not result and ("generation %} markers needs no patch" in result.message
                           or "not only Qwen2.5" in result.message)


def test_patch_checker_wants_a_bool(tokenizer):
    result = check_can_trl_patch(lambda tok: "yes", tokenizer)
    assert not result and "expected a bool" in result.message
