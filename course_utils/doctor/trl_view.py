"""What TRL will build from a set-up, computed with TRL's own code and without a model: the
``SFTConfig``, the tokenizer as ``SFTTrainer.__init__`` leaves it, the dataset as ``trl sft`` loads it, the
rows ``SFTTrainer._prepare_dataset`` would train (only through ``course_utils.internals``), the stop token a
chat row teaches, and the training template TRL ships for a template's family.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import multiprocessing as mp
import os
import pickle
import re
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

from .. import internals
from ..data import IGNORE_INDEX, end_of_turn_id, first_special_after
from ..grader_process import FORK_WARNING
from .inputs import DoctorInputError
from .report import Finding

# A room of the doctor, not an API: its names serve the package; users import ``course_utils.doctor``
__all__ = []

# A template is of a shipped family when it uses the same turn markers (Jaccard >= 0.5) and is this similar
# (difflib ratio, not quick_ratio: quick_ratio only compares character counts and put Llama next to Qwen3)
FAMILY_SIMILARITY = 0.6


def sft_args(config: dict, max_length=None):
    """``(SFTConfig, user's precision flags)`` for a checked config dict (``validate_config``).

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


def trl_dataset(data, rows: list[dict]):
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


PARALLEL_ROWS = 2000  # from here on, rows to tokenize are prepared on every core if the config sets no
#                       dataset_num_proc (--all on a large file; TRL's output is the same)


def prepare(tokenizer, dataset, args, chat_template, completion_only_loss, **overrides):
    """The rows TRL's ``SFTTrainer`` would train (tokenize, label, truncate, drop, pack), without a model
    (``internals.prepare_sft_dataset``); ``overrides`` replace SFTConfig fields (e.g. ``max_length``)."""
    return Preparation(tokenizer, dataset, args, chat_template, completion_only_loss, **overrides).result()


class Preparation:
    """``prepare``, started at once and read with ``result()``: the caller does other work meanwhile.

    Many rows to tokenize (``PARALLEL_ROWS``, the config setting no ``dataset_num_proc``) are split into one
    contiguous shard per core, each prepared by TRL's own ``_prepare_dataset`` in a forked process, and
    joined in order; ``then`` (a function of prepared rows, row by row) runs on each shard as soon as it is
    prepared, and ``after`` holds its results, one per shard (None where the rows were prepared in one
    process, or ``then`` raised: the caller computes it itself). Why not ``dataset_num_proc``: datasets
    starts a pool and a manager process for each of TRL's maps and pickles the tokenizer and every shard
    in and out of them (measured on 4,000 chats: ~30 % more CPU than one process, which ate the gain on a
    loaded 2-core machine); a fork inherits the tokenizer and the rows, and each shard's rows cross back
    once, as an Arrow file. TRL's maps and its filter work row by row, so the joined shards are the rows
    one process gives (a test compares them). A shard that fails is prepared again here, in one process,
    which raises TRL's own error for the caller.
    """

    def __init__(self, tokenizer, dataset, args, chat_template, completion_only_loss, then=None, **overrides):
        args = _replace(args, shuffle_dataset=False, **overrides)  # the config's dataset_num_proc: TRL's own
        self._prepare = functools.partial(internals.prepare_sft_dataset, tokenizer=tokenizer, args=args,
                                          chat_template=chat_template,
                                          completion_only_loss=completion_only_loss)
        self.dataset, self._shards, self._folder = dataset, [], None  # the rows handed to TRL
        self._then, self.after = then, None
        if (args.dataset_num_proc is None and len(dataset) >= PARALLEL_ROWS
                and "input_ids" not in dataset.column_names and "fork" in mp.get_all_start_methods()
                and (cores := _cores()) > 1):
            try:
                self._fork(cores)
            except Exception:  # noqa: BLE001 — no children here (a daemonic process may have none): one process
                self._stop()

    def _fork(self, shards: int) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="doctor-prepare-")
        bounds = [len(self.dataset) * i // shards for i in range(shards + 1)]
        # as datasets does around its own forks: a tokenizer whose threads ran in this process would warn
        # (and turn its threads off) in each child
        before = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            for i in range(shards):
                path = os.path.join(self._folder.name, f"{i}.arrow")
                rows = self.dataset.select(range(bounds[i], bounds[i + 1]))
                child = mp.get_context("fork").Process(target=_prepare_shard, daemon=True,
                                                        args=(self._prepare, self._then, rows, path))
                with warnings.catch_warnings():  # 3.12+ warns of a fork with threads (a notebook's kernel)
                    warnings.filterwarnings("ignore", message=FORK_WARNING, category=DeprecationWarning)
                    child.start()
                self._shards.append((child, path))
        finally:
            if before is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = before

    def result(self):
        """TRL's prepared rows (raises what TRL's preparation raises)."""
        if not self._shards:
            return self._prepare(self.dataset)
        import pyarrow as pa
        from datasets import Dataset, concatenate_datasets

        try:
            for child, _ in self._shards:
                child.join()
            if all(child.exitcode == 0 for child, _ in self._shards):
                parts = [Dataset(pa.ipc.open_file(pa.OSFile(path)).read_all()) for _, path in self._shards]
                joined = concatenate_datasets(parts)
                if self._then is not None:
                    after = [pickle.loads(Path(f"{path}.then").read_bytes()) for _, path in self._shards]
                    self.after = None if _FAILED in after else after
                return joined
        except Exception:  # noqa: BLE001 — shards that do not join: one process, below, gives the answer
            pass
        finally:
            self._stop()
        return self._prepare(self.dataset)  # a shard failed: TRL's own error, raised in this process

    def _stop(self) -> None:
        for child, _ in self._shards:
            if child.is_alive():
                child.kill()
                child.join()
        self._shards = []
        if self._folder is not None:
            self._folder.cleanup()


def _cores() -> int:
    """The shards to prepare in: the cores this process may run on (a container's CPU set, not the
    machine's; at most 8) — or 1 when the machine's cores were busy while the doctor started. Why: on a
    machine shared with other work, the shards get no more CPU than one process would (Linux shares it
    between sessions) and only add their own cost (measured on 4,000 chats with another job on the second
    of 2 cores: ~0.9 CPU s more, no sooner)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    idle = _idle_cores()
    return 1 if idle is not None and idle < 0.5 else min(cores, 8)


def _cpu_times() -> tuple[float, int, int] | None:
    """``(when, idle, all)`` jiffies of the machine's cores (Linux's /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            ticks = [int(t) for t in stat.readline().split()[1:9]]  # user nice system idle iowait ... steal
    except (OSError, ValueError):
        return None
    return time.monotonic(), ticks[3] + ticks[4], sum(ticks)


_STARTED = _cpu_times()  # as the doctor's checks are imported: the window _idle_cores looks back over


def _idle_cores() -> float | None:
    """How many cores sat idle, on average, since the doctor's checks were imported (the seconds of
    imports and reading before TRL's preparation; in a session that imported them long ago, the next
    0.2 s). None where the machine does not say."""
    start = _STARTED
    if start is None or time.monotonic() - start[0] > 60:
        start = _cpu_times()
        time.sleep(0.2)
    end = _cpu_times()
    if start is None or end is None or end[2] <= start[2]:
        return None
    return os.cpu_count() * (end[1] - start[1]) / (end[2] - start[2])


_FAILED = "then raised"  # a shard's ``then`` that raised: the caller computes it again (and sees why)


def _prepare_shard(prepare, then, rows, path: str) -> None:
    """In a forked child: TRL's preparation of ``rows`` to an Arrow file at ``path``, and ``then`` of the
    prepared rows pickled beside it (exit status 1 and no traceback when the preparation raises: the parent
    prepares the rows again and raises TRL's error itself)."""
    import pyarrow as pa

    try:
        prepared = prepare(rows)
        table = prepared.with_format("arrow")[:]  # the filter's row selection applied
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    except Exception:  # noqa: BLE001
        sys.exit(1)
    if then is not None:
        try:
            result = then(prepared)
        except Exception:  # noqa: BLE001 — the check that asked for it runs it again and reports what failed
            result = _FAILED
        Path(f"{path}.then").write_bytes(pickle.dumps(result))


def _flat(prepared, column: str):
    """``(values, starts, lengths)`` of a list column of TRL's prepared rows as numpy arrays: every row's
    tokens end to end, where each row starts, how long it is. Why: a Python pass over each label of each row
    took ~0.4 s per check on 4,000 chats of ~1,500 tokens (``--all``); numpy reads Arrow's buffers in ms."""
    import numpy as np
    import pyarrow.compute as pc

    cells = prepared.with_format("arrow")[:].column(column)  # a filter's row selection applied
    lengths = pc.list_value_length(cells).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(cells).to_numpy(zero_copy_only=False)
    return values, np.cumsum(lengths) - lengths, lengths


def graded_bounds(prepared) -> dict:
    """``{row id: (first, last) graded position}`` of TRL's prepared rows, in their order (``None``: a row
    without a graded label) — what ``data.graded_positions`` gives at its ends (unshifted, label != -100)."""
    import numpy as np

    values, starts, _ = _flat(prepared, "labels")
    graded = np.flatnonzero(values != IGNORE_INDEX)
    row = np.searchsorted(starts, graded, side="right") - 1  # an empty row shares its start with the next
    rows, first = np.unique(row, return_index=True)
    last = np.append(first[1:], len(graded)) - 1
    ids = list(prepared["_doctor_row"])
    bounds = dict.fromkeys(ids)
    for i, a, b in zip(rows.tolist(), (graded[first] - starts[rows]).tolist(),
                       (graded[last] - starts[rows]).tolist()):
        bounds[ids[i]] = (a, b)
    return bounds


def longest_row(prepared) -> int:
    """The most tokens one of TRL's prepared rows holds."""
    return int(_flat(prepared, "labels")[2].max())


def rows_holding(prepared, column: str, token: int) -> int:
    """How many of TRL's prepared rows hold ``token`` in ``column`` (as ``token in row[column]``)."""
    import numpy as np

    values, starts, _ = _flat(prepared, column)
    return len(np.unique(np.searchsorted(starts, np.flatnonzero(values == token), side="right") - 1))


def rows_starting_twice(prepared, token: int) -> list:
    """Row ids of TRL's prepared rows whose ``input_ids`` start with ``token`` twice (``ids[:2] == [t, t]``).
    """
    import numpy as np

    values, starts, lengths = _flat(prepared, "input_ids")
    two = np.flatnonzero(lengths >= 2)
    twice = two[(values[starts[two]] == token) & (values[starts[two] + 1] == token)]
    ids = list(prepared["_doctor_row"])
    return [ids[i] for i in twice.tolist()]


def _replace(args, **changes):
    clone = types.SimpleNamespace(**{k: getattr(args, k) for k in args.__dataclass_fields__})
    for key, value in changes.items():
        setattr(clone, key, value)
    return clone


def apply_chat_template_path(tokenizer, args):
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


def trl_tokenizer(tokenizer, args):
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


def generation_eos_ids(source, model_obj) -> list[int]:
    from transformers import GenerationConfig

    if model_obj is not None:  # a loaded model: its generation_config is what generate() will use
        eos = model_obj.generation_config.eos_token_id
    else:
        try:
            eos = GenerationConfig.from_pretrained(source).eos_token_id
        except (OSError, ValueError):
            eos = None
    return [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def end_of_turn_or_none(tokenizer) -> int | None:
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


# turn markers in a template's text: <|eot_id|>, <｜User｜>, [INST], <start_of_turn>, <|im_end|>
_MARKER = re.compile(r"<\|[^|'\"\s]+\|>|<｜[^｜]+｜>|\[/?INST\]|<(?:start|end)_of_turn>")


def template_family(template: str) -> tuple[str | None, float]:
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


def training_template_name(family: str) -> str | None:
    """The training template of ``family`` TRL ships: its own (``qwen2_5``), else its base name's
    (``llama3_1`` → ``llama3``), else None. Never another family's."""
    from trl import chat_template_utils as ctu

    parts = re.sub(r"_v\d+$", "", family).split("_")
    for end in range(len(parts), 0, -1):
        name = "_".join(parts[:end])
        if isinstance(getattr(ctu, f"{name}_training_chat_template", None), str):
            return name
    return None


def family_training_template(template: str) -> tuple[str, str] | None:
    """``(name, text)`` of TRL's training template of ``template``'s own family, or None. A training template
    TRL swapped in is its own answer (no similarity to compute: gpt-oss's takes seconds)."""
    from trl import chat_template_utils as ctu

    for attribute in dir(ctu):
        if attribute.endswith("_training_chat_template") and getattr(ctu, attribute) == template:
            return attribute[: -len("_training_chat_template")], template
    family, _ = template_family(template)
    name = training_template_name(family) if family else None
    return None if name is None else (name, getattr(ctu, f"{name}_training_chat_template"))


def assistant_only_keeps_calls(tokenizer, chat_template: str | None) -> bool:
    """Would ``assistant_only_loss=True`` train rows with their tool calls? Only when TRL can give the
    template (``chat_template``, else the tokenizer's) ``{% generation %}`` markers — it has them, or TRL
    ships its family's training template — and the template it would train with renders ``tool_calls``:
    TRL's llama3_training.jinja does not."""
    tokenizer = copy.copy(tokenizer)
    if chat_template:
        tokenizer.chat_template = chat_template
    try:
        training = internals.sft_chat_template(tokenizer)
    except ValueError:  # TRL ships no training template of this family: SFTTrainer would refuse
        return False
    return "tool_calls" in (training or tokenizer.chat_template or "")
