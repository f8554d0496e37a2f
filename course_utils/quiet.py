"""Hear a library's warnings on purpose, or silence its chatter for one block — and restore it.

Used by lessons 02-07, ``training.make_sft_trainer``, ``model.load_course_model`` and the doctor.
No helper of the course changes process-wide state for good: progress bars, logging levels and
handlers are changed inside these context managers and put back on exit, so what a learner sees
never depends on which cell ran first.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings

from . import validate


def captured_log(name: str = "transformers", level: int = logging.WARNING):
    """Collect what logger ``name`` (and its children) log at ``level`` and above into a list,
    instead of printing it to stderr. The lesson then shows the message it is about.

    For transformers, ``warning_once``'s memory is cleared first (a warning the process already
    showed is shown again) and the verbosity is raised to WARNING for the block, since a lesson may
    have silenced it; everything is restored on exit. The arguments are checked when it is called, not
    when the block is entered.
    """
    validate.non_empty_string("name", name, why="it names the logger to listen to ('' is the root logger: "
                              "every library at once)")
    validate.integer("level", level, minimum=0, why="it is a logging level (logging.WARNING is 30)",
                     fix="pass e.g. level=logging.INFO")
    return _captured_log(name, level)


@contextlib.contextmanager
def _captured_log(name: str, level: int):
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger(name)
    handler = _Collect(level=level)
    previous_level, previous_propagate = logger.level, logger.propagate
    hf_verbosity = None
    if name.split(".")[0] == "transformers":
        from transformers.utils import logging as hf_logging

        hf_logging.warning_once.cache_clear()
        hf_verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_warning()
    # the libraries' own stderr handlers sit on their root loggers ("transformers", "trl"): mute them here
    library_root = logging.getLogger(name.split(".")[0])
    saved_handlers = list(library_root.handlers)
    for h in saved_handlers:
        library_root.removeHandler(h)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    logger.addHandler(handler)
    logger.propagate = False  # the library's own stderr handlers sit on parents: keep them quiet
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = previous_propagate
        if hf_verbosity is not None:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity(hf_verbosity)
        for h in saved_handlers:
            library_root.addHandler(h)
        logger.setLevel(previous_level)


@contextlib.contextmanager
def no_progress_bars(*, datasets: bool = True):
    """transformers' and datasets' progress bars off for one block, each restored on exit.

    For work that is over in a blink ("Loading weights" of a 2 MB course model, a dataset map of 48
    rows): a bar there is noise in a notebook's output, not progress. ``datasets=False`` leaves datasets
    alone, for a block that maps no dataset: importing it (with pandas) costs ~0.35 s in a process that
    never needs it, such as lesson 07's torchrun workers, which only load the model.
    """
    validate.flag("datasets", datasets, why="it says whether the block maps a dataset")
    from transformers.utils import logging as hf_logging

    ds = None
    if datasets:
        import datasets as ds
    hf_bars = hf_logging.is_progress_bar_enabled()
    ds_bars = ds is not None and ds.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    if ds is not None:
        ds.disable_progress_bars()
    try:
        yield
    finally:
        if hf_bars:
            hf_logging.enable_progress_bar()
        if ds_bars:
            ds.enable_progress_bars()


@contextlib.contextmanager
def quiet_libraries(*, logs: bool = True, capture_output: bool = False, python_warnings: bool = True):
    """Silence transformers/datasets/TRL banners and dataset-map progress bars for one block.

    ``logs=False`` keeps the libraries' warnings (only the bars go); ``capture_output=True`` also
    swallows what the block prints (e.g. a Trainer's log dicts, bitsandbytes' kernel notice); the
    lesson reads the records instead. ``python_warnings=False`` also ignores Python warnings (peft's
    FutureWarnings) inside the block. Progress bars, verbosity and warning filters are restored on exit.
    """
    switches = {"logs": logs, "capture_output": capture_output, "python_warnings": python_warnings}
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name}={value!r} must be True or False — it switches one kind of output on "
                            f"or off — pass {name}=True or {name}=False (and call it: "
                            "`with quiet_libraries():`).")
    import datasets
    import transformers

    verbosity = transformers.logging.get_verbosity()
    trl_logger = logging.getLogger("trl")
    trl_level = trl_logger.level
    bars_were_on = datasets.is_progress_bar_enabled()
    if logs:
        transformers.logging.set_verbosity_error()
        trl_logger.setLevel(logging.ERROR)
    datasets.disable_progress_bars()   # only datasets': a Trainer's own bar is the progress a learner wants
    try:
        with contextlib.ExitStack() as stack:
            if capture_output:
                stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            if not python_warnings:
                stack.enter_context(warnings.catch_warnings())
                warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        trl_logger.setLevel(trl_level)
        if bars_were_on:
            datasets.enable_progress_bars()


def library_state() -> dict:
    """What ``quiet_libraries`` and ``captured_log`` promise to restore (a test compares it)."""
    import datasets
    import transformers

    return {"datasets_bars": datasets.is_progress_bar_enabled(),
            "transformers_verbosity": transformers.logging.get_verbosity(),
            "transformers_bars": transformers.utils.logging.is_progress_bar_enabled(),
            "trl_level": logging.getLogger("trl").level,
            "transformers_propagate": logging.getLogger("transformers").propagate,
            "transformers_handlers": list(logging.getLogger("transformers").handlers)}


_RANK_PREFIX = re.compile(r"^\[RANK \d+\]\s*")  # TRL's logger marks each message with the process rank
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def brief(message, limit: int = 200) -> str:
    """A library's message (a warning, an exception, a finding) as a lesson prints it: TRL's "[RANK 0] "
    prefix dropped, cut at the end of its first sentence when it is longer than ``limit`` characters, else at
    a space before ``limit``, never inside a `code span` — so a learner never reads a word or a span cut
    in two ("… is not set to Tr"), which reads as the course's own bug."""
    validate.integer("limit", limit, minimum=20, why="it is the longest line the lesson shows",
                     fix="pass e.g. limit=200")
    if isinstance(message, (list, tuple, set, frozenset, dict)):
        raise TypeError(f"message is a {type(message).__name__} — brief shortens one message — pass one "
                        "item, e.g. [brief(m) for m in messages].")
    text = "" if message is None else _RANK_PREFIX.sub("", str(message).strip().split("\n")[0])
    if not text:
        raise ValueError(f"message={message!r:.40} has no text to show — brief shortens a library's warning "
                         "or error — pass the warning, the exception or its str().")
    if len(text) <= limit:
        return text
    ends = [m.start() for m in _SENTENCE_END.finditer(text) if m.start() <= limit
            and text[:m.start()].count("`") % 2 == 0]
    if ends:
        return text[:ends[0]]
    cut = text.rfind(" ", 0, limit)
    cut = cut if cut > 0 else limit
    if text[:cut].count("`") % 2:  # an open code span: end before it
        cut = text.rfind(" ", 0, text[:cut].rfind("`")) if text[:cut].rfind("`") > 0 else cut
    return text[:max(cut, 1)].rstrip(" ,;:") + " …"
