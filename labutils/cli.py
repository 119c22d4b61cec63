"""The command line: `python -m labutils SUBCOMMAND ...`.

Each concept module that offers a subcommand defines `add_cli(subparsers)`, which adds its parser
and sets `func(args) -> int`. Bad input ends with one line on stderr naming the parameter and exit
status 2, before anything starts: a LabInputError from the command (or from $LAB_RESULTS_DIR, checked
for the subcommands that keep results), or argparse's own complaint
(an unknown option, a value that is not a number), printed after the short usage so that the last
line is always the one that names the value.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from labutils.core.inputs import LabInputError
from labutils.core.results import check_results_dir

# Each subcommand and the module that defines it (its `add_cli`), in the order `--help` lists them.
# Only the module of the subcommand asked for is imported, so `python -m labutils budget` loads no
# torch; `--help`, no subcommand or an unknown one build the whole parser.
COMMANDS = {
    "check": "labutils.course.machine",
    "topo": "labutils.readers.topology",
    "sweep": "labutils.measure.sweep",
    "slurm-script": "labutils.measure.slurm",
    "parse-nccl-tests": "labutils.readers.nccl_tests",
    "doctor": "labutils.doctor.doctor",
    "nccl-transports": "labutils.readers.nccl_debug",
    "budget": "labutils.course.budget_cli",
    "tp-check": "labutils.experiments.megatron",
    "run-notebooks": "labutils.course.runner",
    "lab": "labutils.course.lab",
}
# The subcommands that read or keep results (sweep saves one, doctor reads the newest, the
# notebooks run by run-notebooks and lab save theirs): $LAB_RESULTS_DIR is checked before they start.
KEEPS_RESULTS = {"sweep", "doctor", "run-notebooks", "lab"}


class LabArgumentParser(argparse.ArgumentParser):
    """argparse with the lab's contract: the usage line, then one `error: ...` line naming the
    option and the value as the last line of stderr, exit status 2."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        line = " ".join(str(message).split())
        self.exit(2, f"error: {self.prog.split()[-1]}: {line}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `command` alone when it is a known subcommand, else of every subcommand."""
    parser = LabArgumentParser(
        prog="python -m labutils",
        description="The Interconnect Lab: measure and model why two GPUs are not twice as fast.",
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=LabArgumentParser)
    modules = [COMMANDS[command]] if command in COMMANDS else dict.fromkeys(COMMANDS.values())
    for name in modules:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's refusal (2, its one line already printed) or --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if args.command in KEEPS_RESULTS:
            check_results_dir()
        return int(args.func(args) or 0)
    except LabInputError as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
