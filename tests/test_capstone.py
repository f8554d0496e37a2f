"""Tests for course_utils.capstone (lesson 08): planted failures are all found (the checker's answers and
hints: test_checkers.py)."""

import pytest

from course_utils.capstone import FAILURES, broken_setup
from course_utils.doctor import diagnose


def test_every_planted_failure_is_found_by_its_check():
    setup = broken_setup(7, planted=list(FAILURES))
    report = diagnose(str(setup.model_dir), setup.data_path, setup.config_path)
    assert setup.expected_checks <= report.checks() and report.exit_code == 1


def test_the_seed_draws_the_failures_and_bad_names_are_refused():
    drawn = {tuple(broken_setup(seed).planted) for seed in range(4)}
    assert len(drawn) > 1, "different seeds plant different failures"
    with pytest.raises(ValueError, match="unknown failure"):
        broken_setup(0, planted=["nan_everywhere"])
    with pytest.raises(ValueError, match="must be an int"):
        broken_setup("0")


def test_fixes_explorer_reruns_the_doctor_on_each_choice(course, tmp_path):
    import copy

    from course_utils.capstone import fixes_explorer, fixes_frame

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
    with pytest.raises(ValueError, match="not failures of this set-up"):
        fixes_frame(setup, report, apply_fixes, model, tok, {"base_template"})
    with pytest.raises(TypeError, match="apply_fixes"):
        fixes_explorer(setup, report, "fix it", model, tok)
