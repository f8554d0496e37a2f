"""Bad input gets a clear error from every public function of the package — never a result, never a hang.

Every public function of every ``course_utils`` module (learner tools, the core, the checkers and their
case generators, the doctor, the watch; 260+) is called with the mistakes learners and users make. Where
the package can build a valid value for each required argument (``good_values``: the course model, its
tokenizer, a collated batch, tokenized examples, …) one argument at a time is replaced by a bad one of
each category, the others kept valid — so the check that must catch it is the one reached:

- ``None``; the wrong kind (a string for a number, one string for a list of strings, a list for a
  tensor, a tokenizer for a model and back); empty (``[]``, ``""``, ``{}``); negative (``-1``, ``-0.5``);
  a percentage where a fraction is meant (a good value in (0, 1] times 100).

Functions with an argument the sweep cannot build get ``None`` / ``[]`` / ``-1`` for each required
argument in turn (the others ``None``). Each call ends in one of: a what/why/fix error raised by
``course_utils`` (the message has the "what — why — fix" shape), another error (raw, from a library or
from our own indexing), a result, or a time-out. A result from ``None``, the wrong kind or empty input
is a silent wrong answer; so is a time-out. ~1,100 calls, ~10 s of one core: part of `make test`.
The figures are printed (``python tests/test_bad_input.py`` prints the whole table) and quoted in
the README.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
import signal
import sys
from collections import Counter

import pytest
import torch

import course_utils

# Never called: entry points that exit the process, the course's settings (they take no argument).
SKIP = re.compile(r"^(main|use_course_defaults)$")
# Modules whose functions are the validation itself: ``validate.x(name, value)`` is called by the package
# with a literal name, and its job is to raise on a bad ``value`` (its own tests check the messages).
# The reference answers (exercises/answers/) are what a learner writes in a cell: kept as short as theirs.
NOT_SWEPT = ("course_utils.validate",)
NOT_SWEPT_PACKAGES = ("course_utils.exercises.answers",)
# Functions for which None, empty or the wrong kind is valid input, with why.
ACCEPTS_ANYTHING = {
    "checks.close": "it compares any two values (None equals None): it is the checkers' comparison",
    "checks.plain": "None and empty values are plain values: it returns them as they are",
}
WHAT_WHY_FIX = re.compile(r".+ — .+ — .+", re.S)
PUBLIC_FACES = ("course_utils.doctor",)
SILENT = ("None", "wrong kind", "empty")


def public_functions():
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        if "course_model" in info.name or info.name in NOT_SWEPT or info.name.startswith(NOT_SWEPT_PACKAGES):
            continue
        module = importlib.import_module(info.name)
        for attr, fn in sorted(vars(module).items()):
            label = f"{info.name.removeprefix('course_utils.')}.{attr}"
            if (not attr.startswith("_") and _swept_kind(fn) and fn.__module__ == module.__name__
                    and not SKIP.match(attr) and label not in ACCEPTS_ANYTHING and _offered(info.name, attr)):
                yield label, fn


def _offered(module: str, attr: str) -> bool:
    """A package with a public face (``__all__``: the doctor) offers users only those names; the other names
    of its files serve the package and are called with what it built (issue 42's rooms)."""
    for package in PUBLIC_FACES:
        if module.startswith(package + "."):
            return attr in importlib.import_module(package).__all__
    return True


def _swept_kind(obj) -> bool:
    """Functions, and classes a user constructs (``SFTWatch``, ``StopCriterion``); not exceptions, and not
    dataclasses, which are records the package builds and hands back (``Setup``, ``Case``, ``Diagnosis``)."""
    if inspect.isfunction(obj):
        return True
    return (inspect.isclass(obj) and not issubclass(obj, BaseException)
            and not dataclasses.is_dataclass(obj))


def required_params(fn) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def good_values() -> dict:
    """A valid value for the argument names the package shares (``name -> value``)."""
    from trl import SFTTrainer  # noqa: F401 — imported once here (~10 s on a busy CPU), not inside a timed call

    from course_utils import load_course_model
    from course_utils.data import collate_right, make_chat_dataset, make_messages, tokenize_chat

    model, tokenizer = load_course_model()
    conversations = make_messages("add", 4, seed=0)
    examples = [tokenize_chat(tokenizer, m) for m in conversations]
    batch = collate_right(examples, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    return {
        "model": model, "tokenizer": tokenizer, "tok": tokenizer, "messages": conversations[0],
        "conversations": conversations, "examples": examples, "example": examples[0], "batch": batch,
        "micro_batches": [batch, batch], "batches": [batch, batch], "labels": batch["labels"],
        "input_ids": batch["input_ids"], "logits": logits, "seed": 0, "n": 2, "steps": 1, "k": 2,
        "batch_size": 2, "accum_steps": 2, "pad_token_id": tokenizer.pad_token_id, "max_length": 64,
        "lr": 1e-3, "template": tokenizer.chat_template, "chat_template": tokenizer.chat_template,
        "eot": "<|im_end|>", "dataset": make_chat_dataset("add", 4, seed=0),
    }


def bad_values(good) -> list[tuple[str, object]]:
    """The mistakes to try in place of ``good``, by category."""
    out = [("None", None)]
    if isinstance(good, bool):
        return out + [("wrong kind", "yes")]
    if isinstance(good, int):
        out += [("wrong kind", str(good)), ("negative", -1)]
    elif isinstance(good, float):
        out += [("wrong kind", str(good)), ("negative", -0.5)]
        if 0 < good <= 1:
            out.append(("percentage for a fraction", good * 100))
    elif isinstance(good, str):
        out += [("wrong kind", 3), ("empty", "")]
    elif isinstance(good, torch.Tensor):
        out += [("wrong kind", good.tolist()), ("empty", good[:0])]
    elif isinstance(good, dict):
        out += [("wrong kind", list(good.values())), ("empty", {})]
    elif isinstance(good, (list, tuple)):
        out += [("wrong kind", "x"), ("empty", [])]
    elif isinstance(good, torch.nn.Module):
        out.append(("wrong kind", "a model name"))
    else:  # a tokenizer, a dataset
        out.append(("wrong kind", 3))
    return out


class _OverTime(BaseException):  # not an Exception: no `except Exception` in the package swallows it
    pass


def _timeout(*_):
    raise _OverTime("over 20 s")


def classify(fn, kwargs) -> tuple[str, str]:
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(20)
    try:
        fn(**kwargs)
    except _OverTime:
        return "time-out", ""
    except Exception as exc:  # noqa: BLE001 - classifying, not handling
        message = str(exc)
        ours = "course_utils" in inspect.trace()[-1].filename
        clear = (isinstance(exc, (ValueError, TypeError, FileNotFoundError, TimeoutError))
                 and WHAT_WHY_FIX.match(message))
        if ours and clear:
            return "what/why/fix", message[:120]
        return "raw error", f"{type(exc).__name__}: {message[:100]}"
    finally:
        signal.alarm(0)
    return "result", ""


def measure(good: dict | None = None):
    good = good_values() if good is None else good
    rows = []
    for label, fn in public_functions():
        params = required_params(fn)
        if all(p in good for p in params):
            for target in params:
                for category, bad in bad_values(good[target]):
                    kwargs = {p: (bad if p == target else good[p]) for p in params}
                    rows.append((label, target, category, *classify(fn, kwargs)))
        else:
            for target in params:
                for category, bad in (("None", None), ("empty", []), ("negative", -1)):
                    kwargs = {p: (bad if p == target else None) for p in params}
                    rows.append((label, target, category, *classify(fn, kwargs)))
    return rows


@pytest.fixture(scope="module")
def rows():
    return measure()


def test_errors_from_bad_input_carry_what_why_fix(rows):
    errors = [r for r in rows if r[3] in ("what/why/fix", "raw error")]
    share = sum(r[3] == "what/why/fix" for r in errors) / len(errors)
    raw = [f"{label}({target}: {category}): {detail}" for label, target, category, outcome, detail in rows
           if outcome == "raw error"]
    assert share >= 0.9, f"{share:.0%} what/why/fix of {len(errors)} errors; raw errors:\n" + "\n".join(raw)


def test_no_silent_result_and_no_hang(rows):
    bad = [f"{label}({target}: {category})" for label, target, category, outcome, _ in rows
           if outcome == "time-out" or (outcome == "result" and category in SILENT)]
    assert not bad, "a result (or a time-out) from input that should have been refused:\n" + "\n".join(bad)


def test_the_sweep_reaches_every_module_and_the_check_it_aims_at(rows):
    """Every module with a public function or class that takes a required argument is swept (the rest,
    e.g. ``quiet``'s context managers, take keyword switches with defaults); and where the neighbours are
    valid, the error is about the argument that was made bad."""
    swept = {label.rsplit(".", 1)[0] for label, *_ in rows}
    expected = {label.rsplit(".", 1)[0] for label, fn in public_functions() if required_params(fn)}
    assert expected <= swept, expected - swept
    aimed = [r for r in rows if r[2] == "wrong kind"]
    named = sum(r[1] in r[4] for r in aimed)
    assert aimed and named >= 0.9 * len(aimed), f"{named} of {len(aimed)} wrong-kind errors name the argument"



# ---------------------------------------------------------------------------------------------
# The adversarial pass (issue 42): numbers that are not counts, text for a list, blank names, outputs over
# inputs, and both commands. Every public function whose required arguments the package can build is
# called with each optional number made bad in turn (the rest valid), each list made one string, each name
# made blank; the commands get each flag wrong. ~1,500 calls, ~2-4 min of one core: `make test-slow`.
# ---------------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
# a result from these is wrong whatever the parameter: NaN passes no comparison (a NaN tolerance accepts
# anything), "3" is not a number, True is not a count, 2.5 is not a number of rows
ALWAYS_WRONG = ("NaN", "text for a number", "bool for a number", "fraction for a count", "string for a list",
                "blank name")
# optional numbers for which a negative value, zero or infinity is meaningful, and why
NEGATIVE_OK = {"position": "an index: -1 is the last position"}
ZERO_OK = {
    "seed": "a seed", "skip": "how many to skip", "weight_decay": "no decay", "eps": "no epsilon",
    "momentum": "no momentum", "margin": "no margin", "beta": "no smoothing",
    "level": "the bottom of a range", "same": "identical", "leak": "none leaked",
    "reasoning_share": "no reasoning", "max_load_gb": "load nothing",
    "context_words": "no context", "skip_timeout": "no wait", "position": "the first position",
    "shown": "show none", "turns": "no extra turn", "lr": "a control run that does not move",
}
INFINITE_OK = {"timeout": "no time limit", "skip_timeout": "no time limit", "max_load_gb": "no load limit"}
FRACTION_OK = {"timeout": "seconds: 2.5 s is a time limit", "width": "inches", "height": "inches"}
BLANK_OK = {"text": "any text is read, an empty reply included"}  # text to read, not a name


def numeric_attacks(default) -> list[tuple[str, object]]:
    if isinstance(default, int):
        return [("NaN", NAN), ("infinite", INF), ("negative", -3), ("zero", 0), ("fraction for a count", 2.5),
                ("text for a number", "3"), ("bool for a number", True)]
    return [("NaN", NAN), ("infinite", INF), ("negative", -0.5), ("zero", 0.0), ("text for a number", "0.5"),
            ("bool for a number", True)]


def extra_good_values(good) -> dict:
    """Valid values for more of the names the package shares, so that more functions are reached with
    every neighbour valid."""
    from course_utils.data import make_messages

    conversations = make_messages("add", 2, seed=1)
    return {**good, "records": [{"text": "4<|im_end|>"}, {"text": "<think>x</think>5"}],
            "rows": [{"messages": c} for c in conversations], "histories": [c[:-1] for c in conversations],
            "values": [1.0, 2.0, 3.0, 4.0], "text": "The answer is 4.", "prompts": ["What is 2 plus 2?"],
            "name": "a check", "n_rows": 8, "stop_id": good["tokenizer"].convert_tokens_to_ids("<|im_end|>")}


def silent(name: str, category: str, default, outcome: str) -> bool:
    """Whether ``outcome`` (a result, or running on past the time limit) is a wrong answer for this slip."""
    if outcome not in ("result", "time-out"):
        return False
    if category in ALWAYS_WRONG:
        return not ((category == "fraction for a count" and name in FRACTION_OK)
                    or (category == "blank name" and name in BLANK_OK))
    if category == "negative":
        return name not in NEGATIVE_OK
    if category == "zero":  # a token id of 0 is a token (<|endoftext|> in the course's vocabulary)
        return (name not in ZERO_OK and not name.endswith("_id") and isinstance(default, (int, float))
                and default > 0)
    if category == "infinite":
        return name not in INFINITE_OK
    return False


def _signature(fn):
    try:
        return inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []


def adversarial(good: dict | None = None) -> list[tuple]:
    """``(function, argument, slip, outcome, detail, silent)`` for every call of the adversarial pass."""
    good = extra_good_values(good_values() if good is None else good)
    rows = []
    for label, fn in public_functions():
        required = required_params(fn)
        if not all(p in good for p in required):
            continue
        base = {p: good[p] for p in required}
        calls = []
        for param in _signature(fn):
            default = param.default
            numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) and numeric:
                calls += [(param.name, category, default, bad) for category, bad in numeric_attacks(default)]
        for name in required:
            if isinstance(good[name], (list, tuple)) and good[name] and not isinstance(good[name][0], int):
                calls.append((name, "string for a list", None, "some text"))
            if isinstance(good[name], str):
                calls.append((name, "blank name", None, "   "))
            if isinstance(good[name], int) and not isinstance(good[name], bool) and good[name] > 0:
                calls += [(name, "zero", good[name], 0), (name, "NaN", good[name], NAN)]
        for name, category, default, bad in calls:
            outcome, detail = classify(fn, {**base, name: bad})
            rows.append((label, name, category, outcome, detail, silent(name, category, default, outcome)))
    return rows


def _doctor_argv(tmp_path) -> list[str]:
    import json

    from course_utils.data import make_messages
    from course_utils.model import SHIPPED_MODELS

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in make_messages("add", 8, seed=0)))
    return ["--model", str(SHIPPED_MODELS["tiny-qwen"]), "--data", str(data), "--no-forward"]


def cli_cases(tmp_path) -> list[tuple[str, list[str]]]:
    """``(command, argv)``: each a user mistake on an otherwise valid command line."""
    good = _doctor_argv(tmp_path)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    (tmp_path / "list.json").write_text("[1, 2]")
    doctor = [[*good, flag, value] for flag, values in {
        "--max-length": ["0", "-5", "abc"], "--sample": ["0", "-1", "2.5"], "--num-processes": ["0", "-2"],
        "--max-load-gb": ["nan", "-1", "inf"], "--seed": ["-1", "x"],
        "--config": [str(folder), "", str(tmp_path / "list.json")],
        "--peft-config": [str(tmp_path / "list.json"), str(folder)], "--trainer": ["nomodule", ":Class"],
    }.items() for value in values]
    doctor += [["--model", "", *good[2:]], ["--model", str(folder), *good[2:]], [*good[:2], "--data", ""],
               [*good[:2], "--data", str(folder)], [*good[:2], "--data", str(tmp_path / "list.json")]]
    ship = [["--trained", str(folder), "--saved", str(folder), "--tolerance", t]
            for t in ("-1", "nan", "0", "inf")]
    ship += [["--trained", "", "--saved", str(folder)],
             ["--trained", str(tmp_path / "none"), "--saved", str(folder)],
             ["--trained", str(folder), "--saved", str(tmp_path / "list.json")]]
    return [("doctor", argv) for argv in doctor] + [("ship", argv) for argv in ship]


def run_command(command: str, argv: list[str]) -> tuple[int, str]:
    """``(exit status, stderr)`` of ``python -m course_utils.<command>`` run in this process; an exception
    that escapes the command is a traceback, status None."""
    import contextlib
    import io

    from course_utils.doctor.__main__ import main as doctor_main
    from course_utils.shipping import main as ship_main

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = {"doctor": doctor_main, "ship": ship_main}[command](argv)
    except SystemExit as exc:  # argparse: usage and "error:" on stderr, exit 2
        status = exc.code
    except Exception as exc:  # noqa: BLE001 - what a user would see as a traceback
        return None, f"Traceback: {type(exc).__name__}: {exc}"
    return status, err.getvalue()


def cli_outcome(status, stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if status != 2 or "Traceback" in stderr:
        return "raw error" if status is None or "Traceback" in stderr else "result"
    reason = lines[-1] if lines else ""
    clear = WHAT_WHY_FIX.match(reason) or ": error:" in reason  # argparse: usage, then "prog: error: ..."
    return "what/why/fix" if clear else "raw error"


@pytest.fixture(scope="module")
def adversarial_rows():
    return adversarial()


@pytest.mark.slow  # ~1,500 calls, some of which run a function to its end: `make test-slow`
def test_adversarial_pass_gets_no_silent_result(adversarial_rows):
    wrong = [f"{label}({name}: {category}) -> {outcome}" for label, name, category, outcome, _, bad
             in adversarial_rows if bad]
    assert not wrong, "accepted input that should have been refused:\n" + "\n".join(wrong)


@pytest.mark.slow
def test_adversarial_pass_errors_are_ours_and_say_what_why_fix(adversarial_rows):
    errors = [r for r in adversarial_rows if r[3] in ("what/why/fix", "raw error")]
    raw = [f"{label}({name}: {category}): {detail}" for label, name, category, outcome, detail, _
           in adversarial_rows if outcome == "raw error"]
    assert errors and len(raw) <= 0.05 * len(errors), (f"{len(raw)} raw errors of {len(errors)}:\n"
                                                        + "\n".join(raw))


@pytest.mark.slow
def test_both_commands_answer_every_mistake_with_exit_2_and_one_line(tmp_path):
    bad = []
    for command, argv in cli_cases(tmp_path):
        status, stderr = run_command(command, argv)
        if cli_outcome(status, stderr) != "what/why/fix":
            bad.append(f"{command} {' '.join(argv[-2:])}: exit {status}: {stderr.strip()[-200:]}")
    assert not bad, "\n".join(bad)


def _fake_adapter(root) -> object:
    """An adapter directory as peft writes one (a LoRA matrix and a trained embedding row)."""
    import json

    import torch as _torch
    from safetensors.torch import save_file

    from course_utils.model import SHIPPED_MODELS

    root.mkdir()
    save_file({"base_model.model.lm_head.lora_A.weight": _torch.zeros(2, 4),
               "base_model.model.embed_tokens.modules_to_save.weight": _torch.ones(3, 4)},
              str(root / "adapter_model.safetensors"))
    (root / "adapter_config.json").write_text(json.dumps({
        "base_model_name_or_path": str(SHIPPED_MODELS["tiny-qwen"]), "peft_type": "LORA",
        "modules_to_save": ["embed_tokens"], "r": 2}))
    return root


def test_no_output_is_written_over_an_input_or_a_folder_with_files(tmp_path):
    """An output path equal to, inside or around an input, or a folder that already holds files: refused,
    and every byte on disk as it was."""
    from course_utils import load_course_model
    from course_utils.exercises.lesson08 import broken_setup
    from course_utils.shipping import lora_only_copy
    from course_utils.templates import save_other_family_tokenizer

    adapter = _fake_adapter(tmp_path / "adapter")
    busy = tmp_path / "project"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    _, tokenizer = load_course_model()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    calls = {"lora_only_copy into the adapter": lambda: lora_only_copy(adapter, adapter),
             "lora_only_copy inside the adapter": lambda: lora_only_copy(adapter, adapter / "copy"),
             "lora_only_copy around the adapter": lambda: lora_only_copy(adapter, tmp_path),
             "lora_only_copy into a folder with files": lambda: lora_only_copy(adapter, busy),
             "save_other_family_tokenizer into a folder with files":
                 lambda: save_other_family_tokenizer(tokenizer, str(busy)),
             "broken_setup into a folder with files": lambda: broken_setup(0, busy)}
    for what, call in calls.items():
        with pytest.raises(ValueError, match=WHAT_WHY_FIX) as caught:
            call()
        assert "overwrite" in str(caught.value), what
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before, "a refused call changed the disk"


def summary(rows: list[tuple], label: str) -> str:
    counts = Counter(r[3] for r in rows)
    errors = counts["what/why/fix"] + counts["raw error"]
    wrong = sum(1 for r in rows if (r[5] if len(r) > 5 else r[3] == "result" and r[2] in SILENT))
    return (f"{label}: {len(rows)} calls of {len({r[0] for r in rows})} functions: {dict(counts)}; "
            f"{counts['what/why/fix'] / max(errors, 1):.1%} of errors what/why/fix; {wrong} silent results")

if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    good = good_values()
    table, attacks = measure(good), adversarial(good)
    for row in table + attacks:
        print(" | ".join(str(x) for x in row))
    commands = [(c, " ".join(a[-2:]), cli_outcome(*run_command(c, a)))
                for c, a in cli_cases(Path(tempfile.mkdtemp()))]
    for row in commands:
        print(" | ".join(row))
    print(summary(table, "first pass"))
    print(summary(attacks, "adversarial pass"))
    print(f"commands: {len(commands)} mistakes, {dict(Counter(r[2] for r in commands))}")
    sys.exit(0)


# ---------------------------------------------------------------------------------------------
# Issue 42, part 3 (the independent sweep), modules without a test file of their own: quantization's
# device and internals.count_items_hook's switch. The rest is tested beside each module.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device, error, says", [
    (None, TypeError, "device=None is not a device name"),  # .to(None) kept the tensor where it was: True
    ("", TypeError, "device='' is not a device name"),
    (3, TypeError, "device=3 is not a device name"),
    (["cpu"], TypeError, "device=\\['cpu'\\]"),
    ("cpx", ValueError, "device='cpx' cannot be used here \\(did you mean 'cpu'\\?\\)"),
])
def test_nf4_check_refuses_a_device_it_cannot_use(device, error, says):
    pytest.importorskip("bitsandbytes")
    from course_utils.quantization import nf4_dequantizes_exactly

    with pytest.raises(error, match=says) as info:
        nf4_dequantizes_exactly(64, device=device)
    assert " — " in str(info.value)


@pytest.mark.parametrize("count", [None, "yes", 1])
def test_count_items_hook_count_is_a_flag(count):
    from trl import SFTTrainer

    from course_utils.internals import count_items_hook

    with pytest.raises(TypeError, match="count=.* must be True or False"):
        count_items_hook(SFTTrainer, print, count=count)
