"""Shared fixtures: the course model is loaded once per test session (it is read-only here)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="session")
def course():
    """``(model, tokenizer)`` of the embedded course model. Do not train it: load your own copy."""
    from course_utils import load_course_model

    return load_course_model()


@pytest.fixture(scope="session")
def tokenizer(course):
    return course[1]


def stub(*args, **kwargs):
    """What a learner's exercise cell holds before they write anything (shared by the checker tests)."""
    raise NotImplementedError("Exercise: write your solution here")
