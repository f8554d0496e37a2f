"""Lesson 04's exercises: their checkers, and the set-ups of the diagnosis exercise.

1. ``check_generation_template(fn, tokenizer=None)``: ``fn()`` returns Qwen2's template with
   ``{% generation %}`` markers; graded by rendering conversations the notebook never shows.
2. ``unseen_setup(tokenizer, seed)`` (what a learner reads) + ``check_template_diagnosis(fn)``:
   ``fn(setup) -> Diagnosis(cause, evidence)``, one of ``TEMPLATE_CAUSES``, graded on fresh set-ups.

The generator that knows a set-up's cause (``_template_case``) is private: the notebook shows the
set-up only. Reference answers: ``answers/lesson04.py``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence

from transformers import AutoTokenizer
from trl.chat_template_utils import qwen2_5_chat_template

from .. import validate
from ..checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import make_messages, tokenize_chat
from ..model import COURSE_MODEL_DIR
from ..templates import (
    INSTRUCT_SYSTEM,
    QWEN2_CHAT_TEMPLATE,
    _sft_template,  # the template SFTTrainer would render with: one copy, in the lesson module
    assistant_mask,
    base_variant,
    masked_tokens,
    template_variant,
    with_template,
)


def _course_tokenizer():
    return AutoTokenizer.from_pretrained(COURSE_MODEL_DIR)


# ---------------------------------------------------------------------------------------------
# Exercise 1: add generation markers to Qwen2's template
# ---------------------------------------------------------------------------------------------

def _hidden_conversations() -> list[list[dict]]:
    return [
        [{"role": "user", "content": "What is 12 + 30?"}, {"role": "assistant", "content": "42"}],
        [{"role": "system", "content": "Answer briefly."},
         {"role": "user", "content": "Reverse the words: red cat"},
         {"role": "assistant", "content": "cat red"},
         {"role": "user", "content": "What is 7 + 8?"}, {"role": "assistant", "content": "15"}],
        [{"role": "user", "content": "Reverse the words: sun moon star"},
         {"role": "assistant", "content": "star moon sun"}],
    ]


def _expected_render(tokenizer, messages: list[dict]) -> dict:
    """The oracle: Qwen2's text, the mask on ``\\n + content + <|im_end|> + \\n`` of each assistant turn."""
    oracle = copy.deepcopy(tokenizer)
    oracle.chat_template = QWEN2_CHAT_TEMPLATE
    encoded = tokenize_chat(oracle, messages)  # locates assistant spans by rendering prefixes
    return {"messages": messages, "input_ids": encoded["input_ids"], "mask": encoded["assistant_mask"]}


def _render_or_error(tokenizer, template, messages):
    if not isinstance(template, str):
        return None, f"expected your function to return the template as a str, got {type(template).__name__}"
    try:
        return assistant_mask(tokenizer, messages, chat_template=template), None
    except Exception as exc:  # the learner's Jinja error is the message
        return None, f"your template does not render: {type(exc).__name__}: {str(exc)[:160]}"


def check_generation_template(fn, tokenizer=None):
    """Checker for exercise 1: ``fn()`` returns QWEN2_CHAT_TEMPLATE with ``{% generation %}`` markers.

    Renders hidden conversations (multi-turn, with and without a system message) and requires the
    same text as the original and a mask on exactly ``\\n + content + <|im_end|> + \\n`` of each assistant
    turn (TRL's convention for Qwen templates, and ``data.tokenize_chat``'s).
    """
    tokenizer = _course_tokenizer() if tokenizer is None else validate.tokenizer("tokenizer", tokenizer)
    cases = [Case((), _expected_render(tokenizer, m), label=f"{len(m)}-message conversation")
             for m in _hidden_conversations()]

    def compare(got, expected):
        out, error = _render_or_error(tokenizer, got, expected["messages"])
        if error:
            return error
        if out["input_ids"] != expected["input_ids"]:
            return "your template renders different text from Qwen2's (markers must not change the text)"
        if out["assistant_masks"] != expected["mask"]:
            shown = masked_tokens(tokenizer, out["input_ids"], out["assistant_masks"])
            return f"the mask covers {shown!r}"
        return None

    def diagnose(got, case):
        out, error = _render_or_error(tokenizer, got, case.expected["messages"])
        if error or out["input_ids"] != case.expected["input_ids"]:
            return ("render the original text exactly: put {% generation %} ... {% endgeneration %} around "
                    "the assistant's output without adding or dropping characters.")
        mask, want = out["assistant_masks"], case.expected["mask"]
        tokens = tokenizer.convert_ids_to_tokens(out["input_ids"])
        if not any(mask):
            return ("the mask is all zeros: no {% generation %} block is rendered for assistant turns "
                    "(is it inside a branch that never runs?).")
        extra = [t for t, m, w in zip(tokens, mask, want, strict=True) if m and not w]
        missing = [t for t, m, w in zip(tokens, mask, want, strict=True) if w and not m]
        if "<|im_end|>" in missing:
            return ("<|im_end|> is outside your block: the model would never be trained to end its turn "
                    "(lesson 02). Close the block after '<|im_end|>\\n'.")
        if "assistant" in extra or "<|im_start|>" in extra:
            return ("your block includes the '<|im_start|>assistant' header: the prompt supplies it at "
                    "inference (add_generation_prompt), so it should carry no loss.")
        if "user" in extra or "system" in extra:
            return "your block covers user/system turns too: only the assistant role's output is trained."
        missing_at = [i for i, (m, w) in enumerate(zip(mask, want, strict=True)) if w and not m]
        if missing_at and all(i > 0 and tokens[i - 1] == "assistant" for i in missing_at):
            return ("your block opens after the '\\n' that follows 'assistant': TRL's Qwen2.5 training "
                    "template (and tokenize_chat) open it right after '<|im_start|>assistant', so that "
                    "newline is trained.")
        if missing:
            return f"your block misses {missing!r}: it must end after '<|im_end|>\\n'."
        return None

    return run_check("generation_template", fn, cases, compare=compare, diagnose=diagnose,
                     hint=Hints("Which part of an assistant turn does the model produce at inference, and "
                                "which part does the prompt already contain?",
                                "Compare with the Fix C cell: add_generation_markers(base_template) wraps "
                                "the output of the assistant branch; print its diff there.",
                                "split the loop: for assistant messages emit '<|im_start|>assistant', then "
                                "{% generation %}'\\n' + content + '<|im_end|>\\n'{% endgeneration %}; other "
                                "roles as before."))


# ---------------------------------------------------------------------------------------------
# Exercise 2: diagnose an assistant-only set-up you have not seen
# ---------------------------------------------------------------------------------------------

TEMPLATE_CAUSES = ("refused_exact_match", "markers_mark_nothing", "stop_token_not_graded",
                   "whole_sequence_graded", "trains_correctly")
TEMPLATE_MISCONCEPTIONS = {
    ("trains_correctly", "refused_exact_match"):
        "it looks like Qwen2.5's template, but TRL compares strings exactly: ask get_training_chat_template, "
        "don't eyeball it.",
    ("refused_exact_match", "markers_mark_nothing"):
        "this template has {% generation %} markers, so TRL does not look it up: render a conversation and "
        "look at the mask.",
    ("trains_correctly", "stop_token_not_graded"):
        "the answer is graded, but is <|im_end|>? Lesson 02 shows what an ungraded stop token costs.",
    ("trains_correctly", "whole_sequence_graded"):
        "check assistant_only_loss first: without it TRL grades every token (lesson 00).",
}


def _unmarked_near_miss(rng: random.Random) -> str:
    return rng.choice([base_variant(qwen2_5_chat_template), qwen2_5_chat_template + "\n",
                       qwen2_5_chat_template.replace("\n", "\r\n"),
                       qwen2_5_chat_template.replace(INSTRUCT_SYSTEM, "You are a concise assistant.")])


def _template_case(tokenizer, seed: int):
    """An assistant-only SFT set-up broken (or not) in one of ``TEMPLATE_CAUSES`` ways, and the truth."""
    rng = random.Random(seed)
    cause = TEMPLATE_CAUSES[seed % len(TEMPLATE_CAUSES)]
    conversation = make_messages(rng.choice(("add", "reverse")), 1, seed=seed)[0]
    assistant_only = cause != "whole_sequence_graded"
    either = rng.choice(["base system prompt", "none"])  # the base checkpoint's template, or TRL's copy
    template = {"refused_exact_match": _unmarked_near_miss(rng),
                "markers_mark_nothing": template_variant(either, "tool-call branch only"),
                "stop_token_not_graded": template_variant(either, "closed before <|im_end|>"),
                "whole_sequence_graded": template_variant(either),
                "trains_correctly": rng.choice([template_variant("none"),
                                                template_variant("base system prompt",
                                                                 "ours (add_generation_markers)")])}[cause]
    tok = with_template(tokenizer, template)
    if cause == "whole_sequence_graded":
        evidence = len(tok.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"])
    elif cause in ("refused_exact_match", "markers_mark_nothing"):
        evidence = 0
    else:
        evidence = sum(assistant_mask(tok, conversation, chat_template=_sft_template(tok))["assistant_masks"])
    setup = {"tokenizer": tok, "assistant_only_loss": assistant_only, "conversation": conversation}
    return setup, Diagnosis(cause, evidence)


def unseen_setup(tokenizer, seed: int) -> dict:
    """An SFT set-up you have not seen (exercise 2): ``tokenizer`` (with its chat template),
    ``assistant_only_loss`` and one ``conversation`` of its dataset. The checker grades your diagnosis
    on other seeds: read the set-up, not this function."""
    validate.tokenizer("tokenizer", tokenizer)
    validate.seed("seed", seed)
    return _template_case(tokenizer, seed)[0]


def check_template_diagnosis(fn, tokenizer=None, seeds: Sequence[int] | None = None):
    """Checker for exercise 2: ``fn(setup) -> Diagnosis(cause, evidence)``, ``cause`` one of
    ``TEMPLATE_CAUSES``, ``evidence`` the number of tokens of the conversation that would carry loss
    (0 when SFTTrainer refuses or the mask is empty). ``seeds`` (a non-empty list): grade on those
    set-ups instead of ten fresh ones."""
    validate.function("fn", fn)  # check_diagnosis wraps fn, so run_check's own test would not see it
    tokenizer = _course_tokenizer() if tokenizer is None else validate.tokenizer("tokenizer", tokenizer)
    seeds = validate.seeds("seeds", fresh_seeds(10) if seeds is None else seeds)
    return check_diagnosis(
        "diagnose_template", fn, lambda seed: _template_case(tokenizer, seed), seeds=seeds,
        misconceptions=TEMPLATE_MISCONCEPTIONS,
        hint=Hints("Before any mask: does this set-up ask for assistant-only loss at all, and does its "
                   "template carry {% generation %} markers, or will TRL have to look it up?",
                   "Tools: has_generation_markers(template), get_training_chat_template(tokenizer) (raises "
                   "ValueError when it cannot patch), assistant_mask(tokenizer, conversation, "
                   "chat_template=...) and masked_tokens(...) from section 8.",
                   "not assistant_only_loss -> whole_sequence_graded (evidence: all tokens); no markers and "
                   "get_training_chat_template raises -> refused_exact_match (0); else mask = "
                   "assistant_mask(...) with the template TRL would use; sum 0 -> markers_mark_nothing; "
                   "<|im_end|> not masked -> stop_token_not_graded; else trains_correctly "
                   "(evidence: the mask's sum)."))
