"""Lesson 08's exercise (course_utils.exercises.lesson08): the tables of the checker of fix_setup, whose
oracle is the doctor (the reference answer in answers/lesson08.py, a second correct answer, each known
wrong answer with its misconception: tests/test_checkers.py runs them); the reference is the solution
notebook's; and the checker's own bad input."""

import functools
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


def fix_setup_bfd_whole_conversation(config, rows, tokenizer, report):
    """A second correct answer: reads the findings' fix column as a person would — turns packing off only when
    the packing is the finding, drops the fp16 key, sets the base rate — and keeps a row only when its whole
    conversation fits max_length."""
    found = {f.check for f in report if f.severity in ("error", "warning")}
    config = dict(config)
    if "template-unpatchable" in found:
        config["chat_template_path"] = trl_training_template_path()
    if "eos-mismatch" in found:
        config["eos_token"] = "<|im_end|>"
    if "fp16-overflow-risk" in found:
        config.pop("fp16", None)
        config["learning_rate"] = 3e-3
    if found & {"packing-no-boundaries", "answers-packed-apart"}:
        config["packing"] = False
    path = config.get("chat_template_path")
    template = Path(path).read_text(encoding="utf-8") if path else tokenizer.chat_template
    fixed = []
    for row in rows:
        messages = [dict(m, role="assistant" if m["role"] == "gpt" else m["role"]) for m in row["messages"]]
        ids = tokenizer.apply_chat_template(messages, chat_template=template, return_dict=True)["input_ids"]
        if len(ids) <= config["max_length"]:
            fixed.append({"messages": messages})
    return config, fixed


def changes_nothing(config, rows, tokenizer, report):
    """Hands the set-up back unchanged: the doctor's first finding is the rows that say 'gpt'."""
    return config, rows


def assistant_only_loss_off(config, rows, tokenizer, report):
    """Turns assistant_only_loss off to silence the template error (then trains on the prompts)."""
    return lesson08.fix_setup(dict(config, assistant_only_loss=False), rows, tokenizer, report)[:1] + \
        (lesson08.fix_setup(config, rows, tokenizer, report)[1],)


def raises_max_length(config, rows, tokenizer, report):
    """Raises max_length so long prompts fit: breaks the set-up's memory budget."""
    fixed_config, fixed_rows = lesson08.fix_setup(config, rows, tokenizer, report)
    return dict(fixed_config, max_length=512), fixed_rows


def keeps_only_100_good_rows(config, rows, tokenizer, report):
    """Drops the renamed rows and all but 100 of the rest: throws good data away with the broken rows."""
    return lesson08.fix_setup(config, rows, tokenizer, report)[0], \
        [x for x in rows if x["messages"][1]["role"] == "assistant"][:100]


# ---- shortcuts a learner has at each exercise: each fails its checker (issue 33) ------------------------

def fix_everything_blindly(config, rows, tokenizer, report):
    """Exercise 2: every fix of the walk-through, whatever the findings (the reference of before issue 33)."""
    config = dict(config, chat_template_path=trl_training_template_path(), eos_token="<|im_end|>",
                  fp16=False, learning_rate=min(config["learning_rate"], 3e-3), packing=False)
    template = Path(config["chat_template_path"]).read_text(encoding="utf-8")
    fixed = []
    for row in rows:
        messages = [dict(m, role="assistant" if m["role"] == "gpt" else m["role"]) for m in row["messages"]]
        tokens = tokenizer.apply_chat_template(messages, chat_template=template,
                                               return_dict=True)["input_ids"]
        if len(tokens) <= config["max_length"]:
            fixed.append({"messages": messages})
    return config, fixed


def drop_rows_by_first_word(config, rows, tokenizer, report):
    """Exercise 2: the config fixes, then drops every row whose prompt opens with "Context:", unmeasured."""
    fixed_config, _ = lesson08.fix_setup(config, rows, tokenizer, report)
    kept = [{"messages": [dict(m, role="assistant" if m["role"] == "gpt" else m["role"])
                          for m in r["messages"]]}
            for r in rows if not r["messages"][0]["content"].startswith("Context:")]
    return fixed_config, kept


def apply_fixes_of_the_walk_through(config, rows, tokenizer, report):
    """Exercise 2: the notebook's own apply_fixes (section 5) — raises max_length where the doctor says so."""
    import copy

    config, rows, found = copy.deepcopy(config), copy.deepcopy(rows), report.checks()
    if "template-unpatchable" in found:
        config["chat_template_path"] = trl_training_template_path()
    for row in rows:
        for message in row["messages"]:
            message["role"] = "assistant" if message["role"] == "gpt" else message["role"]
    if "fully-truncated" in found:
        finding = next(f for f in report if f.check == "fully-truncated")
        config["max_length"] = int(finding.fix.split("max_length >= ")[1].split()[0])
    if "fp16-overflow-risk" in found:
        config.update(fp16=False, learning_rate=3e-3)
    if "packing-no-boundaries" in found:
        config["packing"] = False
    if "eos-mismatch" in found:
        config["eos_token"] = "<|im_end|>"
    return config, rows


def findings_without_the_trainer(setup):
    """Exercise 1: the doctor on the files alone, without the colleague's trainer class."""
    from course_utils.doctor import diagnose

    report = diagnose(str(setup.model_dir), setup.data_path, setup.config_path)
    stated = {f.check: None for f in report if f.severity in ("error", "warning")}
    stated["no-assistant-turns"] = lesson08.findings(setup).get("no-assistant-turns")
    return stated


def findings_with_the_quoted_row_ids(setup):
    """Exercise 1: the row ids the doctor's evidence quotes (the first few), not all of them."""
    stated = lesson08.findings(setup)
    stated["no-assistant-turns"] = stated["no-assistant-turns"][:5]
    return stated


def every_check_i_know(setup):
    """Exercise 1: a blanket statement — every check a planted failure can fire, and the trainer's."""
    stated = lesson08.findings(setup)
    return {**{check: None for _, check in ex.FAILURES.values()}, **stated}


def the_family_rule(setup):
    """Issue 43's audit: no doctor run, a rule fitted to the old fixed family (eos, the trainer, the config's
    one failure, the renamed rows)."""
    config = setup.config
    third = ("fp16-overflow-risk" if config.get("fp16") else "packing-no-boundaries" if config.get("packing")
             else "template-unpatchable")
    return {"eos-mismatch": None, "trainer-accumulation": None, third: None,
            "no-assistant-turns": [i for i, r in enumerate(setup.rows)
                                   if any(m["role"] == "gpt" for m in r["messages"])]}


SHORTCUTS = [
    ("findings", "a rule fitted to the set-up family, no doctor run (issue 43)", the_family_rule),
    ("fix_setup", "every fix, whatever the findings", fix_everything_blindly),
    ("fix_setup", "drop rows by their first word", drop_rows_by_first_word),
    ("fix_setup", "the walk-through's apply_fixes", apply_fixes_of_the_walk_through),
    ("findings", "the doctor without the trainer class", findings_without_the_trainer),
    ("findings", "the row ids the evidence quotes", findings_with_the_quoted_row_ids),
    ("findings", "every check I know", every_check_i_know),
]


@pytest.fixture(scope="module")
def another():
    return _another_setup()


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, another, capsys):
    if exercise == "fix_setup":
        result = ex.check_fix_setup(function)
    else:
        result = ex.check_findings(function)
    assert not result, f"{description} passes exercise {exercise}"


def test_the_truth_lives_with_the_answers(another):
    """What was planted is recorded in answers/lesson08.py; the exercise module keeps no copy of it."""
    assert not {"_PLANTED", "_planted", "_true_findings"} & set(vars(ex))
    assert lesson08.planted_in(another) == tuple(sorted(lesson08.PLANTED[str(another.config_path)]))


def test_the_reference_findings_pass_and_name_the_trainer(another, capsys):
    stated = lesson08.findings(another)
    assert "trainer-accumulation" in stated and ex.check_findings(lesson08.findings)
    assert another.cli().endswith(f"--trainer {another.trainer}")


def test_the_control_setup_is_healthy_for_the_doctor():
    setup, report = ex._hidden_setup(ex.CONTROL_SEED, (), True)
    assert not report.errors and report.checks("warning") <= ex.ALLOWED_WARNINGS
    assert setup.config["packing_strategy"] == "bfd" and "chat_template_path" in setup.config


def keeps_wrapped_packing(config, rows, tokenizer, report):
    """Keeps wrapped packing: examples in a packed row attend to each other."""
    fixed_config, fixed_rows = lesson08.fix_setup(config, rows, tokenizer, report)
    return dict(fixed_config, packing=True, packing_strategy="wrapped"), fixed_rows


def misspelt_eos_key(config, rows, tokenizer, report):
    """Writes 'eos_tokn': SFTConfig would refuse the key, and the eos stays unset (the doctor refuses it)."""
    fixed_config, fixed_rows = lesson08.fix_setup(config, rows, tokenizer, report)
    fixed_config["eos_tokn"] = fixed_config.pop("eos_token")
    return fixed_config, fixed_rows


def learning_rate_as_text(config, rows, tokenizer, report):
    """Writes the rate as text, '3e-3': SFTConfig stores it, training cannot use it (graded, not a crash)."""
    fixed_config, fixed_rows = lesson08.fix_setup(config, rows, tokenizer, report)
    return dict(fixed_config, learning_rate="3e-3"), fixed_rows


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

@functools.lru_cache(maxsize=1)
def _another_setup():
    return ex.another_setup(0)


def findings_rows_first(setup):
    """A second correct answer for the findings: the rows' roles first, then the doctor with the trainer."""
    from course_utils.doctor import diagnose

    renamed = [i for i, row in enumerate(setup.rows) if any(m["role"] == "gpt" for m in row["messages"])]
    report = diagnose(str(setup.model_dir), setup.rows, setup.config, trainer=setup.trainer)
    warnings = {f.check: None for f in report if f.severity == "warning" and f.check != "learning-rate"}
    return {**{f.check: None for f in report.errors}, **warnings,
            **({"no-assistant-turns": renamed} if renamed else {})}


CHECKERS = [Row("fix_setup", graded(ex.check_fix_setup), lesson08.fix_setup),
            Row("findings", graded(ex.check_findings), lesson08.findings)]
ALSO_CORRECT = [("fix_setup", fix_setup_bfd_whole_conversation), ("findings", findings_rows_first)]
WRONG = [
    ("fix_setup", changes_nothing, "'gpt' is not 'assistant'"),
    ("fix_setup", assistant_only_loss_off, "hides the template error"),
    ("fix_setup", raises_max_length, "memory budget"),
    ("fix_setup", keeps_only_100_good_rows, "only the rows that do not fit may go"),
    ("fix_setup", keeps_wrapped_packing, "attend to each other"),
    ("fix_setup", misspelt_eos_key, "(did you mean 'eos_token'?)"),
    ("fix_setup", learning_rate_as_text, "learning_rate='3e-3' has type str"),
    ("findings", findings_without_the_trainer, "trainer=setup.trainer"),
    ("findings", findings_with_the_quoted_row_ids, "the first few ids"),
    ("findings", every_check_i_know, "not fire on this set-up"),
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
        ex._check_fix_setup(lesson08.fix_setup, cases=cases)


def test_checker_refuses_a_non_function(capsys):
    with pytest.raises(TypeError, match="must be a function.* without calling it"):
        ex.check_fix_setup("fix_setup")


def test_findings_messages_name_no_check_a_dummy_could_collect(capsys):
    """Given every check name, the checker says how many are extra, not which: the truth cannot be cut out of
    its messages (issue 43)."""
    CHECKS = {check for _, check in {**ex.FAILURES, **ex.ALWAYS}.values()} | {
        "trainer-accumulation", "answers-packed-apart"}

    def every_check(setup):
        """Every check the doctor knows, with no rows."""
        return dict.fromkeys(CHECKS, [])

    result = ex.check_findings(every_check)
    assert not result and "of your findings do not fire" in result.message
    assert not any(f"'{name}'" in result.message for name in CHECKS), result.message


def test_findings_are_graded_on_set_ups_the_notebook_never_shows(capsys):
    """A dict written for the set-up in front of the learner (another_setup(COURSE_SEED)) is not enough."""
    from course_utils.model import course_seed

    shown = lesson08.findings(ex.another_setup(course_seed()))

    def memorised(setup):
        """The findings of the notebook's set-up, whatever set-up is given."""
        return shown

    assert not ex.check_findings(memorised)
