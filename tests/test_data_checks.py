"""The doctor's data checks (issue 49): each planted failure is found by its own check, its healthy twin
reports nothing of it, the command answers without a traceback — and without torch."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.doctor.__main__ import data_only, main
from course_utils.doctor.data_checks import FAMILY_MARKERS, data_findings, sharegpt_hint
from course_utils.doctor.inputs import DoctorInputError, read_rows

ROOT = Path(__file__).resolve().parents[1]


def user(text):
    return {"role": "user", "content": text}


def assistant(content, **extra):
    return {"role": "assistant", "content": content, **extra}


def chats(n=40):
    """Healthy: varied questions, varied answers of varied length."""
    words = "the model reads each token and learns what was asked with care".split()
    return [{"messages": [user(f"Question {i}: what is {i} times {i + 3}?"),
                          assistant(f"{i} times {i + 3} is {i * (i + 3)}. " + " ".join(words[: i % 11 + 1]))]}
            for i in range(n)]


def checks(rows, tokenizer=None):
    rows, _ = read_rows(rows)
    return {f.check: f for f in data_findings(rows, _form(rows), tokenizer)}


def _form(rows):
    from course_utils.doctor.inputs import row_form

    return row_form(rows)


LOOP = " ".join(["and then the answer is"] * 12)
PLANTED = {  # label -> (rows, the check that must report, its severity)
    "chatml text": ([{"text": f"<|im_start|>user\nQ{i}<|im_end|>\n<|im_start|>assistant\nA{i}<|im_end|>\n"}
                     for i in range(20)], "rendered-markers", "warning"),
    "llama3 in content": ([{"messages": [user(f"<|start_header_id|>user<|end_header_id|>\n\nQ{i}<|eot_id|>"),
                                         assistant(f"A{i}")]} for i in range(20)],
                          "rendered-markers", "warning"),
    "[INST] prompt": ([{"prompt": f"[INST] Q{i} [/INST]", "completion": f" A{i}"} for i in range(20)],
                      "rendered-markers", "warning"),
    "exact duplicates": (chats(30) + chats(30)[:6], "duplicate-rows", "warning"),
    "near duplicates": (chats(30) + [{"messages": [user(m["messages"][0]["content"].upper()),
                                                   assistant(m["messages"][1]["content"])]}
                                     for m in chats(30)[:4]], "duplicate-rows", "warning"),
    "contradictions": (chats(30) + [{"messages": [user("Question 1: what is 1 times 4?"), assistant("5.")]}],
                       "contradicting-answers", "warning"),
    "empty answers": (chats(30) + [{"messages": [user(f"Tell me {i}"), assistant("  ")]} for i in range(5)],
                      "response-empty", "error"),
    "empty conversational completions": (
        [{"prompt": [user(f"Question {i}: what is {i} times {i + 3}?")],
          "completion": [assistant(f"It is {i * (i + 3)}.")]} for i in range(30)]
        + [{"prompt": [user(f"Tell me {i}")], "completion": [assistant("")]} for i in range(5)],
        "response-empty", "error"),
    "looping answers": (chats(30) + [{"messages": [user(f"Story {i}"), assistant(f"{i} {LOOP}")]}
                                     for i in range(2)], "response-looping", "warning"),
    "echoed prompts": (chats(30) + [{"messages": [user(f"Repeat after me number {i}"),
                                                  assistant(f"Repeat after me number "
                                                            f"{i}")]} for i in range(4)],
                       "response-copies-prompt", "error"),
    "partial reasoning": ([{"messages": [user(f"Q{i}"), assistant(f"<think>{i}+{i}</think>{2 * i}" if i % 4
                                                                  else f"{2 * i}")]} for i in range(20)],
                          "reasoning-partial", "warning"),
    "partial reasoning field": ([{"messages": [user(f"Q{i}"), assistant(f"{2 * i}", **(
        {"reasoning_content": f"{i}+{i}"} if i % 2 else {}))]} for i in range(20)],
        "reasoning-partial", "warning"),
    "sharegpt "
    "roles": ([{"messages": [{"role": "human", "content": f"Q{i}"}, {"role": "gpt", "content": f"A{i}"}]}
                        for i in range(10)], "sharegpt-roles", "error"),
    "dict content": ([{"messages": [user(f"Call {i}"), assistant({"name": "f", "arguments": {"x": i}})]}
                      for i in range(10)], "content-not-string", "error"),
    "number content": ([{"messages": [user(f"{i} plus {i}?"), assistant(2 * i)]} for i in range(10)],
                       "content-not-string", "warning"),
    "response key": ([{"messages": [user(f"Q{i}")], "response": f"A{i}"} for i in range(10)], "unread-keys",
                     "warning"),
    "output beside "
    "prompt": ([{"prompt": f"Q{i}", "completion": f" A{i}", "output": f"B{i}"} for i in range(10)],
                             "unread-keys", "warning"),
}
HEALTHY = {  # label -> rows: none of the data checks reports
    "chats": chats(40),
    "prompt/completion": [{"prompt": f"Q: {i} plus {i}?", "completion": f" {2 * i}."} for i in range(40)],
    "conversational prompt/completion": [{"prompt": [user(f"Q: {i} plus {i}?")],
                                          "completion": [assistant(f"{2 * i}.")]} for i in range(40)],
    "text": [{"text": f"Row {i}: the model learns {i} things."} for i in range(40)],
    "all reasoning": [{"messages": [user(f"Q{i}"), assistant(f"<think>{i}+{i}</think>{2 * i}")]}
                      for i in range(20)],
    "tool calls with empty content": [{"messages": [
        user(f"Weather in city {i}?"),
        assistant("", tool_calls=[{"type": "function",
                                   "function": {"name": "weather", "arguments": {"c": i}}}]),
        {"role": "tool", "content": f"{i} C"}, assistant(f"It is {i} C.")]} for i in range(20)],
    "multimodal parts": [{"messages": [{"role": "user", "content": [{"type": "text", "text": f"Q{i}"}]},
                                       assistant(f"A{i}")]} for i in range(20)],
    "same question, multi-turn": [{"messages": [user("Hi"), assistant("Hello!"), user(f"What is {i}?"),
                                                assistant(f"It is {i}.")]} for i in range(20)],
    "tool-call tags in "
    "content": [{"messages": [user(f"Q{i}"), assistant(f"<tool_call>{{\"x\": {i}}}</tool_call>")]}
                                  for i in range(20)],
}


@pytest.mark.parametrize("label", PLANTED)
def test_each_planted_data_failure_is_found_by_its_own_check(label):
    rows, check, severity = PLANTED[label]
    found = checks(rows)
    assert check in found, f"{label}: {check} not reported; got {sorted(found)}"
    assert found[check].severity == severity, (label, found[check])
    assert "row ids" in found[check].evidence or "groups" in found[check].evidence, found[check].evidence


def test_a_few_copies_are_info_and_a_lone_gpt_role_is_left_to_no_assistant_turns():
    """Lesson 08's capstone chats repeat 0.4-2.5 % of their rows by chance and rename 'assistant' to 'gpt' in
    some: under diagnose no-assistant-turns finds those rows (the data check leaves them to it); the data
    checks alone (no such set-up check) report the role."""
    rows = chats(60) + chats(60)[:2] + [{"messages": [user("Q"), {"role": "gpt", "content": "A"}]}]
    read, _ = read_rows(rows)
    found = {f.check: f for f in data_findings(read, "messages", answerless=[62])}
    assert found["duplicate-rows"].severity == "info" and "sharegpt-roles" not in found, found
    assert checks(rows)["sharegpt-roles"].severity == "error"


def renamed(rows, user_role, assistant_role):
    return [{"messages": [dict(m, role=user_role if m["role"] == "user" else assistant_role)
                          for m in r["messages"]]} for r in rows]


ROLE_PAIRS = [("human", "assistant"), ("user", "gpt"), ("user", "model"), ("USER", "ASSISTANT"),
              ("human", "gpt"), ("User", "Assistant"), ("user", "chatbot")]


@pytest.mark.parametrize("pair", ROLE_PAIRS, ids="+".join)
def test_every_role_outside_trls_is_an_error_and_its_fix_maps_it_back(pair):
    """Issue 49: only human+gpt was flagged; human+assistant, user+gpt, user+model and USER/ASSISTANT passed
    clean. Any role outside TRL's (exact strings) is an error, with counts, row ids and the mapping."""
    rows = renamed(chats(30), *pair)
    finding = next(f for f in checks(rows).values() if f.check in ("sharegpt-roles", "unknown-roles"))
    assert finding.severity == "error" and "30 of 30 rows" in finding.what
    assert "in 30 rows (row ids [0, 1, 2])" in finding.evidence, finding.evidence
    table = ast.literal_eval(finding.fix.split("m['role'] = ")[1].split(".get(")[0])  # the fix's mapping
    fixed = [{"messages": [dict(m, role=table.get(m["role"], m["role"])) for m in r["messages"]]}
             for r in rows]
    assert fixed == chats(30) and not checks(fixed)


def test_every_trl_role_and_multimodal_or_tool_rows_are_not_unknown_roles():
    roles = ("system", "developer", "user", "assistant", "tool", "ipython", "function")
    rows = [{"messages": [{"role": r, "content": f"x{i}"} for r in roles]} for i in range(10)]
    assert not {"unknown-roles", "sharegpt-roles"} & set(checks(rows))


@pytest.mark.slow
def test_the_role_mapping_leaves_a_real_family_set_up_clean(tmp_path):
    """With a model (Llama 3.1's conventions, built from the course model): human/assistant rows are an
    error under diagnose too (no-assistant-turns cannot see them: they have an assistant), and the fix's
    mapping leaves no role finding and no missing assistant turn."""
    from test_doctor_families import build_family

    from course_utils.doctor import diagnose

    model = build_family("llama-3.1-instruct", tmp_path / "llama")
    rows = renamed(chats(12), "human", "assistant")
    before = diagnose(str(model), rows, {"learning_rate": 2e-5}, forward=False)
    assert "sharegpt-roles" in before.checks("error"), before
    gpt = diagnose(str(model), renamed(chats(12), "user", "gpt"), {"learning_rate": 2e-5}, forward=False)
    assert "no-assistant-turns" in gpt.checks("error") and "sharegpt-roles" not in gpt.checks(), gpt
    after = diagnose(str(model), chats(12), {"learning_rate": 2e-5}, forward=False)
    assert not {"sharegpt-roles", "unknown-roles", "no-assistant-turns"} & after.checks(), after


@pytest.mark.parametrize("label", HEALTHY)
def test_healthy_data_reports_nothing(label):
    assert not checks(HEALTHY[label]), label


def test_markers_of_another_family_than_the_models_are_an_error(tokenizer):
    """The course model's template is ChatML: Llama 3 markers are a foreign format (error), ChatML ones the
    model's own, rendered twice (warning)."""
    assert checks(PLANTED["llama3 in content"][0], tokenizer)["rendered-markers"].severity == "error"
    assert checks(PLANTED["chatml text"][0], tokenizer)["rendered-markers"].severity == "warning"
    assert all(markers[0] in FAMILY_MARKERS[family] for family, markers in FAMILY_MARKERS.items())
    # data_checks._family skips text without "<" or "[" (most rows): every marker must hold one
    assert all("<" in m or "[" in m for markers in FAMILY_MARKERS.values() for m in markers)


def test_sharegpt_roles_render_nothing_of_the_turns_on_qwen25s_template(tokenizer):
    """The measurement behind sharegpt-roles: Qwen2.5's template (the course model's) renders human/gpt
    turns as nothing but its default system prompt."""
    from trl.chat_template_utils import qwen2_5_chat_template

    rendered = tokenizer.apply_chat_template(PLANTED["sharegpt roles"][0][3]["messages"], tokenize=False,
                                             chat_template=qwen2_5_chat_template)
    assert "Q3" not in rendered and "A3" not in rendered and "<|im_start|>system" in rendered, rendered


def test_dict_content_becomes_python_text_under_llama3s_template(tokenizer):
    """The measurement behind content-not-string: a dict content renders with Python's quotes, not JSON's."""
    template = (Path(__import__("trl").__file__).parent / "chat_templates" / "llama3.jinja").read_text()
    row = PLANTED["dict content"][0][1]["messages"]
    rendered = tokenizer.apply_chat_template(row, tokenize=False, chat_template=template, bos_token="<s>")
    assert "{'name': 'f'" in rendered and '{"name": "f"' not in rendered, rendered


def test_a_generation_cap_is_found_in_tokens_and_distinct_copies_are_not_one(tokenizer):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()
    capped = [" ".join(words[(i + j) % len(words)] for j in range(30)) for i in range(6)]
    lengths = {len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in capped}
    cap = min(lengths)
    cut = [tokenizer.decode(tokenizer(c, add_special_tokens=False)["input_ids"][:cap]) for c in capped]
    rows = chats(40) + [{"messages": [user(f"Write {i}"), assistant(c)]} for i, c in enumerate(cut)]
    assert "response-length-cap" in checks(rows, tokenizer)
    assert "response-length-cap" not in checks(chats(40), tokenizer)
    copies = chats(40) + [{"messages": [user(f"Write {i}"), assistant(cut[0])]} for i in range(6)]
    assert "response-length-cap" not in checks(copies, tokenizer), "one answer copied is not a cap"


def test_the_sharegpt_file_is_bad_input_naming_the_format(tmp_path, capsys):
    path = tmp_path / "sharegpt.jsonl"
    path.write_text("\n".join(json.dumps({"conversations": [{"from": "human", "value": f"Q{i}"},
                                                            {"from": "gpt", "value": f"A{i}"}]})
                              for i in range(3)))
    assert main(["--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert "ShareGPT" in err and "KeyError: 'text'" in err and "Traceback" not in err
    assert sharegpt_hint({"messages": [{"from": "human", "value": "x"}]})
    assert not sharegpt_hint({"messages": [user("x")]})
    with pytest.raises(DoctorInputError, match="ShareGPT"):
        read_rows([{"messages": [{"from": "human", "value": "x"}]}])


def test_data_only_report_and_exit_codes(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in PLANTED["sharegpt roles"][0]))
    assert main(["--data", str(path)]) == 1
    assert "sharegpt-roles" in capsys.readouterr().out
    assert main(["--data", str(path), "--ignore", "sharegpt-roles"]) == 0
    healthy = tmp_path / "h.jsonl"
    healthy.write_text("\n".join(json.dumps(r) for r in HEALTHY["chats"]))
    report = data_only(str(healthy))
    assert report.checks() == {"data-only"} and report.exit_code == 0


def _cold_data_run(path) -> str:
    """``python -m course_utils.doctor --data PATH`` in a fresh process: its output, its exit status and the
    heavy libraries it imported (printed after the report)."""
    code = ("import sys, runpy\nsys.argv = ['doctor', '--data', sys.argv[1]]\ntry:\n"
            "    runpy.run_module('course_utils.doctor', run_name='__main__')\nexcept SystemExit as e:\n"
            "    print('EXIT', e.code)\nprint('HEAVY', sorted(m for m in ('torch', 'transformers', 'trl', "
            "'datasets') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT)
    return done.stdout + done.stderr


def test_the_data_checks_start_without_torch(tmp_path):
    """`--data` alone imports neither torch nor transformers: a cold start of about a second."""
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in chats(50)))
    out = _cold_data_run(path)
    assert "EXIT 0" in out and "HEAVY []" in out, out


# ---- issue 49, gap 3: user mistakes exit 2 (or are read), never a traceback -------------------------------
def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_non_utf8_byte_is_bad_input_naming_its_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", chats(5))
    path.write_bytes(path.read_bytes() + '{"text": "café"}\n'.encode("latin-1"))
    assert main(["--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert "line 6 is not UTF-8 (byte 0xe9" in err and "Traceback" not in err, err


def test_a_gzipped_jsonl_is_read_as_the_loader_reads_it(tmp_path):
    import gzip

    rows = PLANTED["sharegpt roles"][0]
    plain = write_jsonl(tmp_path / "d.jsonl", rows)
    zipped = tmp_path / "d.jsonl.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    found = data_only(str(zipped)).checks()
    assert found == data_only(str(plain)).checks() == {"sharegpt-roles", "data-only"}


def test_output_piped_to_a_reader_that_closes_early_ends_quietly(tmp_path):
    """`doctor ... | head -1`: the reader goes away; no BrokenPipeError traceback, the report's exit code."""
    path = write_jsonl(tmp_path / "d.jsonl", PLANTED["sharegpt roles"][0])
    for args in (["--data", str(path)], ["--list-checks"]):
        done = subprocess.Popen([sys.executable, "-m", "course_utils.doctor", *args], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        done.stdout.close()  # the reader is gone before the first write
        err = done.stderr.read().decode()
        assert done.wait() == (1 if "--data" in args else 0) and "Traceback" not in err, err


# ---- issue 49, gap 4: a data folder is read as datasets.load_dataset(folder) reads it -------------------
FOLDERS = {  # label -> {relative path: content}
    "train and more": {"train.jsonl": "J", "more.jsonl": "J", "README.md": "# notes", "make.py": "x = 1"},
    "csv outnumber jsonl": {"part1.jsonl": "J", "part2.jsonl": "J", "s1.csv": "C", "s2.csv": "C",
                            "s3.csv": "C"},
    "parts only": {"part1.jsonl": "J", "part2.jsonl": "J", "README.md": "# notes", "stats.csv": "C"},
    "train and test": {"train.jsonl": "J", "test.jsonl": "J", "notes.txt": "T"},
    "split folders": {"train/a.jsonl": "J", "train/b.jsonl": "J", "validation/c.jsonl": "J", "x.jsonl": "J"},
    "sharded": {"data/train-00000-of-00002.jsonl": "J", "data/train-00001-of-00002.jsonl": "J",
                "data/test-00000-of-00001.jsonl": "J", "extra.jsonl": "J"},
    "hidden and gz": {"my_train_set.jsonl.gz": "Z", ".cache/train.jsonl": "J", "__pycache__/x.jsonl": "J"},
}


def make_folder(root: Path, files: dict) -> Path:
    import gzip

    for name, kind in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        chat = "".join(json.dumps(r) + "\n" for r in chats(4))
        body = {"J": chat, "C": "prompt,completion\nQ,A\n", "T": "a note\n"}.get(kind, kind)
        path.write_bytes(gzip.compress(chat.encode()) if kind == "Z" else body.encode())
    return root


def datasets_train_files(folder: Path) -> list[str]:
    """What load_dataset(folder) loads as its train split, by datasets' own code (load.py's steps)."""
    from datasets.data_files import DataFilesDict, get_data_patterns
    from datasets.load import _ALL_ALLOWED_EXTENSIONS, infer_module_for_data_files
    from datasets.packaged_modules import _MODULE_TO_EXTENSIONS

    patterns = get_data_patterns(str(folder))
    files = DataFilesDict.from_patterns(patterns, base_path=str(folder),
                                        allowed_extensions=_ALL_ALLOWED_EXTENSIONS)
    module, _ = infer_module_for_data_files(files)
    files = files.filter(extensions=_MODULE_TO_EXTENSIONS[module])
    return [Path(f).relative_to(folder).as_posix() for f in files.get("train", [])]


@pytest.mark.parametrize("label", FOLDERS)
def test_a_folder_loads_the_files_datasets_loads(label, tmp_path):
    from course_utils.doctor.inputs import folder_files

    folder = make_folder(tmp_path / "d", FOLDERS[label])
    files, findings = folder_files(folder)
    assert [p.relative_to(folder).as_posix() for p, _ in files] == datasets_train_files(folder), label
    finding = findings[0]
    assert finding.check == "data-folder-files"
    dropped = {"train and more": "more.jsonl", "csv outnumber jsonl": "part1.jsonl",
               "split folders": "x.jsonl", "sharded": "extra.jsonl", "parts only": "stats.csv",
               "train and test": "notes.txt"}.get(label)
    assert (finding.severity == "warning") == (dropped is not None), finding
    if dropped:
        assert dropped in finding.what, finding.what


def test_the_folder_command_checks_the_files_that_load_without_torch(tmp_path):
    folder = make_folder(tmp_path / "d", FOLDERS["train and more"])
    write_jsonl(folder / "train.jsonl", PLANTED["sharegpt roles"][0])
    out = _cold_data_run(folder)
    assert "EXIT 1" in out and "HEAVY []" in out, out
    assert all(word in out for word in ("data-folder-files", "more.jsonl", "sharegpt-roles"))


def test_a_folder_without_a_train_split_is_bad_input(tmp_path, capsys):
    folder = make_folder(tmp_path / "d", {"test.jsonl": "J"})
    assert main(["--data", str(folder)]) == 2
    assert "no train split" in capsys.readouterr().err


# ---- issue 49, gap 5: copies and contradictions are counted over every row, not from a sample -----------
def test_copies_in_a_large_file_are_counted_over_every_row_when_sampled(tmp_path):
    """5,000 rows with 600 exact copies (12 %): a 2,000-row sample holds few of the pairs (~4.5 %), and a
    binomial interval around that excludes the truth; the file's own count is 600 (a warning)."""
    rows = [{"messages": [user(f"Question {i}: what is {i} plus {i}?"), assistant(f"{2 * i}.")]}
            for i in range(4400)]
    path = write_jsonl(tmp_path / "big.jsonl", rows + rows[:600])
    finding = next(f for f in data_only(str(path), sample=2000) if f.check == "duplicate-rows")
    assert finding.severity == "warning" and finding.what.startswith("600 of 5,000 rows (12.0%"), finding.what
    assert "interval" not in finding.what and "[0, 4400]" in finding.evidence
    clash = rows + [{"messages": [user(f"Question {i}: what is {i} plus {i}?"), assistant("no idea.")]}
                    for i in range(300)]
    finding = next(f for f in data_only(str(write_jsonl(tmp_path / "c.jsonl", clash)), sample=500)
                   if f.check == "contradicting-answers")
    assert finding.what.startswith("300 prompt(s) are answered differently in 600 of 4,700"), finding.what


# ---- issue 49, gap 7: every family TRL ships a template for is known by its turn markers ----------------
TRL_TEMPLATES = sorted((Path(__import__("trl").__file__).parent / "chat_templates").glob("*.jinja"))
VLM = ("vl", "llava", "idefics", "smolvlm")  # image-text templates: their rows are not text-only chats


def test_every_text_template_trl_ships_maps_to_a_family_in_source_and_rendered(tokenizer):
    from trl import chat_template_utils

    from course_utils.doctor.data_checks import _family

    texts = [p for p in TRL_TEMPLATES if not any(v in p.stem for v in VLM)]
    assert len(texts) > 40, texts
    chat = [user("Q1"), assistant("A1")]
    for path in texts:
        source = path.read_text(encoding="utf-8")
        rendered = tokenizer.apply_chat_template(chat, chat_template=source, tokenize=False, bos_token="<s>")
        assert _family(source) is not None and _family(rendered) == _family(source), (path.stem, rendered)
    strings = [v for k, v in vars(chat_template_utils).items() if k.endswith("_chat_template")
               and isinstance(v, str) and not any(x in k for x in VLM)]
    assert strings and all(_family(s) for s in strings)


@pytest.mark.parametrize("family,render", [
    ("Gemma 4", lambda q, a: f"<bos><|turn>user\n{q}<turn|>\n<|turn>model\n{a}<turn|>\n"),
    ("Cohere", lambda q, a: f"<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>{q}<|END_OF_TURN_TOKEN|>"
                            f"<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{a}<|END_OF_TURN_TOKEN|>")])
def test_gemma4_and_cohere_text_is_found_rendered(family, render):
    finding = checks([{"text": render(f"Q{i}", f"A{i}")} for i in range(20)])["rendered-markers"]
    assert family in finding.what, finding.what


# ---- issue 49, gap 8: a cap is found at any length, not only the longest -------------------------------
FILL = ("it depends on several factors that interact in surprising ways and people often overlook the "
        "simplest explanation which is usually the right one when you look closely at the evidence").split()


def capped_rows(tokenizer, mode: str, n=100, seed=11):
    """``n`` chats: natural answers of 3-60 words; "tokens": a third cut at 64 tokens and ten human-written
    ones much longer (the cap is not the longest length); "words": a third cut at 40 words (a cap in another
    tokenizer's tokens); "none": the control, natural lengths only."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        text = " ".join(rng.choice(FILL) for _ in range(rng.randint(3, 60))) + "."
        if mode == "tokens" and i % 3 == 0:
            long = " ".join(rng.choice(FILL) for _ in range(150))
            text = tokenizer.decode(tokenizer(long, add_special_tokens=False)["input_ids"][:64])
        elif mode == "tokens" and i % 10 == 1:
            text = " ".join(rng.choice(FILL) for _ in range(120)) + "."
        elif mode == "words" and i % 3 == 0:
            text = " ".join(rng.choice(FILL) for _ in range(40))
        rows.append({"messages": [user(f"Question {i}: explain topic {i}."), assistant(text)]})
    return rows


@pytest.mark.parametrize("mode,length", [("tokens", "64 tokens"), ("words", "40 words")])
def test_a_cap_below_the_longest_length_or_in_words_is_found(tokenizer, mode, length):
    finding = checks(capped_rows(tokenizer, mode), tokenizer)["response-length-cap"]
    assert f"exactly {length}" in finding.what and finding.severity == "error", finding.what


def test_natural_lengths_without_a_cap_report_no_cap(tokenizer):
    for seed in range(5):
        assert "response-length-cap" not in checks(capped_rows(tokenizer, "none", seed=seed), tokenizer)
    for label, rows in HEALTHY.items():
        assert "response-length-cap" not in checks(rows, tokenizer), label


# ---- issue 49, gap 9: top-level keys TRL never reads, the family's own reasoning field aside -------------
@pytest.mark.parametrize("key", ["system", "reasoning", "thinking", "rationale", "explanation", "solution"])
def test_a_top_level_key_trl_never_reads_is_unread(key):
    rows = [{**r, key: f"{key} of row {i}"} for i, r in enumerate(chats(20))]
    finding = checks(rows)["unread-keys"]
    assert repr(key) in finding.what and finding.severity == "warning", finding.what
    assert ("'role': 'system'" if key == "system" else "reasoning_content") in finding.fix, finding.fix


def test_reasoning_fields_templates_read_inside_messages_are_not_unread():
    rows = [{"messages": [user(f"Q{i}"), assistant(f"{2 * i}", reasoning_content=f"{i}+{i}", thinking="t")],
             "tools": [], "chat_template_kwargs": {"enable_thinking": True}} for i in range(20)]
    assert "unread-keys" not in checks(rows)


# ---- issue 49, gap 10: loops as repeated chunks and in text without spaces; a row about markers --------
@pytest.mark.parametrize("loop", [
    " ".join([" ".join(FILL[:20]) + "."] * 3),  # a paragraph three times: its 4-grams are ~35 % distinct
    "我认为答案是这样的。" * 40,  # no spaces: characters are the units
])
def test_a_paragraph_repeated_three_times_or_a_loop_without_spaces_is_looping(loop):
    rows = chats(30) + [{"messages": [user(f"Story {i}"), assistant(loop)]} for i in range(4)]
    assert checks(rows)["response-looping"].severity == "error"


def test_natural_chinese_and_a_list_are_not_looping():
    text = ("光合作用是植物利用阳光、水和二氧化碳制造葡萄糖并释放氧气的过程。"
            "叶绿素吸收光能，驱动这一反应。")
    steps = " ".join(f"Step {i}: mix {i} cups of flour with {i + 1} eggs and stir for {i * 2} minutes."
                     for i in range(1, 8))
    rows = chats(30) + [{"messages": [user(f"Q{i}"), assistant(t)]} for i, t in enumerate([text, steps])]
    assert "response-looping" not in checks(rows)


def test_one_row_about_chatml_markers_is_info_not_an_error(tokenizer):
    about = "Each turn starts with <|im_start|> and ends with <|im_end|>."
    rows = chats(39) + [{"messages": [user("How does ChatML mark turns?"), assistant(about)]}]
    assert checks(rows)["rendered-markers"].severity == "info"
    llama = [{"messages": [m if m["role"] != "assistant" else assistant(
        "Llama 3 writes <|start_header_id|>user<|end_header_id|> and ends turns with <|eot_id|>.")
        for m in r["messages"]]} for r in rows[-1:]]
    assert checks(rows[:-1] + llama, tokenizer)["rendered-markers"].severity == "warning"  # foreign, one row
