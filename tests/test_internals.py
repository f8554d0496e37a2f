"""The library internals the course relies on are still there, with the parameters it passes.

Every private name the course uses goes through ``course_utils/internals.py``; when TRL or transformers
renames or changes one, this test fails naming the name and the file to update.
"""

import copy
import importlib
import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from datasets import Dataset
from trl import SFTConfig

from course_utils import internals, make_chat_dataset, make_sft_trainer


@pytest.mark.parametrize("owner,name,params", internals.PRIVATE_NAMES, ids=lambda x: str(x))
def test_each_private_name_the_course_uses_is_still_there(owner, name, params):
    module, cls = owner.rsplit(".", 1)
    method = getattr(getattr(importlib.import_module(module), cls), name, None)
    found = ", ".join(f"{p}={version(p)}" for p in internals.MIRRORS)
    assert method is not None, (f"{owner}.{name} is gone ({found}; course_utils/internals.py mirrors "
                                f"{internals.MIRRORS}) — update course_utils/internals.py")
    got = tuple(inspect.signature(method).parameters)
    assert got == params, (f"{owner}.{name} now takes {got}, not {params} ({found}) — update "
                           "course_utils/internals.py")


def test_the_mirrored_versions_are_the_pinned_ones():
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    pins = dict(line.split("==") for line in project["dependencies"])
    assert {p: pins[p] for p in internals.MIRRORS} == internals.MIRRORS, \
        "internals.MIRRORS names the versions pyproject.toml pins: re-read the private code when a pin moves"


def test_prepare_sft_dataset_gives_the_rows_a_real_trainer_trains(course):
    model, tokenizer = course
    rows = make_chat_dataset("add", 6, seed=3)
    args = SFTConfig(output_dir="/tmp/internals-test", report_to="none", use_cpu=True, max_length=40,
                     dataset_num_proc=None, shuffle_dataset=False)
    mine = internals.prepare_sft_dataset(rows, tokenizer, args)
    trainer = make_sft_trainer(copy.deepcopy(model), tokenizer, Dataset.from_list(list(rows)), max_length=40,
                               progress=False)
    assert mine["input_ids"] == trainer.train_dataset["input_ids"]
