"""Lesson 04's exercises: their checkers, and the training examples of the diagnosis exercise.

1. ``check_generation_template(fn, tokenizer=None)``: ``fn(template)`` returns that Qwen2-style template with
   ``{% generation %}`` markers; graded on templates of the family the notebook never shows, by rendering
   conversations it never shows either.
2. ``training_example(seed)`` (what a learner reads: one example's tokens and loss mask) +
   ``check_mask_diagnosis(fn)``: ``fn(rendering) -> Diagnosis(cause, evidence)``, one of ``MASK_CAUSES``,
   graded on fresh renderings.

The generator that knows a rendering's cause, and the reference answers, live in ``answers/lesson04.py``,
which no notebook imports; the graded renderings are drawn apart from the shown ones.
"""

from __future__ import annotations

import copy

from transformers import AutoTokenizer

from .. import validate
from ..checks import Case, Hints, check_diagnosis, fresh_seeds, run_check
from ..data import tokenize_chat
from ..model import COURSE_MODEL_DIR
from ..templates import QWEN2_CHAT_TEMPLATE, QWEN2_ROLE_EXPRESSION, assistant_mask, masked_tokens
from .answers.lesson04 import MASK_CAUSES
from .answers.lesson04 import rendering_case as _rendering_case  # knows the truth

__all__ = ["MASK_CAUSES", "check_generation_template", "check_mask_diagnosis", "training_example"]


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


def _fresh_templates() -> list[tuple[str, str]]:
    """Qwen2-style templates the notebook never shows: other default system prompts, or none at all. Each
    renders every role with ``QWEN2_ROLE_EXPRESSION``."""
    default = "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    no_system = QWEN2_CHAT_TEMPLATE.replace(
        "{% if loop.first and messages[0]['role'] != 'system' %}" + default + "{% endif %}", "")
    assert QWEN2_ROLE_EXPRESSION in no_system and no_system != QWEN2_CHAT_TEMPLATE
    return [("another default system prompt",
             QWEN2_CHAT_TEMPLATE.replace("You are a helpful assistant.", "You answer in one line.")),
            ("no default system prompt", no_system),
            ("a third default system prompt",
             QWEN2_CHAT_TEMPLATE.replace("You are a helpful assistant.", "Be brief and exact."))]


def _expected_render(tokenizer, template: str, messages: list[dict]) -> dict:
    """The oracle: the template's text, the mask on ``\\n + content + <|im_end|> + \\n`` of each assistant
    turn (``tokenize_chat`` locates the assistant spans by rendering prefixes, without markers)."""
    oracle = copy.deepcopy(tokenizer)
    oracle.chat_template = template
    encoded = tokenize_chat(oracle, messages)
    return {"messages": messages, "input_ids": encoded["input_ids"], "mask": encoded["assistant_mask"]}


def _render_or_error(tokenizer, template, messages):
    if not isinstance(template, str):
        return None, f"expected your function to return the template as a str, got {type(template).__name__}"
    try:
        return assistant_mask(tokenizer, messages, chat_template=template), None
    except Exception as exc:  # the learner's Jinja error is the message
        return None, f"your template does not render: {type(exc).__name__}: {str(exc)[:160]}"


def check_generation_template(fn, tokenizer=None):
    """Checker for exercise 1: ``fn(template)`` returns that Qwen2-style template with ``{% generation %}``.

    Calls ``fn`` on templates of the family the notebook never shows (``_fresh_templates``), renders hidden
    conversations (multi-turn, with and without a system message) with each result, and requires the same text
    as the unmarked template and a mask on exactly ``\\n + content + <|im_end|> + \\n`` of each assistant
    turn (TRL's convention for Qwen templates, and ``data.tokenize_chat``'s).
    """
    tokenizer = _course_tokenizer() if tokenizer is None else validate.tokenizer("tokenizer", tokenizer)

    def cases():  # built in run_check's grading process: this one never holds the expected text
        return [Case((template,), _expected_render(tokenizer, template, m),
                     label=f"a template with {name}, a {len(m)}-message conversation")
                for name, template in _fresh_templates() for m in _hidden_conversations()]

    def compare(got, expected):
        out, error = _render_or_error(tokenizer, got, expected["messages"])
        if error:
            return error
        if out["input_ids"] != expected["input_ids"]:
            return ("your template renders different text from the template it was given (markers must not "
                    "change the text; the checker passes templates you have not seen)")
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
                                "Compare with the Fix B cell: add_generation_markers(base_template) wraps "
                                "the output of the assistant branch; print its diff there. Your function "
                                "gets the template as its argument: edit that string, where "
                                "QWEN2_ROLE_EXPRESSION renders every role.",
                                "replace QWEN2_ROLE_EXPRESSION in the template by an if: for assistant "
                                "messages emit '<|im_start|>assistant', then {% generation %}'\\n' + content "
                                "+ '<|im_end|>\\n'{% endgeneration %}; else the expression as it was."))


# ---------------------------------------------------------------------------------------------
# Exercise 2: read a training example's loss mask
# ---------------------------------------------------------------------------------------------

MASK_MISCONCEPTIONS = {
    ("stop_token_not_graded", "trains_correctly"):
        "the <|im_end|> right after each answer carries loss here; only the newline after it does not, which "
        "is harmless: the model learns to stop at <|im_end|>.",
    ("trains_correctly", "stop_token_not_graded"):
        "look at the <|im_end|> right after each answer: does it carry loss? (lesson 02: a stop token "
        "that is never trained is never generated)",
    ("stop_token_not_graded", "markers_mark_nothing"):
        "no token carries loss at all: the markers wrap nothing these chats render.",
    ("trains_correctly", "whole_sequence_graded"):
        "the system prompt and the user's turn carry loss too: assistant-only loss is off (lesson 00).",
    ("stop_token_not_graded", "whole_sequence_graded"):
        "the system prompt and the user's turn carry loss too: assistant-only loss is off (lesson 00).",
}


def training_example(seed: int) -> dict:
    """One training example as you would inspect it (exercise 2): ``tokens`` (the token strings) and
    ``loss_mask`` (1 = the token carries loss, i.e. its label is not -100). The checker grades your diagnosis
    on examples drawn apart from these: read the mask, not this function."""
    return _rendering_case(validate.seed("seed", seed), graded=False)[0]


def check_mask_diagnosis(fn):
    """Checker for exercise 2: ``fn(rendering) -> Diagnosis(cause, evidence)``, ``cause`` one of
    ``MASK_CAUSES``, ``evidence`` the number of tokens that carry loss. Graded on twelve renderings
    drawn fresh on every run, three rounds through the causes (no keyword fixes them: see
    ``checks.fresh_seeds``)."""
    validate.function("fn", fn)  # check_diagnosis wraps fn, so run_check's own test would not see it
    return check_diagnosis(
        "diagnose_mask", fn, _rendering_case, seeds=lambda: fresh_seeds(3 * len(MASK_CAUSES)),
        misconceptions=MASK_MISCONCEPTIONS,
        hint=Hints("Print the tokens whose loss_mask is 1: for a correct assistant-only example, which "
                   "tokens would you expect them to be, and which would you expect to be missing?",
                   "Section 2 shows the tokens TRL trains for a correct template, section 6 the same with "
                   "our markers; section 4 shows a mask of zeros. Print the tokens whose loss_mask is 1.",
                   "no token graded -> markers_mark_nothing (0); the first token graded -> "
                   "whole_sequence_graded; an answer's own <|im_end|> (the token after a graded one) "
                   "ungraded -> stop_token_not_graded; else trains_correctly. Evidence: sum(loss_mask)."))
