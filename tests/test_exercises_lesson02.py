"""Lesson 02's exercises (``course_utils.exercises.lesson02``): the tables of its checkers (the reference, a
second correct answer, each known wrong answer with its misconception: ``tests/test_checkers.py`` runs
them); the hints; the diagnosis generator draws every cause; the graders refuse bad set-up arguments.
"""

import subprocess
import sys

import pytest
import torch
from conftest import Row, graded, graded_on_tokenizer, tried_twice

from course_utils import eos
from course_utils.checks import Diagnosis
from course_utils.data import IGNORE_INDEX, end_of_turn_id
from course_utils.exercises import lesson02 as ex
from course_utils.exercises.answers import lesson02


def stop_ids_by_token_scan(tokenizer, generation_config):
    """A second correct answer: tokenize the whole rendering and scan from the answer's last token."""
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "zebra"},
                {"role": "user", "content": "b"}]
    enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    answer = tokenizer("zebra", add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(enc)) if enc[i:i + len(answer)] == answer) + len(answer)
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    first = next(t for t in enc[start:] if tokenizer.decode([t]).strip())  # the first non-blank token
    listed = generation_config.eos_token_id
    listed = [listed] if isinstance(listed, int) else (listed or [tokenizer.eos_token_id])
    return list(dict.fromkeys([*listed, first])) if first in special else list(listed)


def only_the_eos(tokenizer, generation_config):
    """Stops on the tokenizer's eos only: a chat model ends its turn with another token."""
    return [tokenizer.eos_token_id]


def hard_coded_im_end(tokenizer, generation_config):
    """Hard-codes <|im_end|>: right for Qwen, wrong for a family with another end-of-turn token."""
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]


def only_the_end_of_turn(tokenizer, generation_config):
    """Drops the tokenizer's eos: a plain-text continuation no longer stops (the reference's last id is the
    end of turn)."""
    return [lesson02.stop_ids_for_generate(tokenizer, generation_config)[-1]]


def the_turn_opener(tokenizer, generation_config):
    """Takes <|im_start|>, the turn *opener*, for the token that ends a turn."""
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")]


def lesson00s_stop_token_ids(tokenizer, generation_config):
    """The shortcut: lesson 00's helper, which ignores what the checkpoint's generation_config lists."""
    return eos.stop_token_ids(tokenizer)


def diagnose_generations_other_order(artefact):
    """A second correct answer: cut replies first, then the training rows, then the replies' stop token."""
    gens, special = artefact["generations"], artefact["special_tokens"]
    stop = special["end_of_turn"] if artefact["format"] == "chat" else special["eos"]
    cut = [g for g in gens if stop not in g["tokens"] and set(g["tokens"]) <= set(g["reference"])]
    if any(len(g["tokens"]) < len(g["reference"]) for g in cut):  # any cut reply, not only the first
        return Diagnosis("max_new_tokens_too_small", artefact["generate_call"]["max_new_tokens"])
    graded = [t for row in artefact["training_rows"] for t, g in zip(row["tokens"], row["graded"]) if g]
    if stop not in graded:
        return Diagnosis("pad_equals_eos" if special["pad"] == stop else "stop_token_not_graded", stop)
    return Diagnosis("wrong_stop_ids", stop)


def always_wrong_stop_ids(artefact):
    """Memorised: every run that does not stop has the wrong stop ids."""
    return Diagnosis("wrong_stop_ids", artefact["special_tokens"]["end_of_turn"])


def always_stop_token_not_graded(artefact):
    """Memorised: every run that does not stop never saw its stop token graded."""
    return Diagnosis("stop_token_not_graded", artefact["special_tokens"]["end_of_turn"])


def _never_pad_eos(artefact):
    """Never suspects pad == eos: takes that look-alike for an ungraded stop token."""
    truth = lesson02.diagnose_generations(artefact)
    if truth.cause == "pad_equals_eos":
        return Diagnosis("stop_token_not_graded", truth.evidence)
    return truth


def _wrong_evidence(artefact):
    """Right cause, but "row 0" as the evidence, whatever the run shows."""
    truth = lesson02.diagnose_generations(artefact)
    return Diagnosis(truth.cause, "row 0")


def collate_left(examples, pad_token_id, eos_token_id):
    """A second correct answer: left padding, the eos appended where a row has none."""
    examples = [lesson02.with_eos(e, eos_token_id) for e in examples]
    width = max(len(e["input_ids"]) for e in examples)
    rows = [(width - len(e["input_ids"]), e["input_ids"], e["labels"]) for e in examples]
    return {"input_ids": torch.tensor([[pad_token_id] * k + ids for k, ids, _ in rows]),
            "attention_mask": torch.tensor([[0] * k + [1] * len(ids) for k, ids, _ in rows]),
            "labels": torch.tensor([[IGNORE_INDEX] * k + labels for k, _, labels in rows])}


def collate_pad_id_then_first_eos(examples, pad_token_id, eos_token_id):
    """A third correct answer, the common fix: append the missing eos, mask by pad id, then restore the
    first eos of each row."""
    examples = [lesson02.with_eos(e, eos_token_id) for e in examples]
    batch = lesson02.collate_keep_eos(examples, pad_token_id, eos_token_id)
    labels = batch["input_ids"].clone()
    for i, e in enumerate(examples):
        labels[i, :len(e["labels"])] = torch.tensor(e["labels"])
    labels[batch["input_ids"] == pad_token_id] = IGNORE_INDEX
    for i in range(len(examples)):
        first = int((batch["input_ids"][i] == eos_token_id).nonzero()[0, 0])
        labels[i, first] = eos_token_id
        labels[i, first + 1:] = IGNORE_INDEX
    batch["labels"] = labels
    return batch


def _pad_id_masking(examples, pad, eos):
    """Masks by pad id, as transformers' collator does: with pad == eos, the eos is masked too."""
    batch = lesson02.collate_keep_eos(examples, pad, eos)
    batch["labels"] = batch["input_ids"].clone()
    batch["labels"][batch["input_ids"] == pad] = IGNORE_INDEX  # transformers' collator: by id
    return batch


def _ignores_prompt_mask(examples, pad, eos):
    """Builds labels from input_ids: the example's own prompt mask is overwritten."""
    return lesson02.collate_keep_eos([{"input_ids": e["input_ids"]} for e in examples], pad, eos)


def _trains_padding(examples, pad, eos):
    """Labels the padding positions: the model is trained to write pad after pad."""
    batch = lesson02.collate_keep_eos(examples, pad, eos)
    batch["labels"] = torch.where(batch["attention_mask"] == 1, batch["labels"], batch["input_ids"])
    return batch


def _keeps_last_eos(examples, pad, eos):
    """Keeps the row's *last* eos (a pad, when pad == eos) instead of its first."""
    batch = lesson02.collate_keep_eos(examples, pad, eos)
    batch["labels"][:, -1] = batch["input_ids"][:, -1]
    return batch


def _all_ones_mask(examples, pad, eos):
    """An all-ones attention mask: the real tokens attend to the padding."""
    batch = lesson02.collate_keep_eos(examples, pad, eos)
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    return batch


def _never_appends(examples, pad, eos):
    """Masks by position, but leaves a row tokenized without its eos without one."""
    width = max(len(e["input_ids"]) for e in examples)
    rows = [(list(e["input_ids"]), list(e.get("labels", e["input_ids"]))) for e in examples]
    return {"input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows]),
            "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows]),
            "labels": torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in rows])}


def _always_appends(examples, pad, eos):
    """Appends an eos to every row, also to those that already end with theirs."""
    return lesson02.collate_keep_eos([{"input_ids": list(e["input_ids"]) + [eos],
                                       "labels": list(e.get("labels", e["input_ids"])) + [eos]}
                                      for e in examples], pad, eos)


# =================================================================================================
# The tables (tests/test_checkers.py runs them)
# =================================================================================================

CHECKERS = [
    Row("stop_token_ids", graded_on_tokenizer(ex.check_stop_token_ids), lesson02.stop_ids_for_generate),
    Row("diagnosis_exercise", graded(ex.check_diagnosis_exercise), lesson02.diagnose_generations),
    Row("collate_keep_eos", graded(ex.check_collate_keep_eos), lesson02.collate_keep_eos),
]

ALSO_CORRECT = [
    ("stop_token_ids", stop_ids_by_token_scan),
    ("diagnosis_exercise", diagnose_generations_other_order),
    ("collate_keep_eos", collate_left),
    ("collate_keep_eos", collate_pad_id_then_first_eos),
]

WRONG = [
    ("stop_token_ids", only_the_eos, "you returned only the tokenizer's eos"),
    ("stop_token_ids", hard_coded_im_end, "you hard-coded <|im_end|>"),
    ("stop_token_ids", only_the_end_of_turn, "keep the tokenizer's eos"),
    ("stop_token_ids", the_turn_opener, "turn *opener*"),
    ("stop_token_ids", lesson00s_stop_token_ids, "finished form of this exercise"),
    ("diagnosis_exercise", always_wrong_stop_ids, "no reply contains the end-of-turn token"),
    ("diagnosis_exercise", always_stop_token_not_graded, "the model DOES write the end-of-turn token"),
    ("diagnosis_exercise", _never_pad_eos, "masks labels by pad id"),
    ("diagnosis_exercise", _wrong_evidence, "does not show it"),
    ("collate_keep_eos", _pad_id_masking, "you masked by pad *id*"),
    ("collate_keep_eos", _ignores_prompt_mask, "overwrote the example's prompt mask"),
    ("collate_keep_eos", _trains_padding, "the padding carries labels"),
    ("collate_keep_eos", _keeps_last_eos, "you kept the row's *last* eos"),
    ("collate_keep_eos", _all_ones_mask, "the attention mask is all ones"),
    ("collate_keep_eos", _never_appends, "still has none"),
    ("collate_keep_eos", _always_appends, "appended another"),
]


# =================================================================================================
# Hints, the diagnosis generator, and the graders' own arguments
# =================================================================================================

def test_stop_token_ids_hints_are_graded(tokenizer, capsys):
    result = tried_twice(ex.check_stop_token_ids, tokenizer)
    first = result.hint()
    assert "question" in first and "get_added_vocab" not in first
    result.hint()
    assert "answer" in result.hint()


def test_broken_generation_run_draws_every_cause_and_varies():
    case = lesson02.broken_run_case
    assert {case(seed)[1].cause for seed in range(len(ex.CAUSES))} == set(ex.CAUSES)
    assert {case(seed, graded=False)[1].cause for seed in range(len(ex.CAUSES))} == set(ex.CAUSES)
    assert case(100)[0] != case(101)[0]
    assert case(7) == case(7), "seeded: the same seed, the same run"


def test_the_public_generator_returns_the_shown_artefact_only_and_the_checker_grades_another_stream():
    artefact = ex.broken_generation_run(7)
    assert artefact == lesson02.broken_run_case(7, graded=False)[0]
    assert isinstance(artefact, dict) and not any(isinstance(v, Diagnosis) for v in artefact.values())
    assert not any(cause in repr(artefact) for cause in ex.CAUSES), "no field names the cause"
    shown = [lesson02.broken_run_case(seed, graded=False)[0] for seed in range(1000, 1040)]
    assert not any(lesson02.broken_run_case(seed)[0] in shown for seed in range(1000, 1040)), (
        "the checker's runs are not the ones a learner can print")
    assert not hasattr(ex, "_broken_generation_run"), "the truth-knowing generator lives with the answers"


def test_every_drawn_run_is_decidable_by_the_reference(capsys, monkeypatch):
    """No run without its evidence (e.g. a budget that cuts no answer): 300 seeds instead of a fresh draw."""
    monkeypatch.setattr(ex, "fresh_seeds", lambda n: list(range(300)))
    assert ex.check_diagnosis_exercise(lesson02.diagnose_generations).passed


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (None, ValueError), ("3", ValueError)])
def test_broken_generation_run_refuses_a_bad_seed(seed, error):
    with pytest.raises(error, match="seed.* — .* — "):
        ex.broken_generation_run(seed)


# (The diagnosis checker takes no seeds: it draws fresh cases per run; tests/test_checkers.py tries
# the shortcuts.)


def test_check_stop_token_ids_refuses_a_missing_or_template_less_tokenizer(tokenizer):
    import copy

    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer, got NoneType — "):
        ex.check_stop_token_ids(lesson02.stop_ids_for_generate, None)
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat_template — "):
        ex.check_stop_token_ids(lesson02.stop_ids_for_generate, bare)


def test_no_lesson_module_imports_the_exercises():
    """eos used to import its answers inside a checker (a cycle): the lesson modules now stand alone."""
    code = ("import sys, course_utils.eos, course_utils.templates; "
            "print([m for m in sys.modules if m.startswith('course_utils.exercises')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("fn", [None, [], "diagnose_generations"])
def test_the_diagnosis_checker_refuses_what_is_not_a_function(fn):
    with pytest.raises(TypeError, match="fn must be a function, got .* — the helper calls it — "):
        ex.check_diagnosis_exercise(fn)


def _settings_only(artefact):
    """Reads the settings and never a reply or a label: a small budget, plain text with pad == eos, else
    the stop list (the issue's shortcut: it passed 17/17 before)."""
    call, special = artefact["generate_call"], artefact["special_tokens"]
    stop = special["end_of_turn"] if artefact["format"] == "chat" else special["eos"]
    if call["max_new_tokens"] < 8:
        return Diagnosis("max_new_tokens_too_small", call["max_new_tokens"])
    if artefact["format"] == "plain" and special["pad"] == stop:
        return Diagnosis("pad_equals_eos", stop)
    return Diagnosis("wrong_stop_ids", stop)


def _match_shown_runs(artefact):
    """Looks the artefact up among the runs broken_generation_run shows, with the reference's verdict."""
    for seed in range(200):
        if ex.broken_generation_run(seed) == artefact:
            return lesson02.diagnose_generations(artefact)
    return Diagnosis("wrong_stop_ids", artefact["special_tokens"]["end_of_turn"])


def _three_lines_with_end_of_turn_id(tokenizer, generation_config):
    """Issue 43: the config's ids plus lesson 00's data.end_of_turn_id, three lines."""
    listed = generation_config.eos_token_id
    ids = [listed] if isinstance(listed, int) else list(listed or [tokenizer.eos_token_id])
    return ids if end_of_turn_id(tokenizer) in ids else ids + [end_of_turn_id(tokenizer)]


def _stop_token_ids_merged_with_the_config(tokenizer, generation_config):
    """Issue 43: lesson 00's eos.stop_token_ids merged with what the config lists."""
    listed = generation_config.eos_token_id
    ids = [listed] if isinstance(listed, int) else list(listed or [])
    return list(dict.fromkeys(ids + eos.stop_token_ids(tokenizer)))


def _trl_collator_as_is(examples, pad, eos):
    """Issue 43: TRL's own collator, which the setup imports, called as it is (it masks by position)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling as TRLCollator

    return TRLCollator(pad_token_id=pad)([{"input_ids": e["input_ids"], **({"labels": e["labels"]} if "labels"
                                           in e else {})} for e in examples])


def _wraps_collate_right(examples, pad, eos):
    """Issue 43: a wrapper around the course's data.collate_right (labels default to the ids)."""
    from course_utils.data import collate_right

    return collate_right([{"input_ids": e["input_ids"], "labels": e.get("labels", e["input_ids"])}
                          for e in examples], pad)


def _wraps_collate_padded(examples, pad, eos):
    """Issue 43: a wrapper around lesson 03's padding.collate_padded."""
    from course_utils.padding import collate_padded

    return collate_padded([{"input_ids": e["input_ids"], "labels": e.get("labels", e["input_ids"])}
                           for e in examples], pad)


def _end_of_turn_id_or_nothing(tokenizer, generation_config):
    """The audit's shortcut (issue 43): the config's ids + data.end_of_turn_id, its ValueError (no id closes a
    turn) caught — the case the helper gets wrong, covered by a try."""
    ids = generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [tokenizer.eos_token_id])
    try:
        eot = end_of_turn_id(tokenizer)
    except ValueError:
        return ids
    return ids if eot in ids else ids + [eot]


def _append_eos_then(collate):
    def wrapper(examples, pad, eos):
        rows = []
        for e in examples:
            ids, labels = list(e["input_ids"]), list(e.get("labels", e["input_ids"]))
            if ids[-1] != eos:
                ids, labels = ids + [eos], labels + [eos]
            rows.append({"input_ids": ids, "labels": labels})
        return collate(rows, pad)
    return wrapper


def _append_eos_then_collate_right(examples, pad, eos):
    """The audit's shortcut (issue 43): append the missing eos, then the course's data.collate_right."""
    from course_utils.data import collate_right
    return _append_eos_then(collate_right)(examples, pad, eos)


def _append_eos_then_collate_padded(examples, pad, eos):
    """The audit's shortcut (issue 43): append the missing eos, then padding.collate_padded."""
    from course_utils.padding import collate_padded
    return _append_eos_then(collate_padded)(examples, pad, eos)


# Shortcuts a learner has: exercise 1, lesson 00's course_utils.eos.stop_token_ids; exercise 2, the settings
# alone, and the public generator's runs.
SHORTCUTS = [("stop_token_ids", "lesson 00's eos.stop_token_ids, called as it is", lesson00s_stop_token_ids),
             ("stop_token_ids", "data.end_of_turn_id with its ValueError caught", _end_of_turn_id_or_nothing),
             ("collate_keep_eos", "append the eos, then data.collate_right", _append_eos_then_collate_right),
             ("collate_keep_eos", "append the eos, then padding.collate_padded",
              _append_eos_then_collate_padded),
             ("diagnosis_exercise", "the generate() settings and special tokens, never a reply or a label",
              _settings_only),
             ("diagnosis_exercise", "match the shown runs over seeds", _match_shown_runs),
             ("stop_token_ids", "the config's ids + data.end_of_turn_id (issue 43)",
              _three_lines_with_end_of_turn_id),
             ("stop_token_ids", "eos.stop_token_ids merged with the config's ids",
              _stop_token_ids_merged_with_the_config),
             ("collate_keep_eos", "TRL's collator, imported by the setup, as it is", _trl_collator_as_is),
             ("collate_keep_eos", "a wrapper around data.collate_right", _wraps_collate_right),
             ("collate_keep_eos", "a wrapper around padding.collate_padded", _wraps_collate_padded)]


@pytest.mark.parametrize("exercise, what, shortcut", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_each_shortcut_fails_its_checker(exercise, what, shortcut, tokenizer, capsys):
    check = getattr(ex, f"check_{exercise}")
    result = check(shortcut, tokenizer) if exercise == "stop_token_ids" else check(shortcut)
    assert not result, what


def test_no_setting_alone_decides_a_cause():
    """Every setting a cause needs also shows up in runs with another cause (issue 33: the settings-only
    function passed 17 of 17)."""
    def settings(seed):
        artefact, truth = lesson02.broken_run_case(seed)
        special = artefact["special_tokens"]
        return (artefact["format"], special["pad"] == special["eos"]), truth.cause
    causes = {}
    for seed in range(400):
        key, cause = settings(seed)
        causes.setdefault(key, set()).add(cause)
    assert all(len(c) >= 2 for c in causes.values()), causes


def test_show_run_prints_what_a_practitioner_reads_and_refuses_another_dict(capsys):
    ex.show_run(ex.broken_generation_run(3))
    out = capsys.readouterr().out
    assert "model.generate(" in out and "carry no loss" in out and not any(c in out for c in ex.CAUSES)
    with pytest.raises(ValueError, match="artefact must be the dict broken_generation_run.* — .* — "):
        ex.show_run({"generations": []})
