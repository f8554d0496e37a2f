"""Reference answer of lesson 08 (capstone). Its checker's oracle is the doctor (no expected output is
computed from this answer): the tests check that it passes, and the solution notebook's ``fix_setup``
is the same function."""

from __future__ import annotations

from pathlib import Path

from ...capstone import Setup, trl_training_template_path

PLANTED: dict[str, tuple[str, ...]] = {}  # str(config_path) -> what _broken_setup planted there


def planted_in(setup) -> tuple[str, ...]:
    """The failures planted in ``setup`` (one ``broken_setup`` / ``another_setup`` wrote in this process)."""
    if not isinstance(setup, Setup):
        raise TypeError(f"setup is a {type(setup).__name__}, not a Setup — only the lesson's set-ups have "
                        "planted failures to compare with — pass broken_setup(seed)'s result.")
    try:
        return PLANTED[str(setup.config_path)]
    except KeyError:
        raise ValueError(f"{setup.config_path} was not written by broken_setup in this process — only the "
                         "lesson's set-ups have planted failures to compare with — call "
                         "setup = broken_setup(seed) (again, after a kernel restart).") from None


def true_findings(setup, expected_checks: set[str]) -> tuple[set[str], dict[str, list[int]]]:
    """Exercise 1's truth: the checks that fire on ``setup`` — ``expected_checks``, the checks of what was
    planted (the exercise module maps failures to checks), plus the trainer check when the set-up has its own
    trainer class — and, for the row checks, every row they concern."""
    checks = set(expected_checks) | ({"trainer-accumulation"} if setup.trainer else set())
    renamed = [i for i, r in enumerate(setup.rows) if any(m["role"] == "gpt" for m in r["messages"])]
    return checks, {"no-assistant-turns": renamed}


def fix_setup(config: dict, rows: list[dict], tokenizer, report) -> tuple[dict, list[dict]]:
    """Exercise 2: fix what the doctor's ``report`` names, and only that (a healthy setting stays); rename
    'gpt' rows, drop the rows that do not fit whole in max_length with TRL's template; max_length stays."""
    found = report.checks("error") | report.checks("warning")
    config = dict(config)
    if "template-unpatchable" in found:
        config["chat_template_path"] = trl_training_template_path()
    if "eos-mismatch" in found:
        config["eos_token"] = "<|im_end|>"
    if "fp16-overflow-risk" in found:
        config.update(fp16=False, learning_rate=min(config["learning_rate"], 3e-3))
    if found & {"packing-no-boundaries", "answers-packed-apart"}:
        config["packing_strategy"] = "bfd"  # packing that keeps each example's boundaries
    path = config.get("chat_template_path")
    template = Path(path).read_text(encoding="utf-8") if path else tokenizer.chat_template
    fixed = []
    for row in rows:
        messages = [dict(m, role="assistant" if m["role"] == "gpt" else m["role"]) for m in row["messages"]]
        tokens = tokenizer.apply_chat_template(messages, chat_template=template,
                                               return_dict=True)["input_ids"]
        if len(tokens) <= config["max_length"]:  # the whole row, answer and <|im_end|> included
            fixed.append({"messages": messages})
    return config, fixed


def findings(setup) -> dict:
    """Exercise 1: every error and warning the doctor reports on the set-up, its trainer class included, and
    every row without an assistant turn."""
    from ...doctor import diagnose

    report = diagnose(str(setup.model_dir), setup.data_path, setup.config_path, trainer=setup.trainer)
    stated = {f.check: None for f in report if f.severity in ("error", "warning")}
    if "no-assistant-turns" in stated:
        stated["no-assistant-turns"] = [i for i, r in enumerate(setup.rows)
                                        if any(m["role"] == "gpt" for m in r["messages"])]
    return stated
