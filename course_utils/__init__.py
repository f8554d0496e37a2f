"""SFT Failure Lab's helper package: one module per idea a lesson teaches.

- ``model``           load the embedded course model (or a real one)         — every lesson
- ``data``            toy chat datasets, tokenization with labels             — every lesson
- ``train``           the instrumented training loop, a CPU SFTTrainer        — every lesson
- ``viz``             curves with thresholds, the token viewer                — every lesson
- ``checks``          the exercise-checker framework                          — every exercise
- ``build_course_model``, ``make_exercises``, ``run_solutions``: the maintainers' scripts
- ``tour``            environment check, lesson 00's checker                 — lesson 00
- ``accumulation``    unscaled accumulation, clipping, the clip rate          — lesson 01
- ``eos``             end-of-turn vs eos, stop rates, the pad == eos trap     — lesson 02
- ``padding``         right/left/packed collates, logit leaks, mask heatmaps  — lesson 03
- ``templates``       chat templates, {% generation %}, TRL's exact match     — lesson 04
- ``truncation``      fully masked labels, NaN micro-batches, a starving packer — lesson 05
- ``nan_detective``   QLoRA NaN causes, hooks, the stop-on-non-finite callback — lesson 06
- ``token_weighting`` token-weighted accumulation, Trainer gradients          — lesson 07
- ``ddp_grad``        the torchrun worker of lesson 07 (two processes, gloo)  — lesson 07
- ``doctor``          the SFT doctor: a pre-flight check of a whole set-up     — lesson 08, your runs
- ``watch``           SFTWatch: clip rate, empty micro-batches, first NaN      — lesson 08, your runs
- ``capstone``        lesson 08's broken set-ups and its checker              — lesson 08

Importing the package turns off Hugging Face telemetry (TRL sends it from a background thread).
"""

import logging
import os

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# bitsandbytes (imported by peft, imported by TRL) warns at import on some CPUs that it cannot fetch an
# optional kernel from the hub; it falls back to its own CPU code, and we are offline by design.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: "kernels-community" not in record.getMessage())

from .data import IGNORE_INDEX, make_batches, make_chat_dataset, make_messages, tokenize_chat  # noqa: E402
from .model import COURSE_MODEL_DIR, load_course_model, token_id  # noqa: E402
from .train import clip_rate, make_sft_trainer, set_seed, train  # noqa: E402

__all__ = [
    "COURSE_MODEL_DIR", "IGNORE_INDEX", "clip_rate", "load_course_model", "make_batches",
    "make_chat_dataset", "make_messages", "make_sft_trainer", "set_seed", "token_id",
    "tokenize_chat", "train",
]
