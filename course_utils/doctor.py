"""The SFT doctor: check a fine-tuning set-up for this course's failures *before* it trains.

Lesson 08 (capstone) and anyone's own set-up::

    python -m course_utils.doctor --model PATH_OR_ID --data FILE.jsonl [--config SFT_CONFIG.json]
                                  [--max-length N] [--json]

or, from Python, ``report = diagnose(model, data, config)``: a list of ``Finding``s (severity, what,
evidence, fix, lesson) that prints as a table in a terminal and renders as one in a notebook.

Every check measures the set-up with the installed libraries' own code, so it sees what training
would see: the rows are tokenized and labelled by TRL's ``SFTTrainer._prepare_dataset`` (the same
template patching, ``return_assistant_tokens_mask``, truncation and "Dropping fully masked
examples" filter), templates are judged by ``trl.chat_template_utils``, activations by one forward
of the real model on real rows. Nothing is trained; it takes seconds.

Exit status of the command (``Report.exit_code``):

- 0: no error found (warnings and info may remain);
- 1: an error-level finding exists (so it can gate CI);
- 2: bad input — a missing file, a malformed JSONL line, rows of mixed forms, an unknown model id
offline, a config that is not a JSON object, a config key that is not an SFTConfig field, a config
value SFTConfig would take but training cannot (``max_length`` or a batch size below 1, a learning
rate <= 0, ``"yes"`` for a flag), a ``--max-length`` below 1 — always with a what/why/fix message and
never a traceback. ``diagnose`` raises ``DoctorInputError`` for the same input: the doctor never
reports on a set-up it had to guess at;
- 3: no error found, but a check could not run on this set-up: a "could-not-check" finding names the
  check and why (an exception the check was not written for). The other checks still ran; exit 0 would
  claim a clean bill of health the doctor did not measure.

Each check mirrors what TRL 1.16's ``SFTTrainer`` does with the set-up: the tokenizer gets the eos and
pad TRL would give it (``eos_token`` from the config; ``pad_token`` from the config, the tokenizer, or
its eos), prompt/completion text rows get ``tokenizer.eos_token`` appended, packing ``wrapped`` and
``bfd_split`` keep every token (``bfd`` and unpacked rows are truncated), and a training template is
only suggested from the template's own family.

The doctor's own checks are the private ``_*_findings`` functions (``check_*`` names are kept for
the exercises' graders).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import html
import json
import math
import re
import sys
import tempfile
import types
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import internals, validate
from .data import end_of_turn_id
from .model import _not_available_offline, _offline, _resolve_source
from .quiet import no_progress_bars

# transformers, trl and datasets are imported where they are used: `from trl import SFTConfig, SFTTrainer`
# costs ~10 s on a 2-core CPU (measured), and bad input, --help and `import course_utils.doctor` answer
# without it (~1.5 s: torch, through data)

SEVERITIES = ("error", "could-not-check", "warning", "info")
EXIT_CODES = {"clean": 0, "error": 1, "bad-input": 2, "could-not-check": 3}
LESSONS = {
    "01": "01 · Accumulation & clipping", "02": "02 · The model never stops",
    "03": "03 · Padding & packing", "04": "04 · Chat templates",
    "05": "05 · Truncation & the NaN micro-batch", "06": "06 · NaN detective (QLoRA)",
    "07": "07 · Token-weighted accumulation",
}
FP16_MAX = 65504.0  # torch.finfo(torch.float16).max
FP16_HEADROOM = 16.0  # activations within 16x of fp16's max leave no room for training to grow them
# Learning rates commonly used for SFT (HF/TRL docs and model cards): full fine-tuning 1e-6..1e-4,
# LoRA 1e-5..1e-3. "Far outside" is 10x beyond either end.
LR_RANGES = {"full": (1e-6, 1e-4), "lora": (1e-5, 1e-3)}
LR_FAR = 10.0
PEFT_KEYS = ("use_peft", "lora_r", "peft_config", "lora_alpha")  # TRL ModelConfig fields a config may carry
STAND_IN_SIMILARITY = 0.9  # above it, the closest shipped training template stands in for the measurement
# A template is of a shipped family when it uses the same turn markers (Jaccard >= 0.5) and is this similar
# (difflib ratio, not quick_ratio: quick_ratio only compares character counts and put Llama next to Qwen3)
FAMILY_SIMILARITY = 0.6
ERROR_SHARE = 0.01  # fully truncated rows: an error from 1 % of the data, a warning below


class DoctorInputError(ValueError):
    """Bad input to the doctor (exit status 2): the message says what, why and how to fix it."""


@dataclass
class Finding:
    """One result of a check: ``severity`` is "error", "could-not-check" (the check failed to run: the
    finding says why), "warning" or "info"."""

    severity: str
    check: str
    what: str
    evidence: str
    fix: str
    lesson: str = ""

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity={self.severity!r} is not one of {SEVERITIES} — the report sorts "
                             "and gates on these — use one of them.")


class Report(list):
    """The doctor's findings, most severe first; prints as a table, renders as HTML in a notebook."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self if f.severity == "error"]

    @property
    def exit_code(self) -> int:
        """1 if an error was found, else 3 if a check could not run, else 0 (2 is bad input: no report)."""
        if self.errors:
            return EXIT_CODES["error"]
        if any(f.severity == "could-not-check" for f in self):
            return EXIT_CODES["could-not-check"]
        return EXIT_CODES["clean"]

    def checks(self, severity: str | None = None) -> set[str]:
        """The names of the checks that reported (at ``severity`` if given)."""
        if severity is not None:
            validate.choice("severity", severity, SEVERITIES, why="a finding has one of these severities")
        return {f.check for f in self if severity is None or f.severity == severity}

    def to_json(self) -> str:
        counts = {s: sum(f.severity == s for f in self) for s in SEVERITIES}
        return json.dumps({"findings": [asdict(f) for f in self], "counts": counts,
                           "exit_code": self.exit_code}, indent=2)

    def __str__(self) -> str:
        if not self:
            return "SFT doctor: no findings."
        unchecked = sum(f.severity == "could-not-check" for f in self)
        lines = [f"SFT doctor: {len(self.errors)} error(s), "
                 + (f"{unchecked} check(s) could not run, " if unchecked else "")
                 + f"{sum(f.severity == 'warning' for f in self)} warning(s), "
                 f"{sum(f.severity == 'info' for f in self)} info", ""]
        width = max(len(f.check) for f in self)
        for f in self:
            label = "UNCHECKED" if f.severity == "could-not-check" else f.severity.upper()
            lines.append(f"{label:<{8 + bool(unchecked) * 2}}{f.check:<{width + 2}}{f.what}")
            pad = " " * (8 + bool(unchecked) * 2 + width + 2)
            lines.append(f"{pad}evidence: {f.evidence}")
            lines.append(f"{pad}fix:      {f.fix}")
            if f.lesson:
                lines.append(f"{pad}lesson:   {LESSONS.get(f.lesson, f.lesson)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = {"error": "#c62828", "could-not-check": "#6a1b9a", "warning": "#ef6c00", "info": "#1565c0"}
        rows = "".join(
            f"<tr><td style='color:{colour[f.severity]};font-weight:bold'>{f.severity}</td>"
            f"<td><code>{html.escape(f.check)}</code></td><td>{html.escape(f.what)}</td>"
            f"<td>{html.escape(f.evidence)}</td><td>{html.escape(f.fix)}</td>"
            f"<td>{html.escape(LESSONS.get(f.lesson, f.lesson))}</td></tr>" for f in self)
        head = "".join(f"<th style='text-align:left'>{h}</th>"
                       for h in ("severity", "check", "what", "evidence", "fix", "lesson"))
        return f"<table><tr>{head}</tr>{rows or '<tr><td colspan=6>no findings</td></tr>'}</table>"


# ---------------------------------------------------------------------------------------------
# Reading the inputs (bad input -> DoctorInputError, exit 2)
# ---------------------------------------------------------------------------------------------

def read_jsonl(path) -> list[dict]:
    """The rows of a JSONL file; a malformed line raises ``DoctorInputError`` naming its number."""
    path = _existing_file("data file", path, "the doctor reads the rows you would train on",
                          "pass the path of a .jsonl file, one JSON object per line")
    rows, numbers = [], []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DoctorInputError(
                    f"{path}: line {number} is not valid JSON ({exc.msg} at column {exc.colno}) — each line "
                    "must be one JSON object — fix or remove that line.") from None
            rows.append(row)
            numbers.append(number)
    if not rows:
        raise DoctorInputError(f"{path} has no rows — there is nothing to check or train on — pass a "
                               "non-empty JSONL file.")
    _check_rows(rows, lambda i: f"{path}: line {numbers[i]}")
    return rows


def _existing_file(what: str, path, why: str, fix: str) -> Path:
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise DoctorInputError(f"the {what} must be a path, got {path!r} — {why} — {fix}.")
    path = Path(path)
    if path.is_dir():
        raise DoctorInputError(f"{what} {str(path)!r} is a directory, not a file — {why} — {fix}.")
    if not path.is_file():
        raise DoctorInputError(f"{what} {str(path)!r} does not exist — {why} — {fix}.")
    return path


def _check_rows(rows: list, where) -> None:
    """Every row in one of TRL's forms, and all rows in the same one (TRL reads one form per dataset)."""
    first = None
    for i, row in enumerate(rows):
        _check_row(row, where(i))
        form = _form([row])
        if first is None:
            first = form
        elif form != first:
            raise DoctorInputError(f"{where(i)} is a {form!r} row but {where(0)} is a {first!r} row — TRL "
                                   "tokenizes a dataset in one form, and the doctor would measure the other "
                                   "rows as the first one — convert the rows to one form.")


def _check_row(row, where: str) -> None:
    if not isinstance(row, dict):
        raise DoctorInputError(f"{where} is a JSON {type(row).__name__}, not an object — TRL's dataset "
                               "formats are objects — write {\"messages\": [...]} or "
                               "{\"prompt\": ..., \"completion\": ...}.")
    if "messages" in row:
        ok = isinstance(row["messages"], list) and all(
            isinstance(m, dict) and "role" in m and "content" in m for m in row["messages"])
        if not ok:
            raise DoctorInputError(f"{where}: 'messages' must be a list of {{'role', 'content'}} objects — "
                                   "the chat template renders such a list — fix that row.")
    elif not ("prompt" in row and "completion" in row) and "text" not in row:
        raise DoctorInputError(f"{where} has keys {sorted(row)} — TRL reads 'messages', "
                               "'prompt'+'completion' or 'text' — rename the columns to one of these forms.")


def read_config(config=None) -> dict:
    """A dict of SFTConfig fields from a dict, a JSON file path, or ``None`` (all defaults)."""
    if config is None:
        return {}
    if isinstance(config, (str, Path)):
        path = _existing_file("config file", config, "it holds your SFTConfig fields",
                              "pass the path of a JSON file, or leave --config out for TRL's defaults")
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DoctorInputError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}) — the config is "
                                   "one JSON object of SFTConfig fields — fix the file.") from None
    if not isinstance(config, dict):
        raise DoctorInputError(f"the config is a {type(config).__name__}, not a JSON object — it maps "
                               "SFTConfig field names to values — write e.g. "
                               "{\"max_length\": 512, \"learning_rate\": 2e-5}.")
    return dict(config)


def _check_config(config: dict) -> None:
    """Every key a field TRL knows, every SFTConfig value of its field's type (and choices), and the
    lengths, batch sizes and learning rate the doctor measures with in range. SFTConfig itself takes
    ``max_length=-5`` or ``packing="yes"`` without a word; training would not."""
    from trl import ModelConfig, ScriptArguments, SFTConfig

    fields = SFTConfig.__dataclass_fields__
    # `trl sft --config` reads one file for the script, the model and the SFTConfig: their keys are known
    known = {*fields, *ModelConfig.__dataclass_fields__, *ScriptArguments.__dataclass_fields__, *PEFT_KEYS}
    for key in config:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(fields), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DoctorInputError(f"config key {key!r} is not an SFTConfig field{hint} — "
                                   "SFTConfig(**config) raises TypeError on it, and the doctor would measure "
                                   "with the default instead — fix the spelling against SFTConfig's fields, "
                                   "or drop the key.")
    for key, value in config.items():
        if key in fields:
            _check_config_value(key, value, fields[key])


_TYPES = {"<class 'bool'>": (bool,), "<class 'int'>": (int,), "<class 'float'>": (int, float),
          "<class 'str'>": (str,), "bool | None": (bool, type(None)), "int | None": (int, type(None)),
          "float | None": (int, float, type(None)), "str | None": (str, type(None))}
_AT_LEAST_1 = ("max_length", "per_device_train_batch_size", "gradient_accumulation_steps")


def _check_config_value(key: str, value, field) -> None:
    kinds = _TYPES.get(str(field.type))
    is_bool = isinstance(value, bool)
    if kinds is not None and (not isinstance(value, kinds) or (is_bool and bool not in kinds)):
        names = " or ".join("null" if k is type(None) else "true/false" if k is bool else k.__name__
                            for k in kinds)
        raise DoctorInputError(f"config {key}={value!r} has type {type(value).__name__}, but SFTConfig's "
                               f"{key} is {names} — SFTConfig stores it unchecked and training reads it as "
                               f"that type — write it as {names} in the JSON.")
    choices = field.metadata.get("choices")
    if choices and value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DoctorInputError(f"config {key}={value!r} is not one of {choices}{hint} — TRL knows only these "
                               f"— pass one of them.")
    if key in _AT_LEAST_1 and value is not None and value < 1:
        raise DoctorInputError(f"config {key}={value!r} is below 1 — it is a count of tokens or rows, and "
                               f"nothing trains with {value!r} — pass a positive number (or leave it out for "
                               "TRL's default).")
    if key == "learning_rate" and not (math.isfinite(value) and value > 0):
        raise DoctorInputError(f"config learning_rate={value!r} is not a positive number — a rate <= 0 "
                               "trains nothing or backwards — pass e.g. 2e-5.")


def _check_max_length(max_length) -> int | None:
    if max_length is None:
        return None
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise DoctorInputError(f"max_length={max_length!r} must be a whole number of tokens >= 1 — it is the "
                               "length TRL truncates every row to, and no row fits in it — pass e.g. "
                               "--max-length 512 (max_length=512), or leave it out for the config's.")
    return max_length


def _load_tokenizer(model):
    from transformers import AutoTokenizer

    try:
        source = _resolve_source(model)
    except (ValueError, FileNotFoundError) as exc:
        raise DoctorInputError(str(exc)) from None
    try:
        return source, AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        if isinstance(source, str) and _offline():
            raise DoctorInputError(str(_not_available_offline(source))) from None
        raise DoctorInputError(f"could not load a tokenizer from {str(source)!r} ({type(exc).__name__}: "
                               f"{str(exc)[:200]}) — the doctor needs the tokenizer you train with — pass a "
                               "directory saved with save_pretrained() or a hub id.") from None


def _load_model(source):
    """The model's weights (for the one forward pass of the precision check), or None if absent."""
    from transformers import AutoModelForCausalLM

    try:
        with no_progress_bars():  # a report, not a log: no loading bar in it
            return AutoModelForCausalLM.from_pretrained(source, device_map="cpu")
    except Exception:  # noqa: BLE001 — no weights, or weights it cannot load: the fp16 check says unmeasured
        return None


def _generation_eos_ids(source, model_obj) -> list[int]:
    from transformers import GenerationConfig

    if model_obj is not None:  # a loaded model: its generation_config is what generate() will use
        eos = model_obj.generation_config.eos_token_id
    else:
        try:
            eos = GenerationConfig.from_pretrained(source).eos_token_id
        except (OSError, ValueError):
            eos = None
    return [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def _build_args(config: dict, max_length=None):
    """``(SFTConfig, user's precision flags)`` for a checked config dict (``_check_config``).

    The SFTConfig is built for CPU with precision off (``bf16`` on a CPU-only machine raises): the
    doctor only reads its fields; the user's ``bf16``/``fp16`` are returned separately.
    """
    from trl import SFTConfig

    fields = set(SFTConfig.__dataclass_fields__)
    known = {k: v for k, v in config.items() if k in fields}
    if max_length is not None:
        known["max_length"] = max_length
    precision = {"fp16": bool(known.pop("fp16", False)), "bf16": known.pop("bf16", None)}
    for key in ("output_dir", "report_to", "use_cpu", "push_to_hub"):
        known.pop(key, None)
    if "gradient_checkpointing" not in known:  # the doctor never trains; avoid the deprecation warning
        known.setdefault("activation_checkpointing", False)
    try:
        args = SFTConfig(output_dir=tempfile.gettempdir(), report_to="none", use_cpu=True, bf16=False,
                         fp16=False, **known)
    except (TypeError, ValueError) as exc:
        raise DoctorInputError(f"SFTConfig rejects this config: {str(exc)[:300]} — TRL would fail the same "
                               "way before training — fix the field it names.") from None
    return args, precision


# ---------------------------------------------------------------------------------------------
# TRL's own dataset preparation, called with a stand-in for the trainer
# ---------------------------------------------------------------------------------------------

def _prepare(tokenizer, dataset, args, chat_template, completion_only_loss, **overrides):
    """The rows TRL's ``SFTTrainer`` would train (tokenize, label, truncate, drop, pack), without a model
    (``internals.prepare_sft_dataset``); ``overrides`` replace SFTConfig fields (e.g. ``max_length``)."""
    args = _replace(args, shuffle_dataset=False, dataset_num_proc=None, **overrides)
    return internals.prepare_sft_dataset(dataset, tokenizer, args, chat_template=chat_template,
                                         completion_only_loss=completion_only_loss)


def _replace(args, **changes):
    clone = types.SimpleNamespace(**{k: getattr(args, k) for k in args.__dataclass_fields__})
    for key, value in changes.items():
        setattr(clone, key, value)
    return clone


def _apply_chat_template_path(tokenizer, args):
    """The tokenizer training would use: SFTTrainer reads a ``.jinja`` ``chat_template_path`` into it.

    Other values make TRL clone a template from another checkpoint (``clone_chat_template``), which
    needs the model; the doctor then checks the tokenizer as it is and says so.
    """
    path = args.chat_template_path
    if path is None:
        return tokenizer, []
    if not (Path(path).is_file() and str(path).endswith((".jinja", ".j2"))):
        return tokenizer, [Finding("info", "chat-template-path", f"chat_template_path={path!r} not applied",
                                   "not a local .jinja file: TRL would clone it with clone_chat_template",
                                   "run the doctor on the cloned tokenizer (save it first)", "04")]
    tokenizer = copy.deepcopy(tokenizer)  # a copy: the caller's tokenizer keeps its template and tokens
    tokenizer.chat_template = Path(path).read_text(encoding="utf-8")
    return tokenizer, []


def _trl_tokenizer(tokenizer, args):
    """The tokenizer as ``SFTTrainer.__init__`` leaves it before preparing the rows (TRL 1.16,
    sft_trainer.py): ``eos_token`` from the config replaces the tokenizer's; the pad is the config's
    ``pad_token``, else the tokenizer's, else its eos. A copy: the caller's tokenizer is untouched (a
    shallow copy would share its special-token map). A token not in the vocabulary is an error finding:
    TRL raises ValueError there."""
    eos = args.eos_token
    pad = args.pad_token or tokenizer.pad_token or (eos if eos is not None else tokenizer.eos_token)
    vocab = tokenizer.get_vocab()
    findings = [Finding("error", "special-token-unknown",
                        f"{field}={token!r} is not in the tokenizer's vocabulary",
                        f"SFTTrainer raises ValueError: the specified `{field}` ('{token}') is not found",
                        f"pick a token of the tokenizer for {field}, or add it "
                        "(tokenizer.add_special_tokens) and resize the model's embeddings", "02")
                for field, token in (("eos_token", eos), ("pad_token", pad)) if token is not None
                and token not in vocab]
    if findings or (eos in (None, tokenizer.eos_token) and pad == tokenizer.pad_token):
        return tokenizer, findings
    tokenizer = copy.deepcopy(tokenizer)
    if eos is not None:
        tokenizer.eos_token = eos
    if pad is not None:
        tokenizer.pad_token = pad
    return tokenizer, findings


def _form(rows) -> str:
    first = rows[0]
    if "messages" in first:
        return "messages"
    if "prompt" in first:
        return "prompt_completion" if isinstance(first["prompt"], list) else "prompt_completion_text"
    return "text"


def _end_of_turn_or_none(tokenizer) -> int | None:
    """``data.end_of_turn_id``, or ``None`` when the tokenizer has no template or its turns end with
    plain text (then there is no stop id to check)."""
    try:
        return end_of_turn_id(tokenizer)
    except Exception:  # no template, or one that rejects the probe or ends turns with text
        return None


# ---------------------------------------------------------------------------------------------
# The checks. Each returns a list of Findings; names match the README and lesson 08.
# ---------------------------------------------------------------------------------------------

def _rows_without_answer(rows, form) -> list[int]:
    """Ids of rows with nothing for the model to say: no assistant message, or an empty completion."""
    if form == "messages":
        return [i for i, r in enumerate(rows) if not any(m["role"] == "assistant" for m in r["messages"])]
    if form.startswith("prompt_completion"):
        return [i for i, r in enumerate(rows) if not r["completion"]]
    return []


def _assistant_turn_findings(rows, form, args) -> list[Finding]:
    """Rows that have nothing for the model to say: no assistant message, or an empty completion."""
    empty = _rows_without_answer(rows, form)
    if not empty:
        return []
    share = len(empty) / len(rows)
    severity = "error" if args.assistant_only_loss or share == 1 or form != "messages" else "warning"
    why = ("TRL raises RuntimeError ('at least one example has no assistant tokens')"
           if args.assistant_only_loss and form == "messages" else
           "these rows teach the model to write the user's side" if form == "messages" else
           "the completion mask is empty: the rows carry no loss")
    return [Finding(severity, "no-assistant-turns",
                    f"{len(empty)} of {len(rows)} rows ({share:.0%}) have no assistant turn to learn",
                    f"row ids {empty[:5]}; {why}",
                    "drop those rows or add the assistant's answer; check the role names ('assistant', not "
                    "'gpt' or 'bot')", "04")]


def _template_findings(tokenizer, args, form) -> tuple[list[Finding], str | None, bool]:
    """Whether TRL can train ``assistant_only_loss`` with this template; the template it would use."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if not args.assistant_only_loss:
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
    if has_generation_markers(template):
        return [], None, True
    try:
        return [], get_training_chat_template(tokenizer), True
    except ValueError as exc:
        return _unpatchable_findings(template, exc)


def _unpatchable_findings(template: str, exc: Exception) -> tuple[list[Finding], str | None, bool]:
    """The template-unpatchable error, with a training template of the template's own family when TRL
    ships one (and, when the two render near-identical text, that template standing in for the rest)."""
    from trl import chat_template_utils as ctu

    family, ratio = _template_family(template)
    training = _training_template_name(family) if family else None
    raised = f"get_training_chat_template raised: {str(exc)[:120]}…"
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


# turn markers in a template's text: <|eot_id|>, <｜User｜>, [INST], <start_of_turn>, <|im_end|>
_MARKER = re.compile(r"<\|[^|'\"\s]+\|>|<｜[^｜]+｜>|\[/?INST\]|<(?:start|end)_of_turn>")


def _template_family(template: str) -> tuple[str | None, float]:
    """The TRL original template (``trl/chat_templates/<name>.jinja``) that ``template`` is a copy or an
    edit of, and how similar they are; ``(None, best ratio)`` when none shares its turn markers (e.g.
    ``<|start_header_id|>``, ``[INST]``) and at least ``FAMILY_SIMILARITY`` of its text."""
    from trl import chat_template_utils as ctu

    originals = {a[: -len("_chat_template")]: getattr(ctu, a) for a in dir(ctu)
                 if a.endswith("_chat_template") and not a.endswith("_training_chat_template")
                 and isinstance(getattr(ctu, a), str)}
    for name, text in originals.items():
        if text.strip() == template.strip():
            return name, 1.0
    mine = set(_MARKER.findall(template))
    candidates = []
    for name, text in originals.items():
        theirs = set(_MARKER.findall(text))
        if not mine or len(mine & theirs) / len(mine | theirs) < 0.5:  # another family's turn markers
            continue
        matcher = difflib.SequenceMatcher(None, template, text, autojunk=False)
        candidates.append((matcher.quick_ratio(), name, matcher))
    # ratio() is quadratic in the templates' length (~1.7 s for two 10 k-character ones); quick_ratio() is
    # an upper bound of it, so the most promising go first and any that cannot beat the best are skipped
    best = (None, 0.0)
    for bound, name, matcher in sorted(candidates, key=lambda c: -c[0]):
        if bound <= best[1]:
            break
        best = max(best, (name, matcher.ratio()), key=lambda x: x[1])
    return best if best[1] >= FAMILY_SIMILARITY else (None, best[1])


def _training_template_name(family: str) -> str | None:
    """The training template of ``family`` TRL ships: its own (``qwen2_5``), else its base name's
    (``llama3_1`` → ``llama3``), else None. Never another family's."""
    from trl import chat_template_utils as ctu

    parts = re.sub(r"_v\d+$", "", family).split("_")
    for end in range(len(parts), 0, -1):
        name = "_".join(parts[:end])
        if isinstance(getattr(ctu, f"{name}_training_chat_template", None), str):
            return name
    return None


def _stop_token_findings(tokenizer, prepared, eot, args, chat_template) -> list[Finding]:
    """The template's end-of-turn token must carry loss, or the model never learns to stop."""
    from trl.chat_template_utils import is_chat_template_stop_token_trained

    if eot is None or prepared is None:
        return []
    rows = prepared["labels"]
    graded = sum(eot in [t for t in labels if t != -100] for labels in rows)  # unshifted: _graded_positions
    token = tokenizer.convert_ids_to_tokens(eot)
    template_ok = (not args.assistant_only_loss
                   or is_chat_template_stop_token_trained(tokenizer, chat_template=chat_template))
    if graded == len(rows) and template_ok:
        return []
    severity = "error" if graded < len(rows) / 2 else "warning"
    return [Finding(severity, "stop-token-untrained",
                    f"the end-of-turn token {token!r} carries no loss in {len(rows) - graded} of "
                    f"{len(rows)} rows",
                    f"graded in {graded} rows (labels from TRL's own preparation); "
                    f"trl is_chat_template_stop_token_trained={template_ok}",
                    f"put {token!r} inside {{% generation %}}…{{% endgeneration %}} (TRL's *_training.jinja "
                    "templates do), or train on the full sequence (assistant_only_loss=False)", "02")]


def _eos_findings(tokenizer, eot, gen_eos, args, conversational=True) -> list[Finding]:
    """Will ``generate()`` stop at the token the rows end with after this training? For chats that is
    the template's end of turn; for text rows the ``tokenizer.eos_token`` TRL appends (``eot`` then)."""
    if eot is None or (not conversational and not gen_eos):  # no generation_config: generate() uses eos
        return []
    stop_ids = list(gen_eos)
    if args.eos_token is not None and args.eos_token in tokenizer.get_vocab():
        stop_ids = [tokenizer.convert_tokens_to_ids(args.eos_token), *stop_ids]  # TRL prepends it
    if eot in stop_ids:
        return []
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
                    f"eos_token_id={[*stop_ids, eot]} to generate()", "02")]


def _pad_eos_findings(tokenizer, prepared, eot, args) -> list[Finding]:
    """pad == the graded stop token. Harmless with SFTTrainer's own collator (it pads labels with -100
    and keeps every stop label: info); a collator that masks labels by pad id — transformers'
    ``DataCollatorForLanguageModeling``, in a custom loop — erases them all. ``tokenizer`` is already set
    up as TRL does (``_trl_tokenizer``): its pad is the one training would use."""
    from transformers import DataCollatorForLanguageModeling

    pad, pad_id = tokenizer.pad_token, tokenizer.pad_token_id
    stop_ids = {i for i in (eot, tokenizer.eos_token_id) if i is not None}
    if prepared is None or pad is None or pad_id not in stop_ids:
        return []
    rows = [{"input_ids": r} for r in prepared["input_ids"][:64]]
    # unshifted, as _graded_positions: an eos label at its own position
    graded = sum(int(t == pad_id and lab != -100) for r in prepared.select(range(len(rows)))
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


def _graded_positions(labels) -> list[int]:
    """Positions of one of TRL's prepared label lists that are not -100. Unshifted on purpose, unlike
    ``data.graded``: the report quotes these positions (the first one is the prompt's length in tokens),
    and column 0 is never a target in a chat row anyway."""
    return [i for i, t in enumerate(labels) if t != -100]


def empty_batch_probability(n_rows: int, n_empty: int, batch_size: int) -> float:
    """P(a micro-batch of ``batch_size`` rows drawn without replacement has no graded row)."""
    validate.positive_int("n_rows", n_rows, why="it counts the rows a micro-batch is drawn from")
    validate.integer("n_empty", n_empty, minimum=0, why="it counts the rows without a graded token")
    validate.positive_int("batch_size", batch_size, why="it counts the rows of a micro-batch")
    if n_empty > n_rows:
        raise ValueError(f"n_empty={n_empty} is more than n_rows={n_rows} — the rows without a graded token "
                         "are some of the rows — pass n_empty <= n_rows.")
    return _empty_batch_probability(n_rows, n_empty, batch_size)


def _empty_batch_probability(n_rows: int, n_empty: int, batch_size: int) -> float:
    if batch_size > n_rows:
        return float(n_empty == n_rows)
    return math.prod((n_empty - i) / (n_rows - i) for i in range(batch_size))


def _truncation_findings(prepared, tokenizer, args, chat_template, completion_only_loss) -> list[Finding]:
    """Rows whose every graded token is cut at max_length, what TRL does with them, and the odds of an
    all-empty micro-batch."""
    if prepared is None or args.max_length is None:
        return []
    if args.packing and args.packing_strategy in ("wrapped", "bfd_split"):
        return _packed_apart_findings(prepared, args)  # these strategies cut no token
    max_length, batch = args.max_length, args.per_device_train_batch_size
    graded = {r: _graded_positions(lab) for r, lab in zip(prepared["_doctor_row"], prepared["labels"])}
    first = {r: pos[0] for r, pos in graded.items() if pos}
    findings = _answer_cut_findings(graded, args)
    prompts = sorted(first.values())
    median_prompt = prompts[len(prompts) // 2] if prompts else 0
    if prompts and median_prompt >= max_length:
        findings.append(Finding(
            "error", "max-length-below-prompts",
            f"max_length={max_length} is below most prompts (median {median_prompt} tokens)",
            f"{sum(p >= max_length for p in prompts)} of {len(prompts)} prompts are at least max_length "
            f"tokens long; the longest answer starts at token {prompts[-1]}",
            f"raise max_length above {median_prompt} (the longest needs {prompts[-1] + 1}), or shorten the "
            "prompts", "05"))
    tokenized = prepared.remove_columns([c for c in prepared.column_names if c not in
                                         ("input_ids", "labels", "_doctor_row")])
    cut = _prepare(tokenizer, tokenized, args, chat_template, completion_only_loss, packing=False)
    dropped = sorted(set(first) - set(cut["_doctor_row"]))
    if not dropped:
        return findings
    n = len(first)
    share = len(dropped) / n
    p_empty = _empty_batch_probability(n, len(dropped), batch)
    end_mode = "keep_end" if args.truncation_mode == "keep_start" else "keep_start"
    other = _prepare(tokenizer, tokenized, args, chat_template, completion_only_loss, packing=False,
                     truncation_mode=end_mode)
    other_kept = n - len(set(first) - set(other["_doctor_row"]))
    if args.packing:
        packed = _prepare(tokenizer, tokenized, args, chat_template, completion_only_loss)
        empty_rows = sum(not _graded_positions(lab) for lab in packed["labels"])
        p_packed = _empty_batch_probability(len(packed), empty_rows, batch)
        path = (f"packing={args.packing_strategy}: TRL does not drop them; {empty_rows} of {len(packed)} "
                f"packed rows have no graded token, so a micro-batch of {batch} has none with p="
                f"{p_packed:.3g} and SFTTrainer logs a silent 0.0 (compute_loss divides by "
                "num_tokens.clamp(min=1))")
    else:
        path = (f"SFTTrainer drops them ('Dropping fully masked examples'): it trains on {n - len(dropped)} "
                "rows, not the ones you think; a loop without that filter that takes the mean over a "
                "micro-batch without graded tokens gets NaN (0/0), TRL's compute_loss a silent 0.0")
    severity = "error" if share >= ERROR_SHARE else "warning"
    findings.append(Finding(
        severity, "fully-truncated",
        f"{len(dropped)} of {n} rows ({share:.1%}) lose every graded token at max_length={max_length}",
        f"row ids {dropped[:8]}; a micro-batch of {batch} such rows (no graded token at all) has "
        f"p={p_empty:.3g}, "
        f"~{p_empty * n / batch:.2g} per epoch; {path}",
        # the first number is the one that also keeps every answer's end (a smaller one leaves answers
        # without their stop token: answer-truncated); lesson 08 reads it
        f"max_length >= {max(pos[-1] for pos in graded.values() if pos) + 1} keeps every answer whole "
        f"(>= {max(first.values()) + 1} keeps a graded token in every row); truncation_mode="
        f"'{end_mode}' keeps {other_kept} of {n}; or drop/shorten the long prompts", "05"))
    return findings


def _answer_cut_findings(graded: dict, args) -> list[Finding]:
    """Rows that keep part of their answer but lose its end — and with it the end-of-turn / eos token —
    at max_length (``keep_start``): the model is taught answers that do not stop (lesson 02)."""
    if args.truncation_mode != "keep_start":
        return []
    cut = sorted(r for r, pos in graded.items() if pos and pos[0] < args.max_length <= pos[-1])
    if not cut:
        return []
    return [Finding("warning", "answer-truncated",
                    f"{len(cut)} of {len(graded)} rows lose the end of their answer at "
                    f"max_length={args.max_length}",
                    f"row ids {cut[:8]}: their last graded token (the end of turn) lies past max_length, so "
                    "these rows teach the answer without its stop token",
                    f"max_length >= {max(graded[r][-1] for r in cut) + 1} keeps every answer's end; or "
                    "shorten the long rows", "05")]


def _packed_apart_findings(prepared, args) -> list[Finding]:
    """``wrapped`` and ``bfd_split`` packing keep every token (TRL truncates nothing), but a row longer than
    ``max_length`` is split across packed rows: the part of its answer past the cut trains without the
    start of its prompt."""
    max_length = args.max_length
    long_rows = [(r, _graded_positions(lab)) for r, lab in zip(prepared["_doctor_row"], prepared["labels"])
                 if len(lab) > max_length]
    apart = [r for r, pos in long_rows if pos and pos[-1] >= max_length]
    if not apart:
        return []
    beside = " (and, wrapped, beside other examples)" if args.packing_strategy == "wrapped" else ""
    return [Finding("warning", "answers-packed-apart",
                    f"{len(apart)} of {len(prepared)} rows are longer than max_length={max_length}: "
                    f"packing_strategy={args.packing_strategy!r} splits them, answer apart from prompt",
                    f"row ids {apart[:8]}; no token is lost (TRL does not truncate under this packing), but "
                    f"graded tokens past the cut are trained without the start of their prompt{beside}",
                    f"max_length >= {max(len(lab) for lab in prepared['labels'])} keeps every row whole; or "
                    "shorten the long rows", "05")]


def _packing_findings(prepared, tokenizer, args, chat_template, completion_only_loss) -> list[Finding]:
    """Packing without per-example boundaries lets attention cross examples (lesson 03)."""
    if not args.packing or prepared is None or args.max_length is None:
        return []
    padding_free = args.padding_free or args.packing_strategy in ("bfd", "bfd_split")
    if args.packing_strategy != "wrapped" or padding_free:
        return []
    extra = [c for c in prepared.column_names if c not in ("input_ids", "labels")]
    tokenized = prepared.remove_columns(extra)
    packed = _prepare(tokenizer, tokenized, args, chat_template, completion_only_loss)
    return [Finding("warning", "packing-no-boundaries",
                    "packing_strategy='wrapped' without padding_free: examples attend to each other",
                    f"TRL packs {len(prepared)} rows into {len(packed)} rows of {args.max_length} tokens "
                    f"(~{len(prepared) / max(len(packed), 1):.1f} examples per row) with an all-ones "
                    "attention mask and no position_ids reset",
                    "use packing_strategy='bfd' (padding-free, boundaries kept), or set padding_free=True",
                    "03")]


def _padding_side_findings(tokenizer) -> list[Finding]:
    if tokenizer.padding_side != "right":
        return []
    return [Finding("info", "right-padding",
                    "tokenizer.padding_side='right': fine for training, wrong for batched generate()",
                    "a decoder continues from each row's last position; right padding puts pad tokens there",
                    "set tokenizer.padding_side='left' before batched generation", "03")]


def _max_activation(model, tokenizer, prepared, rows: int = 4) -> tuple[float, str]:
    """The largest |activation| any module outputs on a few real rows (fp32 forward), and where."""
    largest = [0.0, ""]

    def hook(name):
        def record(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
                value = float(out.detach().abs().max())
                if value > largest[0]:
                    largest[:] = [value, name]
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            for ids in prepared["input_ids"][:rows]:
                model(input_ids=torch.tensor([ids[:512]]))
    finally:
        for h in handles:
            h.remove()
    return largest[0], largest[1]


def _precision_and_lr_findings(config, precision, args, model_obj, tokenizer, prepared) -> list[Finding]:
    findings = []
    lora = any(config.get(k) for k in PEFT_KEYS)
    low, high = LR_RANGES["lora" if lora else "full"]
    lr, kind = args.learning_rate, "LoRA" if lora else "full fine-tuning"
    hot = lr > high
    if lr > high * LR_FAR or lr < low / LR_FAR:
        ratio = lr / (high if lr > high else low)
        findings.append(Finding(
            "warning", "learning-rate", f"learning_rate={lr:g} is far outside the usual range for {kind}",
            f"usual {low:g}..{high:g}; this is {ratio:.3g}x that end",
            "a tiny model can take it, a real one diverges or forgets: sweep a few values around "
            f"{math.sqrt(low * high):.0e} and watch the loss and grad_norm", "06"))
    if not precision["fp16"]:
        return findings
    if model_obj is None or prepared is None:
        findings.append(Finding("error" if hot else "warning", "fp16-overflow-risk" if hot else "fp16-range",
                                "fp16=True" + (f" with learning_rate={lr:g} above the usual {high:g}" if hot
                                               else ", activation range not measured"),
                                "no weights in the model directory (or no tokenized rows) to measure the "
                                "range",
                                "use bf16 (same range as fp32) or fp32, and a usual learning rate", "06"))
        return findings
    peak, where = _max_activation(model_obj, tokenizer, prepared)
    headroom = FP16_MAX / max(peak, 1e-30)
    near = headroom < FP16_HEADROOM
    if near or hot:
        why = (f"activations already reach {peak:.3g} in {where} ({headroom:.3g}x below fp16's max "
               f"{FP16_MAX:g})" if near else
               f"learning_rate={lr:g} is above the usual {high:g} for {kind}: fast-growing "
               f"weights push activations (now {peak:.3g}, in {where}) past fp16's {FP16_MAX:g} → inf → NaN")
        findings.append(Finding("error", "fp16-overflow-risk", "fp16 training risks overflow to inf/NaN", why,
                                "use bf16 (same range as fp32) or fp32; if fp16 is a must, lower the "
                                "learning rate and keep max_grad_norm", "06"))
    else:
        findings.append(Finding("info", "fp16-range", f"fp16: activations peak at {peak:.3g} ({where})",
                                f"{headroom:.3g}x headroom below fp16's max {FP16_MAX:g}",
                                "bf16 removes the question where the hardware supports it", "06"))
    return findings


# ---------------------------------------------------------------------------------------------
# The API and the command
# ---------------------------------------------------------------------------------------------

def _as_rows(data) -> list[dict]:
    if isinstance(data, (str, Path)):
        return read_jsonl(data)
    if not (isinstance(data, (list, tuple)) or hasattr(data, "column_names")):  # a datasets.Dataset
        raise DoctorInputError(f"data must be a JSONL path or a list of rows, got {type(data).__name__} — "
                               "the doctor checks each row as TRL would read it — pass e.g. 'train.jsonl' "
                               "or [{'messages': [...]}, ...].")
    rows = list(data)
    if not rows:
        raise DoctorInputError("the data has no rows — there is nothing to check — pass a JSONL path or a "
                               "non-empty list of rows.")
    _check_rows(rows, lambda i: f"row {i}")
    return [dict(r) for r in rows]


def _check_model(model) -> None:
    """A model directory or hub id, or a loaded ``(model, tokenizer)`` pair that fits together."""
    if isinstance(model, tuple) and len(model) == 2:
        try:
            validate.model_and_tokenizer(*model)
        except (TypeError, ValueError) as exc:
            raise DoctorInputError(str(exc)) from None
    elif not isinstance(model, (str, Path)) or not str(model).strip():
        raise DoctorInputError(f"model must be a model directory, a hub id or a (model, tokenizer) pair, "
                               f"got {model!r:.60} — the doctor checks the tokenizer (and weights) you train "
                               "with, and will not guess a default — pass e.g. --model ./my-model or "
                               "diagnose((model, tokenizer), ...).")


def _model_and_tokenizer(model):
    if isinstance(model, tuple):  # (model, tokenizer) already loaded
        return None, model[0], model[1]
    source, tokenizer = _load_tokenizer(model)
    return source, None, tokenizer


def diagnose(model, data, config=None, *, max_length: int | None = None, forward: bool = True) -> Report:
    """Check a fine-tuning set-up; return a ``Report`` (a list of ``Finding``s, errors first).

    ``model``: a local directory, a hub id (offline: from the cache) or a ``(model, tokenizer)``
    pair; ``data``: a JSONL path or a list of rows (``messages`` or ``prompt``/``completion``);
    ``config``: a dict or JSON path of SFTConfig fields; ``max_length`` overrides the config's.
    ``forward=False`` skips loading weights (the fp16 check then reports that it could not measure).
    Raises ``DoctorInputError`` on bad input (a set-up the doctor would have to guess at), before any
    measurement: the cheap checks (files, rows, arguments) first, then the config against SFTConfig.
    """
    if not isinstance(forward, bool):
        raise DoctorInputError(f"forward={forward!r} must be True or False — it switches the forward pass of "
                               "the fp16 check — pass forward=False to skip loading weights.")
    max_length = _check_max_length(max_length)
    config = read_config(config)
    rows = _as_rows(data)
    _check_model(model)
    _check_config(config)
    source, model_obj, tokenizer = _model_and_tokenizer(model)
    args, precision = _build_args(config, max_length)
    form = _form(rows)
    with no_progress_bars():
        return _run_checks(rows, form, tokenizer, args, precision, config, source, model_obj, forward)


def _run_checks(rows, form, tokenizer, args, precision, config, source, model_obj, forward) -> Report:
    from datasets import Dataset

    tokenizer, findings = _apply_chat_template_path(tokenizer, args)
    try:
        tokenizer, setup_findings = _trl_tokenizer(tokenizer, args)
    except Exception as exc:  # noqa: BLE001 — measure with the tokenizer as given, and say so
        setup_findings = _could_not_check("special-token-unknown", exc)
    findings += setup_findings
    findings += _guarded("no-assistant-turns", _assistant_turn_findings, rows, form, args)
    try:
        template_findings, chat_template, trainable = _template_findings(tokenizer, args, form)
    except Exception as exc:  # noqa: BLE001 — a check that cannot run is a finding, not a traceback
        template_findings, chat_template, trainable = _could_not_check("template", exc), None, False
    findings += template_findings
    completion_only = args.completion_only_loss
    if completion_only is None:
        completion_only = form.startswith("prompt_completion")
    prepared = None
    # rows without an answer are reported above; the rest is measured without them (TRL would refuse them)
    skip = set(_rows_without_answer(rows, form)) if args.assistant_only_loss else set()
    if trainable and len(skip) < len(rows):
        try:
            kept = [{**r, "_doctor_row": i} for i, r in enumerate(rows) if i not in skip]
            dataset = Dataset.from_list(kept)
            prepared = _prepare(tokenizer, dataset, args, chat_template, completion_only,
                                max_length=None, packing=False)
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:  # TRL's own refusal is the finding
            findings.append(Finding("error", "trl-preparation",
                                    "TRL's dataset preparation fails on these rows",
                                    f"{type(exc).__name__}: {str(exc)[:200]}",
                                    "fix the rows or the template it names; SFTTrainer would stop here",
                                    "04"))
        except Exception as exc:  # noqa: BLE001
            findings += _could_not_check("trl-preparation", exc)
    # the stop the rows end with: the template's end of turn for chats; for plain text and prompt/completion
    # text, the tokenizer.eos_token TRL appends to each row ("Adding EOS")
    conversational = form in ("messages", "prompt_completion")
    eot = _end_of_turn_or_none(tokenizer) if conversational else tokenizer.eos_token_id
    if model_obj is None and forward and precision["fp16"] and source is not None:
        model_obj = _load_model(source)
    try:
        gen_eos = _generation_eos_ids(source, model_obj)
    except Exception as exc:  # noqa: BLE001
        gen_eos, findings = None, findings + _could_not_check("eos-mismatch", exc)
    findings += _guarded("stop-token-untrained", _stop_token_findings, tokenizer, prepared, eot, args,
                         chat_template)
    if gen_eos is not None:
        findings += _guarded("eos-mismatch", _eos_findings, tokenizer, eot, gen_eos, args, conversational)
    findings += _guarded("pad-is-eos", _pad_eos_findings, tokenizer, prepared, eot, args)
    findings += _guarded("truncation", _truncation_findings, prepared, tokenizer, args, chat_template,
                         completion_only)
    findings += _guarded("packing", _packing_findings, prepared, tokenizer, args, chat_template,
                         completion_only)
    findings += _guarded("precision-and-learning-rate", _precision_and_lr_findings, config, precision, args,
                         model_obj if forward else None, tokenizer, prepared)
    findings += _guarded("right-padding", _padding_side_findings, tokenizer)
    return Report(sorted(findings, key=lambda f: SEVERITIES.index(f.severity)))


def _guarded(check: str, run, *args) -> list[Finding]:
    """``run(*args)``'s findings; an exception it was not written for becomes a "could-not-check" finding
    naming ``check`` and why (exit status 3), so one check's bug neither hides the others nor ends in a
    traceback."""
    try:
        return run(*args)
    except Exception as exc:  # noqa: BLE001 — any failure of a check is reported, the others still run
        return _could_not_check(check, exc)


def _could_not_check(check: str, exc: Exception) -> list[Finding]:
    return [Finding("could-not-check", check, f"the {check} check could not run on this set-up",
                    f"{type(exc).__name__}: {str(exc)[:200]}",
                    "the other checks ran; check this one by hand, and report the set-up as a doctor bug "
                    "(exit status 3 until then)")]


def main(argv=None) -> int:
    """The command: ``argv`` as ``sys.argv[1:]`` would be (None: the process's). Returns the exit status."""
    if argv is not None:
        validate.strings("argv", argv, allow_empty=True)  # main("--model m") would parse one letter at a time
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.doctor",
        description="Check an SFT set-up for the failures of the SFT Failure Lab.")
    parser.add_argument("--model", required=True,
                        help="local model directory or hub id (offline: cache only)")
    parser.add_argument("--data", required=True, help="JSONL file: 'messages' or 'prompt'/'completion' rows")
    parser.add_argument("--config", help="JSON object of trl.SFTConfig fields")
    parser.add_argument("--max-length", type=int, help="overrides the config's max_length")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--no-forward", action="store_true", help="skip loading weights (fp16 range check)")
    options = parser.parse_args(argv)
    try:
        report = diagnose(options.model, options.data, options.config, max_length=options.max_length,
                          forward=not options.no_forward)
    except DoctorInputError as exc:
        print(f"doctor: bad input: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if options.json else report)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
