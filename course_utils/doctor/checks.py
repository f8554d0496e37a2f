"""The doctor's checks of templates, stop tokens and labels (lessons 02, 03, 04, 05): each takes what TRL
will build (``trl_view``) and returns a list of ``Finding``s; names match the README and lesson 08.
"""

from __future__ import annotations

import difflib

from .. import internals
from ..data import graded_positions, is_graded
from . import trl_view
from .report import Finding, share_of

# A room of the doctor, not an API: its names serve the package; users import ``course_utils.doctor``
__all__ = []

STAND_IN_SIMILARITY = 0.9  # above it, the closest shipped training template stands in for the measurement


def rows_without_answer(rows, form) -> list[int]:
    """Ids of rows with nothing for the model to say: no assistant message, or an empty completion."""
    if form == "messages":
        return [r["_doctor_row"] for r in rows if not any(m["role"] == "assistant" for m in r["messages"])]
    if form.startswith("prompt_completion"):
        return [r["_doctor_row"] for r in rows if not r["completion"]]
    if form == "tokenized":  # labels all -100, or a mask without a 1: nothing graded even before truncation
        return [r["_doctor_row"] for r in rows
                if ("labels" in r and not graded_positions(r["labels"]))
                or any(c in r and not any(r[c]) for c in ("completion_mask", "assistant_masks"))]
    return []


def assistant_turn_findings(rows, form, args) -> list[Finding]:
    """Rows that have nothing for the model to say: no assistant message, or an empty completion."""
    empty = rows_without_answer(rows, form)
    if not empty:
        return []
    share = len(empty) / len(rows)
    severity = "error" if args.assistant_only_loss or share == 1 or form != "messages" else "warning"
    why = ("TRL raises RuntimeError ('at least one example has no assistant tokens')"
           if args.assistant_only_loss and form == "messages" else
           "these rows teach the model to write the user's side" if form == "messages" else
           "every label is -100 (or the mask has no 1): SFTTrainer drops such rows only when max_length is "
           "set, and a hand-written loop's mean over a micro-batch of them is 0/0 = NaN (lesson 05)"
           if form == "tokenized" else "the completion mask is empty: the rows carry no loss")
    what = "no graded token" if form == "tokenized" else "no assistant turn to learn"
    return [Finding(severity, "no-assistant-turns",
                    f"{share_of(len(empty), len(rows))} have {what}",
                    f"row ids {empty[:5]}; {why}",
                    "drop those rows or add the assistant's answer; check the role names ('assistant', not "
                    "'gpt' or 'bot')", "04")]


def template_findings(tokenizer, args, form, rows=()) -> tuple[list[Finding], str | None, bool]:
    """Whether TRL can train ``assistant_only_loss`` with this template; the template it would use. ``rows``:
    the data, so that a training template that drops tool calls is never suggested for rows that have them."""
    if not args.assistant_only_loss or form == "tokenized":  # tokenized: the rows carry their own masks
        return [], None, True
    if form not in ("messages", "prompt_completion"):
        return [Finding("error", "assistant-only-loss",
                        "assistant_only_loss=True on a dataset that is not conversational",
                        "TRL raises ValueError: the option needs rows of role/content messages",
                        "use a 'messages' dataset, or drop assistant_only_loss (prompt/completion rows are "
                        "trained on the completion only by default)", "04")], None, False
    template = tokenizer.chat_template
    if not template:
        return [Finding("error", "template-unpatchable",
                        "assistant_only_loss=True but the tokenizer has no chat template",
                        "tokenizer.chat_template is None", "set chat_template_path to a template with "
                        "{% generation %} markers", "04")], None, False
    try:
        return [], internals.sft_chat_template(tokenizer), True
    except ValueError as exc:
        return _unpatchable_findings(template, exc, _has_tool_calls(rows))


def _has_tool_calls(rows) -> bool:
    return any(isinstance(m, dict) and m.get("tool_calls") for r in rows if isinstance(r, dict)
               for key in ("messages", "prompt", "completion") if isinstance(r.get(key), list)
               for m in r[key])


def _unpatchable_findings(template: str, exc: Exception, tools: bool = False
                          ) -> tuple[list[Finding], str | None, bool]:
    """The template-unpatchable error, with a training template of the template's own family when TRL
    ships one (and, when the two render near-identical text, that template standing in for the rest) — but
    never, for rows with tool calls, a training template that renders content only (TRL's llama3_training
    drops every call; TRL ships no Llama 3.1 training template): prompt/completion rows instead."""
    from trl import chat_template_utils as ctu

    family, ratio = trl_view.template_family(template)
    training = trl_view.training_template_name(family) if family else None
    raised = f"get_training_chat_template raised: {str(exc)[:120]}…"
    shipped = getattr(ctu, f"{training}_training_chat_template", "") if training else ""
    drops_calls = training is not None and "tool_calls" not in shipped
    if tools and drops_calls:
        return [Finding("error", "template-unpatchable",
                        "assistant_only_loss=True with a chat template TRL cannot patch, on rows with tool "
                        "calls",
                        f"{raised}; TRL's {training}_training.jinja renders message content only: it would "
                        "drop every tool call from the loss",
                        "turn each assistant turn into a prompt/completion row (the conversation before it, "
                        "with its tools, as the prompt; the turn with its tool_calls as the completion) and "
                        "drop assistant_only_loss: TRL grades the completion without {% generation %} "
                        "markers (lessons 04 and 09)", "04")], None, False
    if training is None:
        known = (f"closest shipped family: {family} ({ratio:.1%} similar), which TRL ships no training "
                 "template for" if family else "no template TRL ships is of this family")
        return [Finding("error", "template-unpatchable",
                        "assistant_only_loss=True with a chat template TRL cannot patch",
                        f"{raised}; {known}",
                        "add {% generation %}…{% endgeneration %} around the assistant's output (content and "
                        "end-of-turn token) in your template and pass it as chat_template_path (lesson 04, "
                        "templates.add_generation_markers)", "04")], None, False
    # similarity to the original the training template was made from: that is what it would render
    original = getattr(ctu, f"{training}_chat_template")
    close = difflib.SequenceMatcher(None, template, original, autojunk=False).ratio()
    renders = (f"it renders {training}'s text with {{% generation %}} markers" if close >= STAND_IN_SIMILARITY
               else f"TRL's training template of the {training} family: it renders {training}'s text, "
               f"{close:.1%} similar to yours — diff the two before training")
    findings = [Finding("error", "template-unpatchable",
                        "assistant_only_loss=True with a chat template TRL cannot patch",
                        f"{raised}; closest shipped template: {family} ({ratio:.1%} similar)",
                        f"set chat_template_path to TRL's trl/chat_templates/{training}_training.jinja "
                        f"({renders}), or add the markers to your own template (lesson 04, "
                        "templates.add_generation_markers)", "04")]
    if close < STAND_IN_SIMILARITY:
        return findings, None, False
    # Measure the rest as if the suggested fix were applied, so one run shows every problem.
    findings.append(Finding("info", "measured-with-stand-in",
                            f"the other checks used {training}_training.jinja in place of your template",
                            f"your template is {close:.1%} similar to {training}'s",
                            "re-run the doctor after fixing the template", "04"))
    return findings, getattr(ctu, f"{training}_training_chat_template"), True


def stop_token_findings(tokenizer, prepared, eot, args, chat_template) -> list[Finding]:
    """The template's end-of-turn token must carry loss, or the model never learns to stop."""
    from trl.chat_template_utils import is_chat_template_stop_token_trained

    if eot is None or prepared is None:
        return []
    n = len(prepared)
    graded = trl_view.rows_holding(prepared, "labels", eot)  # a label equal to a token id is graded
    token = tokenizer.convert_ids_to_tokens(eot)
    template_ok = (not args.assistant_only_loss
                   or is_chat_template_stop_token_trained(tokenizer, chat_template=chat_template))
    if graded == n and template_ok:
        return []
    severity = "error" if graded < n / 2 else "warning"
    return [Finding(severity, "stop-token-untrained",
                    f"the end-of-turn token {token!r} carries no loss in {share_of(n - graded, n)}",
                    f"graded in {graded} rows (labels from TRL's own preparation); "
                    f"trl is_chat_template_stop_token_trained={template_ok}",
                    f"put {token!r} inside {{% generation %}}…{{% endgeneration %}} (TRL's *_training.jinja "
                    "templates do), or train on the full sequence (assistant_only_loss=False)", "02")]


def eos_findings(tokenizer, eot, gen_eos, args, conversational=True, peft=None) -> list[Finding]:
    """Will ``generate()`` stop at the token the rows end with after this training? For chats that is
    the template's end of turn; for text rows the ``tokenizer.eos_token`` TRL appends (``eot`` then). With
    LoRA, SFTConfig's ``eos_token`` reaches the in-memory model only: the adapter ``trainer.save_model``
    writes carries no ``generation_config.json`` (lesson 10), so the advice says how to ship it."""
    if eot is None or (not conversational and not gen_eos):  # no generation_config: generate() uses eos
        return []
    stop_ids = list(gen_eos)
    fixed_in_memory = False
    if args.eos_token is not None and args.eos_token in tokenizer.get_vocab():
        stop_ids = [tokenizer.convert_tokens_to_ids(args.eos_token), *stop_ids]  # TRL prepends it
        fixed_in_memory = eot not in gen_eos
    if eot in stop_ids:
        shipped = peft and fixed_in_memory
        return [_adapter_eos_finding(tokenizer.convert_ids_to_tokens(eot))] if shipped else []
    token = tokenizer.convert_ids_to_tokens(eot)
    names = [tokenizer.convert_ids_to_tokens(i) for i in stop_ids]
    where = ("the chat template ends a turn with" if conversational else
             "TRL appends tokenizer.eos_token to every text row:")
    return [Finding("warning", "eos-mismatch",
                    f"generate() will not stop at the template's end-of-turn token {token!r}"
                    if conversational else
                    f"generate() will not stop at the eos token TRL appends to every row, {token!r}",
                    f"generation_config eos ids {stop_ids} = {names}; tokenizer.eos_token="
                    f"{tokenizer.eos_token!r}; {where} {token!r}",
                    f"set eos_token={token!r} in the SFTConfig (TRL adds it to generation_config), or pass "
                    f"eos_token_id={[*stop_ids, eot]} to generate()"
                    + (f"; with LoRA that fixes the in-memory model only: {_SHIP_EOS}" if peft else ""),
                    "10" if peft else "02")]


_SHIP_EOS = ("an adapter saved by trainer.save_model has no generation_config.json and peft reads none, so a "
             "server uses the base's eos list — merge, save with the trained generation_config (or give the "
             "server the stop list), then run python -m course_utils.ship on what you saved")


def _adapter_eos_finding(token: str) -> Finding:
    return Finding("info", "adapter-eos",
                   f"SFTConfig's eos_token={token!r} stops the in-memory LoRA model only",
                   "TRL writes it into the in-memory model's generation_config; the saved adapter does not "
                   "carry it", _SHIP_EOS, "10")


def pad_eos_findings(tokenizer, prepared, eot, args) -> list[Finding]:
    """pad == the graded stop token. Harmless with SFTTrainer's own collator (it pads labels with -100
    and keeps every stop label: info); a collator that masks labels by pad id — transformers'
    ``DataCollatorForLanguageModeling``, in a custom loop — erases them all. ``tokenizer`` is already set
    up as TRL does (``trl_tokenizer``): its pad is the one training would use."""
    from transformers import DataCollatorForLanguageModeling

    pad, pad_id = tokenizer.pad_token, tokenizer.pad_token_id
    stop_ids = {i for i in (eot, tokenizer.eos_token_id) if i is not None}
    if prepared is None or pad is None or pad_id not in stop_ids:
        return []
    rows = [{"input_ids": r} for r in prepared["input_ids"][:64]]
    # unshifted (data.is_graded): an eos label at its own position
    graded = sum(int(t == pad_id and is_graded(lab)) for r in prepared.select(range(len(rows)))
                 for t, lab in zip(r["input_ids"], r["labels"]))
    if graded == 0:
        return []
    masked = DataCollatorForLanguageModeling(tokenizer, mlm=False)(rows)["labels"]
    kept = int((masked == pad_id).sum())
    return [Finding("info", "pad-is-eos",
                    f"pad token {pad!r} is the stop token the model must learn: harmless with SFTTrainer",
                    f"{graded} graded {pad!r} labels in {len(rows)} rows; SFTTrainer's own collator pads "
                    "labels with -100 and keeps them all; transformers' DataCollatorForLanguageModeling "
                    f"keeps {kept} of them (it masks labels by pad id)",
                    "keep SFTTrainer's collator; with your own collator or loop, set pad_token to a token "
                    "that is not a stop token (e.g. a dedicated <|pad|>)", "02")]


def rows_hold(rows, token_id) -> bool:
    """Whether most pre-tokenised rows contain ``token_id`` (a chat template's end of turn: chats)."""
    return token_id is not None and sum(token_id in r["input_ids"] for r in rows) > len(rows) / 2


def label_alignment_findings(prepared) -> list[Finding]:
    """Your own ``labels`` against ``input_ids``. A transformers model shifts the labels itself (the loss
    at position i predicts token i+1 from ``labels[i+1]``), so a graded label must be the token at its own
    position. Labels shifted beforehand train every token to predict the one after next."""
    same = shifted = graded = 0
    for ids, labels in zip(prepared["input_ids"], prepared["labels"]):
        for i, label in enumerate(labels):
            if is_graded(label):
                graded += 1
                same += label == ids[i]
                shifted += i + 1 < len(ids) and label == ids[i + 1]
    if graded == 0 or same == graded:
        return []
    pre_shifted = shifted > same
    return [Finding("error", "labels-misaligned",
                    "the labels are already shifted by one" if pre_shifted else
                    f"{graded - same} of {graded} graded labels are not the token at their position",
                    f"of {graded} graded labels, {same} equal input_ids at their own position and {shifted} "
                    "the next token; the model shifts labels itself, so "
                    + ("it trains every token to predict the one after next" if pre_shifted else
                       "these positions train the model on tokens the row does not hold"),
                    "set labels[i] = input_ids[i] (or -100) — no shift; or drop 'labels' and give "
                    "completion_mask / assistant_masks, from which TRL builds them", "05")]


def double_bos_findings(tokenizer, prepared) -> list[Finding]:
    """Rows that start with the bos token twice: text the chat template already rendered (with its
    ``{{ bos_token }}``) tokenized again by a tokenizer that prepends bos itself — Llama 3, Gemma and
    DeepSeek-R1's do. The model trains on a start it never sees at inference."""
    bos = tokenizer.bos_token_id
    if prepared is None or bos is None:
        return []
    doubled = trl_view.rows_starting_twice(prepared, bos)
    if not doubled:
        return []
    return [Finding("warning", "double-bos",
                    f"{share_of(len(doubled), len(prepared))} start with {tokenizer.bos_token!r} twice",
                    f"row ids {doubled[:8]}: the rows' text already begins with {tokenizer.bos_token!r} (a "
                    "chat template's rendering) and the tokenizer prepends another one; inference renders "
                    "one",
                    "give TRL 'messages' (or prompt/completion) rows and let it apply the template, or strip "
                    "the bos from the rendered text (TRL 1.16's text path ignores dataset_kwargs="
                    "{'add_special_tokens': False}: measured in lesson 04)", "04")]


def padding_side_findings(tokenizer) -> list[Finding]:
    if tokenizer.padding_side != "right":
        return []
    return [Finding("info", "right-padding",
                    "tokenizer.padding_side='right': fine for training, wrong for batched generate()",
                    "a decoder continues from each row's last position; right padding puts pad tokens there",
                    "set tokenizer.padding_side='left' before batched generation", "03")]
