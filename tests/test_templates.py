"""Unit tests for course_utils.templates (lesson 04): template surgery, probes, the "what if" control, and
the bad input each public function refuses (issue 36). The exercises: test_exercises_lesson04.py."""

import re

import pytest
import torch
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


# ---- bad input (issue 36): refused with what — why — fix, never a silently wrong result -----------------

WHAT_WHY_FIX = r"(?s).+ — .+ — .+"


def _refused(error, phrase, fn, *args, **kwargs):
    with pytest.raises(error, match=phrase) as info:
        fn(*args, **kwargs)
    assert re.match(WHAT_WHY_FIX, str(info.value)), str(info.value)


@pytest.mark.parametrize("fn", [base_variant, add_generation_markers])
def test_template_surgery_refuses_what_is_not_a_template(fn):
    _refused(TypeError, "chat template string", fn, None)
    _refused(ValueError, "empty template", fn, "  ")


def test_template_diff_and_with_template_refuse_bad_arguments(tokenizer):
    _refused(TypeError, "chat template string", templates.template_diff, qwen2_5_chat_template, None)
    _refused(TypeError, "labels one side of the diff", templates.template_diff, "a", "b", name_a=1)
    _refused(TypeError, "chat template string", templates.with_template, tokenizer, ["{{ x }}"])
    _refused(TypeError, "transformers tokenizer", templates.with_template, "Qwen/Qwen2.5",
             qwen2_5_chat_template)


def test_assistant_mask_refuses_a_bad_conversation_or_no_template(tokenizer):
    _refused(ValueError, "non-empty list", assistant_mask, tokenizer, [])
    _refused(ValueError, "non-empty list", assistant_mask, tokenizer, CONVERSATION[0])
    _refused(ValueError, "has no 'role'", assistant_mask, tokenizer, [{"content": "hi"}])
    bare = templates.with_template(tokenizer, "{{ 'x' }}")
    bare.chat_template = None
    _refused(ValueError, "no chat_template and none was passed", assistant_mask, bare, CONVERSATION)


def test_masked_tokens_refuses_labels_a_batch_and_foreign_ids(tokenizer):
    out = assistant_mask(tokenizer, CONVERSATION, chat_template=add_generation_markers(
        base_variant(qwen2_5_chat_template)))
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert masked_tokens(tokenizer, torch.tensor(ids), torch.tensor(mask)) == ["\n", "5", "<|im_end|>", "\n"]
    _refused(ValueError, "values other than 0 and 1", masked_tokens, tokenizer, ids, [-100] * len(ids))
    _refused(ValueError, "same length", masked_tokens, tokenizer, ids, mask[:-1])
    _refused(ValueError, "2-D .* tensor — one example", masked_tokens, tokenizer, torch.tensor([ids]), mask)
    _refused(ValueError, "another tokenizer", masked_tokens, tokenizer, ids[:-1] + [10_000], mask)


def test_the_what_if_frame_refuses_a_typo_with_the_closest_name(tokenizer):
    _refused(ValueError, "did you mean 'base system prompt'", templates.template_frame, tokenizer,
             CONVERSATION, edit="base system promt")
    _refused(ValueError, "non-empty list", templates.template_explorer, tokenizer, [])
    _refused(TypeError, "transformers tokenizer", templates.template_explorer, None, CONVERSATION)


def test_save_other_family_tokenizer_refuses_a_file(tokenizer, tmp_path):
    path = tmp_path / "a_file"
    path.write_text("x")
    _refused(ValueError, "must be a folder path", templates.save_other_family_tokenizer, tokenizer, str(path))


def test_patch_acceptance_follows_the_exact_match_not_the_distance(tokenizer):
    """Section 4's table: one newline away is refused, another family's shipped copy is accepted, and
    trl_accepts says the same as SFTTrainer's own test (markers, else get_training_chat_template)."""
    rows = {label: (d, accepted) for label, d, accepted in templates.patch_acceptance(tokenizer)}
    assert rows["Qwen2.5-Instruct template"] == (0, True)
    assert rows["Instruct template + trailing newline"] == (1, False)
    assert rows["Llama-3 template"][1] and rows["base template with our generation markers"][1]
    for label, tok in templates.patch_cases(tokenizer):
        assert templates.trl_accepts(tok) == rows[label][1]
    fig = templates.plot_patch_acceptance(templates.patch_acceptance(tokenizer))
    assert len(fig.axes[0].patches) == len(rows)
    with pytest.raises(ValueError, match=".+ — .+ — .+"):
        templates.plot_patch_acceptance([("only a label",)])


def test_trl_text_path_doubles_a_bos_the_text_already_has_and_ignores_dataset_kwargs(tokenizer):
    """Issue 45: TRL 1.16's text path tokenizes with the tokenizer's specials whatever dataset_kwargs says."""
    from course_utils import templates as TT

    bos_tok = TT.bos_adding_variant(tokenizer)
    assert tokenizer.bos_token is None, "the course tokenizer itself is untouched"
    texts = [bos_tok.bos_token + "What is 2 + 2? 4", "What is 3 + 3? 6"]
    for kwargs in (None, {"add_special_tokens": False}):
        rows = TT.trl_text_rows(bos_tok, texts, kwargs)
        assert [TT.leading_bos(r, bos_tok.bos_token_id) for r in rows] == [2, 1], kwargs
        assert TT.double_bos_rows(rows, bos_tok.bos_token_id) == [0]


@pytest.mark.parametrize("call, words", [
    (lambda tok: __import__("course_utils.templates").templates.double_bos_rows([], 1), "non-empty list"),
    (lambda tok: __import__("course_utils.templates").templates.leading_bos([1, 2], -1), "bos_token_id"),
    (lambda tok: __import__("course_utils.templates").templates.trl_text_rows(tok, []), "texts"),
    (lambda tok: __import__("course_utils.templates").templates.bos_adding_variant(tok, ""), "bos_token"),
])
def test_the_bos_helpers_refuse_bad_input(call, words, tokenizer):
    with pytest.raises((TypeError, ValueError), match=words) as error:
        call(tokenizer)
    assert " — " in str(error.value)


# ---- issue 42, part 3: a template Jinja cannot compile, a blank BOS, an id no vocabulary holds ----------
@pytest.mark.parametrize("template", ["{% if %}", "{% for m in messages %}{{ m }}", "{{ x"])
def test_with_template_and_assistant_mask_refuse_a_template_jinja_cannot_compile(tokenizer, template):
    _refused(ValueError, "does not compile as Jinja", templates.with_template, tokenizer, template)
    _refused(ValueError, "does not compile as Jinja", assistant_mask, tokenizer, CONVERSATION,
             chat_template=template)


def test_templates_with_generation_blocks_still_compile(tokenizer):
    marked = add_generation_markers(base_variant(qwen2_5_chat_template))
    assert templates.with_template(tokenizer, marked).chat_template == marked


@pytest.mark.parametrize("call, phrase", [
    (lambda tok: templates.bos_adding_variant(tok, "   "), "must be a non-blank string"),
    (lambda tok: templates.leading_bos([1, 1, 2], 10_000_000), "bos_token_id=10000000 is beyond any"),
    (lambda tok: templates.double_bos_rows([[1, 1, 2]], 10_000_000), "bos_token_id=10000000 is beyond any"),
    (lambda tok: templates.double_bos_rows([{"ids": [1]}], 1), "must be a list of token ids"),
])
def test_bos_helpers_refuse_a_blank_token_and_an_id_no_vocabulary_holds(tokenizer, call, phrase):
    _refused((TypeError, ValueError), phrase, call, tokenizer)


def test_masked_tokens_points_at_the_courses_rule_for_labels(tokenizer):
    with pytest.raises(ValueError, match="is_graded") as info:
        masked_tokens(tokenizer, [1, 2], [-100, 1])
    assert "!= -100" not in str(info.value) and "!= -100" not in masked_tokens.__doc__
