"""Command-line entry point: ``companion <command> ...``.

Each command lives in the module that owns its concept and exposes ``register(subparsers)``;
this file only dispatches, so adding a command never touches another module's code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from companion.parsing import OneLineParser, run_parsed

# (module, description) in the order shown by ``companion --help``.
COMMAND_MODULES: tuple[str, ...] = (
    "companion.models.tiny_pair.cli",   # pair-report: the embedded closed-world pair, frozen
    "companion.harvest.cli",     # harvest: per-step traces from a target and drafter
    "companion.harvest.full_profile",  # full-profile: the paper's protocol at its size on the 1.5B, committed
    "companion.harvest.stability_profile",  # stability-profile: the first prompts alone in bf16 and float32, committed
    "companion.models.distill.cli",     # build-drafter: SmolLM2's distilled drafter
    "companion.models.weights.cli",     # fetch-weights: models from the package index, converted once
    "companion.models.weights.cache_cli",  # cache: list the weights cache, prune stale folders
    "companion.book.cli",        # reproduce / build-book: run every notebook, build the HTML book
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="companion",
        description="Acceptance certificates for speculative decoding: reproduction tools.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            # Only tolerate the command module itself being absent (e.g. a trimmed install);
            # a missing dependency inside it is a real error and must surface.
            if err.name and (name == err.name or name.startswith(err.name + ".")):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``companion ARGV``; return the exit status (2 for a mistake in the options, 0 after ``--help``)."""
    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
