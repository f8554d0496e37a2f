"""Unit tests for course_utils.templates (lesson 04): template surgery, probes, the diagnosis generator (the
checkers' answers: test_checkers.py)."""

import pytest
from trl.chat_template_utils import get_training_chat_template, has_generation_markers, qwen2_5_chat_template

from course_utils import templates
from course_utils.quiet import captured_log
from course_utils.templates import (
    BASE_SYSTEM,
    INSTRUCT_SYSTEM,
    QWEN2_CHAT_TEMPLATE,
    add_generation_markers,
    assistant_mask,
    base_variant,
    masked_tokens,
)

CONVERSATION = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]


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


def test_patch_cases_leave_the_shared_tokenizer_alone(tokenizer):
    labels = [label for label, _ in templates.patch_cases(tokenizer)]
    assert "Qwen2.5 base template" in labels and len(labels) == 9
    assert tokenizer.chat_template == qwen2_5_chat_template, "patch_cases changed the shared tokenizer"


def test_unmarked_template_gives_an_all_zero_mask_and_a_warning(tokenizer):
    with captured_log("transformers") as log:
        out = assistant_mask(tokenizer, CONVERSATION, chat_template=base_variant(qwen2_5_chat_template))
    assert sum(out["assistant_masks"]) == 0
    assert any("{% generation %}" in m for m in log)


def test_other_family_tokenizer_leaves_the_shared_one_alone(tokenizer, tmp_path):
    n = len(tokenizer)
    directory = templates.save_other_family_tokenizer(tokenizer, str(tmp_path))
    assert (tmp_path / "tokenizer_config.json").exists() and directory == str(tmp_path)
    assert len(tokenizer) == n and tokenizer.chat_template == qwen2_5_chat_template


# ------------------------------------------------------------------------------------------------
# Exercise 2 checker (diagnosis)
# ------------------------------------------------------------------------------------------------

def test_template_diagnosis_generator_covers_every_cause(tokenizer):
    causes = {templates._template_case(tokenizer, seed)[1].cause for seed in range(3000, 3010)}
    assert causes == set(templates.TEMPLATE_CAUSES)
    with pytest.raises(ValueError, match="seed"):
        templates.unseen_setup(tokenizer, -3)


# ---- lesson 04's "what if": an edit to TRL's template x its markers -> what SFTTrainer does --------------

def test_template_explorer_follows_the_exact_match_and_the_markers(tokenizer):
    box = templates.template_explorer(tokenizer, CONVERSATION)
    edit, markers, _ = box.children
    start = box.text
    assert "edit: base system prompt" in start and "REFUSED" in start and "graded tokens: 0" in start
    assert start in box._repr_mimebundle_()["text/plain"], "without a frontend: the start frame's text"

    edit.value = "none"
    assert "accepted — an exact copy" in box.text and "'5' '<|im_end|>' '\\n'" in box.text
    for label in ("one trailing newline", "an extra space in a tag", "CRLF line endings"):
        edit.value = label
        assert "renders this chat as TRL's copy does: yes" in box.text and "REFUSED" in box.text, label
    markers.value = "ours (add_generation_markers)"
    assert "no lookup" in box.text and "'<|im_end|>'" in box.text, "markers skip the lookup, any edit"
    markers.value = "closed before <|im_end|>"
    assert "'<|im_end|>'" not in box.text and "never learn to stop" in box.text
    markers.value = "tool-call branch only"
    assert "graded tokens: 0" in box.text and "RuntimeError" in box.text


def test_template_variant_rejects_an_unknown_edit():
    with pytest.raises(ValueError, match="not one of"):
        templates.template_variant("renamed role")
    with pytest.raises(ValueError, match="not one of"):
        templates.template_variant("none", markers="everywhere")
