"""Reference answers of lesson 04 (chat templates), and the rendering generator that knows each rendering's
cause (exercise 2's truth lives here, out of the exercise copy's reach). The notebook never imports this
module; ``course_utils.exercises.lesson04`` does."""

from __future__ import annotations

import functools
import random

from ...checks import Diagnosis
from ...data import make_messages
from ...templates import (
    QWEN2_ROLE_EXPRESSION,
    add_generation_markers,
    assistant_mask,
    base_variant,
    template_variant,
)

# ---------------------------------------------------------------------------------------------
# Exercise 1: add generation markers to a Qwen2-style template
# ---------------------------------------------------------------------------------------------

_MARKED_ROLE = ("{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant' }}"
                "{% generation %}{{ '\\n' + message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
                "{% else %}" + QWEN2_ROLE_EXPRESSION + "{% endif %}")


def add_generation_block(template: str) -> str:
    """Exercise 1: a Qwen2-style template (every role rendered by ``QWEN2_ROLE_EXPRESSION``) with
    ``{% generation %}`` around each assistant turn's output: ``\\n + content + <|im_end|> + \\n``."""
    return template.replace(QWEN2_ROLE_EXPRESSION, _MARKED_ROLE)


# ---------------------------------------------------------------------------------------------
# Exercise 2: read a training example's loss mask
# ---------------------------------------------------------------------------------------------

MASK_CAUSES = ("whole_sequence_graded", "markers_mark_nothing", "stop_token_not_graded", "trains_correctly")

# Healthy templates, each a look-alike of a broken one: our markers on the base template, TRL's own patched
# training template, and a block that closes right after <|im_end|> (its trailing newline ungraded, as in
# stop_token_not_graded the end of the turn is outside the block — but the stop token itself is graded).
_HEALTHY = ("ours", "trl", "closed after <|im_end|>")


def _closed_after_stop(template: str) -> str:
    marked = add_generation_markers(template)
    return marked.replace("{{- '\\n' + message.content + '<|im_end|>\\n' }}\n        {%- endgeneration %}",
                          "{{- '\\n' + message.content + '<|im_end|>' }}\n        {%- endgeneration %}\n"
                          "        {{- '\\n' }}")


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from transformers import AutoTokenizer

    from ...model import COURSE_MODEL_DIR

    return AutoTokenizer.from_pretrained(COURSE_MODEL_DIR)  # the Qwen vocabulary, whatever COURSE_MODEL says


def _conversation(rng: random.Random) -> list[dict]:
    turns = []
    for _ in range(rng.choice((1, 1, 2))):
        turns += make_messages(rng.choice(("add", "reverse")), 1, seed=rng.randrange(10 ** 6))[0]
    if rng.random() < 0.4:
        turns = [{"role": "system", "content": rng.choice(("Answer briefly.", "Be exact."))}] + turns
    return turns


def rendering_case(seed: int, graded: bool = True) -> tuple[dict, Diagnosis]:
    """One training example as a practitioner inspects it — ``{"tokens": [...], "loss_mask": [...]}``, each
    token as text, 1 where it carries loss — and its true ``Diagnosis`` (evidence: how many tokens carry
    loss). ``graded`` picks the stream: the checker's renderings are drawn apart from the ones
    ``training_example`` shows."""
    from trl.chat_template_utils import get_training_chat_template, qwen2_5_chat_template

    rng = random.Random(f"{'graded' if graded else 'shown'}-{seed}")
    cause = MASK_CAUSES[seed % len(MASK_CAUSES)]
    conversation = _conversation(rng)
    base = rng.choice((base_variant(qwen2_5_chat_template), qwen2_5_chat_template))
    either = "base system prompt" if base != qwen2_5_chat_template else "none"
    if cause == "trains_correctly":
        healthy = _HEALTHY[(seed // len(MASK_CAUSES)) % len(_HEALTHY)]
        template = {"ours": lambda: add_generation_markers(base),
                    "trl": lambda: get_training_chat_template(_tokenizer()),
                    "closed after <|im_end|>": lambda: _closed_after_stop(base)}[healthy]()
    else:
        template = {"whole_sequence_graded": base,
                    "markers_mark_nothing": template_variant(either, "tool-call branch only"),
                    "stop_token_not_graded": template_variant(either, "closed before <|im_end|>")}[cause]
    tok = _tokenizer()
    out = assistant_mask(tok, conversation, chat_template=template) if cause != "whole_sequence_graded" else \
        {"input_ids": tok.apply_chat_template(conversation, chat_template=template, tokenize=True,
                                              return_dict=True)["input_ids"]}
    ids = list(out["input_ids"])
    mask = [1] * len(ids) if cause == "whole_sequence_graded" else list(out["assistant_masks"])
    rendering = {"tokens": [tok.decode([i]) for i in ids], "loss_mask": mask}  # each token as text
    return rendering, Diagnosis(cause, sum(mask))


def diagnose_mask(rendering: dict) -> Diagnosis:
    """Exercise 2: which tokens of the example carry loss, and what that says about the set-up."""
    tokens, mask = rendering["tokens"], rendering["loss_mask"]
    graded = sum(mask)
    if graded == 0:
        return Diagnosis("markers_mark_nothing", 0)
    if mask[0] == 1:  # the system header carries loss: the whole conversation is graded
        return Diagnosis("whole_sequence_graded", graded)
    ends = [i for i, t in enumerate(tokens) if t == "<|im_end|>" and i > 0 and mask[i - 1] == 1]
    if any(mask[i] == 0 for i in ends):  # an answer's own <|im_end|> carries no loss
        return Diagnosis("stop_token_not_graded", graded)
    return Diagnosis("trains_correctly", graded)


# The self-test's plain phrases, in a fixed order (what a learner of lesson 04 can name).
SELF_TEST_CAUSES = {
    "whole_sequence_graded": "loss on every token: assistant-only loss is off",
    "markers_mark_nothing": "the generation markers mark no token",
    "stop_token_not_graded": "the end-of-turn token carries no loss",
    "trains_correctly": "nothing: the answers and their end-of-turn token carry loss",
}


def self_test_case(seed: int) -> tuple[str, str, tuple[str, ...]]:
    """One self-test question: a training example as TRL would train it — each token, with a mark on those
    that carry loss — its true cause as a plain phrase, and the phrases to choose from (fixed order)."""
    rendering, truth = rendering_case(seed, graded=False)
    text, inside = "", False
    for token, graded in zip(rendering["tokens"], rendering["loss_mask"]):
        if graded != inside:  # a run of tokens that carry loss opens or closes
            text += "⟦" if graded else "⟧"
            inside = bool(graded)
        text += token.replace("\n", "↵\n")
    text += "⟧" if inside else ""
    lines = ["One training example as SFTTrainer trains it (⟦ ⟧: tokens that carry loss; ↵: a newline):"]
    lines += text.splitlines()
    return "\n".join(lines[:25]), SELF_TEST_CAUSES[truth.cause], tuple(SELF_TEST_CAUSES.values())
