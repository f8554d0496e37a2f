"""Lesson 08 (capstone): a fine-tuning set-up as a colleague hands it over, and TRL's training template.

- ``Setup``: a set-up on disk — a model directory, a JSONL file of chats and an SFTConfig as JSON —
  and the same config and rows in memory; ``Setup.cli()`` is the doctor's command line for it.
- ``trl_training_template_path()``: TRL's Qwen2.5 training template (``{% generation %}`` markers),
  the file to point ``chat_template_path`` at when TRL cannot patch a template (lesson 04).

The lesson's tools are the doctor (``course_utils.doctor``, before training) and the watch
(``course_utils.watch``, while it trains). The broken set-ups the lesson hands you, the explorer over
their fixes and the exercise's checker are in ``course_utils.exercises.lesson08``: which failures a
set-up holds is for the doctor to find, so no function here knows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import trl  # its package is lazy (0.1 s): the trainer stack loads only when a trainer is built


@dataclass
class Setup:
    """A set-up on disk: ``model_dir``, ``data_path`` (JSONL), ``config_path`` (JSON); the ``config``
    and ``rows`` they hold, in memory; the ``seed`` it was drawn with; and ``trainer``, the colleague's own
    trainer class when they train with one."""

    seed: int
    model_dir: Path
    data_path: Path
    config_path: Path
    config: dict = field(repr=False)
    rows: list[dict] = field(repr=False)
    trainer: str | None = None  # the colleague's own SFTTrainer subclass, as the doctor's "module:Class"

    def cli(self) -> str:
        """The doctor's command line for this set-up (``python -m course_utils.doctor ...``; with a trainer
        class, run it from the set-up's folder, where its module imports)."""
        trainer = f" --trainer {self.trainer}" if self.trainer else ""
        return (f"python -m course_utils.doctor --model {self.model_dir} --data {self.data_path} "
                f"--config {self.config_path}{trainer}")


def trl_training_template_path() -> str:
    """TRL's Qwen2.5 training template (``{% generation %}`` markers, Instruct text) as a file path."""
    path = Path(trl.__file__).parent / "chat_templates" / "qwen2_5_training.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist — this TRL ({trl.__version__}) ships no Qwen2.5 "
                                "training template there — install the TRL version the course pins "
                                "(make install).")
    return str(path)
