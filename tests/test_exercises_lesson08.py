"""Lesson 08's exercise (course_utils.exercises.lesson08): the tables of the checker of fix_setup, whose
oracle is the doctor (the reference answer in answers/lesson08.py, a second correct answer, each known
wrong answer with its misconception: tests/test_checkers.py runs them); the reference is the solution
notebook's; and the checker's own bad input."""

import inspect
import json
from pathlib import Path

import pytest
from conftest import Row, graded

from course_utils.capstone import trl_training_template_path
from course_utils.exercises import lesson08 as ex
from course_utils.exercises.answers import lesson08

WHAT_WHY_FIX = r".+ — .+ — .+"
SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "08_capstone.ipynb"


def fix_setup_bfd_whole_conversation(config, rows, tokenizer):
    """A second correct answer: keeps packing on with bfd (boundaries kept), drops the fp16 key, sets the
    base rate, and keeps a row only when its whole conversation fits max_length."""
    config = dict(config, chat_template_path=trl_training_template_path(), eos_token="<|im_end|>",
                  learning_rate=3e-3)
    config.pop("fp16", None)
    if config.get("packing"):
        config["packing_strategy"] = "bfd"
    template = Path(config["chat_template_path"]).read_text(encoding="utf-8")
    fixed = []
    for row in rows:
        messages = [dict(m, role="assistant" if m["role"] == "gpt" else m["role"]) for m in row["messages"]]
        ids = tokenizer.apply_chat_template(messages, chat_template=template, return_dict=True)["input_ids"]
        if len(ids) <= config["max_length"]:
            fixed.append({"messages": messages})
    return config, fixed


def changes_nothing(config, rows, tokenizer):
    """Hands the set-up back unchanged: the doctor's first finding is the rows that say 'gpt'."""
    return config, rows


def assistant_only_loss_off(config, rows, tokenizer):
    """Turns assistant_only_loss off to silence the template error (then trains on the prompts)."""
    return lesson08.fix_setup(dict(config, assistant_only_loss=False), rows, tokenizer)[:1] + \
        (lesson08.fix_setup(config, rows, tokenizer)[1],)


def raises_max_length(config, rows, tokenizer):
    """Raises max_length so long prompts fit: breaks the set-up's memory budget."""
    fixed_config, fixed_rows = lesson08.fix_setup(config, rows, tokenizer)
    return dict(fixed_config, max_length=512), fixed_rows


def keeps_only_100_good_rows(config, rows, tokenizer):
    """Drops the renamed rows and all but 100 of the rest: throws good data away with the broken rows."""
    return lesson08.fix_setup(config, rows, tokenizer)[0], \
        [x for x in rows if x["messages"][1]["role"] == "assistant"][:100]


def keeps_wrapped_packing(config, rows, tokenizer):
    """Keeps wrapped packing: examples in a packed row attend to each other."""
    fixed_config, fixed_rows = lesson08.fix_setup(config, rows, tokenizer)
    return dict(fixed_config, packing=True, packing_strategy="wrapped"), fixed_rows


def misspelt_eos_key(config, rows, tokenizer):
    """Writes 'eos_tokn': SFTConfig would refuse the key, and the eos stays unset (the doctor refuses it)."""
    fixed_config, fixed_rows = lesson08.fix_setup(config, rows, tokenizer)
    fixed_config["eos_tokn"] = fixed_config.pop("eos_token")
    return fixed_config, fixed_rows


def learning_rate_as_text(config, rows, tokenizer):
    """Writes the rate as text, '3e-3': SFTConfig stores it, training cannot use it (graded, not a crash)."""
    fixed_config, fixed_rows = lesson08.fix_setup(config, rows, tokenizer)
    return dict(fixed_config, learning_rate="3e-3"), fixed_rows


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

CHECKERS = [Row("fix_setup", graded(ex.check_fix_setup), lesson08.fix_setup)]
ALSO_CORRECT = [("fix_setup", fix_setup_bfd_whole_conversation)]
WRONG = [
    ("fix_setup", changes_nothing, "'gpt' is not 'assistant'"),
    ("fix_setup", assistant_only_loss_off, "hides the template error"),
    ("fix_setup", raises_max_length, "memory budget"),
    ("fix_setup", keeps_only_100_good_rows, "only the broken rows"),
    ("fix_setup", keeps_wrapped_packing, "attend to each other"),
    ("fix_setup", misspelt_eos_key, "(did you mean 'eos_token'?)"),
    ("fix_setup", learning_rate_as_text, "learning_rate='3e-3' has type str"),
]


# =================================================================================================
# The reference answer and the solution notebook
# =================================================================================================

def test_the_reference_is_the_solution_notebooks_fix_setup():
    """One answer, two places: the notebook's fenced solution and answers/lesson08.py do the same steps."""
    cells = ["".join(c["source"]) for c in json.loads(SOLUTION.read_text(encoding="utf-8"))["cells"]]
    solution = next(c for c in cells if c.startswith("def fix_setup("))
    body = solution.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
    reference = inspect.getsource(lesson08.fix_setup)

    def code(text):
        return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]

    assert code(body) == [line for line in code(reference) if not line.startswith(('"""', "def "))
                          and not line.endswith('"""')]


# =================================================================================================
# The checker's own arguments: never zero cases, only known failures
# =================================================================================================

@pytest.mark.parametrize("cases", [[], (), "1001", {1001: ("long_prompts",)}, [(1001,)],
                                   [(1001, ["long_prompt"])], [(None, ["long_prompts"])],
                                   [(1001, "long_prompts")]])
def test_checker_refuses_cases_that_grade_nothing_or_name_no_failure(cases):
    with pytest.raises((TypeError, ValueError), match=WHAT_WHY_FIX):
        ex.check_fix_setup(lesson08.fix_setup, cases=cases)


def test_checker_refuses_a_non_function(capsys):
    with pytest.raises(TypeError, match="must be a function.* without calling it"):
        ex.check_fix_setup("fix_setup")
