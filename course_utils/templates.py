"""Lesson 04 (chat templates): why ``assistant_only_loss=True`` refuses a perfectly valid template.

TRL trains on assistant tokens only when the chat template marks them with ``{% generation %}``.
For templates without markers it swaps in a patched copy, but it recognises a template by **exact
string equality** with the copies it ships (``trl.chat_template_utils``), so a variant that differs
in one sentence (Qwen2.5 base's default system prompt) or one character is refused. This module
holds the lesson's template surgery (base variant, diff, our own generation markers), the mask and
warning probes, the "other family" tokenizer used to demonstrate ``clone_chat_template``, and the
two exercise checkers.
"""

from __future__ import annotations

import copy
import difflib
import os
import random
import tempfile

from . import validate
from .checks import Case, Diagnosis, Hints, check_diagnosis, fresh_seeds, run_check

# Qwen2.5-Instruct's default system prompt, and the one the Qwen2.5 base checkpoints ship instead.
INSTRUCT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
BASE_SYSTEM = "You are a helpful assistant."

# Qwen2-Instruct's template (one line, no tools): the exercise's starting point.
QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Phi-3's turn tokens: the "other model family" whose template we clone in Fix B.
PHI3_SPECIAL_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

_MARKER_ANCHOR = '    {%- if (message.role == "user")'


def _check_template(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a chat template string, got {type(value).__name__} — templates are "
                        "Jinja source — pass e.g. tokenizer.chat_template.")
    return value


def base_variant(template: str) -> str:
    """The Qwen2.5 *base* template made from the Instruct one: only the default system prompt differs."""
    if not isinstance(template, str) or INSTRUCT_SYSTEM not in template:
        raise ValueError(
            "the template does not contain Qwen2.5-Instruct's default system prompt — base_variant swaps "
            "that sentence for the base checkpoint's — pass trl.chat_template_utils.qwen2_5_chat_template "
            "(the course tokenizer's chat_template)."
        )
    return template.replace(INSTRUCT_SYSTEM, BASE_SYSTEM)


def template_diff(a: str, b: str, name_a: str = "a", name_b: str = "b") -> list[str]:
    """The lines that differ between two templates (unified diff, no context lines)."""
    for name, value in (("a", a), ("b", b)):
        _check_template(name, value)
    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), name_a, name_b, n=0, lineterm=""))


def add_generation_markers(template: str) -> str:
    """A Qwen2.5-style template whose plain assistant turns are wrapped in ``{% generation %}``.

    The span is ``\\n + content + <|im_end|> + \\n``, as in TRL's own ``qwen2_5_training.jinja`` (and
    ``data.tokenize_chat``): the ``<|im_start|>assistant`` header stays outside, the end-of-turn token
    is inside, so the model learns to stop. The rendered *text* is unchanged. Assistant turns with
    ``tool_calls`` keep the original branch (unmarked): wrap them the same way if your data has them.
    """
    if not isinstance(template, str) or template.count(_MARKER_ANCHOR) != 1:
        raise ValueError(
            "the template does not have the Qwen2.5 message loop this function edits (one line starting "
            f"{_MARKER_ANCHOR.strip()!r}) — the edit is made at that anchor — pass a Qwen2.5-family "
            "template (e.g. base_variant(qwen2_5_chat_template)) or add the markers by hand."
        )
    assistant_branch = (
        '    {%- if message.role == "assistant" and not message.tool_calls %}\n'
        "        {{- '<|im_start|>assistant' }}\n"
        "        {%- generation %}\n"
        "        {{- '\\n' + message.content + '<|im_end|>\\n' }}\n"
        "        {%- endgeneration %}\n"
        '    {%- elif (message.role == "user")'
    )
    return template.replace(_MARKER_ANCHOR, assistant_branch)


# ---------------------------------------------------------------------------------------------
# Probes: the assistant mask transformers computes, and what it logs
# ---------------------------------------------------------------------------------------------

def assistant_mask(tokenizer, messages: list[dict], chat_template: str | None = None) -> dict:
    """``input_ids`` and ``assistant_masks`` as transformers computes them from ``{% generation %}``.

    Exactly the call TRL's SFTTrainer makes for ``assistant_only_loss=True``; 1 = the token carries loss.
    """
    from .data import _check_messages

    validate.tokenizer("tokenizer", tokenizer)
    _check_messages(messages)
    if chat_template is not None:
        _check_template("chat_template", chat_template)
    out = tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
    return {"input_ids": list(out["input_ids"]), "assistant_masks": list(out["assistant_masks"])}


def masked_tokens(tokenizer, input_ids, mask) -> list[str]:
    """The tokens (as text) that carry loss, in order: what a learner reads to check a mask.

    ``mask`` is 0/1 (an assistant mask); pass labels through ``[int(l != -100) for l in labels]``.
    """
    validate.tokenizer("tokenizer", tokenizer)
    if input_ids is None or mask is None or len(list(input_ids)) != len(list(mask)):
        raise ValueError("masked_tokens needs input_ids and a mask of the same length — one mask value per "
                         "token — pass out['input_ids'] and out['assistant_masks'] of assistant_mask().")
    if any(int(m) not in (0, 1) for m in mask):
        raise ValueError("mask holds values other than 0 and 1 (labels?) — a -100 would count as 'trained' — "
                         "pass [int(label != -100) for label in labels] instead.")
    return [tokenizer.convert_tokens_to_string([t])
            for t, m in zip(tokenizer.convert_ids_to_tokens(list(input_ids)), mask, strict=True) if m]


# ---------------------------------------------------------------------------------------------
# What if: one edit to TRL's Qwen2.5 template, with or without markers, through SFTTrainer's test
# ---------------------------------------------------------------------------------------------

# Edits that leave the rendered text of a chat unchanged (all but the system prompt), or nearly so.
TEMPLATE_EDITS = {
    "none": lambda t: t,
    "base system prompt": base_variant,
    "one trailing newline": lambda t: t + "\n",
    "an extra space in a tag": lambda t: t.replace("{%- for message in messages %}",
                                                   "{%- for message in messages  %}", 1),
    "CRLF line endings": lambda t: t.replace("\n", "\r\n"),
}
MARKER_STYLES = ("none", "ours (add_generation_markers)", "closed before <|im_end|>", "tool-call branch only")


def template_variant(edit: str, markers: str = "none") -> str:
    """TRL's Qwen2.5 template with one of ``TEMPLATE_EDITS`` and one of ``MARKER_STYLES`` of markers."""
    from trl.chat_template_utils import qwen2_5_chat_template

    validate.choice("edit", edit, tuple(TEMPLATE_EDITS), why="each is a one-line change the lesson measures")
    validate.choice("markers", markers, MARKER_STYLES, why="each is a way of marking the assistant's tokens")
    template = TEMPLATE_EDITS[edit](qwen2_5_chat_template)
    if markers == "none":
        return template
    if markers == "closed before <|im_end|>":
        return _markers_without_stop(template)
    if markers == "tool-call branch only":
        return _markers_in_tool_branch_only(template)
    return add_generation_markers(template)


def _sft_template(tokenizer) -> str | None:
    """The template ``SFTTrainer(assistant_only_loss=True)`` renders with: its own if it has markers, else
    TRL's patched copy found by exact match (``trl/trainer/sft_trainer.py`` ~l.941); ``None``: it refuses."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if has_generation_markers(tokenizer.chat_template):
        return tokenizer.chat_template
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:
        return None


def template_frame(tokenizer, messages: list[dict], *, edit: str = "none", markers: str = "none") -> str:
    """What ``SFTTrainer(assistant_only_loss=True)`` does with ``template_variant(edit, markers)``, as text.

    Whether the template is the exact string TRL ships and renders the same chat; whether TRL accepts it
    (markers: used as they are; none: the exact-match lookup); which tokens of ``messages`` carry loss;
    and what TRL says: its ValueError, its RuntimeError on an empty mask, or its stop-token warning.
    """
    from trl.chat_template_utils import is_chat_template_stop_token_trained, qwen2_5_chat_template

    from .data import _check_messages

    validate.tokenizer("tokenizer", tokenizer)
    _check_messages(messages)
    template = template_variant(edit, markers)
    tok = with_template(tokenizer, template)
    original = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=qwen2_5_chat_template)
    same_text = tok.apply_chat_template(messages, tokenize=False) == original
    lines = [f"template: TRL's Qwen2.5 copy, {'unedited' if edit == 'none' else 'edit: ' + edit}"
             f" · {{% generation %}} markers: {markers}",
             f"the very string TRL ships: {'yes' if template == qwen2_5_chat_template else 'no'}"
             f" · renders this chat as TRL's copy does: {'yes' if same_text else 'no'}"]
    used = _sft_template(tok)
    total = len(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    if used is None:
        lines += ["SFTTrainer(assistant_only_loss=True): REFUSED — no {% generation %} markers, and not an "
                  "exact copy of a template TRL can patch (ValueError before training)",
                  f"graded tokens: 0 of {total}"]
        return "\n".join(lines)
    how = ("uses it as it is (it has markers: no lookup)" if used == template else
           "accepted — an exact copy: TRL swaps in its patched training template")
    lines.append(f"SFTTrainer(assistant_only_loss=True): {how}")
    out = assistant_mask(tok, messages, chat_template=used)
    graded = masked_tokens(tok, out["input_ids"], out["assistant_masks"])
    lines.append(f"graded tokens: {len(graded)} of {len(out['input_ids'])}"
                 + (f": {' '.join(repr(t) for t in graded)}" if graded else ""))
    if not graded:
        lines.append("→ the mask is empty: SFTTrainer raises RuntimeError ('no assistant tokens') while "
                     "tokenizing")
    elif not is_chat_template_stop_token_trained(tok, chat_template=used):
        lines.append("→ TRL warns that the end-of-turn token is not in the loss, and trains on: the model "
                     "may never learn to stop (lesson 02)")
    return "\n".join(lines)


def template_explorer(tokenizer, messages: list[dict]):
    """What if: an edit to TRL's Qwen2.5 template × how it is marked → ``template_frame`` on ``messages``.

    Each move renders one chat through SFTTrainer's own test (a fraction of a second, cached once seen);
    it starts on the lesson's symptom, the base checkpoint's system prompt without markers.
    """
    from .viz import what_if

    return what_if(lambda edit, markers: template_frame(tokenizer, messages, edit=edit, markers=markers),
                   {"edit": list(TEMPLATE_EDITS), "markers": list(MARKER_STYLES)},
                   start={"edit": "base system prompt"},
                   descriptions={"edit": "edit to TRL's template", "markers": "{% generation %} markers"},
                   width="520px")


# ---------------------------------------------------------------------------------------------
# Fix B's "other family": a tokenizer with Phi-3's turn tokens and template, saved locally
# ---------------------------------------------------------------------------------------------

def save_other_family_tokenizer(tokenizer, directory: str | None = None) -> str:
    """Save a copy of ``tokenizer`` with Phi-3's special tokens and TRL's Phi-3 template; return the dir.

    It stands in for a hub checkpoint of another family (``chat_template_path="microsoft/..."``), so
    ``clone_chat_template`` can load it offline. The shared tokenizer is not modified.
    """
    from trl.chat_template_utils import phi3_chat_template

    validate.tokenizer("tokenizer", tokenizer)
    if directory is not None and (not isinstance(directory, str) or os.path.isfile(directory)):
        raise ValueError(f"directory={directory!r} must be a folder path (or None for a temporary one) — the "
                         "tokenizer's files are written there — pass a directory, not a file.")
    source = copy.deepcopy(tokenizer)
    source.add_special_tokens({"additional_special_tokens": list(PHI3_SPECIAL_TOKENS)})
    source.chat_template = phi3_chat_template
    directory = directory or tempfile.mkdtemp(prefix="other-family-tok-")
    source.save_pretrained(directory)
    return directory


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
    from .data import tokenize_chat

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
    if tokenizer is None:
        tokenizer = _course_tokenizer()
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
# The templates of section 4, and exercise 2: diagnose an assistant-only set-up you have not seen
# ---------------------------------------------------------------------------------------------

def _course_tokenizer():
    from transformers import AutoTokenizer

    from .model import COURSE_MODEL_DIR

    return AutoTokenizer.from_pretrained(COURSE_MODEL_DIR)


def with_template(tokenizer, template: str):
    """A copy of ``tokenizer`` carrying ``template`` (the original and its special tokens are untouched)."""
    validate.tokenizer("tokenizer", tokenizer)
    _check_template("template", template)
    tok = copy.deepcopy(tokenizer)  # a shallow copy would share (and leak) special-token changes
    tok.chat_template = template
    return tok


def patch_cases(tokenizer) -> list[tuple[str, object]]:
    """``(label, tokenizer copy)`` pairs whose templates TRL does or does not accept (section 4)."""
    validate.tokenizer("tokenizer", tokenizer)
    from trl.chat_template_utils import (
        gemma4_chat_template,
        llama3_chat_template,
        qwen2_5_chat_template,
        qwen2_5_training_chat_template,
    )

    templates = {
        "Qwen2.5-Instruct template": qwen2_5_chat_template,
        "Qwen2.5 base template": base_variant(qwen2_5_chat_template),
        "Instruct template + trailing newline": qwen2_5_chat_template + "\n",
        "Llama-3 template": llama3_chat_template,
        "base template with our generation markers":
            add_generation_markers(base_variant(qwen2_5_chat_template)),
        "TRL's Qwen2.5 training template": qwen2_5_training_chat_template,
        "Qwen2 template": QWEN2_CHAT_TEMPLATE,
        "Gemma-4 template": gemma4_chat_template,
        "Instruct template, CRLF line endings": qwen2_5_chat_template.replace("\n", "\r\n"),
    }
    return [(label, with_template(tokenizer, t)) for label, t in templates.items()]


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
    from trl.chat_template_utils import qwen2_5_chat_template

    return rng.choice([base_variant(qwen2_5_chat_template), qwen2_5_chat_template + "\n",
                       qwen2_5_chat_template.replace("\n", "\r\n"),
                       qwen2_5_chat_template.replace(INSTRUCT_SYSTEM, "You are a concise assistant.")])


def _markers_without_stop(template: str) -> str:
    """Markers that close before ``<|im_end|>``: the answer is graded, the stop token is not."""
    marked = add_generation_markers(template)
    return marked.replace("{{- '\\n' + message.content + '<|im_end|>\\n' }}\n        {%- endgeneration %}",
                          "{{- '\\n' + message.content }}\n        {%- endgeneration %}\n"
                          "        {{- '<|im_end|>\\n' }}")


def _markers_in_tool_branch_only(template: str) -> str:
    """Markers that exist but wrap nothing our chats render (an empty generation block)."""
    return template.replace("{{- '<|im_start|>' + message.role }}",
                            "{{- '<|im_start|>' + message.role }}{%- generation %}{%- endgeneration %}")


def _template_case(tokenizer, seed: int):
    """An assistant-only SFT set-up broken (or not) in one of ``TEMPLATE_CAUSES`` ways, and the truth."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from .data import make_messages

    rng = random.Random(seed)
    cause = TEMPLATE_CAUSES[seed % len(TEMPLATE_CAUSES)]
    conversation = make_messages(rng.choice(("add", "reverse")), 1, seed=seed)[0]
    base = base_variant(qwen2_5_chat_template)
    assistant_only = cause != "whole_sequence_graded"
    either = rng.choice([base, qwen2_5_chat_template])
    template = {"refused_exact_match": _unmarked_near_miss(rng),
                "markers_mark_nothing": _markers_in_tool_branch_only(either),
                "stop_token_not_graded": _markers_without_stop(either),
                "whole_sequence_graded": either,
                "trains_correctly": rng.choice([qwen2_5_chat_template, add_generation_markers(base)])}[cause]
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
    from . import validate

    validate.integer("seed", seed, minimum=0, why="it picks the set-up")
    return _template_case(tokenizer, seed)[0]


def check_template_diagnosis(fn, tokenizer=None):
    """Checker for exercise 2: ``fn(setup) -> Diagnosis(cause, evidence)``, ``cause`` one of
    ``TEMPLATE_CAUSES``, ``evidence`` the number of tokens of the conversation that would carry loss
    (0 when SFTTrainer refuses or the mask is empty)."""
    tokenizer = tokenizer if tokenizer is not None else _course_tokenizer()
    return check_diagnosis(
        "diagnose_template", fn, lambda seed: _template_case(tokenizer, seed), seeds=fresh_seeds(10),
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


# Every public function above checks its arguments by their conventional names (model, tokenizer,
# batch, steps, ...) before it runs: one what/why/fix message for the slips learners make most.
validate.check_module_arguments(globals())
