"""The doctor's command: ``python -m course_utils.doctor --model M --data D.jsonl [--config C.json] ...``.

Exit status: 0 clean, 1 an error finding, 2 bad input (a one-line reason, never a traceback), 3 a check
could not run (``report.EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import sys

from .. import validate
from .inputs import DoctorInputError
from .precision import LOAD_LIMIT_GB
from .run import SAMPLE_ROWS, diagnose


def main(argv=None) -> int:
    """The command: ``argv`` as ``sys.argv[1:]`` would be (None: the process's). Returns the exit status."""
    if argv is not None:
        validate.strings("argv", argv, allow_empty=True)  # main("--model m") would parse one letter at a time
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.doctor",
        description="Check an SFT set-up for the failures of the SFT Failure Lab.")
    parser.add_argument("--model", required=True,
                        help="local model directory or hub id (offline: cache only)")
    parser.add_argument("--data", required=True, help="JSONL file: 'messages' or 'prompt'/'completion' rows")
    parser.add_argument("--config", help="JSON object of trl.SFTConfig fields")
    parser.add_argument("--max-length", type=int, help="overrides the config's max_length")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--peft-config", help="JSON object of peft.LoraConfig fields (what you pass to "
                        "SFTTrainer(peft_config=...)); leave out for full fine-tuning")
    parser.add_argument("--num-processes", type=int, default=1,
                        help="processes sharing each optimizer step (torchrun's --nproc-per-node x nodes)")
    parser.add_argument("--max-load-gb", type=float, default=LOAD_LIMIT_GB,
                        help=f"largest checkpoint (GB) the fp16 check loads (default {LOAD_LIMIT_GB:g})")
    parser.add_argument("--no-forward", action="store_true", help="skip loading weights (fp16 range check)")
    parser.add_argument("--sample", type=int, default=SAMPLE_ROWS,
                        help=f"rows to check, a seeded random sample when the data holds more (default "
                        f"{SAMPLE_ROWS}); rates come with 95%% intervals")
    parser.add_argument("--all", action="store_true", help="check every row (exact counts; slower)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--trainer", help="your SFTTrainer subclass as module:Class: lesson 01's split test "
                        "checks its loss under gradient accumulation")
    options = parser.parse_args(argv)
    try:
        report = diagnose(options.model, options.data, options.config, max_length=options.max_length,
                          forward=not options.no_forward, peft_config=options.peft_config,
                          num_processes=options.num_processes, max_load_gb=options.max_load_gb,
                          sample=None if options.all else options.sample, seed=options.seed,
                          trainer=options.trainer)
    except DoctorInputError as exc:
        print(f"doctor: bad input: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if options.json else report)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
