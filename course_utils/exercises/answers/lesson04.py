"""Reference answers for lesson 04 (chat templates); the checkers in ``exercises/lesson04.py`` use them."""

from __future__ import annotations

from ...checks import Diagnosis
from ...templates import QWEN2_CHAT_TEMPLATE, assistant_mask


def qwen2_training_template() -> str:
    """Exercise 1: Qwen2's template with ``{% generation %}`` around each assistant turn's output."""
    assert "{{'<|im_start|>' + message['role']" in QWEN2_CHAT_TEMPLATE
    return (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
        "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant' }}"
        "{% generation %}{{ '\\n' + message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
        "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


def diagnose_template(setup: dict) -> Diagnosis:
    """Exercise 2: what assistant-only SFT would do with this set-up, and how many tokens it grades."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    tok, conversation = setup["tokenizer"], setup["conversation"]
    if not setup["assistant_only_loss"]:
        n = len(tok.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"])
        return Diagnosis("whole_sequence_graded", n)
    template = tok.chat_template
    if not has_generation_markers(template):
        try:
            template = get_training_chat_template(tok)
        except ValueError:
            return Diagnosis("refused_exact_match", 0)
    out = assistant_mask(tok, conversation, chat_template=template)
    graded = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    if not graded:
        return Diagnosis("markers_mark_nothing", 0)
    if tok.convert_tokens_to_ids("<|im_end|>") not in graded:
        return Diagnosis("stop_token_not_graded", len(graded))
    return Diagnosis("trains_correctly", len(graded))
