"""The SFT doctor on reasoning and tool-call data (issue 34): it reads rows as TRL trains them (datasets'
JSON loader, not ``Dataset.from_list``), prepares the same rows a real ``SFTTrainer`` trains on tool data,
names the row a template raises on instead of a traceback, never tells gpt-oss to stop at ``<|end|>``, and
the counts it reports are the ones TRL's own preparation shows. Each new check's healthy and broken set-ups
on the families' checkpoints are in ``test_doctor_families.py`` (``reasoning_setups``)."""

import copy
import json
import random
import shutil

import pytest
from datasets import Dataset, load_dataset
from test_doctor_families import (
    build_family,
    describe,
    reasoning_chats,
    reasoning_text,
    split_at,
    tool_chats,
    tool_stop_outside_template,
)
from transformers import AutoTokenizer, GenerationConfig
from trl import SFTConfig, SFTTrainer
from trl.chat_template_utils import is_chat_template_stop_token_trained

from course_utils import internals
from course_utils.data import make_messages
from course_utils.doctor import diagnose, trl_view
from course_utils.doctor.__main__ import main

ONLY = {"learning_rate": 2e-5, "assistant_only_loss": True}
FULL = {"learning_rate": 2e-5}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The four families this file needs (the course model with their tokens and templates, ~1 s each)."""
    root = tmp_path_factory.mktemp("reasoning-families")
    return {name: build_family(name, root / name)
            for name in ("qwen2.5-instruct", "qwen3", "deepseek-r1-distill", "gpt-oss")}


def write_jsonl(path, rows, blank_every=0):
    with path.open("w", encoding="utf-8") as handle:
        for i, row in enumerate(rows):
            handle.write(json.dumps(row) + "\n")
            if blank_every and i % blank_every == blank_every - 1:
                handle.write("\n")  # a blank line: neither the doctor nor the JSON loader counts it
    return path


@pytest.fixture
def prepared_by_the_doctor(monkeypatch):
    """What the doctor hands TRL's preparation (the dataset) and gets back (the rows), first call."""
    seen = {}
    real = trl_view.Preparation.result  # every preparation of the doctor's ends here

    def recording(preparation):
        out = real(preparation)
        seen.setdefault("dataset", preparation.dataset)
        seen.setdefault("prepared", out)
        return out

    monkeypatch.setattr(trl_view.Preparation, "result", recording)
    return seen


# ---------------------------------------------------------------------------------------------
# The rows TRL trains: datasets' JSON loader, not Dataset.from_list
# ---------------------------------------------------------------------------------------------

def test_tool_rows_are_read_as_the_json_loader_reads_them_not_as_from_list(checkpoints, tmp_path,
                                                                           prepared_by_the_doctor):
    mixed = tool_chats(arguments="mixed")
    with pytest.raises(Exception, match="cannot mix struct and non-struct"):
        Dataset.from_list(mixed)  # the old reader: a false preparation error on mixed argument types
    filled = Dataset.from_list(tool_chats())[0]["messages"][0]
    assert filled["tool_calls"] is None and filled["name"] is None, "from_list fills every missing key"
    path = write_jsonl(tmp_path / "tools.jsonl", mixed)
    report = diagnose(str(checkpoints["qwen2.5-instruct"]), str(path), ONLY)
    assert "trl-preparation" not in report.checks(), describe(report)
    trained = [r["messages"] for r in prepared_by_the_doctor["dataset"]]
    loaded = load_dataset("json", data_files=str(path), split="train")["messages"]
    assert trained == list(loaded) == [r["messages"] for r in mixed], "the loader keeps each row as written"
    assert "tool-arguments-mixed" in report.checks("error")  # measured on those rows, not refused


def test_a_sample_holds_the_loaders_rows_at_the_sampled_lines(checkpoints, tmp_path, prepared_by_the_doctor):
    """Row by row what load_dataset("json") gives TRL, at the lines the sample drew. Blank lines make a
    difference here: datasets 5.2 detects messages with differing keys by parsing the file's first chunk
    line by line, a blank line stops that, and the rows come back with every missing key filled with None
    — for TRL and for the doctor alike."""
    rows = reasoning_chats(30)
    path = write_jsonl(tmp_path / "rows.jsonl", rows, blank_every=4)
    lines = path.read_text(encoding="utf-8").splitlines()
    index = {line: i for i, line in enumerate(n for n, text in enumerate(lines) if text.strip())}
    loaded = load_dataset("json", data_files=str(path), split="train")
    assert loaded[0]["messages"][0] == {**rows[0]["messages"][0], "reasoning_content": None}
    report = diagnose(str(checkpoints["qwen3"]), str(path), FULL, sample=9, seed=2)
    assert "9 of 30 rows" in next(f.what for f in report if f.check == "sample")
    dataset = prepared_by_the_doctor["dataset"]
    assert len(dataset) == 9
    for row in dataset:  # _doctor_row is the line's index in the file, blank lines included
        assert row["messages"] == loaded[index[row["_doctor_row"]]]["messages"]
        assert [m["content"] for m in row["messages"]] == [
            m["content"] for m in json.loads(lines[row["_doctor_row"]])["messages"]]


@pytest.mark.parametrize("arguments", [pytest.param("dict", marks=pytest.mark.slow), "mixed"])
def test_the_doctor_prepares_the_rows_a_real_sfttrainer_trains_on_tool_data(arguments, checkpoints,
                                                                            tmp_path, prepared_by_the_doctor):
    directory = checkpoints["qwen2.5-instruct"]
    path = write_jsonl(tmp_path / "tools.jsonl", tool_chats(arguments=arguments))
    diagnose(str(directory), str(path), ONLY)
    mine = prepared_by_the_doctor["prepared"]
    args = SFTConfig(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True,
                     assistant_only_loss=True, shuffle_dataset=False)
    trainer = SFTTrainer(model=str(directory), args=args,
                         processing_class=AutoTokenizer.from_pretrained(directory),
                         train_dataset=load_dataset("json", data_files=str(path), split="train"))
    assert mine["input_ids"] == trainer.train_dataset["input_ids"]
    assert mine["labels"] == trainer.train_dataset["labels"]


def late_tool_rows() -> list[dict]:
    """Over 10 MiB of plain chats, then eight tool-call rows."""
    plain = [{"messages": [{**m, "content": m["content"] + " and so on" * 40} if m["role"] == "user" else m
                           for m in messages]} for messages in make_messages(n=40, seed=1)]
    repeat = 10 * 2 ** 20 // sum(len(json.dumps(r)) + 1 for r in plain) + 1
    return plain * repeat + tool_chats(8)


def test_a_file_the_json_loader_cannot_read_past_its_first_chunk_is_an_error_with_a_fix(checkpoints,
                                                                                         tmp_path):
    """datasets fixes each field's type from a file's first 10 MiB: tool-call rows after 10 MiB of plain
    chats fail to cast, and TRL never starts (every other set-up in these tests is the healthy case)."""
    late = write_jsonl(tmp_path / "late.jsonl", late_tool_rows())
    report = diagnose(str(checkpoints["qwen2.5-instruct"]), str(late), ONLY, sample=16)
    finding = next(f for f in report if f.check == "data-unloadable")
    assert finding.severity == "error" and "shuffle" in finding.fix, describe(report)
    assert "CastError" in finding.evidence and report.exit_code == 1


@pytest.mark.slow  # ~5 s: another 10 MiB file
def test_the_same_rows_shuffled_load(checkpoints, tmp_path):
    rows = late_tool_rows()
    random.Random(0).shuffle(rows)
    shuffled = write_jsonl(tmp_path / "shuffled.jsonl", rows)
    report = diagnose(str(checkpoints["qwen2.5-instruct"]), str(shuffled), ONLY, sample=16)
    assert "data-unloadable" not in report.checks(), describe(report)


# ---------------------------------------------------------------------------------------------
# Never a traceback on a template error
# ---------------------------------------------------------------------------------------------

def test_a_template_error_names_its_row_and_exits_1_without_a_traceback(checkpoints, tmp_path, capsys):
    """DeepSeek-R1's template on a tool call whose content is null: jinja2's UndefinedError inside TRL's
    tokenization, which used to end the doctor with a could-not-check."""
    rows = reasoning_chats(2, style="think") + tool_chats(3, content=None)
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    code = main(["--model", str(checkpoints["deepseek-r1-distill"]), "--data", str(path), "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err
    finding = next(f for f in json.loads(out)["findings"] if f["check"] == "template-error")
    assert "row 2" in finding["what"] and "UndefinedError" in finding["evidence"]
    assert "supports_tool_calling=False" in finding["fix"], "the way out: a template that renders tool calls"


# ---------------------------------------------------------------------------------------------
# gpt-oss: a training row ends with <|return|>; <|end|> ends every earlier message
# ---------------------------------------------------------------------------------------------

def test_gpt_oss_is_never_told_to_stop_at_end(checkpoints, tmp_path):
    """Advising eos_token='<|end|>' would stop generation after the analysis message, before the final
    answer, in every row. With a generation_config that lacks <|return|>, the advice is <|return|>."""
    source = checkpoints["gpt-oss"]
    no_return = tmp_path / "gpt-oss-no-return"
    copy_of = AutoTokenizer.from_pretrained(source)
    assert copy_of.convert_ids_to_tokens(trl_view.end_of_turn_or_none(copy_of)) == "<|return|>"
    shutil.copytree(source, no_return)
    config = GenerationConfig.from_pretrained(no_return)
    config.eos_token_id = copy_of.convert_tokens_to_ids("<|endoftext|>")
    config.save_pretrained(no_return)
    setups = {"chats": (reasoning_chats(style=None), FULL),
              "reasoning": (reasoning_chats(style="thinking"), ONLY),
              "multi-turn reasoning": (reasoning_chats(turns=2, style="thinking"), FULL),
              "tool calls": (tool_chats(), ONLY),
              "prompt/completion": (split_at(reasoning_chats(style="thinking"), 1), FULL)}
    for directory in (source, no_return):
        for label, (data, config) in setups.items():
            report = diagnose(str(directory), data, config)
            text = str(report)
            assert "'<|end|>'" not in text.split("evidence:")[0] and "eos_token='<|end|>'" not in text, label
            if directory == no_return:
                finding = next(f for f in report if f.check == "eos-mismatch")
                assert "eos_token='<|return|>'" in finding.fix, (label, finding.fix)
            else:
                assert "eos-mismatch" not in report.checks(), (label, describe(report))


# ---------------------------------------------------------------------------------------------
# The counts are TRL's: measured on its rendering and labels
# ---------------------------------------------------------------------------------------------

def test_reasoning_lost_counts_the_turns_and_tokens_trls_rendering_drops(checkpoints):
    """Qwen3's original template, full-sequence loss (TRL's default), two exchanges per row: the first
    turn's reasoning is not in TRL's tokens, the second's is, graded."""
    directory = checkpoints["qwen3"]
    rows = reasoning_chats(8, turns=2)
    tok = AutoTokenizer.from_pretrained(directory)
    args = SFTConfig(output_dir="/tmp/doctor-reasoning-test", report_to="none", use_cpu=True,
                     dataset_num_proc=None, shuffle_dataset=False)
    trained = internals.prepare_sft_dataset(Dataset.from_list(rows), tok, args)
    texts = [tok.decode(ids) for ids in trained["input_ids"]]
    thoughts = [[m["reasoning_content"] for m in r["messages"] if m["role"] == "assistant"] for r in rows]
    assert not any(first in text for (first, _), text in zip(thoughts, texts))
    assert all(second in text for (_, second), text in zip(thoughts, texts))
    lost = sum(len(tok(first, add_special_tokens=False)["input_ids"]) for first, _ in thoughts)
    total = lost + sum(len(tok(second, add_special_tokens=False)["input_ids"]) for _, second in thoughts)
    finding = next(f for f in diagnose(str(directory), rows, FULL) if f.check == "reasoning-lost")
    assert finding.what == (f"8 of 16 reasoning turns ({lost:,} of {total:,} reasoning tokens) never reach "
                            "the loss"), finding.what
    assert "qwen3_training.jinja" in finding.fix
    assert reasoning_text("What is 1 + 1?", "2", 0) != reasoning_text("What is 1 + 1?", "2", 1)


def test_empty_think_blocks_counted_where_trls_labels_grade_them(checkpoints):
    directory = checkpoints["qwen3"]
    rows = reasoning_chats(8, style=None)
    tok = AutoTokenizer.from_pretrained(directory)
    args = SFTConfig(output_dir="/tmp/doctor-reasoning-test", report_to="none", use_cpu=True,
                     dataset_num_proc=None, shuffle_dataset=False)
    trained = internals.prepare_sft_dataset(Dataset.from_list(rows), tok, args)
    graded = [tok.decode([t for t in labels if t != -100]) for labels in trained["labels"]]
    assert sum(text.count("<think>\n\n</think>") for text in graded) == 8
    finding = next(f for f in diagnose(str(directory), rows, FULL) if f.check == "empty-think-graded")
    assert finding.what.startswith("8 empty <think></think> blocks carry loss, in 8 of 8 rows")
    assert finding.severity == "warning" and "enable_thinking" in finding.fix


def test_tool_replies_graded_are_an_error_only_where_the_rest_is_masked(checkpoints):
    """Full-sequence loss grades every token (a warning: the choice was to train on all of it); a
    completion that holds the tool replies grades them although the prompt is masked (an error)."""
    directory = str(checkpoints["qwen2.5-instruct"])
    full = next(f for f in diagnose(directory, tool_chats(), FULL) if f.check == "tool-output-graded")
    masked = next(f for f in diagnose(directory, split_at(tool_chats(), 1), FULL)
                  if f.check == "tool-output-graded")
    assert (full.severity, masked.severity) == ("warning", "error")
    assert "8 of 8 tool replies" in full.what and "assistant_only_loss=True" in full.fix


def test_the_tool_stop_probe_of_trl_says_trained_where_the_doctor_measures_untrained(checkpoints, tmp_path):
    template = tool_stop_outside_template()
    tok = copy.deepcopy(AutoTokenizer.from_pretrained(checkpoints["qwen2.5-instruct"]))
    assert is_chat_template_stop_token_trained(tok, chat_template=template), "TRL probes a plain turn"
    path = tmp_path / "hand-marked.jinja"
    path.write_text(template, encoding="utf-8")
    report = diagnose(str(checkpoints["qwen2.5-instruct"]), tool_chats(),
                      {**ONLY, "chat_template_path": str(path)})
    finding = next(f for f in report if f.check == "tool-stop-untrained")
    assert finding.what == ("the stop token '<|im_end|>' after a tool call carries no loss in 8 of 8 "
                            "tool-call turns")
    assert "is_chat_template_stop_token_trained=True" in finding.evidence
