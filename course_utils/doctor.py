"""The SFT doctor: check a fine-tuning set-up for this course's failures *before* it trains.

Lesson 08 (capstone) and anyone's own set-up::

    python -m course_utils.doctor --model PATH_OR_ID --data FILE.jsonl [--config SFT_CONFIG.json]
                                  [--max-length N] [--json]

or, from Python, ``report = diagnose(model, data, config)``: a list of ``Finding``s (severity, what,
evidence, fix, lesson) that prints as a table in a terminal and renders as one in a notebook.

Every check measures the set-up with the installed libraries' own code, so it sees what training
would see: the rows are read as ``datasets.load_dataset("json")`` reads them (as ``trl sft`` does; a file
the loader rejects is an error finding), tokenized and labelled by TRL's ``SFTTrainer._prepare_dataset``
(the same template patching, ``return_assistant_tokens_mask``, truncation and "Dropping fully masked
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
the exercises' graders); those for reasoning and tool-call data (lesson 09) are in ``doctor_reasoning``.
A chat template that raises on a row is an error finding naming the row, like TRL's own refusals.
"""

from __future__ import annotations

import argparse
import contextvars
import copy
import difflib
import functools
import html
import json
import math
import os
import re
import sys
import tempfile
import types
from dataclasses import asdict, dataclass
from pathlib import Path

from . import doctor_precision as P
from . import doctor_reasoning as R
from . import doctor_trainer as DT
from . import internals, validate
from .data import end_of_turn_id, first_special_after
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
    "07": "07 · Token-weighted accumulation", "09": "09 · Thinking & tool-call templates",
}
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


# Rows the data holds while the checks run on a sample of them (None: every row is checked)
_SAMPLED: contextvars.ContextVar[int | None] = contextvars.ContextVar("doctor_sampled", default=None)
SAMPLE_ROWS = 2000  # rows checked by default: a rate's 95 % interval is then at most +-2.2 points


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
    return _read_jsonl(path, sample=None, seed=0)[0]


def _read_jsonl(path, sample: int | None, seed: int) -> tuple[list[dict], int]:
    """``(rows, how many the file holds)``: every row, or a seeded uniform sample of ``sample`` of them
    (reservoir sampling while the file streams by: memory holds the sample, never the file). Every line is
    parsed and checked, sampled or not: a malformed line is bad input wherever it is."""
    import random

    path = _existing_file("data file", path, "the doctor reads the rows you would train on",
                          "pass the path of a .jsonl file, one JSON object per line")
    rng, kept, first_form, total = random.Random(seed), [], None, 0
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
            first_form = _check_form(row, f"{path}: line {number}", first_form)
            slot = total if sample is None or total < sample else rng.randrange(total + 1)
            if sample is None or slot < sample:
                entry = (row, number, total)
                if slot < len(kept):
                    kept[slot] = entry
                else:
                    kept.append(entry)
            total += 1
    if not kept:
        raise DoctorInputError(f"{path} has no rows — there is nothing to check or train on — pass a "
                               "non-empty JSONL file.")
    kept.sort(key=lambda entry: entry[1])  # file order: TRL's order, and row ids a reader can find
    # _doctor_index: the row's position among the file's rows, where datasets' JSON loader puts it
    return [{**row, "_doctor_row": number - 1, "_doctor_index": index} for row, number, index in kept], \
        total


def _check_form(row, where: str, first):
    """``_check_row``, and the row in the first row's form ``first`` (returned: the form so far)."""
    _check_row(row, where)
    form = _form([row])
    if first is not None and form != first[0]:
        raise DoctorInputError(f"{where} is a {form!r} row but {first[1]} is a {first[0]!r} row — TRL "
                               "tokenizes a dataset in one form, and the doctor would measure the other "
                               "rows as the first one — convert the rows to one form.")
    return first or (form, where)


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
        first = _check_form(row, where(i), first)


TOKENIZED_COLUMNS = ("labels", "completion_mask", "assistant_masks")  # what TRL reads beside input_ids


def _check_row(row, where: str) -> None:
    if not isinstance(row, dict):
        raise DoctorInputError(f"{where} is a JSON {type(row).__name__}, not an object — TRL's dataset "
                               "formats are objects — write {\"messages\": [...]} or "
                               "{\"prompt\": ..., \"completion\": ...}.")
    if "input_ids" in row:  # TRL trains such rows as they are (its "already processed" path)
        _check_tokenized_row(row, where)
    elif "messages" in row:
        ok = isinstance(row["messages"], list) and all(
            isinstance(m, dict) and "role" in m and "content" in m for m in row["messages"])
        if not ok:
            raise DoctorInputError(f"{where}: 'messages' must be a list of {{'role', 'content'}} objects — "
                                   "the chat template renders such a list — fix that row.")
    elif not ("prompt" in row and "completion" in row) and "text" not in row:
        raise DoctorInputError(f"{where} has keys {sorted(row)} — TRL reads 'messages', "
                               "'prompt'+'completion' or 'text' — rename the columns to one of these forms.")


def _check_tokenized_row(row: dict, where: str) -> None:
    """A pre-tokenised row (the output of your own tokenization or collator): ``input_ids``, and
    ``labels`` / ``completion_mask`` / ``assistant_masks`` of the same length when present."""
    ids = row["input_ids"]
    if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in ids)):
        raise DoctorInputError(f"{where}: 'input_ids' must be a non-empty list of token ids (whole numbers "
                               ">= 0) — TRL feeds them to the model as they are — fix that row.")
    for column in TOKENIZED_COLUMNS:
        if column not in row:
            continue
        values, allowed = row[column], "ids or -100" if column == "labels" else "0 or 1"
        labels = column == "labels"
        ok = isinstance(values, list) and len(values) == len(ids) and all(
            isinstance(v, int) and not isinstance(v, bool) and (v >= -100 if labels else v in (0, 1))
            for v in values)
        if not ok:
            raise DoctorInputError(f"{where}: '{column}' must be a list of {len(ids)} values ({allowed}), "
                                   "one per input id — TRL pairs them position by position — fix that row.")


def _trl_dataset(data, rows: list[dict]):
    """``(dataset, findings)``: the rows the doctor checks, read as TRL trains them — a ``datasets.Dataset``
    with a ``_doctor_row`` column.

    A JSONL file goes through ``datasets.load_dataset("json", data_files=...)``, as TRL's ``trl sft`` and
    its docs read one: the whole file (the loader fixes each field's type from the file's first 10 MiB
    and fails on a later row that does not fit, and so would TRL), then the sampled rows are selected. A
    list of rows is read the same way, as the JSONL file its (sampled) rows would be; a ``Dataset`` is
    trained as it is.
    Not ``Dataset.from_list``: it fills every message's missing keys with None (``tool_calls: None`` on
    each user turn, which templates then render) and raises on tool-call arguments that are dicts in some
    rows and strings in others, which the JSON loader keeps as JSON. A file the loader rejects is an error
    finding, and ``dataset`` is None: TRL would stop there.
    """
    from datasets import load_dataset

    ids = [r["_doctor_row"] for r in rows]
    if hasattr(data, "column_names"):  # a Dataset: TRL trains it as it is
        chosen = data.select(ids).flatten_indices(keep_in_memory=True)
        return chosen.remove_columns([c for c in ["_doctor_row"] if c in chosen.column_names]).add_column(
            "_doctor_row", ids), []
    with tempfile.TemporaryDirectory() as cache:  # the loader's Arrow cache: never the user's HF cache
        if isinstance(data, (str, Path)):
            source, picked = str(data), [r["_doctor_index"] for r in rows]
        else:
            source, picked = os.path.join(cache, "rows.jsonl"), None
            with open(source, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps({k: v for k, v in r.items() if k != "_doctor_index"}) + "\n"
                                  for r in rows)
        try:
            full = load_dataset("json", data_files=source, split="train", cache_dir=os.path.join(cache, "hf"))
        except Exception as exc:  # noqa: BLE001 — whatever the loader raises, TRL would not start
            return None, _unloadable_findings(exc)
        # in memory: the cache directory goes away with this block
        dataset = (full if picked is None else full.select(picked)).flatten_indices(keep_in_memory=True)
    return (dataset if picked is None else dataset.add_column("_doctor_row", ids)), []


def _unloadable_findings(exc: Exception) -> list[Finding]:
    cause = exc  # datasets wraps the loader's error ("An error occurred while generating the dataset")
    while (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    message = " ".join(str(cause).split())[:300]
    return [Finding("error", "data-unloadable", "datasets.load_dataset('json') fails on this data: TRL "
                    "never starts training", f"{type(cause).__name__}: {message}",
                    "the loader fixes each field's type from the file's first 10 MiB and cannot cast a later "
                    "row that adds keys or changes a type (e.g. tool-call rows after 10 MiB of plain chats): "
                    "shuffle the file so its start holds every kind of row, or give each field one type in "
                    "every row (tool-call arguments as objects everywhere, or JSON strings everywhere)",
                    "09")]


def read_config(config=None) -> dict:
    """A dict of SFTConfig fields from a dict, a JSON file path, or ``None`` (all defaults)."""
    if config is None:
        return {}
    return _json_object(config, "config", "SFTConfig", "--config", "TRL's defaults",
                        '{"max_length": 512, "learning_rate": 2e-5}')


def _json_object(value, name: str, fields_of: str, flag: str, without: str, example: str) -> dict:
    """``value`` as a dict of ``fields_of``'s fields: a dict as it is, or a JSON file holding one object."""
    if isinstance(value, (str, Path)):
        path = _existing_file(f"{name} file", value, f"it holds your {fields_of} fields",
                              f"pass the path of a JSON file, or leave {flag} out for {without}")
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DoctorInputError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}) — the {name} is "
                                   f"one JSON object of {fields_of} fields — fix the file.") from None
    if not isinstance(value, dict):
        raise DoctorInputError(f"the {name} is a {type(value).__name__}, not a JSON object — it maps "
                               f"{fields_of} field names to values — write e.g. {example}.")
    return dict(value)


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
            hint = _did_you_mean(key, fields)
            raise DoctorInputError(f"config key {key!r} is not an SFTConfig field{hint} — "
                                   "SFTConfig(**config) raises TypeError on it, and the doctor would measure "
                                   "with the default instead — fix the spelling against SFTConfig's fields, "
                                   "or drop the key.")
    for key, value in config.items():
        if key in fields:
            _check_config_value(key, value, fields[key])


def _did_you_mean(key, names) -> str:
    """`` (did you mean 'x'?)`` with the closest of ``names``, or nothing when none is close."""
    close = difflib.get_close_matches(str(key), sorted(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
        hint = _did_you_mean(value, choices)
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
    args = _replace(args, shuffle_dataset=False, **overrides)  # the config's dataset_num_proc: TRL's own
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
    if "input_ids" in first:  # TRL's test too: a dataset with input_ids is "already processed"
        return "tokenized"
    if "messages" in first:
        return "messages"
    if "prompt" in first:
        return "prompt_completion" if isinstance(first["prompt"], list) else "prompt_completion_text"
    return "text"


def _end_of_turn_or_none(tokenizer) -> int | None:
    """The stop token a chat row teaches: the first special token after the *final* assistant message of a
    training row (no generation prompt after it) — ``<|im_end|>`` for ChatML, ``<|return|>`` for gpt-oss,
    whose earlier turns end with ``<|end|>`` (a token generation must *not* stop on). ``None`` when the
    tokenizer has no template or the template ends that turn with plain text (no stop id to check)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    probe = "Fine, thank you."
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "How are you?"},
                                              {"role": "assistant", "content": probe}], tokenize=False)
        after = text[text.rindex(probe) + len(probe):]
    except Exception:  # noqa: BLE001 — a template that rejects the probe: the lessons' rule below
        after = ""
    token = first_special_after(tokenizer, after)
    if token is not None:
        return token
    try:
        return end_of_turn_id(tokenizer)  # a template that closes a turn only when another one starts
    except Exception:  # noqa: BLE001 — no template, or one that ends turns with text
        return None


# ---------------------------------------------------------------------------------------------
# The checks. Each returns a list of Findings; names match the README and lesson 08.
# ---------------------------------------------------------------------------------------------

def _rows_without_answer(rows, form) -> list[int]:
    """Ids of rows with nothing for the model to say: no assistant message, or an empty completion."""
    if form == "messages":
        return [r["_doctor_row"] for r in rows if not any(m["role"] == "assistant" for m in r["messages"])]
    if form.startswith("prompt_completion"):
        return [r["_doctor_row"] for r in rows if not r["completion"]]
    if form == "tokenized":  # labels all -100, or a mask without a 1: nothing graded even before truncation
        return [r["_doctor_row"] for r in rows if ("labels" in r and all(t == -100 for t in r["labels"]))
                or any(c in r and not any(r[c]) for c in ("completion_mask", "assistant_masks"))]
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
           "every label is -100 (or the mask has no 1): SFTTrainer drops such rows only when max_length is "
           "set, and a hand-written loop's mean over a micro-batch of them is 0/0 = NaN (lesson 05)"
           if form == "tokenized" else "the completion mask is empty: the rows carry no loss")
    what = "no graded token" if form == "tokenized" else "no assistant turn to learn"
    return [Finding(severity, "no-assistant-turns",
                    f"{_of(len(empty), len(rows))} have {what}",
                    f"row ids {empty[:5]}; {why}",
                    "drop those rows or add the assistant's answer; check the role names ('assistant', not "
                    "'gpt' or 'bot')", "04")]


def _template_findings(tokenizer, args, form) -> tuple[list[Finding], str | None, bool]:
    """Whether TRL can train ``assistant_only_loss`` with this template; the template it would use."""
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
        bound = difflib.SequenceMatcher(None, template, text, autojunk=False).quick_ratio()
        candidates.append((bound, name, text))
    # the similarity is quadratic in the templates' length (~1.7 s for two 10 k-character ones);
    # quick_ratio() is an upper bound of it, so the most promising go first and any that cannot beat the
    # best are skipped
    best = (None, 0.0)
    for bound, name, text in sorted(candidates, key=lambda c: -c[0]):
        if bound <= best[1]:
            break
        best = max(best, (name, _similarity(template, text)), key=lambda x: x[1])
    return best if best[1] >= FAMILY_SIMILARITY else (None, best[1])


def _similarity(a: str, b: str) -> float:
    """difflib's ratio (2 x matched characters / both lengths), with the common prefix and suffix matched
    first: an edited template shares most of its text with the original at both ends, and only the middle
    that differs goes through the quadratic matcher (gpt-oss's 13 k-character template: seconds -> ms)."""
    start = len(os.path.commonprefix([a, b]))
    end = len(os.path.commonprefix([a[start:][::-1], b[start:][::-1]]))
    middle_a, middle_b = a[start:len(a) - end], b[start:len(b) - end]
    blocks = difflib.SequenceMatcher(None, middle_a, middle_b, autojunk=False).get_matching_blocks()
    matched = start + end + sum(block.size for block in blocks)
    return 2 * matched / max(len(a) + len(b), 1)


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
                    f"the end-of-turn token {token!r} carries no loss in "
                    f"{_of(len(rows) - graded, len(rows))}",
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


def _of(k: int, n: int) -> str:
    """"k of n rows (share)"; when the rows are a sample of the data (``_SAMPLED``), with the 95 % Wilson
    interval of the share in all the rows — a rate from 2,000 sampled rows is not the rate of a million."""
    text = f"{k} of {n} rows ({k / n:.1%})"
    total = _SAMPLED.get()
    if total is None or n == 0:
        return text
    z, p = 1.96, k / n
    centre, spread = (p + z * z / (2 * n)), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = (centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n)
    return f"{text} (sampled; in all {total:,} rows: {max(low, 0):.1%}..{min(high, 1):.1%}, 95 % interval)"


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


def _truncation_findings(prepared, tokenizer, args, chat_template, completion_only_loss,
                         num_processes: int = 1) -> list[Finding]:
    """Rows whose every graded token is cut at max_length, what TRL does with them, and the odds that a
    micro-batch (a hand-written loop's NaN) or a whole optimizer step (SFTTrainer's 0.0) has none."""
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
    # what one optimizer step draws: SFTTrainer's loss divides by the graded tokens of all its micro-batches
    # on all processes (num_items_in_batch), so only a step without any graded token logs 0.0
    step_rows = batch * args.gradient_accumulation_steps * num_processes
    step_words = (f"{args.gradient_accumulation_steps} micro-batches of {batch} rows on {num_processes} "
                  f"process{'es' if num_processes > 1 else ''}")
    if args.packing:
        packed = _prepare(tokenizer, tokenized, args, chat_template, completion_only_loss)
        empty_rows = sum(not _graded_positions(lab) for lab in packed["labels"])
        p_step = _empty_batch_probability(len(packed), empty_rows, step_rows)
        path = (f"packing={args.packing_strategy}: TRL keeps them, and {empty_rows} of {len(packed)} packed "
                "rows have no graded token; SFTTrainer divides by the graded tokens of the whole optimizer "
                f"step ({step_words}: num_items_in_batch), so such a row adds nothing and the logged loss is "
                f"the mean of the rest; a step with no graded token at all (p={p_step:.3g}) logs 0.0 and "
                "updates nothing")
    else:
        p_micro = _empty_batch_probability(n, len(dropped), batch)
        path = (f"SFTTrainer drops them ('Dropping fully masked examples'): it trains on {n - len(dropped)} "
                f"rows, not the ones you think; a loop without that filter meets a micro-batch of {batch} "
                f"with no graded token with p={p_micro:.3g} (~{p_micro * n / batch:.2g} per epoch), and a "
                "per-micro-batch mean over it logs NaN (0/0; its gradients are zero with F.cross_entropy's "
                "ignore_index, NaN for a per-token loss at every position then masked): guard it with "
                "sum / count.clamp(min=1), not a skip, when it runs on several processes")
    severity = "error" if share >= ERROR_SHARE else "warning"
    findings.append(Finding(
        severity, "fully-truncated",
        f"{_of(len(dropped), n)} lose every graded token at max_length={max_length}",
        f"row ids {dropped[:8]}; {path}",
        # the first number is the one that also keeps every answer's end (a smaller one leaves answers
        # without their stop token: answer-truncated); lesson 08 reads it. No truncation_mode='keep_end':
        # TRL 1.16 deprecates it, ignores it under packing, and it cuts the BOS and the system prompt
        f"max_length >= {max(pos[-1] for pos in graded.values() if pos) + 1} keeps every answer whole "
        f"(>= {max(first.values()) + 1} keeps a graded token in every row); or drop or shorten the long "
        "prompts", "05"))
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
                    f"{_of(len(cut), len(graded))} lose the end of their answer at "
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
                    f"{_of(len(apart), len(prepared))} are longer than max_length={max_length}: "
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
                    # not padding_free=True with 'wrapped': TRL warns against that combination
                    "use packing_strategy='bfd' (padding-free, per-example boundaries kept; it truncates "
                    "rows longer than max_length), or 'bfd_split' (splits them instead)",
                    "03")]


def _rows_hold(rows, token_id) -> bool:
    """Whether most pre-tokenised rows contain ``token_id`` (a chat template's end of turn: chats)."""
    return token_id is not None and sum(token_id in r["input_ids"] for r in rows) > len(rows) / 2


def _label_alignment_findings(prepared) -> list[Finding]:
    """Your own ``labels`` against ``input_ids``. A transformers model shifts the labels itself (the loss
    at position i predicts token i+1 from ``labels[i+1]``), so a graded label must be the token at its own
    position. Labels shifted beforehand train every token to predict the one after next."""
    same = shifted = graded = 0
    for ids, labels in zip(prepared["input_ids"], prepared["labels"]):
        for i, label in enumerate(labels):
            if label != -100:
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


def _double_bos_findings(tokenizer, prepared) -> list[Finding]:
    """Rows that start with the bos token twice: text the chat template already rendered (with its
    ``{{ bos_token }}``) tokenized again by a tokenizer that prepends bos itself — Llama 3, Gemma and
    DeepSeek-R1's do. The model trains on a start it never sees at inference."""
    bos = tokenizer.bos_token_id
    if prepared is None or bos is None:
        return []
    doubled = [r for r, ids in zip(prepared["_doctor_row"], prepared["input_ids"]) if ids[:2] == [bos, bos]]
    if not doubled:
        return []
    return [Finding("warning", "double-bos",
                    f"{_of(len(doubled), len(prepared))} start with {tokenizer.bos_token!r} twice",
                    f"row ids {doubled[:8]}: the rows' text already begins with {tokenizer.bos_token!r} (a "
                    "chat template's rendering) and the tokenizer prepends another one; inference renders "
                    "one",
                    "give TRL 'messages' (or prompt/completion) rows and let it apply the template, or strip "
                    "the bos from the rendered text", "04")]


def _trainer_findings(trainer_cls, args, num_processes: int) -> list[Finding]:
    """Your trainer class under lesson 01's split test (``doctor_trainer``): the same rows as one batch and
    as micro-batches must give the same gradient, as they do with stock ``SFTTrainer``."""
    if trainer_cls is None:
        return []
    mine, stock = DT._split_gaps(trainer_cls)
    limit = max(stock * DT.ROUND_OFF_FACTOR, DT.ROUND_OFF_FLOOR)
    name, (one, many) = trainer_cls.__name__, DT.SPLITS
    test = (f"split test (lesson 01) on the course model: {DT.ROWS} rows as {one} batch and as {many} "
            f"micro-batches give first-step gradient norms {mine:.2%} apart (stock SFTTrainer: {stock:.1e})")
    if mine <= limit:
        return [Finding("info", "trainer-accumulation",
                        f"{name} weights the tokens of a step as SFTTrainer does", test, "nothing to fix",
                        "01")]
    accumulates = args.gradient_accumulation_steps > 1 or num_processes > 1
    return [Finding("error" if accumulates else "warning", "trainer-accumulation",
                    f"{name}'s gradient depends on how a batch is split into micro-batches",
                    f"{test}; gradient_accumulation_steps={args.gradient_accumulation_steps} on "
                    f"{num_processes} process(es): "
                    + ("the run's gradient is not the batch's" if accumulates else
                       "harmless until you accumulate or add processes"),
                    "in compute_loss, sum the token losses and divide by num_items_in_batch (the step's "
                    "graded tokens) when the Trainer passes it — or return super().compute_loss(model, "
                    "inputs, return_outputs, num_items_in_batch)", "01")]


def _padding_side_findings(tokenizer) -> list[Finding]:
    if tokenizer.padding_side != "right":
        return []
    return [Finding("info", "right-padding",
                    "tokenizer.padding_side='right': fine for training, wrong for batched generate()",
                    "a decoder continues from each row's last position; right padding puts pad tokens there",
                    "set tokenizer.padding_side='left' before batched generation", "03")]


def _lora_config(config: dict, peft_config):
    """The LoRA set-up training would use: the user's ``LoraConfig`` (``SFTTrainer(peft_config=...)``), or
    the one ``trl sft`` builds from ModelConfig fields (``use_peft``, ``lora_r``: TRL's defaults r=16,
    alpha=32), or None (full fine-tuning)."""
    if peft_config is not None:
        return peft_config
    if not (config.get("use_peft") or config.get("lora_r")):
        return None
    fields = {"r": config.get("lora_r", 16), "lora_alpha": config.get("lora_alpha", 32)}
    if config.get("lora_target_modules"):
        fields["target_modules"] = config["lora_target_modules"]
    return P._peft_config_from(fields)


def _precision_and_lr_findings(config, precision, args, loaded, tokenizer, prepared, peft) -> list[Finding]:
    """The learning rate against the usual range (a warning), and fp16's range measured on the set-up's
    own first optimizer steps (``doctor_precision``): an error only when the measured activations leave
    fp16's range, never for a flag or a rate alone."""
    model_obj, why_unloaded = loaded
    findings = []
    low, high = LR_RANGES["lora" if peft is not None else "full"]
    lr, kind = args.learning_rate, "LoRA" if peft is not None else "full fine-tuning"
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
        findings.append(Finding("info", "fp16-range", "fp16=True: the activation range was not measured",
                                why_unloaded or "no tokenized rows to run the model on",
                                "run the doctor where it can load the weights (--max-load-gb), or use bf16 "
                                "(float32's range) where the hardware has it", "06"))
        return findings
    rows = [ids[:P.PROBE_TOKENS] for ids in prepared["input_ids"][:P.PROBE_ROWS]]
    peaks, where = P._activation_peaks(model_obj, rows, lr, peft)
    before, worst = peaks[0], (math.nan if any(p != p for p in peaks) else max(peaks))
    trained = "LoRA adapters" if peft is not None else "all weights"
    run = (f"{len(peaks) - 1} AdamW steps at learning_rate={lr:g} on {trained} (a float32 copy, "
           f"{len(rows)} rows)")
    fix = ("use bf16 (float32's range) or fp32; if fp16 is a must, lower the learning rate and keep "
           "max_grad_norm")
    if before * P.FP16_HEADROOM > P.FP16_MAX:
        findings.append(Finding("error", "fp16-overflow-risk", "fp16 training risks overflow to inf/NaN",
                                f"activations already reach {before:.3g} in {where} before training "
                                f"({P.FP16_MAX / before:.3g}x below fp16's max {P.FP16_MAX:g})", fix, "06"))
    elif not worst <= P.FP16_MAX or P._growth(peaks)[1] <= P.PROBE_HORIZON:
        slope, steps = P._growth(peaks)
        when = (f"past fp16's max {P.FP16_MAX:g}" if steps == 0 else
                f"growing {slope:.3g} a step: at that rate past fp16's max {P.FP16_MAX:g} in ~{steps:.0f} "
                "more steps")
        findings.append(Finding("error", "fp16-overflow-risk", "fp16 training overflows to inf/NaN",
                                f"measured: after {run} activations reach {worst:.3g} in {where} (from "
                                f"{before:.3g}), {when}", fix, "06"))
    elif worst * P.FP16_HEADROOM > P.FP16_MAX:
        findings.append(Finding("warning", "fp16-range", "fp16: activations grow toward fp16's max",
                                f"measured: after {run} they reach {worst:.3g} in {where} (from "
                                f"{before:.3g}), within {P.FP16_HEADROOM:g}x of fp16's max {P.FP16_MAX:g}",
                                fix, "06"))
    else:
        findings.append(Finding("info", "fp16-range", f"fp16: activations peak at {worst:.3g} ({where})",
                                f"measured: {before:.3g} before and {worst:.3g} after {run}; "
                                f"{P.FP16_MAX / max(worst, 1e-30):.3g}x headroom below fp16's max "
                                f"{P.FP16_MAX:g}", "bf16 removes the question where the hardware has it",
                                "06"))
    return findings


def _load_dtype_findings(config, precision, source, model_obj, peft) -> list[Finding]:
    """The dtype the weights train in against the precision flags. ``SFTTrainer`` loads a model path in
    float32 unless ``model_init_kwargs`` says otherwise; a model you load yourself with transformers 5's
    ``from_pretrained`` keeps the checkpoint's dtype. fp16 weights under ``fp16=True`` fail at the first
    step: the GradScaler refuses to unscale fp16 gradients (measured: ``ValueError: Attempting to unscale
    FP16 gradients.``). LoRA adapters train in float32 (peft upcasts them), so only full fine-tuning."""
    requested = (config.get("model_init_kwargs") or {}).get("dtype") or (
        config.get("model_init_kwargs") or {}).get("torch_dtype")
    if model_obj is not None and source is None:  # a (model, tokenizer) pair: its weights as they are
        dtype, how = str(next(model_obj.parameters()).dtype).removeprefix("torch."), "the model you pass"
    elif requested not in (None, "auto"):
        dtype, how = str(requested).removeprefix("torch."), "model_init_kwargs"
    else:
        stored = P._checkpoint_dtype(source) if source is not None else None
        if requested == "auto":
            dtype, how = stored, "model_init_kwargs dtype='auto' (the checkpoint's)"
        else:
            if precision["fp16"] and peft is None and stored == "float16":
                return [Finding("info", "load-dtype", "SFTTrainer loads this float16 checkpoint in float32",
                                "a model path with no model_init_kwargs dtype: TRL loads float32, which fp16 "
                                "mixed precision needs; from_pretrained() yourself (transformers 5: the "
                                "checkpoint's dtype) gives float16 weights, and fp16 training then fails",
                                "load it with dtype=torch.float32 when you load it yourself", "06")]
            return []
    if dtype == "float16" and precision["fp16"] and peft is None:
        return [Finding("error", "load-dtype", "fp16=True on float16 weights fails at the first step",
                        f"the weights are float16 ({how}); full fine-tuning with fp16 mixed precision needs "
                        "float32 weights: the GradScaler raises 'ValueError: Attempting to unscale FP16 "
                        "gradients.'",
                        "load the model in float32 (model_init_kwargs={'dtype': 'float32'}, or "
                        "from_pretrained(..., dtype=torch.float32)), or train LoRA adapters", "06")]
    if dtype in ("float16", "bfloat16") and not (precision["fp16"] or precision["bf16"]) and peft is None:
        return [Finding("info", "load-dtype", f"the weights train in pure {dtype}, without float32 master "
                        "weights", f"the weights are {dtype} ({how}) and no mixed-precision flag is set",
                        "fine for many runs; an update smaller than the weight's precision is lost: load in "
                        "float32 with bf16=True for mixed precision", "06")]
    return []


# ---------------------------------------------------------------------------------------------
# The API and the command
# ---------------------------------------------------------------------------------------------

def _as_rows(data, sample: int | None = None, seed: int = 0) -> tuple[list[dict], int]:
    """``(rows, how many the data holds)``: all rows, or a seeded sample of ``sample``; each row carries its
    index in the data as ``_doctor_row`` (the row ids the findings quote)."""
    import random

    if isinstance(data, (str, Path)):
        return _read_jsonl(data, sample, seed)
    if not (isinstance(data, (list, tuple)) or hasattr(data, "column_names")):  # a datasets.Dataset
        raise DoctorInputError(f"data must be a JSONL path or a list of rows, got {type(data).__name__} — "
                               "the doctor checks each row as TRL would read it — pass e.g. 'train.jsonl' "
                               "or [{'messages': [...]}, ...].")
    total = len(data)
    if not total:
        raise DoctorInputError("the data has no rows — there is nothing to check — pass a JSONL path or a "
                               "non-empty list of rows.")
    picked = range(total) if sample is None or total <= sample else sorted(
        random.Random(seed).sample(range(total), sample))
    rows = [data[i] for i in picked]  # a Dataset reads only these rows
    _check_rows(rows, lambda i: f"row {picked[i]}")
    return [{**dict(r), "_doctor_row": i} for i, r in zip(picked, rows)], total


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


def read_peft_config(peft_config=None):
    """The ``peft.LoraConfig`` a practitioner passes to ``SFTTrainer(peft_config=...)``: from a LoraConfig, a
    dict of its fields or a JSON file of them; ``None`` (full fine-tuning) stays None. The doctor measures
    the fp16 range and judges the learning rate with it."""
    from peft import LoraConfig, PeftConfig

    if peft_config is None or isinstance(peft_config, PeftConfig):
        return peft_config
    peft_config = _json_object(peft_config, "peft config", "LoraConfig", "--peft-config", "full fine-tuning",
                               '{"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}')
    fields = LoraConfig.__dataclass_fields__
    for key in peft_config:
        if key not in fields:
            hint = _did_you_mean(key, fields)
            raise DoctorInputError(f"peft config key {key!r} is not a LoraConfig field{hint} — "
                                   "LoraConfig(**it) raises TypeError — fix the spelling against "
                                   "LoraConfig's fields.")
    for key, kinds in (("r", (int,)), ("lora_alpha", (int, float)), ("lora_dropout", (int, float))):
        value = peft_config.get(key, 1 if key != "lora_dropout" else 0)
        if isinstance(value, bool) or not isinstance(value, kinds) or value < 0 or (key == "r" and value < 1):
            raise DoctorInputError(f"peft config {key}={value!r} is not a {'whole ' if key == 'r' else ''}"
                                   f"number{' >= 1' if key == 'r' else ' >= 0'} — LoraConfig stores it "
                                   "unchecked and peft fails when it builds the adapters — write e.g. "
                                   "{\"r\": 16, \"lora_alpha\": 32, \"lora_dropout\": 0.05}.")
    try:
        return P._peft_config_from(peft_config)
    except (TypeError, ValueError) as exc:
        raise DoctorInputError(f"LoraConfig rejects these fields: {str(exc)[:200]} — SFTTrainer would "
                               "fail the same way — fix the field it names.") from None


def diagnose(model, data, config=None, *, max_length: int | None = None, forward: bool = True,
             peft_config=None, num_processes: int = 1, max_load_gb: float = P.LOAD_LIMIT_GB,
             sample: int | None = SAMPLE_ROWS, seed: int = 0, trainer=None) -> Report:
    """Check a fine-tuning set-up; return a ``Report`` (a list of ``Finding``s, errors first).

    ``model``: a local directory, a hub id (offline: from the cache) or a ``(model, tokenizer)``
    pair; ``data``: a JSONL path or a list of rows (``messages`` or ``prompt``/``completion``);
    ``config``: a dict or JSON path of SFTConfig fields; ``max_length`` overrides the config's;
    ``peft_config``: the ``LoraConfig`` (or a dict / JSON path of its fields) you pass to
    ``SFTTrainer(peft_config=...)``; ``num_processes``: the processes training runs on (torchrun's
    ``--nproc-per-node`` x nodes), which share each optimizer step; ``max_load_gb``: the largest checkpoint
    the fp16 check loads; ``sample``: how many rows to check, a uniform random draw seeded by ``seed``
    when the data holds more (``None``: every row; a report on a sample quotes each rate with its 95 %
    interval for the whole data); ``trainer``: your own ``SFTTrainer`` subclass (or ``"module:Class"``),
    whose loss lesson 01's split test checks under gradient accumulation. ``forward=False`` skips loading
    weights (the fp16 check then says it did not measure). Raises ``DoctorInputError`` on bad input (a
    set-up the doctor would have to guess at), before any measurement: the cheap checks (files, rows,
    arguments) first, then the configs.

    Example (the course model, eight rows)::

        from course_utils.doctor import diagnose
        rows = [{"prompt": f"Q: {a} plus {a}?", "completion": f" {2 * a}."} for a in range(8)]
        report = diagnose("tiny-qwen", rows, {"learning_rate": 2e-5})
        print(report.exit_code)  # 0: no error
    """
    if not isinstance(forward, bool):
        raise DoctorInputError(f"forward={forward!r} must be True or False — it switches the forward pass of "
                               "the fp16 check — pass forward=False to skip loading weights.")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise DoctorInputError(f"num_processes={num_processes!r} must be a whole number >= 1 — it is how "
                               "many processes share each optimizer step — pass e.g. 8 for torchrun "
                               "--nproc-per-node 8 (1 for a single GPU or CPU).")
    if isinstance(max_load_gb, bool) or not isinstance(max_load_gb, (int, float)) or not max_load_gb >= 0:
        raise DoctorInputError(f"max_load_gb={max_load_gb!r} must be a number of GB >= 0 — the fp16 check "
                               "loads no checkpoint larger — pass e.g. 16 (0: never load weights).")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 1):
        raise DoctorInputError(f"sample={sample!r} must be a whole number of rows >= 1, or None for every "
                               "row — the doctor checks that many rows — pass e.g. 2000 (--sample 2000), or "
                               "None (--all).")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DoctorInputError(f"seed={seed!r} must be a whole number — it picks the sampled rows "
                               "reproducibly — pass e.g. 0.")
    max_length = _check_max_length(max_length)
    config = read_config(config)
    rows, total = _as_rows(data, sample, seed)
    try:
        trainer_cls = None if trainer is None else DT._import_trainer(trainer)
    except ValueError as exc:
        raise DoctorInputError(str(exc)) from None
    _check_model(model)
    _check_config(config)
    peft = _lora_config(config, read_peft_config(peft_config))
    source, model_obj, tokenizer = _model_and_tokenizer(model)
    args, precision = _build_args(config, max_length)
    form = _form(rows)
    setup = types.SimpleNamespace(data=data, config=config, precision=precision, source=source,
                                  model=model_obj, forward=forward, peft=peft, num_processes=num_processes,
                                  max_load_gb=max_load_gb, trainer=trainer_cls)
    sampled = total if len(rows) < total else None
    token = _SAMPLED.set(sampled)
    try:
        with no_progress_bars():
            report = _run_checks(rows, form, tokenizer, args, setup)
    finally:
        _SAMPLED.reset(token)
    if sampled:
        report.append(Finding("info", "sample", f"checked a random sample of {len(rows):,} of {total:,} rows "
                              f"(seed {seed})", "counts and row ids are the sample's; each rate is quoted "
                              "with its 95 % interval for all the rows",
                              "--all (sample=None) checks every row: exact counts, in time proportional to "
                              "the rows (README: the doctor at scale)"))
    return report


def _loaded_model(setup):
    """``(model, why not)`` for the fp16 measurement: the caller's model, or the checkpoint loaded within
    the size limit (``doctor_precision._load_bounded``), or None and the reason."""
    if setup.model is not None:
        return setup.model, None
    if not setup.forward:
        return None, "forward=False (--no-forward): the doctor was asked not to load the weights"
    if not setup.precision["fp16"] or setup.source is None:
        return None, None
    return P._load_bounded(setup.source, setup.max_load_gb)


def _run_checks(rows, form, tokenizer, args, setup) -> Report:
    from jinja2 import TemplateError

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
    completion_only = internals.sft_completion_only(args, form.startswith("prompt_completion"))
    prepared = kept = None
    # rows without an answer are reported above; the rest is measured without them (TRL would refuse them)
    skip = set(_rows_without_answer(rows, form)) if args.assistant_only_loss else set()
    try:
        dataset, load_findings = _trl_dataset(setup.data, rows)
    except Exception as exc:  # noqa: BLE001
        dataset, load_findings = None, _could_not_check("data-unloadable", exc)
    findings += load_findings
    if trainable and dataset is not None and len(skip) < len(rows):
        try:
            kept = dataset.select([i for i, r in enumerate(dataset["_doctor_row"]) if r not in skip])
            prepared = _prepare(tokenizer, kept, args, chat_template, completion_only,
                                max_length=None, packing=False)
        except (TemplateError, TypeError) as exc:  # a template that raises on a row: name the row
            findings += R._template_error_findings(kept, tokenizer, chat_template, exc, Finding) or [
                _preparation_failed(exc)]
        except (RuntimeError, ValueError, KeyError) as exc:  # TRL's own refusal is the finding
            findings.append(_preparation_failed(exc))
        except Exception as exc:  # noqa: BLE001
            findings += _could_not_check("trl-preparation", exc)
    # the stop the rows end with: the template's end of turn for chats; for plain text and prompt/completion
    # text, the tokenizer.eos_token TRL appends to each row ("Adding EOS")
    conversational = form in ("messages", "prompt_completion") or (
        form == "tokenized" and _rows_hold(rows, _end_of_turn_or_none(tokenizer)))  # rendered chats
    eot = _end_of_turn_or_none(tokenizer) if conversational else tokenizer.eos_token_id
    loaded = _loaded_model(setup)
    try:
        gen_eos = _generation_eos_ids(setup.source, loaded[0])
    except Exception as exc:  # noqa: BLE001
        gen_eos, findings = None, findings + _could_not_check("eos-mismatch", exc)
    findings += _guarded("stop-token-untrained", _stop_token_findings, tokenizer, prepared, eot, args,
                         chat_template)
    if gen_eos is not None:
        findings += _guarded("eos-mismatch", _eos_findings, tokenizer, eot, gen_eos, args, conversational)
    findings += _guarded("pad-is-eos", _pad_eos_findings, tokenizer, prepared, eot, args)
    masked = args.assistant_only_loss or (form.startswith("prompt_completion") and completion_only)
    stop_ids = {i for i in (eot, tokenizer.eos_token_id, *(gen_eos or [])) if i is not None}
    if form in ("messages", "prompt_completion"):  # chats: what the template renders of each message
        findings += _reasoning_and_tool_findings(kept, prepared, tokenizer, chat_template, masked, stop_ids)
    findings += _guarded("truncation", _truncation_findings, prepared, tokenizer, args, chat_template,
                         completion_only, setup.num_processes)
    findings += _guarded("packing", _packing_findings, prepared, tokenizer, args, chat_template,
                         completion_only)
    findings += _guarded("precision-and-learning-rate", _precision_and_lr_findings, setup.config,
                         setup.precision, args, loaded if setup.forward else (None, "forward=False"),
                         tokenizer, prepared, setup.peft)
    findings += _guarded("load-dtype", _load_dtype_findings, setup.config, setup.precision, setup.source,
                         setup.model, setup.peft)
    findings += _guarded("double-bos", _double_bos_findings, tokenizer, prepared)
    if form == "tokenized" and "labels" in rows[0]:
        findings += _guarded("labels-misaligned", _label_alignment_findings, prepared)
    findings += _guarded("right-padding", _padding_side_findings, tokenizer)
    findings += _guarded("trainer-accumulation", _trainer_findings, setup.trainer, args, setup.num_processes)
    return Report(sorted(findings, key=lambda f: SEVERITIES.index(f.severity)))


def _preparation_failed(exc: Exception) -> Finding:
    return Finding("error", "trl-preparation", "TRL's dataset preparation fails on these rows",
                   f"{type(exc).__name__}: {str(exc)[:200]}",
                   "fix the rows or the template it names; SFTTrainer would stop here", "04")


def _reasoning_and_tool_findings(dataset, prepared, tokenizer, chat_template, masked, stop_ids) -> list:
    """The reasoning and tool-call checks (``doctor_reasoning``), each through ``_guarded``, on the rows as
    TRL renders and labels them (``prepared``: untruncated, unpacked)."""
    if dataset is None or prepared is None:
        return []
    try:
        renders = R._renderings(dataset, prepared, tokenizer, chat_template, stop_ids)
    except Exception as exc:  # noqa: BLE001 — a check that cannot run is a finding, not a traceback
        return _could_not_check("reasoning-and-tools", exc)
    if not renders:
        return []
    template = chat_template or tokenizer.chat_template
    training = functools.cache(lambda: _family_training_template(template))  # computed once, when asked
    ctx = R._context(tokenizer, chat_template, masked, training, Finding)
    return [f for check, run in R.CHECKS.items() for f in _guarded(check, run, renders, ctx)]


def _family_training_template(template: str) -> tuple[str, str] | None:
    """``(name, text)`` of TRL's training template of ``template``'s own family, or None. A training template
    TRL swapped in is its own answer (no similarity to compute: gpt-oss's takes seconds)."""
    from trl import chat_template_utils as ctu

    for attribute in dir(ctu):
        if attribute.endswith("_training_chat_template") and getattr(ctu, attribute) == template:
            return attribute[: -len("_training_chat_template")], template
    family, _ = _template_family(template)
    name = _training_template_name(family) if family else None
    return None if name is None else (name, getattr(ctu, f"{name}_training_chat_template"))


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
    parser.add_argument("--peft-config", help="JSON object of peft.LoraConfig fields (what you pass to "
                        "SFTTrainer(peft_config=...)); leave out for full fine-tuning")
    parser.add_argument("--num-processes", type=int, default=1,
                        help="processes sharing each optimizer step (torchrun's --nproc-per-node x nodes)")
    parser.add_argument("--max-load-gb", type=float, default=P.LOAD_LIMIT_GB,
                        help=f"largest checkpoint (GB) the fp16 check loads (default {P.LOAD_LIMIT_GB:g})")
    parser.add_argument("--no-forward", action="store_true", help="skip loading weights (fp16 range check)")
    parser.add_argument("--sample", type=int, default=SAMPLE_ROWS,
                        help=f"rows to check, a seeded random sample when the data holds more (default "
                        f"{SAMPLE_ROWS}); rates come with 95%% intervals")
    parser.add_argument("--all", action="store_true", help="check every row (exact counts; slower)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--trainer", help="your SFTTrainer subclass as module:Class: lesson 01's split test "
                        "checks its loss under gradient accumulation")
    options = parser.parse_args(argv)
    try:
        report = diagnose(options.model, options.data, options.config, max_length=options.max_length,
                          forward=not options.no_forward, peft_config=options.peft_config,
                          num_processes=options.num_processes, max_load_gb=options.max_load_gb,
                          sample=None if options.all else options.sample, seed=options.seed,
                          trainer=options.trainer)
    except DoctorInputError as exc:
        print(f"doctor: bad input: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if options.json else report)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
