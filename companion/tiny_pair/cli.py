"""``companion retrain`` and ``companion pair-report``: rebuild and describe the embedded pair."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from companion.tiny_pair import ASSET_DIR

DEFAULT_RETRAIN_OUT = Path("runs") / "default_pair"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``retrain`` and ``pair-report`` subcommands."""
    p = subparsers.add_parser(
        "retrain",
        help="rebuild the embedded target/drafter pair (rule-generated chat corpus + Python standard library; "
             "offline, seeded)",
        description="Train the tokenizer, the target and the distilled drafter, then write the pair, the default "
                    "prompts and manifest.json to --out (built in a staging folder, renamed into place at the end). "
                    "To regenerate the committed assets: --out companion/assets/default_pair.",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_RETRAIN_OUT,
                   help=f"destination folder (default: {DEFAULT_RETRAIN_OUT}; replaced atomically if it exists)")
    p.add_argument("--shrink", action="store_true", help="tiny configuration that runs in seconds (for checks)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the config's, 0)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set target_stage.steps=100 (repeatable)")
    p.add_argument("--compare-to", type=Path, default=None,
                   help="manifest (or pair folder) to compare the rebuilt files against (default: the committed one); "
                        "it must exist")
    p.add_argument("--no-compare", action="store_true", help="do not compare the rebuilt files with any manifest")
    p.add_argument("--reuse-target", type=Path, default=None, metavar="PAIR_DIR",
                   help="load tokenizer and target from a finished build instead of retraining them; refused unless "
                        "that build used the same target-side config, corpus and package versions (for iterating on "
                        "the drafter stage)")
    p.add_argument("--checkpoint-dir", type=Path, default=None, metavar="DIR",
                   help="save each training stage's state here every 200 steps and resume from it: after an "
                        "interruption, rerun the same command (the result equals an uninterrupted run)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (a log line every 50 steps)")
    p.set_defaults(func=cmd_retrain)

    r = subparsers.add_parser(
        "pair-report",
        help="figures of a target/drafter pair: held-out loss, agreement, sum(min(p,q)), top-1 spread, speed",
        description="Print the pair's manifest figures, re-measure load time and greedy speed on this machine, and "
                    "recompute the held-out figures when this interpreter's standard library matches the training corpus.",
    )
    r.add_argument("--pair", type=Path, default=ASSET_DIR, help="pair folder (default: the embedded pair)")
    r.add_argument("--no-recompute", action="store_true", help="do not recompute held-out figures")
    r.add_argument("--no-speed", action="store_true", help="do not measure load time and tokens/s")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    r.set_defaults(func=cmd_pair_report)


class _Refused(Exception):
    """A mistake in the arguments, found before any work: one line on stderr, exit status 2."""


def _refuse(command: str, err: object) -> int:
    print(f"companion {command}: {err}", file=sys.stderr)
    return 2


def _check_reuse_target(path: Path) -> None:
    from companion.tiny_pair.pair_folder import PairFolderError, read_pair_manifest

    try:
        manifest = read_pair_manifest(path)
    except PairFolderError as err:
        raise _Refused(f"--reuse-target {err}") from None
    if "files_sha256" not in manifest or not (path / "tokenizer" / "tokenizer.json").is_file():
        raise _Refused(f"--reuse-target {path}: no tokenizer/tokenizer.json or file digests; "
                       "pass a folder written by companion retrain")


def _compare_manifest(path: Path) -> Path:
    """The manifest file ``--compare-to`` names (a pair folder stands for its manifest.json)."""
    manifest = path / "manifest.json" if path.is_dir() else path
    if not manifest.exists():
        where = f"{path}: no manifest.json in this folder" if path.is_dir() else f"{path}: no such file"
        raise _Refused(f"--compare-to {where}; pass a pair's manifest.json or its folder")
    try:
        loaded = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise _Refused(f"--compare-to {manifest} is not a readable JSON manifest ({err})") from None
    if not isinstance(loaded, dict) or "files_sha256" not in loaded:
        raise _Refused(f"--compare-to {manifest}: not a pair manifest (no files_sha256)")
    return manifest


def cmd_retrain(args: argparse.Namespace) -> int:
    from companion.tiny_pair.config import ConfigOverrideError, apply_overrides, default_config, shrunk_config
    from companion.tiny_pair.train import build_pair, compare_to_manifest

    # Every argument is checked here, before a training run that may last an hour.
    try:
        cfg = shrunk_config() if args.shrink else default_config()
        overrides = dict(_split_kv(s) for s in args.overrides)
        if args.seed is not None:
            overrides["seed"] = str(args.seed)
        try:
            cfg = apply_overrides(cfg, overrides)
        except ConfigOverrideError as err:
            raise _Refused(f"--set {err}") from None
        if args.reuse_target is not None:
            _check_reuse_target(args.reuse_target)
        # The committed manifest by default (skipped if this install lacks it); one named must exist.
        default_ref = ASSET_DIR / "manifest.json"
        if args.no_compare and args.compare_to is not None:
            raise _Refused(f"--compare-to {args.compare_to} and --no-compare contradict each other: give one")
        ref_path = (None if args.no_compare else _compare_manifest(args.compare_to) if args.compare_to is not None
                    else default_ref if default_ref.is_file() else None)
        if args.out.exists() and not args.out.is_dir():
            raise _Refused(f"--out {args.out} is a file; pass a folder (it is replaced atomically if it exists)")
        _check_creatable(args.out, "--out")
        if args.checkpoint_dir is not None:
            if args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
                raise _Refused(f"--checkpoint-dir {args.checkpoint_dir} is a file; pass a folder (it is created if "
                               "missing)")
            _check_creatable(args.checkpoint_dir, "--checkpoint-dir")
    except _Refused as err:
        return _refuse("retrain", err)
    # SIGTERM (e.g. a job runner's timeout) becomes SystemExit, so the staging folder is cleaned up.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        result = build_pair(cfg, args.out, progress=not args.no_progress, reuse_target=args.reuse_target,
                            checkpoint_dir=args.checkpoint_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"wrote {result.out_dir}")
    print(format_report(result.manifest, None))
    if ref_path is not None and ref_path.resolve() != (result.out_dir / "manifest.json").resolve():
        diffs = compare_to_manifest(result.manifest, json.loads(ref_path.read_text()))
        if diffs:
            print(f"differs from {ref_path}:")
            for d in diffs:
                print(f"  {d}")
        else:
            print(f"identical to {ref_path}: every file's sha256 matches")
    return 0


def _check_creatable(path: Path, option: str) -> None:
    """``path`` is a folder this process can write, or can be created: its nearest existing ancestor is a
    writable folder (the build writes a staging folder beside ``--out``, so its parent must be writable too)."""
    import os

    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise _Refused(f"{option} {path}: cannot create it, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _Refused(f"{option} {path}: cannot create it, {parent} is not writable")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _split_kv(s: str) -> tuple[str, str]:
    if "=" not in s:
        raise _Refused(f"--set expects KEY=VALUE, got {s!r}")
    k, v = s.split("=", 1)
    return k.strip(), v.strip()


def cmd_pair_report(args: argparse.Namespace) -> int:
    from companion.tiny_pair.pair_folder import PairFolderError, read_pair_manifest, read_pair_prompts
    from companion.tiny_pair.report import pair_report

    try:
        read_pair_manifest(args.pair)  # before any model loads: the folder, its manifest and its prompts
        read_pair_prompts(args.pair)
    except PairFolderError as err:
        return _refuse("pair-report", f"--pair {err}")

    manifest, fresh = pair_report(args.pair, recompute=not args.no_recompute, speed=not args.no_speed)
    if args.json:
        print(json.dumps({"manifest_figures": manifest.get("figures"), "manifest_speed": manifest.get("speed"),
                          "fresh": fresh}, indent=1))
    else:
        print(format_report(manifest, fresh))
    return 0 if fresh.get("files_ok", True) else 1


def _fmt(x: Any, nd: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return "-" if x is None else str(x)


def _section(d: Any, key: str) -> dict[str, Any]:
    """``d[key]`` when both are mappings, else empty: a report prints what a manifest has, never a traceback."""
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, dict) else {}


def _count(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else _fmt(x)


def format_report(manifest: dict[str, Any], fresh: dict[str, Any] | None) -> str:
    """Plain-text report: sizes, training, held-out and greedy figures (manifest vs fresh), speed."""
    m, f = manifest, fresh or {}
    fig, ffig = _section(m, "figures"), _section(f, "figures")
    out = []
    models = _section(m, "models")
    out.append(f"pair: target {_count(_section(models, 'target').get('params'))} params, drafter "
               f"{_count(_section(models, 'drafter').get('params'))} params, vocab {models.get('vocab_size')}, "
               f"stored as {models.get('save_dtype')}")
    tr = _section(m, "training")
    for name in ("target", "drafter"):
        s = _section(tr, name)
        if not s:
            out.append(f"training {name}: not recorded in the manifest")
            continue
        what = "loss" if name == "target" else "KL(target||drafter)"
        tokens = s.get("tokens")
        out.append(f"training {name}: {s.get('steps')} steps, {_count(tokens)} tokens, {s.get('seconds')} s "
                   f"({s.get('tokens_per_second')} tok/s), {what} {s.get('first_loss_mean')} -> {s.get('last_loss_mean')}")
    if "files_ok" in f:
        out.append("files: " + ("every sha256 matches the manifest" if f["files_ok"] else
                                "MISMATCH: " + ", ".join(f.get("files_bad", []))))
    if f.get("corpus_note"):
        out.append(f"corpus: {f['corpus_note']}")
    cols = "manifest" + ("     fresh" if ffig else "")
    out.append(f"\nheld-out text, teacher-forced ({fig.get('eval_tokens')} scored tokens)      {cols}")
    rows = [("target loss (nats/token)", "target_loss"), ("drafter loss (nats/token)", "drafter_loss"),
            ("target top-1 accuracy", "target_accuracy"), ("drafter top-1 accuracy", "drafter_accuracy")]
    for label, key in rows:
        out.append(f"  {label:<40} {_fmt(fig.get(key)):>8}" + (f"  {_fmt(ffig.get(key)):>8}" if ffig else ""))
    for section, title in (("held_out", "held-out steps"), ("greedy", "greedy continuations of default prompts")):
        s, fs = _section(fig, section), _section(ffig, section)
        if not s:
            continue
        out.append(f"{title} ({s.get('n_steps')} steps)")
        for label, key in (
            ("drafter top-1 agreement with target", "agreement_top1"),
            ("mean sum(min(p, q))", "overlap"),
            ("mean KL(p||q)", "kl_pq"),
            ("mean KL(q||p)", "kl_qp"),
            ("target top-1 prob: mean", "target_top1_mean"),
            ("target top-1 prob: median", "target_top1_median"),
            ("target top-1 prob: 5th percentile", "target_top1_p5"),
            ("target top-10 mass: mean", "target_top10_mass"),
            ("share of peaked steps (p1 >= 0.9)", "frac_peaked"),
            ("share of flat steps (p1 < 0.3)", "frac_flat"),
            ("share of near-ties (p1 - p2 < 0.05)", "frac_near_tie"),
        ):
            out.append(f"  {label:<40} {_fmt(s.get(key)):>8}" + (f"  {_fmt(fs.get(key)):>8}" if fs else ""))
    r = _section(fig, "regime")
    if r:
        out.append(f"\nregime: target's own greedy answers to {r.get('n_prompts')} chat prompts, at most {r.get('max_steps')} "
                   f"steps, stop at EOS ({r.get('n_steps')} steps)")
        for label, key in (("top-1 probability: mean", "top1_mean"), ("top-1 probability: median", "top1_median"),
                           ("top-10 mass: mean", "top10_mass_mean"),
                           ("strict-greedy certificate: median (nats)", "greedy_certificate_median"),
                           ("answers ending with EOS", "eos_rate"), ("mean answer length (steps)", "answer_length_mean"),
                           ("drafter greedy token accepted (strict greedy)", "drafter_greedy_acceptance")):
            out.append(f"  {label:<46} {_fmt(r.get(key)):>8}")
    tasks = f.get("tasks") or fig.get("tasks")
    if tasks:
        from companion.tiny_pair.tasks_report import format_task_table

        which = "fresh" if f.get("tasks") else "manifest"
        out.append(f"\nper task ({which}): the target's greedy answers to the regime's prompts; right = content "
                   "exact-match; p5 = 5th percentile over the answer's steps (certificates: forward, nats)")
        out.extend(format_task_table(tasks))
    h = _section(fig, "assisted")
    if h:
        out.append(f"\ntransformers' assisted generation, {h.get('num_assistant_tokens')} drafts a round, same prompts "
                   f"({h.get('rounds')} rounds)")
        out.append(f"  {'accepted drafts per round':<46} {_fmt(h.get('accepted_per_round')):>8}")
        out.append(f"  {'new tokens per round':<46} {_fmt(h.get('tokens_per_round')):>8}")
    sp, fsp = _section(m, "speed"), _section(f, "speed")
    if sp or fsp:
        out.append(f"\nspeed ({(fsp or sp).get('device')}, {(fsp or sp).get('torch_threads')} threads, batch 1, KV cache)"
                   f"       {'manifest' if sp else ''}" + ("     fresh" if fsp else ""))
        for label, key in (("load_pair time (s)", "load_seconds"),
                           ("target greedy tokens/s", "target_greedy_tokens_per_s"),
                           ("drafter greedy tokens/s", "drafter_greedy_tokens_per_s")):
            out.append(f"  {label:<40} {_fmt(sp.get(key), 2):>8}" + (f"  {_fmt(fsp.get(key), 2):>8}" if fsp else ""))
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="companion")
    register(parser.add_subparsers(dest="command"))
    a = parser.parse_args()
    sys.exit(a.func(a))
