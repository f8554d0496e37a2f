"""The doctor's inputs: the rows (a JSONL file, a list, a ``datasets.Dataset``), the SFTConfig and LoRA
fields, the model, and the arguments of ``diagnose`` — each read and checked before anything is measured.
Bad input raises ``DoctorInputError`` (exit status 2) with what was wrong, why, and how to fix it: the
doctor never reports on a set-up it had to guess at.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from .. import validate
from ..model import model_source, offline_error
from .data_checks import sharegpt_hint

# What this file offers users (re-exported by ``course_utils.doctor``); its other names serve the package
__all__ = ["DoctorInputError", "read_config", "read_jsonl", "read_peft_config"]

SAMPLE_ROWS = 2000  # rows checked by default: a rate's 95 % interval is then at most +-2.2 points
PEFT_KEYS = ("use_peft", "lora_r", "peft_config", "lora_alpha")  # TRL ModelConfig fields a config may carry


class DoctorInputError(ValueError):
    """Bad input to the doctor (exit status 2): the message says what, why and how to fix it."""


def read_jsonl(path) -> list[dict]:
    """The rows of a JSONL file; a malformed line raises ``DoctorInputError`` naming its number."""
    return _read_jsonl(path, sample=None, seed=0)[0]


class Rows(list):
    """The rows ``read_rows`` returns (a list), with what reading them found beside: ``counts`` (the
    duplicate and contradiction counts over every row of a file, ``data_checks.RowCounts``; None for a
    list or Dataset) and ``findings`` (the data folder's, ``data-folder-files``)."""

    counts = None
    findings: list = []


def _read_jsonl(path, sample: int | None, seed: int) -> tuple[Rows, int]:
    """``(rows, how many the file holds)``: every row, or a seeded uniform sample of ``sample`` of them
    (reservoir sampling while the file streams by: memory holds the sample, never the file). Every line is
    parsed, checked and counted (``data_checks.RowCounts``: copies and contradictions over the whole file),
    sampled or not: a malformed line is bad input wherever it is. ``path``: a JSONL file (gzip-compressed
    too) or a data folder, whose files are those ``datasets.load_dataset(folder)`` would load."""
    import random

    from .data_checks import RowCounts

    if isinstance(path, (str, Path)) and Path(path).is_dir():
        files, folder_findings = folder_files(Path(path))
    else:
        files = [(_existing_file("data file", path, "the doctor reads the rows you would train on",
                                 "pass the path of a .jsonl file (one JSON object per line) or of a data "
                                 "folder"), "json")]
        folder_findings = []
    rng, kept, first_form, total, counts = random.Random(seed), [], None, 0, RowCounts()
    by_line = len(files) == 1 and files[0][1] == "json"  # a row's id: its line - 1, else its index
    for row, number, where in _records(files):
        try:
            first_form = _check_form(row, where, first_form)
        except DoctorInputError as exc:  # in a folder, say what it loads
            folder = f" (In the data folder, {folder_findings[0].what}.)" if folder_findings else ""
            raise DoctorInputError(f"{exc}{folder}") from None
        number = number if by_line else total + 1
        counts.add(row, first_form[0], number - 1)
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
    kept.sort(key=lambda entry: entry[2])  # file order: TRL's order, and row ids a reader can find
    # _doctor_index: the row's position among the file's rows, where datasets' JSON loader puts it
    rows = Rows({**row, "_doctor_row": number - 1, "_doctor_index": index} for row, number, index in kept)
    rows.counts, rows.findings = counts, folder_findings
    return rows, total


def _records(files):
    """``(row, line number, where)`` for each row of ``files`` (``(path, loader)`` pairs, in load order):
    JSON Lines (gzip by its magic bytes), CSV / TSV through ``csv``, text as one ``{"text": line}`` each."""
    import csv
    import gzip
    import io

    for path, loader in files:
        with path.open("rb") as raw:
            zipped = raw.read(2) == b"\x1f\x8b"
        try:
            handle = gzip.open(path, "rb") if zipped else path.open("rb")
            with handle:
                if loader == "csv":
                    text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
                    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
                    for number, row in enumerate(csv.DictReader(text, dialect=dialect), 2):
                        yield row, number, f"{path}: line {number}"
                    continue
                for number, line in enumerate(handle, 1):
                    line = _decoded(line, path, number)
                    if loader == "text":
                        yield {"text": line.rstrip("\r\n")}, number, f"{path}: line {number}"
                        continue
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise DoctorInputError(
                            f"{path}: line {number} is not valid JSON ({exc.msg} at column {exc.colno}) — "
                            "each line must be one JSON object — fix or remove that line.") from None
                    yield row, number, f"{path}: line {number}"
        except (gzip.BadGzipFile, EOFError, UnicodeDecodeError, csv.Error) as exc:
            raise DoctorInputError(f"{path} cannot be read ({type(exc).__name__}: {str(exc)[:120]}) — the "
                                   "doctor reads UTF-8 JSON Lines, gzip-compressed or not — fix or "
                                   "re-export the file.") from None


def _decoded(line: bytes, path: Path, number: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        compressed = next((s for s in (".bz2", ".xz", ".zst", ".zip", ".7z") if path.name.endswith(s)), None)
        hint = (f"decompress the {compressed} file first (the doctor reads plain or gzip-compressed JSONL)"
                if compressed else "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), or fix "
                "that line")
        raise DoctorInputError(f"{path}: line {number} is not UTF-8 (byte {line[exc.start]:#04x} at column "
                               f"{exc.start + 1}) — datasets' JSON loader and TRL read UTF-8 only — "
                               f"{hint}.") from None


# --- a data folder, resolved as datasets.load_dataset(folder) resolves it (datasets 4.x, data_files.py) ---
_SEP = "-._ 0-9"
_SPLITS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
           "test": ("test", "testing", "eval", "evaluation")}
_IGNORED = {"README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip",
            "dataset_dict.json"}
# the loader of each extension (load.py's _EXTENSION_TO_MODULE; "media": its image, audio, video, bio ones)
_LOADERS = {**dict.fromkeys((".json", ".jsonl", ".ndjson"), "json"), ".csv": "csv", ".tsv": "csv",
            ".txt": "text", **dict.fromkeys((".parquet", ".geoparquet", ".gpq"), "parquet"),
            ".arrow": "arrow", ".md": "harbor", ".toml": "harbor", ".eval": "eval", ".xml": "xml",
            ".tar": "webdataset", ".lance": "lance", ".vortex": "vortex", ".h5": "hdf5", ".hdf5": "hdf5",
            ".conll": "conll", ".conllu": "conll", ".tsfile": "tsfile", ".zip": "zip"}
_MEDIA = set("png jpg jpeg gif bmp tif tiff webp ico jfif apng wav mp3 flac ogg opus aiff mp4 mkv mov avi "
             "webm m4v mpg mpeg flv wmv pdf fa fasta fna ffn faa frn afa gb gbk genbank fq fastq pdb ent cif "
             "mmcif ply stl glb gltf".split())


def _folder_patterns() -> list[dict]:
    """datasets' default patterns, in the order it tries them: the first group that matches a file wins."""
    in_dir = ("**/{k}/**", "**/{k}[{s}]*/**", "**/*[{s}]{k}/**", "**/*[{s}]{k}[{s}]*/**")
    in_name = ("**/{k}[{s}]*", "**/*[{s}]{k}[{s}]*")
    return [{"logs": ["**/*.eval"]}, {"test": ["**/task.toml", "**/instruction.md"]},
            *({split: [p.format(k=k, s=_SEP) for k in keys for p in pats] for split, keys in _SPLITS.items()}
              for pats in (in_dir, in_name)), {"train": ["**"]}]


def _glob(pattern: str):
    """fsspec's glob as a regex on a relative path: ``**/`` any folders (or none), ``*`` within one name."""
    import re

    parts = re.split(r"(\*\*/|\*\*|\*|\[[^\]]*\])", pattern)
    table = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*"}
    return re.compile("".join(table.get(p) or (p if p.startswith("[") else re.escape(p)) for p in parts))


def _loaders(name: str) -> list[str]:
    """The loaders of a file's suffixes (``a.jsonl.gz``: json), as datasets counts them."""
    suffixes = name.rsplit("/", 1)[-1].split(".")[1:]
    return [x for s in suffixes if (x := _LOADERS.get("." + s) or ("media" if s.lower() in _MEDIA else None))]


def folder_files(folder: Path) -> tuple[list[tuple[Path, str]], list]:
    """``([(file, loader)], findings)``: the train split's files ``datasets.load_dataset(folder)`` loads
    (hidden and ``__`` entries skipped, ``README.md`` and the other card files ignored; the first pattern
    group that matches a file — sharded ``data/{split}-NNNNN-of-NNNNN``, split names in folder names, then in
    file names, then every file; of the train split, only the files of its most common extension's loader),
    and the ``data-folder-files`` finding: what loads, and the files left out."""
    import re
    from collections import Counter

    from .report import Finding

    every = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                   and not any(part.startswith((".", "__")) for part in p.relative_to(folder).parts))
    candidates = [f for f in every if f.rsplit("/", 1)[-1] not in _IGNORED]
    shard = r"-\d{5}-of-\d{5}[^/]*\.[^/]*"
    sharded = {m.group(1) for f in candidates if (m := re.fullmatch(rf"data/(\w+){shard}", f))}
    groups = [{s: [re.compile(rf"data/{s}{shard}")] for s in sharded}] if sharded else []
    groups += [{s: [_glob(p) for p in ps] for s, ps in g.items()} for g in _folder_patterns()]
    split_files = next(({s: [f for p in ps for f in candidates if p.fullmatch(f) and _loaders(f)]
                         for s, ps in g.items()} for g in groups
                        if any(p.fullmatch(f) for ps in g.values() for p in ps for f in candidates)), {})
    where, train = f"data folder {str(folder)!r}", split_files.get("train")
    if not train:
        raise DoctorInputError(f"{where} has no train split datasets would load (splits: "
                               f"{ {s: fs[:3] for s, fs in split_files.items()} }; files: {every[:8]}) — "
                               "trl sft trains on the folder's 'train' split — put the rows in train.jsonl "
                               "(or pass the file you train on as --data).")
    counts = Counter((ext, f) for f in train
                     for ext in {"." + x.lower() for x in f.split("/")[-1].split(".")[1:]})
    by_ext = Counter(ext for ext, _ in counts)
    favourites = (".parquet", ".lance", ".vortex", ".arrow", ".jsonl", ".json", ".csv")
    ranked = sorted(by_ext, key=lambda e: (by_ext[e], *(e == x for x in favourites), e), reverse=True)
    loader = next(_loaders("x" + e)[0] for e in ranked if _loaders("x" + e))
    extensions = "|".join(re.escape(e) for e, name in _LOADERS.items() if name in (loader, "zip"))
    keep = [f for f in train if re.fullmatch(rf".*({extensions})(\..+)?", f)]
    if loader not in ("json", "csv", "text"):
        raise DoctorInputError(f"{where} loads as datasets' {loader!r} files ({train[:4]}) — the doctor "
                               "reads JSON Lines, CSV and text rows — export the rows you train on as JSONL "
                               "(Dataset.to_json) and pass that file.")
    others = {s: fs for s, fs in split_files.items() if s != "train" and fs}
    left_out = [f for f in every if f not in keep and not any(f in fs for fs in others.values())]
    data_left = [f for f in left_out if set(_loaders(f)) & {"json", "csv", "text", "parquet", "arrow"}]
    more = f" and {len(left_out) - 8} more" if len(left_out) > 8 else ""
    finding = Finding(
        "warning" if data_left else "info", "data-folder-files",
        f"the folder's train split is {len(keep)} {loader} file(s) {keep[:6]}"
        + (f"; {len(data_left)} data file(s) in the folder are never loaded: {data_left[:6]}" if data_left
           else ""),
        f"datasets.load_dataset(folder), what trl sft does with a folder, takes the files its split-name "
        f"patterns match (every file when none does), then of the train split only those of its most common "
        f"extension's loader ({loader}); other splits: { {s: fs[:3] for s, fs in others.items()} or 'none'}; "
        f"left out: {left_out[:8]}{more} (README.md, scripts and notes are not training data); the doctor "
        "checks the files that load",
        "pass the training file itself (--data FILE, data_files=...), or name the files so that the ones you "
        "mean are the train split (train.jsonl, or data/train-00000-of-00001.jsonl)", "08")
    return [(folder / f, loader) for f in keep], [finding]


def _check_form(row, where: str, first):
    """``_check_row``, and the row in the first row's form ``first`` (returned: the form so far)."""
    _check_row(row, where)
    form = row_form([row])
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
        _check_messages(row["messages"], f"{where}: 'messages'", sharegpt_hint(row))
    elif not ("prompt" in row and "completion" in row) and "text" not in row:
        raise DoctorInputError(f"{where} has keys {sorted(row)}{sharegpt_hint(row)} — TRL reads 'messages', "
                               "'prompt'+'completion' or 'text' — rename the columns to one of these forms.")
    elif "completion" not in row and not isinstance(row["text"], str):  # a 'text' row
        raise DoctorInputError(f"{where}: 'text' is {row['text']!r:.40}, not a string — TRL tokenizes each "
                               "row's text as it is — write the row's text as a JSON string.")
    else:
        for column in ("prompt", "completion"):
            if isinstance(row.get(column), list):  # conversational prompt/completion: messages too
                _check_messages(row[column], f"{where}: '{column}'")


def _check_messages(messages, where: str, hint: str = "") -> None:
    """A list of ``{'role', 'content'}`` objects, and each tool call naming its function. ``hint``: what the
    row looks like instead (a ShareGPT row's ``from``/``value``), said in the error."""
    ok = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"].strip() and "content" in m
        for m in messages)
    if not ok:
        raise DoctorInputError(f"{where} must be a non-empty list of {{'role', 'content'}} objects with a "
                               f"role name{hint} — the chat template renders such a list (an empty one is no "
                               "conversation) — fix or remove that row.")
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise DoctorInputError(f"{where}, message {i}: 'tool_calls' is a {type(calls).__name__}, not a "
                                   "list — templates iterate over the calls — write [{\"type\": "
                                   "\"function\", \"function\": {\"name\": ..., \"arguments\": {...}}}].")
        for j, call in enumerate(calls):
            function = call.get("function", call) if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not (isinstance(name, str) and name.strip()):
                raise DoctorInputError(f"{where}, message {i}: tool call {j} has function name {name!r} — a "
                                       "call names the function to run, and without one the model is trained "
                                       "to call nothing — give each call its function's name.")


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


def validate_config(config: dict) -> None:
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
_AT_LEAST_1 = ("per_device_train_batch_size", "gradient_accumulation_steps")


def _check_config_value(key: str, value, field) -> None:
    """``value`` of SFTConfig's type for ``key``, one of its choices, a count >= 1, a float finite and
    >= 0 (``learning_rate`` > 0): SFTConfig stores a NaN ``max_grad_norm`` or -1 epochs without a word."""
    if key == "max_length":  # one check for it, the argument's and the config's
        validate_max_length(value, "config max_length")
        return
    kinds = _TYPES.get(str(field.type))
    is_bool = isinstance(value, bool)
    if kinds is not None and (not isinstance(value, kinds) or (is_bool and bool not in kinds)):
        names = " or ".join("null" if k is type(None) else "true/false" if k is bool else k.__name__
                            for k in kinds)
        raise DoctorInputError(f"config {key}={value!r} has type {type(value).__name__}, but SFTConfig's "
                               f"{key} is {names} — SFTConfig stores it unchecked and training reads it as "
                               f"that type — write it as {names} in the JSON.")
    choices, name = field.metadata.get("choices"), f"config {key}"
    try:
        if choices:
            validate.choice(name, value, choices, why="TRL knows only these")
        if key in _AT_LEAST_1 and value is not None:
            validate.positive_int(name, value, why="it counts rows or micro-batches, and nothing trains "
                                  "with fewer than one", fix="pass e.g. 8, or leave it out for TRL's default")
        elif float in (kinds or ()) and value is not None:
            validate.number(name, value, minimum=0, positive=key == "learning_rate",
                            why="a rate <= 0 trains nothing or backwards" if key == "learning_rate" else
                            "SFTConfig stores it unchecked, and training reads a NaN, infinite or negative "
                            "one as a rate, a scale or a count", fix=f"write a finite number (TRL's default: "
                            f"{field.default!r}), or leave it out")
    except (TypeError, ValueError) as exc:
        raise DoctorInputError(str(exc)) from None


def validate_max_length(max_length, name: str = "max_length") -> int | None:
    """The one check of a ``max_length``, the argument's (``--max-length``) and the config's."""
    if max_length is None:
        return None
    try:
        return validate.integer(name, max_length, minimum=1, why="it is the number of tokens TRL "
                                "truncates every row to, and no row fits in fewer than one", fix="pass e.g. "
                                "--max-length 512 (max_length=512), or leave it out for the config's (TRL's "
                                "default: 1024)")
    except ValueError as exc:
        raise DoctorInputError(str(exc)) from None


def _load_tokenizer(model):
    from transformers import AutoTokenizer

    try:
        source = model_source(model)
    except (ValueError, FileNotFoundError) as exc:
        raise DoctorInputError(str(exc)) from None
    try:
        return source, AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        offline = offline_error(source)
        if offline is not None:
            raise DoctorInputError(str(offline)) from None
        raise DoctorInputError(f"could not load a tokenizer from {str(source)!r} ({type(exc).__name__}: "
                               f"{str(exc)[:200]}) — the doctor needs the tokenizer you train with — pass a "
                               "directory saved with save_pretrained() or a hub id.") from None


def row_form(rows) -> str:
    first = rows[0]
    if "input_ids" in first:  # TRL's test too: a dataset with input_ids is "already processed"
        return "tokenized"
    if "messages" in first:
        return "messages"
    if "prompt" in first:
        return "prompt_completion" if isinstance(first["prompt"], list) else "prompt_completion_text"
    return "text"


def read_rows(data, sample: int | None = None, seed: int = 0) -> tuple[Rows, int]:
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
    out = Rows({**dict(r), "_doctor_row": i} for i, r in zip(picked, rows))
    if isinstance(data, (list, tuple)) and len(rows) < total:  # in memory: count copies over every row
        from .data_checks import RowCounts

        out.counts, form = RowCounts(), row_form(rows)
        for i, row in enumerate(data):
            out.counts.add(row if isinstance(row, dict) else {}, form, i)
    return out, total


def validate_model(model) -> None:
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


def model_source_and_tokenizer(model):
    if isinstance(model, tuple):  # (model, tokenizer) already loaded
        return None, model[0], model[1]
    source, tokenizer = _load_tokenizer(model)
    return source, None, tokenizer


def validate_options(*, forward, num_processes, max_load_gb, sample, seed) -> None:
    """``diagnose``'s options, each of its type and in its range (``DoctorInputError`` otherwise)."""
    try:
        validate.flag("forward", forward, why="it switches the forward pass of the fp16 check",
                      fix="pass forward=False to skip loading weights")
        validate.positive_int("num_processes", num_processes, why="it is how many processes share each "
                              "optimizer step", fix="pass e.g. 8 for torchrun --nproc-per-node 8 (1 for a "
                              "single GPU or CPU)")
        validate.number("max_load_gb", max_load_gb, minimum=0, why="the fp16 check loads no checkpoint "
                        "larger", fix="pass e.g. 16 (0: never load weights)")
        if sample is not None:
            validate.positive_int("sample", sample, why="the doctor checks that many rows", fix="pass e.g. "
                                  "2000 (--sample 2000), or None (--all) for every row")
        validate.seed("seed", seed)
    except (TypeError, ValueError) as exc:  # the CLI's exit 2: one line, what — why — fix
        raise DoctorInputError(str(exc)) from None


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
    why, fix = "LoraConfig stores it unchecked and peft fails (or trains nothing) with it", \
        'write e.g. {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "bias": "none"}'
    try:  # LoraConfig(bias="some") is built, and peft raises NotImplementedError when it makes the adapters
        if "r" in peft_config:
            validate.positive_int("peft config r", peft_config["r"], why=why, fix=fix)
        for key in ("lora_alpha", "lora_dropout"):
            if key in peft_config:
                validate.number(f"peft config {key}", peft_config[key], minimum=0, why=why, fix=fix)
        if "bias" in peft_config:
            validate.choice("peft config bias", peft_config["bias"], ("none", "all", "lora_only"),
                            why="peft builds the adapters' biases only these ways")
    except (TypeError, ValueError) as exc:
        raise DoctorInputError(str(exc)) from None
    try:
        return _peft_config_from(peft_config)
    except (TypeError, ValueError) as exc:
        raise DoctorInputError(f"LoraConfig rejects these fields: {str(exc)[:200]} — SFTTrainer would "
                               "fail the same way — fix the field it names.") from None


def lora_setup(config: dict, peft_config):
    """The LoRA set-up training would use: the user's ``LoraConfig`` (``SFTTrainer(peft_config=...)``), or
    the one ``trl sft`` builds from ModelConfig fields (``use_peft``, ``lora_*``: TRL's defaults r=16,
    alpha=32, dropout 0.05 — built by TRL's own ``get_peft_config``), or None (full fine-tuning)."""
    if peft_config is not None:
        return peft_config
    if not (config.get("use_peft") or config.get("lora_r")):
        return None
    from ..lora_coverage import lora_config_as_trl_builds

    try:  # TRL's own path (ModelConfig, then get_peft_config): its lora_dropout=0.05, target_parameters
        return lora_config_as_trl_builds({**config, "use_peft": True})
    except (TypeError, ValueError) as exc:
        raise DoctorInputError(f"trl sft cannot build a LoraConfig from these lora_* fields: "
                               f"{str(exc)[:200]} "
                               "— training would fail the same way — fix the field it names.") from None


def _peft_config_from(fields: dict):
    """A ``peft.LoraConfig`` from a dict of its fields (what a practitioner passes to
    ``SFTTrainer(peft_config=...)``); ``task_type`` defaults to causal LM."""
    from peft import LoraConfig

    return LoraConfig(**{"task_type": "CAUSAL_LM", **fields})
