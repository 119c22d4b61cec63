"""The command line (labutils/cli.py): each subcommand is built from the module that defines it, and
only that module is loaded, so a pure command such as `budget` starts without torch."""

import subprocess
import sys

from labutils.cli import COMMANDS, build_parser, main


def _choices(parser) -> list[str]:
    return list(parser._subparsers._group_actions[0].choices)


def test_the_whole_parser_lists_every_subcommand_in_order():
    assert _choices(build_parser()) == list(COMMANDS)
    assert _choices(build_parser("no-such-command")) == list(COMMANDS)


def test_each_subcommand_comes_from_the_module_the_cli_names():
    for command in COMMANDS:
        assert _choices(build_parser(command)) == [command]


def test_an_unknown_subcommand_is_refused_naming_it(capsys):
    assert main(["no-such-command"]) == 2
    assert "no-such-command" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_pure_subcommand_starts_without_torch():
    code = ("import sys\nfrom labutils.cli import main\n"
            "assert main(['budget', '--json']) == 0\nprint('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
