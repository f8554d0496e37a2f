"""SFT Failure Lab's helper package: one module per idea a lesson teaches.

The core (every other module imports only these; a helper a second lesson needs moves here):

- ``model``           load a shipped course model (or a real one); ``course_seed()`` — every lesson
- ``data``            toy chat datasets, tokenization with labels, ``graded``  — every lesson
- ``losses``          the masked mean written three ways; eval loss; finiteness — lessons 01, 05-07
- ``training``        the instrumented loop ``train``, a CPU ``make_sft_trainer`` — every lesson
- ``quiet``           capture a library's warnings; silence it for one block  — lessons 02-07
- ``validate``        what/why/fix argument checks, called at each public entry — every module
- ``internals``       the one place that touches TRL / transformers private code — lessons 05, 07, 08
- ``viz``             curves with thresholds, the token viewer, ``what_if``   — every lesson
- ``checks``          the exercise-checker framework (graded hints, diagnoses) — every exercise
- ``outcomes``        outcome claims with their margins (``report_outcome``)  — every lesson
- ``generation``      greedy generation with checked ids (``generate_greedy``) — lessons 00, 02, 08-10
- ``predictions``     record a prediction, reveal it against the measurement  — every lesson

A lesson's learner tools (what its notebook explains and a practitioner reuses):

- ``tour``            environment check, loss modes                           — lesson 00
- ``accumulation``    unscaled accumulation, clipping, the clip rate          — lesson 01
- ``eos``             end-of-turn vs eos, stop rates, the pad == eos trap     — lesson 02
- ``padding``         right/left/packed collates, logit leaks, mask heatmaps  — lesson 03
- ``templates``       chat templates, {% generation %}, TRL's exact match     — lesson 04
- ``truncation``      fully masked labels, NaN micro-batches, the best-fit packer — lesson 05
- ``nan_detective``   QLoRA NaN causes, hooks, the stop-on-non-finite callback — lesson 06
- ``token_weighting`` token-weighted accumulation, Trainer gradients          — lesson 07
- ``ddp_grad``        the torchrun worker of lesson 07 (two processes, gloo)  — lesson 07
- ``doctor``          the SFT doctor (a package): a pre-flight check of a whole set-up — lesson 08, your runs
- ``watch``           SFTWatch: clip rate, empty micro-batches, first NaN      — lesson 08, your runs
- ``capstone``        a set-up on disk (``Setup``), TRL's training template path   — lesson 08
- ``reasoning``       reasoning and tool-call data, what a template grades of it, reply readers — lesson 09
- ``shipping``        what a saved directory serves vs what was trained; ``ship`` its CLI — lesson 10
- ``lora_coverage``   what a LoRA config adapts, group by group (MoE experts, hybrid mixers) — lesson 13

``exercises/lessonNN.py`` holds lesson NN's checkers (``check_*``) and the generators of their cases;
``exercises/answers/`` the reference answers. A notebook imports checkers and artefacts, never an
answer or a generator that returns the cause. The maintainers' tooling (model builds, exercise
generation, the robustness matrix, the claims table) lives in ``tools/``, outside this package.

Importing the package changes nothing in your process. The lessons call ``use_course_defaults()``
in their first cell (offline, no telemetry); your own scripts decide for themselves.
"""

import importlib
import logging
import os
import sys

# The names a lesson imports from the package itself, and the module each lives in. Loaded on first
# use (PEP 562), so that ``import course_utils`` stays cheap and ``use_course_defaults()`` can run
# before transformers reads its settings.
_EXPORTS = {
    "IGNORE_INDEX": "data", "make_batches": "data", "make_chat_dataset": "data", "make_messages": "data",
    "tokenize_chat": "data", "graded": "data", "is_graded": "data", "n_graded": "data",
    "COURSE_MODEL_DIR": "model", "course_model_name": "model", "course_seed": "model",
    "load_course_model": "model", "load_base_checkpoint": "model", "token_id": "model",
    "add_reasoning_tokens": "model",
    "report_outcome": "outcomes",
    "clip_rate": "training", "make_sft_trainer": "training", "set_seed": "training",
}

COURSE_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",             # nothing downloads: the course models ship in the repository
    "HF_HUB_DISABLE_TELEMETRY": "1",   # TRL reports usage from a background thread otherwise
    "TOKENIZERS_PARALLELISM": "false",  # the tokenizers' thread pool warns after a fork (DataLoader)
}


# Set by use_course_defaults(): this process is a lesson kernel, whose settings the course may choose
# (its first load_course_model then freezes the imports: freeze_lesson_imports). A process that never calls
# it (yours, running the doctor or SFTWatch) is left as it is.
_lesson_kernel = False
_imports_frozen = False


def use_course_defaults() -> dict[str, str]:
    """The course's settings for this process, set once at the top of a lesson: offline, no
    telemetry, no tokenizer threads. A variable you set yourself is kept (``HF_HUB_OFFLINE=0`` to
    download a real model once). Returns what is now in force. It also marks the process as a lesson
    kernel: its first ``load_course_model`` freezes what the imports left in memory (``gc.freeze``), so
    that each ``Trainer.train()``'s full garbage collection skips it (``freeze_lesson_imports``).

    huggingface_hub reads ``HF_HUB_OFFLINE`` when it is first imported; when it already was, its
    constant is updated too, so the call works wherever it stands. bitsandbytes (imported by peft,
    imported by TRL) also logs on some CPUs that it cannot fetch an optional kernel from the hub; it
    falls back to its own CPU code, and offline that notice is noise: it is filtered.
    """
    global _lesson_kernel
    _lesson_kernel = True
    for name, value in COURSE_DEFAULTS.items():
        os.environ.setdefault(name, value)
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = _is_true(os.environ["HF_HUB_OFFLINE"])
        hub.HF_HUB_DISABLE_TELEMETRY = _is_true(os.environ["HF_HUB_DISABLE_TELEMETRY"])
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_no_kernel_download_notice)
    return {name: os.environ[name] for name in COURSE_DEFAULTS}


def freeze_lesson_imports() -> None:
    """In a lesson kernel (``use_course_defaults()`` was called), once, before its first model exists:
    import what every lesson trains with and freeze it, so that garbage collections skip it.

    Why: transformers' ``Trainer.train()`` starts with a full ``gc.collect()`` (accelerate's
    ``free_memory``), and with torch, transformers and TRL imported that scans ~500,000 objects: 0.2-0.3 s
    a run on a 2-core CPU, measured, and a lesson trains up to six. ``gc.freeze()`` moves every object in
    memory to a generation the collector never scans; the modules the imports made live as long as the
    kernel anyway, so skipping them changes nothing else (three short ``train()`` calls: 0.76 s before,
    0.15 s after). It runs before any model exists because a model is never freed while frozen:
    transformers' modules hold reference cycles, which only the collector frees. TRL's trainer is imported
    here first, so that its ~290,000 objects are frozen too (every lesson that loads a model imports it
    sooner or later, measured). Your own process — one that never called ``use_course_defaults`` — is left
    alone; ``gc.unfreeze()`` undoes it.
    """
    global _imports_frozen
    if _imports_frozen or not _lesson_kernel:
        return
    import gc

    import transformers  # noqa: F401
    from trl import SFTTrainer  # noqa: F401

    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()
    _imports_frozen = True


def _is_true(value: str) -> bool:
    return value.upper() in ("1", "ON", "YES", "TRUE")  # huggingface_hub's own reading of the variable


def _no_kernel_download_notice(record: logging.LogRecord) -> bool:
    return "kernels-community" not in record.getMessage()


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'course_utils' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])


__all__ = ["COURSE_DEFAULTS", "use_course_defaults", *_EXPORTS]
