"""The SFT doctor: check a fine-tuning set-up for this course's failures *before* it trains.

Lesson 08 (capstone) and anyone's own set-up::

    python -m course_utils.doctor --model PATH_OR_ID --data FILE.jsonl [--config SFT_CONFIG.json]
                                  [--max-length N] [--json]

or, from Python, ``report = diagnose(model, data, config)``: a list of ``Finding``s (severity, what,
evidence, fix, lesson) that prints as a table in a terminal and renders as one in a notebook.

Every check measures the set-up with the installed libraries' own code, so it sees what training
would see: the rows are read as ``datasets.load_dataset("json")`` reads them (as ``trl sft`` does; a file
the loader rejects is an error finding), tokenized and labelled by TRL's ``SFTTrainer._prepare_dataset``
(the same template patching, ``return_assistant_tokens_mask``, truncation and "Dropping fully masked
examples" filter), templates are judged by ``trl.chat_template_utils``, activations by one forward
of the real model on real rows. Nothing is trained; it takes seconds.

Exit status of the command (``Report.exit_code``):

- 0: no error found (warnings and info may remain);
- 1: an error-level finding exists (so it can gate CI);
- 2: bad input — a missing file, a malformed JSONL line, rows of mixed forms, an unknown model id
offline, a config that is not a JSON object, a config key that is not an SFTConfig field, a config
value SFTConfig would take but training cannot (``max_length`` or a batch size below 1, a learning
rate <= 0, ``"yes"`` for a flag), a ``--max-length`` below 1 — always with a what/why/fix message and
never a traceback. ``diagnose`` raises ``DoctorInputError`` for the same input: the doctor never
reports on a set-up it had to guess at;
- 3: no error found, but a check could not run on this set-up: a "could-not-check" finding names the
  check and why (an exception the check was not written for). The other checks still ran; exit 0 would
  claim a clean bill of health the doctor did not measure.

Each check mirrors what TRL 1.16's ``SFTTrainer`` does with the set-up: the tokenizer gets the eos and
pad TRL would give it (``eos_token`` from the config; ``pad_token`` from the config, the tokenizer, or
its eos), prompt/completion text rows get ``tokenizer.eos_token`` appended, packing ``wrapped`` and
``bfd_split`` keep every token (``bfd`` and unpacked rows are truncated), and a training template is
only suggested from the template's own family.

A chat template that raises on a row is an error finding naming the row, like TRL's own refusals.

The package's files name its jobs; this module is its public face (``__all__``), and the files behind it are
its rooms, not an API of their own:

- ``report``    ``Finding``, ``Report``, severities, exit codes, ``guarded`` (a crashing check -> a finding)
- ``inputs``    reading and checking the model, the rows, the configs and the options (``DoctorInputError``)
- ``trl_view``  what TRL will build: the SFTConfig, tokenizer, dataset and prepared rows (via ``internals``)
- ``checks``    templates, stop tokens, labels, padding (lessons 02-05); ``lengths`` truncation and packing
  (03, 05); ``precision`` fp16 range, load dtype, learning rate (06); ``trainer`` your trainer under the split
  test (01); ``reasoning`` reasoning and tool-call data (09)
- ``run``       ``diagnose``: every check in order, each through ``guarded``; ``__main__`` the command.
- ``data_checks`` the rows alone, no torch: rendered markers, duplicates, damaged answers, schema traps
- ``autopsy``   a finished run's ``trainer_state.json`` judged by ``course_utils.run_rules`` (SFTWatch's)
- ``catalogue`` every check's id, why, fix and lesson (``--list-checks``, docs/doctor_checks.md); ``formats``
  the report as text, markdown, json or SARIF

A new check is a function of what ``run`` hands it that returns a list of ``Finding``s, in the file of its
topic, called from ``run._run_checks`` through ``guarded``.
"""

# transformers, trl and datasets are imported where they are used: `from trl import SFTConfig, SFTTrainer`
# costs ~10 s on a 2-core CPU (measured), and bad input, --help and `import course_utils.doctor` answer
# without it. torch too: ``diagnose`` and ``empty_batch_probability`` load on first use (PEP 562), so the
# data checks, the run autopsy and the catalogue (``python -m course_utils.doctor --data F`` / ``--run D``)
# start without torch (issue 49: a cold start of ~1 s instead of ~6 s)
from .inputs import SAMPLE_ROWS, DoctorInputError, read_config, read_jsonl, read_peft_config
from .report import EXIT_CODES, LESSONS, SEVERITIES, Finding, Report

_LAZY = {"diagnose": "run", "empty_batch_probability": "lengths"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EXIT_CODES", "LESSONS", "SAMPLE_ROWS", "SEVERITIES", "DoctorInputError", "Finding", "Report",
           "diagnose", "empty_batch_probability", "read_config", "read_jsonl", "read_peft_config"]
