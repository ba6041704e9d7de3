"""``companion build-drafter``: rebuild SmolLM2's drafter (resumable), and compare it with the committed one."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "build-drafter", help="rebuild SmolLM2-135M-Instruct's drafter from scratch (resumable)",
        description="Distil SmolLM2-135M-Instruct's drafter: the target's greedy answers to the training split of "
                    "the chat requests, then training; rerun the same command to resume after an interruption. "
                    "Ends by comparing every file's sha256 with the committed drafter's manifest.")
    p.add_argument("--out", required=True, help="folder to write the drafter to (replaced at the end, atomically)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where the stages keep their progress (default: OUT.checkpoints beside OUT)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a knob of the recipe (companion.models.distill.config.DrafterConfig), e.g. epochs=4")
    p.add_argument("--compare", default=None, metavar="MANIFEST",
                   help="manifest to compare with (default: the committed drafter's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_build_drafter)


def _fail(message: str) -> int:
    print(f"companion build-drafter: {message}", file=sys.stderr)
    return 2


def cmd_build_drafter(args: argparse.Namespace) -> int:
    from companion.assets import SMOLLM2_DRAFTER_DIR
    from companion.models.distill.build import MANIFEST_NAME, build_drafter, compare_files
    from companion.models.distill.config import DrafterConfig, apply_overrides

    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            return _fail(f"--set {item}: expected KEY=VALUE")
        overrides[key.strip()] = value.strip()
    try:
        cfg = apply_overrides(DrafterConfig(), overrides)
    except ValueError as err:
        return _fail(" ".join(str(err).split()))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return _fail(f"--out {out}: exists and is not a folder")
    ckpt = Path(args.checkpoint_dir) if args.checkpoint_dir else out.with_name(out.name + ".checkpoints")
    if ckpt.exists() and not ckpt.is_dir():
        return _fail(f"--checkpoint-dir {ckpt}: exists and is not a folder")
    reference = Path(args.compare) if args.compare else SMOLLM2_DRAFTER_DIR / MANIFEST_NAME
    if args.compare and not reference.is_file():
        return _fail(f"--compare {reference}: no such file")
    for folder in (out.parent, ckpt.parent):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return _fail(f"cannot create {folder}: {err.strerror}")
    # Read before building: --out may be the committed folder itself, which the build replaces.
    before = json.loads(reference.read_text()) if reference.is_file() else None
    try:
        manifest = build_drafter(cfg, out, checkpoint_dir=ckpt, progress=not args.no_progress)
    except (ValueError, OSError) as err:
        return _fail(" ".join(str(err).split()))
    if before is not None:
        differ = compare_files(manifest, before)
        if differ:
            print(f"differs from {reference}: {', '.join(differ)} (another recipe, package versions or CPU "
                  "numerics give other bits)")
        else:
            print(f"identical to {reference}: every file's sha256 matches")
    return 0
