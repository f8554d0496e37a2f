"""Tests for lesson 08's set-ups: course_utils.capstone (the Setup a colleague hands over, TRL's training
template) and the broken set-ups of course_utils.exercises.lesson08 — every planted failure is found by its
check, the set-up a notebook gets carries no truth, bad names are refused, and the explorer re-runs the
doctor on each choice (the checker's answers: test_exercises_lesson08.py)."""

import copy
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from course_utils import capstone
from course_utils.capstone import Setup, trl_training_template_path
from course_utils.doctor import diagnose
from course_utils.exercises.lesson08 import (
    FAILURES,
    _broken_setup,
    _expected_checks,
    all_planted_found,
    broken_rows,
    broken_setup,
    expected_trl_error,
    fixes_explorer,
    fixes_frame,
)

WHAT_WHY_FIX = r".+ — .+ — .+"


def test_every_planted_failure_is_found_by_its_check():
    setup, planted = _broken_setup(7, planted=list(FAILURES))
    report = diagnose(str(setup.model_dir), setup.data_path, setup.config_path)
    assert _expected_checks(planted) <= report.checks() and report.exit_code == 1
    assert all_planted_found(setup, report) and expected_trl_error(setup) is ValueError


def test_the_seed_draws_the_failures_and_the_setup_carries_no_truth():
    drawn = {_broken_setup(seed)[1] for seed in range(4)}
    assert len(drawn) > 1, "different seeds plant different failures"
    setup = broken_setup(2)
    assert isinstance(setup, Setup) and not any(hasattr(setup, a) for a in ("planted", "expected_checks"))
    assert not any(name in repr(setup) for name in FAILURES)
    assert setup.cli() == (f"python -m course_utils.doctor --model {setup.model_dir} --data "
                           f"{setup.data_path} --config {setup.config_path}")


def test_the_lesson_module_knows_no_failure():
    """capstone.py is the learner's: the planted failures and the checker live in exercises.lesson08."""
    source = inspect.getsource(capstone)
    assert not re.search(r"^\s*(from|import) \S*exercises", source, re.M), "no import cycle"
    assert not any(name in vars(capstone) for name in ("FAILURES", "broken_setup", "check_fix_setup"))
    assert Path(trl_training_template_path()).read_text(encoding="utf-8").count("{% generation %}") >= 1


def test_bad_names_and_seeds_are_refused(tmp_path):
    with pytest.raises(ValueError, match="is not one of .*the capstone plants only these"):
        broken_setup(0, planted=["nan_everywhere"])
    with pytest.raises(ValueError, match="did you mean 'long_prompts'"):
        broken_setup(0, planted=["long_prompt"])
    with pytest.raises(TypeError, match=r"one string, not a list .* pass \['fp16_hot_lr'\]"):
        broken_setup(0, planted="fp16_hot_lr")
    for seed in ("0", None, -1, True):
        with pytest.raises(ValueError, match="seed"):
            broken_setup(seed)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        broken_setup(0, tmp_path / "file")
    with pytest.raises(TypeError, match="must be a path"):
        broken_setup(0, 5)


def test_broken_rows_plants_what_it_is_told_and_refuses_a_typo():
    def context_words(row):
        first = row["messages"][0]["content"]
        return len(first.split("\n")[0].split()) - 1 if first.startswith("Context:") else 0

    clean = broken_rows(0, [])
    assert sum(context_words(r) > 0 for r in clean) == 24, "10 % of the rows: a short context line that fits"
    assert max(map(context_words, clean)) <= 2, "look-alikes: a first word, not a length"
    assert not any(m["role"] == "gpt" for r in clean for m in r["messages"])
    long_rows = broken_rows(0, ["long_prompts"])
    assert sum(context_words(r) >= 40 for r in long_rows) == 36  # 15 % of 240
    # issue 36: a typo planted nothing, silently; now it names the known failures
    with pytest.raises(ValueError, match=r"'long_prompt' is not one of \['long_prompts', 'renamed_roles'\] "
                                         r"\(did you mean 'long_prompts'\?\)"):
        broken_rows(0, planted=["long_prompt"])
    with pytest.raises(ValueError, match="live in the config or the template"):
        broken_rows(0, ["fp16_hot_lr"])  # not a data failure: it would plant nothing in the rows
    with pytest.raises(TypeError, match="one string"):
        broken_rows(0, "long_prompts")
    with pytest.raises(ValueError, match="seed"):
        broken_rows(None, [])


def test_the_claims_need_a_setup_of_the_lesson(tmp_path):
    setup, _ = _broken_setup(0, tmp_path / "a", planted=["wrapped_packing"])
    stranger = dataclasses.replace(setup, config_path=tmp_path / "elsewhere.json")
    with pytest.raises(ValueError, match="not written by broken_setup"):
        expected_trl_error(stranger)
    with pytest.raises(TypeError, match="not a Setup"):
        all_planted_found("setup", None)
    with pytest.raises(TypeError, match="report is a str"):
        all_planted_found(setup, "report")
    assert expected_trl_error(setup) is None  # TRL checks neither packing nor the eos mismatch


def test_fixes_explorer_reruns_the_doctor_on_each_choice(course, tmp_path):
    model, tok = course  # no base_template planted: the set-up's tokenizer is the course one
    setup = broken_setup(0, tmp_path, planted=["fp16_hot_lr", "long_prompts", "renamed_roles"])
    report = diagnose((model, tok), setup.rows, setup.config)

    def apply_fixes(config, rows, findings):
        config, rows, found = dict(config), copy.deepcopy(rows), findings.checks()
        if "no-assistant-turns" in found:
            rows = [{"messages": [dict(m, role="assistant" if m["role"] == "gpt" else m["role"])
                                  for m in r["messages"]]} for r in rows]
        if "fp16-overflow-risk" in found:
            config.update(fp16=False, learning_rate=3e-3)
        if "fully-truncated" in found:
            config["max_length"] = 512
        if "eos-mismatch" in found:
            config["eos_token"] = "<|im_end|>"
        return config, rows

    w = fixes_explorer(setup, report, apply_fixes, model, tok)
    assert [s.description for s in w.children[:4]] == [
        "fp16_hot_lr (lesson 06)", "long_prompts (lesson 05)", "renamed_roles (lesson 04)",
        "eos_mismatch (lesson 02)"]
    start = w._repr_mimebundle_()["text/plain"]
    assert "fixed: nothing" in start and "exit status 1" in start
    planted_errors = ("fp16-overflow-risk", "no-assistant-turns", "fully-truncated")
    assert all(f"ERROR   {c}" in start for c in planted_errors)
    w.children[0].value = "fixed"  # fp32 and the base rate: the precision error goes, the others stay
    assert "fp16-overflow-risk" not in w.text and "ERROR   no-assistant-turns" in w.text
    w.children[2].value = "fixed"  # roles renamed
    assert "no-assistant-turns" not in w.text and "fully-truncated" in w.text
    w.children[1].value = w.children[3].value = "fixed"
    assert "exit status 0" in w.text and "the doctor still finds: none" in w.text
    assert w._repr_mimebundle_()["text/plain"] != start
    with pytest.raises(ValueError, match="only the failures of this set-up can be fixed"):
        fixes_frame(setup, report, apply_fixes, model, tok, {"base_template"})
    with pytest.raises(TypeError, match="apply_fixes"):
        fixes_explorer(setup, report, "fix it", model, tok)
    with pytest.raises(TypeError, match=r"not \(config, rows\)"):
        fixes_frame(setup, report, lambda config, rows, found: config, model, tok, ["fp16_hot_lr"])
    with pytest.raises(TypeError, match="model, tokenizer"):
        fixes_explorer(setup, report, apply_fixes, tok, model)
