"""``companion pair-report``: check and describe the committed closed-world pair (or a copy of it).

The pair is frozen: ``companion retrain``, which built it, was retired with its training code
(see :mod:`companion.models.tiny_pair`), so ``companion retrain`` is an unknown command now.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from companion.models.tiny_pair import ASSET_DIR


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pair-report`` subcommand."""
    r = subparsers.add_parser(
        "pair-report",
        help="check the closed-world pair's files against its manifest, time its load, print its recorded figures",
        description="Check every file of a closed-world pair against the sha256 its manifest records, time "
                    "loading it on this machine, and print the figures the manifest recorded when the pair was "
                    "built (the pair is frozen; the recipe that built it was retired). Exit status 1 if a file "
                    "differs from the manifest.",
    )
    r.add_argument("--pair", type=Path, default=ASSET_DIR, help="pair folder (default: the committed pair)")
    r.add_argument("--no-load", action="store_true", help="do not load the pair (check its files only)")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    r.set_defaults(func=cmd_pair_report)


def cmd_pair_report(args: argparse.Namespace) -> int:
    """Refuse a folder that is not a pair in one line (exit 2) before any model loads; report; exit 1 on bad files."""
    from companion.models.tiny_pair.pair_folder import PairFolderError
    from companion.models.tiny_pair.report import pair_report

    try:
        manifest, fresh = pair_report(args.pair, load=not args.no_load)
    except PairFolderError as err:
        print(f"companion pair-report: --pair {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"manifest_figures": manifest.get("figures"), "fresh": fresh}, indent=1))
    else:
        print(format_report(manifest, fresh))
    return 0 if fresh["files_ok"] else 1


def _section(d: Any, key: str) -> dict[str, Any]:
    """``d[key]`` when both are mappings, else empty: a report prints what a manifest has, never a traceback."""
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, dict) else {}


def _fmt(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return "-" if x is None else str(x)
    return f"{x:,}" if isinstance(x, int) else f"{x:.3f}" if isinstance(x, float) else str(x)


def format_report(manifest: dict[str, Any], fresh: dict[str, Any]) -> str:
    """Plain text: what the pair is, how it was trained, its recorded figures, and this machine's checks."""
    models, fig = _section(manifest, "models"), _section(manifest, "figures")
    out = [f"pair: target {_fmt(_section(models, 'target').get('params'))} params, drafter "
           f"{_fmt(_section(models, 'drafter').get('params'))} params, vocab {_fmt(models.get('vocab_size'))}, "
           f"stored as {_fmt(models.get('save_dtype'))} (frozen; built by the retired `companion retrain`)"]
    training = _section(manifest, "training")
    for name in ("target", "drafter"):
        s = _section(training, name)
        out.append(f"training {name}: " + (f"{_fmt(s.get('steps'))} steps, {_fmt(s.get('tokens'))} tokens, loss "
                                           f"{_fmt(s.get('first_loss_mean'))} -> {_fmt(s.get('last_loss_mean'))}"
                                           if s else "not recorded in the manifest"))
    out.append("files: " + ("every sha256 matches the manifest" if fresh["files_ok"]
                            else "MISMATCH: " + ", ".join(fresh["files_bad"])))
    if "load_seconds" in fresh:
        out.append(f"load_pair (float32, CPU): {fresh['load_seconds']:.2f} s on this machine")
    regime = _section(fig, "regime")
    if regime:
        out.append(f"recorded regime ({_fmt(regime.get('n_prompts'))} held-out requests, the target's own greedy "
                   f"answers): top-1 median {_fmt(regime.get('top1_median'))}, mean {_fmt(regime.get('top1_mean'))}; "
                   f"EOS rate {_fmt(regime.get('eos_rate'))}; drafter strict-greedy acceptance "
                   f"{_fmt(regime.get('drafter_greedy_acceptance'))}")
    assisted = _section(fig, "assisted")
    if assisted:
        out.append(f"recorded assisted generation: {_fmt(assisted.get('accepted_per_round'))} of "
                   f"{_fmt(assisted.get('num_assistant_tokens'))} drafts accepted a round")
    return "\n".join(out)
