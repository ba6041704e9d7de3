"""Command-line parsing shared by ``companion`` and the commands run from code: one-line errors, exit 2.

:class:`OneLineParser` is the parser of every command; :func:`run_parsed` runs one parsed command
line as ``companion`` does. Both sit below every layer, so a command module (``companion
harvest``'s, ``companion fetch-weights``'s) can run itself from code without importing the
top-level dispatcher ``companion.cli``.
"""
from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``companion CMD: message``) and exit status 2.

    ``add_subparsers`` makes the subcommands' parsers of the same class.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def run_parsed(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv`` with ``parser`` (whose subcommands set ``func``) and run the command; return its exit
    status: 2 for a mistake in the options or no command (after the help), 0 after ``--help``."""
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the subcommand's parser, so that the line names the subcommand
            commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            owner = commands.choices.get(getattr(args, "command", None) or "", parser)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as stop:  # argparse's own exits: --help, a bad option
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)
