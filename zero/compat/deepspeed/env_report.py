"""`deepspeed.env_report` (what DeepSpeed's `ds_report` runs): zero's environment report
(zero/env_report.py). DeepSpeed's op table has no counterpart (zero's C++ is built once, not
just in time); the smoke test stands in for "compatible"."""
from __future__ import annotations

import argparse

from zero import env_report


def main(hide_operator_status: bool = False, hide_errors_and_warnings: bool = False) -> None:
    """DeepSpeed's signature: `hide_operator_status` skips the smoke test,
    `hide_errors_and_warnings` the fixes under WARNING and FAIL lines."""
    env_report.report(smoke_test=not hide_operator_status, fixes=not hide_errors_and_warnings)


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--hide_operator_status", action="store_true",
                        help="Skip the smoke test (zero's stand-in for the op status).")
    parser.add_argument("--hide_errors_and_warnings", action="store_true",
                        help="Leave out what to do under warnings and failures.")
    return parser.parse_args(argv)


def cli_main(argv=None) -> None:
    args = parse_arguments(argv)
    main(hide_operator_status=args.hide_operator_status,
         hide_errors_and_warnings=args.hide_errors_and_warnings)
