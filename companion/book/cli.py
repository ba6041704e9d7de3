"""The command line: ``companion reproduce`` and ``companion build-book``."""
from __future__ import annotations


import argparse
import sys
from pathlib import Path

from companion.book.layout import Layout, ReproduceError, find_root
from companion.book.parameters import available_profiles, notebook_parameters, parse_value
from companion.book.run import check_figures_dir, reproduce
from companion.book.stage import build_book
from companion.book.toc import read_chapters

# --------------------------------------------------------------------------------------------
# Command line


def _positive_int(what: str):
    """argparse type: an integer >= 1, refused with ``what`` it counts (a limit of 0 or -1 would
    silently mean "no limit", 1.5 chapters means nothing)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer ({what}), got {text!r}")
        return value
    return parse


def _given_root(text: str) -> Path:
    """``--root`` as given: it must be a project, never silently replaced by another one."""
    root = Path(text).expanduser()
    if not root.exists():
        raise ReproduceError(f"--root {text}: no such folder")
    if not root.is_dir():
        raise ReproduceError(f"--root {text} is a file; pass the project folder (the one holding _toc.yml)")
    missing = [name for name in ("_toc.yml", "_config.yml") if not (root / name).is_file()]
    if missing:
        raise ReproduceError(f"--root {text}: not a book project (no {' or '.join(missing)} in it)")
    return root


def _layout_from_args(args: argparse.Namespace) -> Layout:
    root = _given_root(args.root) if args.root else find_root(None)
    figures = Path(args.figures_dir) if getattr(args, "figures_dir", None) else None
    return Layout.at(root, figures)


def _list_chapters(layout: Layout) -> int:
    """Every chapter with its parameters: name, default as written, and the comment beside it."""
    for chapter in read_chapters(layout.root):
        if not chapter.exists:
            print(f"{chapter.name}  (notebook not written yet)")
            continue
        params = notebook_parameters(chapter.path)
        if not params:
            print(f"{chapter.name}  (no parameters cell)")
            continue
        print(chapter.name)
        width = max((len(f"{p.name} = {p.source}") for p in params.values() if p.comment), default=0)
        for p in params.values():
            line = f"{p.name} = {p.source}"
            print(f"    {line:{width}s}  # {p.comment}" if p.comment else f"    {line}")
    print("profiles: " + ", ".join(available_profiles(layout.root)))
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    try:
        layout = _layout_from_args(args)
        if args.list:
            return _list_chapters(layout)
        check_figures_dir(layout, args.figures_dir)
        overrides = {name: parse_value(value) for name, value in args.param}
        reproduce(layout, args.profile, overrides, args.only, build=not args.no_build,
                  keep_going=args.keep_going, require_all=args.require_all, cell_timeout=args.cell_timeout,
                  jobs=args.jobs)
    except ReproduceError as err:
        print(f"companion reproduce: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


def _cmd_build_book(args: argparse.Namespace) -> int:
    try:
        build_book(_layout_from_args(args), keep_work=args.keep_stage)
    except ReproduceError as err:
        print(f"companion build-book: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``reproduce`` and ``build-book`` to the ``companion`` command line."""
    p = subparsers.add_parser(
        "reproduce", help="execute every notebook (papermill) and build the book",
        description="Execute the chapters listed in _toc.yml with papermill, record the runs, "
                    "write figures to figures/, then build the HTML book into _build/html.",
    )
    p.add_argument("--profile", default="cpu", help="profile name in profiles/ or a YAML path (default: cpu)")
    p.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="override a notebook parameter (VALUE is read as YAML: 8, 0.3, true, cuda)")
    p.add_argument("--only", action="append", default=[], metavar="CHAPTER",
                   help="run only this chapter (name or unique prefix, e.g. 03_strict_greedy or 03); repeatable")
    p.add_argument("--no-build", action="store_true", help="execute notebooks but do not build the book")
    p.add_argument("--keep-going", action="store_true", help="run the remaining notebooks after a failure")
    p.add_argument("--require-all", action="store_true", help="fail if a chapter's notebook does not exist")
    p.add_argument("--cell-timeout", type=_positive_int("seconds"), default=None, metavar="SECONDS", help="limit per cell")
    p.add_argument("--jobs", "-j", type=_positive_int("chapters run at once"), default=None, metavar="N",
                   help="chapters executed at once (default: one per CPU core, at most 4; 1 on a GPU profile)")
    p.add_argument("--figures-dir", default=None, help="where figures go (default: figures/ at the root)")
    p.add_argument("--root", default=None, help="project root (default: found from the working directory)")
    p.add_argument("--list", action="store_true",
                   help="list chapters, their parameters (default and comment) and the profiles")
    p.set_defaults(func=_cmd_reproduce)

    b = subparsers.add_parser(
        "build-book", help="build the HTML book from the executed notebooks",
        description="Build _build/html from _build/executed (see `companion reproduce`), with warnings as errors.",
    )
    b.add_argument("--root", default=None, help="project root (default: found from the working directory)")
    b.add_argument("--keep-stage", action="store_true", help="keep the staged sources under _build/work")
    b.set_defaults(func=_cmd_build_book)
