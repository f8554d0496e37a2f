"""Lesson 09's exercises (``course_utils.exercises.lesson09``): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: ``tests/test_checkers.py`` runs them);
the diagnosis generator draws every cause and healthy look-alikes from TRL's real preparation; each shortcut a
learner has at each exercise fails."""

import pytest
from conftest import Row, graded

from course_utils.checks import Diagnosis
from course_utils.exercises import lesson09 as ex
from course_utils.exercises.answers import lesson09


def turn_rows_flag_only_where_plain(conversation):
    """A second correct answer: enable_thinking=False only on the plain turns, nothing on the others."""
    rows = []
    for i, m in enumerate(conversation):
        if m["role"] == "assistant":
            kwargs = {} if m.get("reasoning_content") else {"enable_thinking": False}
            rows.append({"prompt": conversation[:i], "completion": [m], "chat_template_kwargs": kwargs})
    return rows


def whole_conversation(conversation):
    """TRL's default: the conversation as one messages row, every token graded."""
    return [{"messages": conversation}]


def last_turn_only(conversation):
    """One prompt-completion row: the history, then the last reply."""
    return [{"prompt": conversation[:-1], "completion": conversation[-1:]}]


def per_turn_without_the_flag(conversation):
    """One row per turn, but plain turns keep the default enable_thinking: their empty block is graded."""
    return [
        {"prompt": conversation[:i], "completion": [m]}
        for i, m in enumerate(conversation)
        if m["role"] == "assistant"
    ]


def per_turn_thinking_off(conversation):
    """One row per turn, every row with enable_thinking=False: the reasoning turns lose their opening."""
    return [
        {"prompt": conversation[:i], "completion": [m], "chat_template_kwargs": {"enable_thinking": False}}
        for i, m in enumerate(conversation)
        if m["role"] == "assistant"
    ]


def diagnose_by_counts_other_order(artefact):
    """A second correct answer: count by walking the graded tokens, reasoning first."""
    found = lesson09.diagnose_rendering(artefact)
    return Diagnosis(found.cause, found.evidence)


def always_healthy(artefact):
    """Memorised: every rendering is fine."""
    return Diagnosis("healthy", None)


def any_empty_block(artefact):
    """Calls every empty think block trained, also one in the prompt."""
    n = sum("".join(t for t, _ in row["tokens"]).count("<think>\n\n</think>") for row in artefact["rows"])
    return Diagnosis("empty_think_graded", n) if n else lesson09.diagnose_rendering(artefact)


def any_turn_without_a_block(artefact):
    """Calls every assistant turn rendered without a block 'dropped', also where the data had no reasoning."""
    truth = lesson09.diagnose_rendering(artefact)
    if truth.cause == "healthy" and artefact["template"] == "qwen3":
        missing = sum(
            sum(m["role"] == "assistant" for m in row["messages"])
            - "".join(t for t, _ in row["tokens"]).count("<think>")
            for row in artefact["rows"]
        )
        if missing:
            return Diagnosis("reasoning_dropped", missing)
    return truth


def llama_drops_calls(artefact):
    """Reads the verdict off the template's name: Llama 3 drops tool calls — also where there are none."""
    if artefact["template"] == "llama3":
        return Diagnosis("tool_calls_dropped", len(artefact["rows"]))
    return lesson09.diagnose_rendering(artefact)


def any_tool_reply(artefact):
    """Calls every rendered tool reply trained, graded or not."""
    n = sum("".join(t for t, _ in row["tokens"]).count("<tool_response>") for row in artefact["rows"])
    truth = lesson09.diagnose_rendering(artefact)
    return Diagnosis("tool_reply_graded", n) if n and truth.cause == "healthy" else truth


CHECKERS = [
    Row("turn_rows", graded(ex.check_turn_rows), lesson09.turn_rows),
    Row("diagnose_rendering", graded(ex.check_diagnose_rendering), lesson09.diagnose_rendering),
]
ALSO_CORRECT = [
    ("turn_rows", turn_rows_flag_only_where_plain),
    ("diagnose_rendering", diagnose_by_counts_other_order),
]
WRONG = [
    ("turn_rows", whole_conversation, "never reach the loss"),
    ("turn_rows", last_turn_only, "never reach the loss"),
    ("turn_rows", per_turn_without_the_flag, "empty think block"),
    ("turn_rows", per_turn_thinking_off, "opening <think> sits in the row's prompt"),
    ("diagnose_rendering", always_healthy, "is not what broke"),
    ("diagnose_rendering", any_empty_block, "in the prompt (not graded)"),
    ("diagnose_rendering", any_turn_without_a_block, "loses nothing"),
    ("diagnose_rendering", llama_drops_calls, "holds no tool call"),
    ("diagnose_rendering", any_tool_reply, "none of its tokens is graded"),
]


def test_the_generator_draws_every_cause_and_its_truth_matches_the_reference():
    drawn = [lesson09.rendering_case(seed) for seed in range(24)]
    assert {truth.cause for _, truth in drawn} == set(ex.CAUSES)
    for artefact, truth in drawn:
        assert lesson09.diagnose_rendering(artefact) == truth
        assert (truth.evidence is None) == (truth.cause == "healthy")
    assert len(ex._look_alike_seeds(5000)) == len(ex._LOOK_ALIKES), "every healthy look-alike is drawn"


def test_the_truth_lives_with_the_answers_on_a_stream_apart():
    assert ex.rendering(3) == lesson09.rendering_case(3, graded=False)[0]
    assert ex.rendering(3) != lesson09.rendering_case(3, graded=True)[0]


def test_the_artefact_names_no_cause():
    artefact = ex.rendering(4)
    assert set(artefact) == {"template", "loss", "rows"}
    assert not any(cause in str(artefact) for cause in ex.CAUSES[1:])


# ---- shortcuts a learner has at each exercise: each fails the checker (issue 33) ----------------------


def notebook_fixed_rows(conversation):
    """Exercise 1: section 5's fix — one prompt-completion row (the last turn), the flag set by reasoning."""
    return [
        {
            "prompt": conversation[:-1],
            "completion": conversation[-1:],
            "chat_template_kwargs": {"enable_thinking": "reasoning_content" in conversation[-1]},
        }
    ]


def rest_as_completion(conversation):
    """Exercise 1: each turn's row holds the rest of the conversation as its completion."""
    return [
        {"prompt": conversation[:i], "completion": conversation[i:]}
        for i, m in enumerate(conversation)
        if m["role"] == "assistant"
    ]


def trl_prepared_rows(conversation):
    """Exercise 1: hand back what reasoning.trained_rows prepared (already tokenized)."""
    from course_utils.exercises.lesson09 import _qwen3_tokenizer
    from course_utils.reasoning import trained_rows

    return trained_rows(_qwen3_tokenizer(), [{"messages": conversation}], assistant_only_loss=True)


def match_the_shown_renderings(artefact):
    """Exercise 2: look the artefact up among rendering(seed) and read the cause off the seed."""
    for seed in range(12):
        if ex.rendering(seed) == artefact:
            return Diagnosis(ex.CAUSES[seed % len(ex.CAUSES)], 1)
    return Diagnosis("healthy", None)


SHORTCUTS = [
    ("turn_rows", "TRL's default messages row", whole_conversation),
    ("turn_rows", "section 5's fix (the last turn, the flag)", notebook_fixed_rows),
    ("turn_rows", "the rest of the conversation as the completion", rest_as_completion),
    ("turn_rows", "the rows trained_rows prepared", trl_prepared_rows),
    ("diagnose_rendering", "match the shown renderings over seeds", match_the_shown_renderings),
    ("diagnose_rendering", "the template's name decides", llama_drops_calls),
    ("diagnose_rendering", "always healthy", always_healthy),
]


@pytest.mark.parametrize("exercise, description, function", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_the_checker(exercise, description, function, capsys):
    checks = {"turn_rows": ex.check_turn_rows, "diagnose_rendering": ex.check_diagnose_rendering}
    assert not checks[exercise](function), f"{description} passes exercise {exercise}"


def test_the_graders_refuse_bad_set_up_arguments():
    with pytest.raises(TypeError, match="must be a function"):
        ex.check_turn_rows("my_turn_rows")
    with pytest.raises(ValueError, match="seed"):
        ex.rendering(None)
