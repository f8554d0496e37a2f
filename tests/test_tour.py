"""Lesson 00 (course_utils.tour): the diagnosis generator, the environment check. The checkers' answers
(reference, stub, second correct, each wrong one) are in test_checkers.py."""

import pytest

from course_utils import tour


def test_diagnosis_generator_covers_every_cause(tokenizer):
    causes = {tour._labelled_case(tokenizer, seed)[1].cause for seed in range(1000, 1010)}
    assert causes == set(tour.LABEL_CAUSES)
    with pytest.raises(ValueError, match="seed"):
        tour.unseen_labelled_example(tokenizer, -1)


def test_environment_check_needs_no_offline_variable(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    rows = dict((name, ok) for name, ok, _ in tour.check_environment(load_model=False))
    assert rows["nothing downloads at run time"], "the shipped model needs no network, whatever the variable"
    monkeypatch.setenv("COURSE_MODEL", "Qwen/Qwen2.5-0.5B")
    rows = dict((name, ok) for name, ok, _ in tour.check_environment(load_model=False))
    assert not rows["nothing downloads at run time"], "a hub id with the hub on would download"
