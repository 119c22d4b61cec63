"""The command line: `python -m labutils SUBCOMMAND ...`.

Each concept module that offers a subcommand defines `add_cli(subparsers)`, which adds its parser
and sets `func(args) -> int`. Bad input (LabInputError) ends with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from labutils.inputs import LabInputError

# Modules that contribute subcommands, in the order `--help` lists them.
COMMAND_MODULES = [
    "labutils.machine",
    "labutils.topology",
    "labutils.sweep",
    "labutils.nccl_tests",
    "labutils.doctor",
    "labutils.nccl_debug",
    "labutils.budget_cli",
    "labutils.megatron",
    "labutils.runner",
    "labutils.lab",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m labutils",
        description="The Interconnect Lab: measure and model why two GPUs are not twice as fast.",
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except LabInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
