"""Reference answer of lesson 08 (capstone). Its checker's oracle is the doctor (no expected output is
computed from this answer): the tests check that it passes, and the solution notebook's ``fix_setup``
is the same function."""

from __future__ import annotations

from pathlib import Path

from ...capstone import trl_training_template_path


def fix_setup(config: dict, rows: list[dict], tokenizer) -> tuple[dict, list[dict]]:
    """The exercise: TRL's training template, eos, fp32, packing off; rename 'gpt' rows, drop the rows that
    do not fit whole (answer and end of turn) in max_length with that template — max_length stays."""
    config = dict(config, chat_template_path=trl_training_template_path(), eos_token="<|im_end|>",
                  fp16=False, learning_rate=min(config["learning_rate"], 3e-3), packing=False)
    template = Path(config["chat_template_path"]).read_text(encoding="utf-8")
    fixed = []
    for row in rows:
        messages = [dict(m, role="assistant" if m["role"] == "gpt" else m["role"]) for m in row["messages"]]
        tokens = tokenizer.apply_chat_template(messages, chat_template=template,
                                               return_dict=True)["input_ids"]
        if len(tokens) <= config["max_length"]:  # the whole row, answer and <|im_end|> included
            fixed.append({"messages": messages})
    return config, fixed
