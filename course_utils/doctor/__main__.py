"""The doctor's command.

    python -m course_utils.doctor --model M --data D.jsonl [--config C.json] ...   the whole set-up
    python -m course_utils.doctor --data D.jsonl                                   the data checks alone
    python -m course_utils.doctor --run OUTPUT_DIR [--config C.json]               a finished run's autopsy
    python -m course_utils.doctor --list-checks                                    the catalogue

``--ignore ID`` (repeatable) mutes a check; ``--format text|markdown|json|sarif`` (``--json``: json). Only
what the request needs is imported: the data checks, the autopsy and the catalogue start without torch.

Exit status: 0 clean, 1 an error finding, 2 bad input (a one-line reason, never a traceback), 3 a check
could not run (``report.EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from .. import validate
from .catalogue import CHECKS, closest, table
from .formats import FORMATS, formatted
from .inputs import SAMPLE_ROWS, DoctorInputError
from .report import SAMPLED, SEVERITIES, Finding, Report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.doctor",
        description="Check an SFT set-up, its data, or a finished run for the failures of the SFT Failure "
                    "Lab.")
    parser.add_argument("--model", help="local model directory or hub id (offline: cache only); without it, "
                        "--data runs the data checks alone")
    parser.add_argument("--data", help="JSONL file: 'messages', 'prompt'/'completion' or 'text' rows")
    parser.add_argument("--run", help="a finished run's output directory (or checkpoint-N/, or its "
                        "trainer_state.json): the autopsy of its log history")
    parser.add_argument("--config", help="JSON object of trl.SFTConfig fields")
    parser.add_argument("--max-length", type=int, help="overrides the config's max_length")
    parser.add_argument("--list-checks", action="store_true", help="print the catalogue of checks and exit")
    parser.add_argument("--ignore", action="append", default=[], metavar="ID",
                        help="mute the check ID (repeatable; ids: --list-checks)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="text (default), markdown, json, or sarif (SARIF 2.1.0 for CI annotations)")
    parser.add_argument("--json", action="store_true", help="the same as --format json")
    parser.add_argument("--peft-config", help="JSON object of peft.LoraConfig fields (what you pass to "
                        "SFTTrainer(peft_config=...)); leave out for full fine-tuning")
    parser.add_argument("--num-processes", type=int, default=1,
                        help="processes sharing each optimizer step (torchrun's --nproc-per-node x nodes)")
    parser.add_argument("--max-load-gb", type=float, default=None,
                        help="largest checkpoint (GB) the fp16 check loads (default 2)")
    parser.add_argument("--no-forward", action="store_true", help="skip loading weights (fp16 range check)")
    parser.add_argument("--sample", type=int, default=None,
                        help=f"rows to check, a seeded random sample when the data holds more (default "
                        f"{SAMPLE_ROWS}); rates come with 95%% intervals")
    parser.add_argument("--all", action="store_true", help="check every row (exact counts; slower)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--trainer", help="your SFTTrainer subclass as module:Class: lesson 01's split test "
                        "checks its loss under gradient accumulation")
    return parser


def main(argv=None) -> int:
    """The command: ``argv`` as ``sys.argv[1:]`` would be (None: the process's). Returns the exit status."""
    if argv is not None:
        validate.strings("argv", argv, allow_empty=True)  # main("--model m") would parse one letter at a time
    options = _parser().parse_args(argv)
    fmt = options.format or ("json" if options.json else "text")
    try:
        if options.list_checks:
            if fmt == "sarif":
                raise DoctorInputError("--list-checks prints the catalogue as text, markdown or json — SARIF "
                                       "describes findings, not a list of checks — pick one of those.")
            return _emit(table(fmt).rstrip("\n"), 0)
        _check_ignored(options.ignore)
        report, artifact = _report(options)
    except DoctorInputError as exc:
        print(f"doctor: bad input: {exc}", file=sys.stderr)
        return 2
    report = Report(f for f in report if f.check not in options.ignore)
    return _emit(formatted(report, fmt, artifact), report.exit_code)


def _emit(text: str, code: int) -> int:
    """Print ``text``; a reader that closed the pipe early (``| head``) ends the output quietly, with the
    same exit status (Python's recipe: stdout to devnull, so the exit's flush raises nothing)."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return code


def _check_ignored(ignored: list[str]) -> None:
    for check in ignored:
        if check not in CHECKS:
            raise DoctorInputError(f"--ignore {check!r} is not a check id{closest(check)} — a "
                                   "misspelt id would mute nothing and let the finding through — use an id "
                                   "from --list-checks.")


def _report(options) -> tuple[Report, dict]:
    """The findings the options ask for, and the files they are about (SARIF's locations: the data file, the
    run's trainer_state.json)."""
    if not (options.run or options.data):
        raise DoctorInputError("nothing to check — the doctor checks a set-up (--model and --data), the data "
                               "alone (--data) or a finished run (--run OUTPUT_DIR) — pass one of these "
                               "(--list-checks lists the checks).")
    if options.all and options.sample is not None:
        raise DoctorInputError(f"--all and --sample {options.sample} were both given — --all checks every "
                               "row, --sample a random draw of that many, and the doctor will not guess "
                               "which you meant — pass one of them.")
    report, artifact = Report(), {"data": options.data}
    if options.run:
        from . import inputs
        from .autopsy import autopsy, find_state

        report += autopsy(options.run, inputs.read_config(options.config))
        artifact["run"] = str(find_state(options.run)[0])  # the state file the autopsy read
        if not options.data:
            return report, artifact
    sample = None if options.all else SAMPLE_ROWS if options.sample is None else options.sample
    if options.model is None:
        return report + data_only(options.data, sample, options.seed), artifact
    from .run import diagnose  # TRL, transformers and torch: only for a whole set-up

    kwargs = {} if options.max_load_gb is None else {"max_load_gb": options.max_load_gb}
    report += diagnose(options.model, options.data, options.config, max_length=options.max_length,
                       forward=not options.no_forward, peft_config=options.peft_config,
                       num_processes=options.num_processes, sample=sample, seed=options.seed,
                       trainer=options.trainer, **kwargs)
    return Report(sorted(report, key=lambda f: SEVERITIES.index(f.severity))), artifact


def data_only(data, sample: int | None = SAMPLE_ROWS, seed: int = 0) -> Report:
    """The data checks (``data_checks``) on ``data`` without a model: no torch, no transformers."""
    from . import data_checks, inputs

    inputs.validate_options(forward=True, num_processes=1, max_load_gb=1.0, sample=sample, seed=seed)
    rows, total = inputs.read_rows(data, sample, seed)
    token = SAMPLED.set(total if len(rows) < total else None)
    try:
        findings = data_checks.data_findings(rows, inputs.row_form(rows)) + rows.findings
    finally:
        SAMPLED.reset(token)
    skipped = sorted(c.id for c in CHECKS.values() if c.needs == "set-up")
    findings.append(Finding("info", "data-only", f"only the data checks ran on {len(rows):,} of {total:,} "
                                                 f"rows "
                            "(no --model)", f"{len(skipped)} set-up checks need the model's tokenizer and "
                            "template (e.g. response-length-cap, truncation, stop-token-untrained)",
                            "add --model PATH_OR_ID (and --config) for the whole set-up", "08"))
    return Report(sorted(findings, key=lambda f: SEVERITIES.index(f.severity)))


def exit_now(code: int):
    """End the command with ``code``. After a whole set-up (torch imported) without the interpreter's
    teardown: the exit handlers run (logs, temporary files, child processes), and the operating system frees
    the memory at once. Why: freeing one by one every object torch, transformers, TRL and the rows left took
    ~1.1-1.7 s, after --all on 4,000 chats as after 50 rows (the libraries' objects, not the rows), work a
    process that ends anyway has no use for. The data checks alone end as usual."""
    if "torch" not in sys.modules:
        sys.exit(code)
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that left (see _emit), a closed stream
            pass
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    # Why: the imports of torch, transformers and TRL leave ~500,000 objects, and Python's default collector
    # thresholds (700 allocations) walk the young ones again and again as the libraries load and the rows'
    # token lists are made: ~0.5 CPU s of a 50-row run, ~1 s of --all on 4,000 chats. A command that ends in
    # seconds collects rarely instead (cycles are still collected; its peak memory measured the same).
    gc.set_threshold(100_000, 50, 100)
    exit_now(main())
