"""Lesson 04 (chat templates): why ``assistant_only_loss=True`` refuses a perfectly valid template.

TRL trains on assistant tokens only when the chat template marks them with ``{% generation %}``.
For templates without markers it swaps in a patched copy, but it recognises a template by **exact
string equality** with the copies it ships (``trl.chat_template_utils``), so a variant that differs
in one sentence (Qwen2.5 base's default system prompt) or one character is refused. This module
holds the lesson's template surgery (``base_variant``, ``template_diff``, ``add_generation_markers``,
``with_template``), the mask probe (``assistant_mask``, ``masked_tokens``), the templates TRL does and
does not accept (``patch_cases``), the "what if" control (``template_variant``, ``template_frame``,
``template_explorer``) and the "other family" tokenizer used to demonstrate ``clone_chat_template``.

The exercises' checkers and the set-ups of the diagnosis exercise are in
``course_utils.exercises.lesson04``; the reference answers in ``course_utils.exercises.answers.lesson04``.
"""

from __future__ import annotations

import copy
import difflib
import tempfile

from . import validate
from .viz import figure, what_if

# TRL (trl.chat_template_utils) is imported inside the functions that need it, not here: importing it
# takes seconds (measured ~16 s on the course VM, after torch and transformers), while the template
# surgery and the mask probe need only strings and a tokenizer.

# Qwen2.5-Instruct's default system prompt, and the one the Qwen2.5 base checkpoints ship instead.
INSTRUCT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
BASE_SYSTEM = "You are a helpful assistant."

# Qwen2-Instruct's template (one line, no tools): exercise 1's family. Every role is rendered by one
# expression, QWEN2_ROLE_EXPRESSION, so there is no assistant branch to put {% generation %} in.
QWEN2_ROLE_EXPRESSION = ("{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
                         " + '\\n'}}")
QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    + QWEN2_ROLE_EXPRESSION +
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Phi-3's turn tokens: the "other model family" whose template we clone in Fix B.
PHI3_SPECIAL_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

_MARKER_ANCHOR = '    {%- if (message.role == "user")'


def _check_template(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a chat template string, got {type(value).__name__} — templates are "
                        "Jinja source — pass e.g. tokenizer.chat_template.")
    if not value.strip():
        raise ValueError(f"{name} is an empty template — it would render every chat as nothing — pass a "
                         "template's source, e.g. tokenizer.chat_template.")
    return value


def _check_jinja(name: str, template: str) -> str:
    """A template Jinja can compile (``{% generation %}`` blocks included): transformers would raise its
    ``TemplateSyntaxError`` only when the template first renders a chat, far from the edit that broke it."""
    import jinja2
    from jinja2.ext import Extension

    class Generation(Extension):  # transformers' {% generation %} block (its AssistantTracker), parsed only
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols", Generation]).parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"{name} does not compile as Jinja ({exc.message}, line {exc.lineno}) — "
                         "transformers compiles it when it renders a chat and would raise there — fix that "
                         "line (a chat template's tags are {% if %}…{% endif %}, {% for %}…{% endfor %}, "
                         "{% generation %}…{% endgeneration %}).") from None
    return template


def _check_chat(tokenizer, messages) -> None:
    """A tokenizer and one conversation to render with it."""
    validate.tokenizer("tokenizer", tokenizer)
    validate.messages("messages", messages)
    if not all(isinstance(m.get("role"), str) for m in messages):
        raise ValueError("a message has no 'role' — the template decides by role what is graded — pass "
                         "{'role': ..., 'content': ...} dicts, e.g. make_messages('add', 1)[0].")


def _check_render_template(tokenizer, chat_template) -> None:
    """A template to render with: the one given, else the tokenizer's own."""
    if chat_template is not None:
        _check_jinja("chat_template", _check_template("chat_template", chat_template))
    elif not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat_template and none was passed — a chat is rendered with "
                         "one — pass chat_template=... or use with_template(tokenizer, template).")


def base_variant(template: str) -> str:
    """The Qwen2.5 *base* template made from the Instruct one: only the default system prompt differs."""
    _check_template("template", template)
    if INSTRUCT_SYSTEM not in template:
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
    for name, value in (("name_a", name_a), ("name_b", name_b)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {type(value).__name__} — it labels one side of "
                            "the diff — pass e.g. 'Qwen2.5-Instruct'.")
    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), name_a, name_b, n=0, lineterm=""))


def add_generation_markers(template: str) -> str:
    """A Qwen2.5-style template whose plain assistant turns are wrapped in ``{% generation %}``.

    The span is ``\\n + content + <|im_end|> + \\n``, as in TRL's own ``qwen2_5_training.jinja`` (and
    ``data.tokenize_chat``): the ``<|im_start|>assistant`` header stays outside, the end-of-turn token
    is inside, so the model learns to stop. The rendered *text* is unchanged. Assistant turns with
    ``tool_calls`` keep the original branch (unmarked): wrap them the same way if your data has them.
    """
    _check_template("template", template)
    if template.count(_MARKER_ANCHOR) != 1:
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


def with_template(tokenizer, template: str):
    """A copy of ``tokenizer`` carrying ``template`` (the original and its special tokens are untouched)."""
    validate.tokenizer("tokenizer", tokenizer)
    _check_jinja("template", _check_template("template", template))
    return _with_template(tokenizer, template)


def _with_template(tokenizer, template: str):
    tok = copy.deepcopy(tokenizer)  # a shallow copy would share (and leak) special-token changes
    tok.chat_template = template
    return tok


# ---------------------------------------------------------------------------------------------
# Probes: the assistant mask transformers computes, and what it logs
# ---------------------------------------------------------------------------------------------

def assistant_mask(tokenizer, messages: list[dict], chat_template: str | None = None) -> dict:
    """``input_ids`` and ``assistant_masks`` as transformers computes them from ``{% generation %}``.

    Exactly the call TRL's SFTTrainer makes for ``assistant_only_loss=True``; 1 = the token carries loss.
    """
    _check_chat(tokenizer, messages)
    _check_render_template(tokenizer, chat_template)
    out = tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
    return {"input_ids": list(out["input_ids"]), "assistant_masks": list(out["assistant_masks"])}


def masked_tokens(tokenizer, input_ids, mask) -> list[str]:
    """The tokens (as text) that carry loss, in order: what a learner reads to check a mask.

    ``mask`` is 0/1, one value per token of ``input_ids`` (an assistant mask). For labels pass
    ``[int(is_graded(label)) for label in labels]`` (``data.is_graded``, the course's one rule): unshifted on
    purpose, since it marks the tokens shown, not the loss targets (``data.graded``, which drops column 0).
    """
    validate.tokenizer("tokenizer", tokenizer)
    input_ids = validate.token_ids("input_ids", input_ids)
    mask = validate.token_ids("mask", mask, labels=True)  # a row of ints; its 0/1 values are checked below
    if len(input_ids) != len(mask):
        raise ValueError("masked_tokens needs input_ids and a mask of the same length — one mask value per "
                         "token — pass out['input_ids'] and out['assistant_masks'] of assistant_mask().")
    if any(m not in (0, 1) for m in mask):
        raise ValueError("mask holds values other than 0 and 1 (labels?) — a -100 would count as 'trained' — "
                         "pass [int(is_graded(label)) for label in labels] instead (from course_utils import "
                         "is_graded: the course's rule for a label that carries loss).")
    outside = [i for i in input_ids if not 0 <= i < len(tokenizer)]
    if outside:
        raise ValueError(f"input_ids holds token id {outside[0]} but the tokenizer has {len(tokenizer)} "
                         "tokens — the ids were made by another tokenizer — pass the tokenizer that made "
                         "them.")
    return [tokenizer.convert_tokens_to_string([t])
            for t, m in zip(tokenizer.convert_ids_to_tokens(list(input_ids)), mask, strict=True) if m]


# ---------------------------------------------------------------------------------------------
# Section 4: the templates TRL accepts for assistant_only_loss, and those it refuses
# ---------------------------------------------------------------------------------------------

def patch_cases(tokenizer) -> list[tuple[str, object]]:
    """``(label, tokenizer copy)`` pairs whose templates TRL does or does not accept (section 4)."""
    from trl.chat_template_utils import (  # TRL: imported here, see the top of the module
        gemma4_chat_template,
        llama3_chat_template,
        qwen2_5_chat_template,
        qwen2_5_training_chat_template,
    )

    validate.tokenizer("tokenizer", tokenizer)
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
    return [(label, _with_template(tokenizer, t)) for label, t in templates.items()]


def trl_accepts(tokenizer) -> bool:
    """Whether ``SFTTrainer(assistant_only_loss=True)`` takes ``tokenizer``'s template: it has
    ``{% generation %}`` markers, or it is, character for character, a template TRL can patch
    (``get_training_chat_template``)."""
    validate.tokenizer("tokenizer", tokenizer)
    return _sft_template(tokenizer) is not None


def patch_acceptance(tokenizer) -> list[tuple[str, int, bool]]:
    """``(label, characters that differ from TRL's Qwen2.5 template, accepted)`` for each of ``patch_cases``:
    the distance is the characters inserted, deleted or replaced to turn TRL's copy into the template."""
    from trl.chat_template_utils import qwen2_5_chat_template  # TRL: see the top of the module

    rows = []
    for label, tok in patch_cases(tokenizer):
        ops = difflib.SequenceMatcher(None, qwen2_5_chat_template, tok.chat_template,
                                      autojunk=False).get_opcodes()
        distance = sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in ops if op != "equal")
        rows.append((label, distance, _sft_template(tok) is not None))
    return rows


def plot_patch_acceptance(rows: list[tuple[str, int, bool]]):
    """Lesson 04's picture: each template's distance from TRL's Qwen2.5 copy (log scale), green if TRL takes
    it for ``assistant_only_loss``, red if it refuses."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, tuple) and len(r) == 3 for r in rows):
        raise ValueError(f"rows={rows!r:.80} is not patch_acceptance()'s list of (label, distance, "
                         "accepted) — the plot draws one bar per template — pass patch_acceptance(tok).")
    fig, ax = figure(8, 3.6)
    labels, distance, accepted = zip(*rows)
    ax.barh(labels, [d + 0.5 for d in distance], color=["#2a9d8f" if a else "#e76f51" for a in accepted])
    ax.axvline(0.5, color="k", ls="--", lw=1, label="0 characters (exact copy)")
    ax.set_xscale("log")
    ax.set_xlabel("characters that differ from TRL's Qwen2.5 template (+0.5, log scale)")
    ax.set_title("TRL accepts (green) or refuses (red) a template for assistant_only_loss")
    ax.legend(fontsize=8, loc="lower right")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


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


def template_variant(edit: str, markers: str = "none") -> str:
    """TRL's Qwen2.5 template with one of ``TEMPLATE_EDITS`` and one of ``MARKER_STYLES`` of markers."""
    validate.choice("edit", edit, tuple(TEMPLATE_EDITS), why="each is a one-line change the lesson measures")
    validate.choice("markers", markers, MARKER_STYLES, why="each is a way of marking the assistant's tokens")
    from trl.chat_template_utils import qwen2_5_chat_template  # TRL: see the top of the module

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
    TRL's patched copy found by exact match (``internals.sft_chat_template``); ``None``: it refuses."""
    from .internals import sft_chat_template

    try:
        return sft_chat_template(tokenizer) or tokenizer.chat_template
    except ValueError:
        return None


def template_frame(tokenizer, messages: list[dict], *, edit: str = "none", markers: str = "none") -> str:
    """What ``SFTTrainer(assistant_only_loss=True)`` does with ``template_variant(edit, markers)``, as text.

    Whether the template is the exact string TRL ships and renders the same chat; whether TRL accepts it
    (markers: used as they are; none: the exact-match lookup); which tokens of ``messages`` carry loss;
    and what TRL says: its ValueError, its RuntimeError on an empty mask, or its stop-token warning.
    """
    _check_chat(tokenizer, messages)  # the frame renders with its own templates
    validate.choice("edit", edit, tuple(TEMPLATE_EDITS), why="each is a one-line change the lesson measures")
    validate.choice("markers", markers, MARKER_STYLES, why="each is a way of marking the assistant's tokens")
    from trl.chat_template_utils import (  # TRL: see the top of the module
        is_chat_template_stop_token_trained,
        qwen2_5_chat_template,
    )

    template = template_variant(edit, markers)
    tok = _with_template(tokenizer, template)
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
    _check_chat(tokenizer, messages)  # the frames render with their own templates
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
    from trl.chat_template_utils import phi3_chat_template  # TRL: see the top of the module

    validate.tokenizer("tokenizer", tokenizer)
    if directory is not None:  # never over another model's files: a tokenizer saved there replaces them
        validate.new_directory("directory", directory, what="the tokenizer's files")
    source = copy.deepcopy(tokenizer)
    source.add_special_tokens({"additional_special_tokens": list(PHI3_SPECIAL_TOKENS)})
    source.chat_template = phi3_chat_template
    directory = directory or tempfile.mkdtemp(prefix="other-family-tok-")
    source.save_pretrained(directory)
    return directory


# ---------------------------------------------------------------------------------------------
# Double BOS on TRL's text path (issue 45): a tokenizer that adds BOS, text that already starts with it
# ---------------------------------------------------------------------------------------------

def bos_adding_variant(tokenizer, bos_token: str = "<|begin_of_text|>"):
    """A copy of ``tokenizer`` that puts ``bos_token`` in front of every encoding, as Llama 3's and Gemma's
    tokenizers do (the course tokenizer adds none, like Qwen's): the stand-in for measuring what TRL's text
    path does with text that already starts with the BOS."""
    validate.tokenizer("tokenizer", tokenizer)
    if not isinstance(bos_token, str) or not bos_token.strip():
        raise ValueError(f"bos_token={bos_token!r} must be a non-blank string — it becomes the tokenizer's "
                         "BOS, a token of its own (a blank one is no token the tokenizer can add) — pass "
                         "e.g. '<|begin_of_text|>'.")
    tok = copy.deepcopy(tokenizer)  # a shallow copy would share the special-token map with the original
    tok.add_special_tokens({"bos_token": bos_token})
    tok.add_bos_token = True  # transformers 5 rebuilds the post-processor: every encoding starts with it
    return tok


def leading_bos(input_ids, bos_token_id: int) -> int:
    """How many BOS tokens ``input_ids`` starts with: 1 is right for a BOS-adding model, 2 a double BOS."""
    input_ids = validate.token_ids("input_ids", input_ids)
    validate.vocab_id("bos_token_id", bos_token_id, why="it is the id the rows would start with",
                      fix="pass tokenizer.bos_token_id")
    count = 0
    while count < len(input_ids) and input_ids[count] == bos_token_id:
        count += 1
    return count


def double_bos_rows(rows, bos_token_id: int) -> list[int]:
    """Indices of the prepared rows (``input_ids`` lists, or dicts holding them) that start with two or more
    BOS tokens: a model trained on them learns a start it never sees at inference."""
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError(f"rows must be a non-empty list of token-id rows, got {type(rows).__name__} — the "
                         "check reads each row's first tokens — pass [r['input_ids'] for r in "
                         "trainer.train_dataset].")
    validate.vocab_id("bos_token_id", bos_token_id, why="it is the id the rows would start with",
                      fix="pass tokenizer.bos_token_id")
    ids = [r.get("input_ids") if isinstance(r, dict) else r for r in rows]
    return [i for i, row in enumerate(ids) if leading_bos(row, bos_token_id) >= 2]


def trl_text_rows(tokenizer, texts: list[str], dataset_kwargs: dict | None = None) -> list[list[int]]:
    """The ``input_ids`` TRL 1.16's ``SFTTrainer`` trains for a text (non-conversational) dataset of
    ``texts`` with ``SFTConfig(dataset_kwargs=...)`` — its own data preparation, without a model."""
    import trl
    from datasets import Dataset

    from . import internals
    from .quiet import quiet_libraries

    validate.tokenizer("tokenizer", tokenizer)
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise ValueError("texts must be a non-empty list of non-empty strings — each becomes one row of a "
                         "'text' dataset — pass e.g. [tokenizer.bos_token + 'some text'].")
    args = trl.SFTConfig(output_dir=tempfile.mkdtemp(prefix="trl-text-"), report_to="none", use_cpu=True,
                         bf16=False, activation_checkpointing=False, dataset_kwargs=dataset_kwargs,
                         max_length=None)
    # TRL's map() bars are not the lesson; the block puts the caller's bar setting back (it once stayed off)
    with quiet_libraries(logs=False):
        rows = internals.prepare_sft_dataset(Dataset.from_dict({"text": list(texts)}), tokenizer, args)
    return [list(r["input_ids"]) for r in rows]
