"""SFT Failure Lab's helper package: one module per idea a lesson teaches.

The core (lesson modules import only these; a helper a second lesson needs moves here):

- ``model``           load a shipped course model (or a real one); ``course_seed()`` — every lesson
- ``data``            toy chat datasets, tokenization with labels             — every lesson
- ``losses``          the masked mean written three ways; eval loss; finiteness — lessons 01, 05-07
- ``train``           the instrumented training loop, a CPU SFTTrainer        — every lesson
- ``quiet``           capture a library's warnings; silence it for one block  — lessons 02-07
- ``validate``        what/why/fix argument checks shared by every helper     — every module
- ``viz``             curves with thresholds, the token viewer                — every lesson
- ``checks``          the exercise-checker framework (graded hints, diagnoses) — every exercise
- ``outcomes``        outcome claims with their margins (``report_outcome``)  — every lesson
- ``answers``         reference answers of the exercises (never imported by a notebook)

Lesson modules:

- ``build_course_model``, ``make_exercises``, ``run_solutions``, ``robustness``: the maintainers' scripts
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

Importing the package makes the course offline by default (``HF_HUB_OFFLINE=1`` unless you set it,
e.g. ``HF_HUB_OFFLINE=0`` to download a real model once) and turns off Hugging Face telemetry (TRL
sends it from a background thread): started from ``make lab``, a bare ``jupyter lab`` or an IDE, the
lessons behave the same.
"""

import logging
import os

# Before transformers/huggingface_hub are imported: they read these once, at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# bitsandbytes (imported by peft, imported by TRL) warns at import on some CPUs that it cannot fetch an
# optional kernel from the hub; it falls back to its own CPU code, and we are offline by design.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: "kernels-community" not in record.getMessage())

from .data import IGNORE_INDEX, make_batches, make_chat_dataset, make_messages, tokenize_chat  # noqa: E402
from .model import COURSE_MODEL_DIR, course_model_name, course_seed, load_course_model, token_id  # noqa: E402
from .outcomes import report_outcome  # noqa: E402
from .train import clip_rate, make_sft_trainer, set_seed  # noqa: E402

# ``train`` (the loop) is not re-exported: it would hide the submodule ``course_utils.train``
# (``import course_utils.train as T`` would give the function). Use ``from course_utils.train import train``.
__all__ = [
    "COURSE_MODEL_DIR", "IGNORE_INDEX", "clip_rate", "course_model_name", "course_seed",
    "load_course_model", "make_batches", "make_chat_dataset", "make_messages", "make_sft_trainer",
    "report_outcome", "set_seed", "token_id", "tokenize_chat",
]
