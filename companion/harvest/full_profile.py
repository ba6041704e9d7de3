"""The full profile: the paper's protocol at its size on Qwen2.5-Coder-1.5B, run once and committed as data.

The paper measures 500 prompts x up to 128 greedy steps per target. On two CPU cores that takes
tens of minutes for the 1.5B (the committed run's wall time, from its manifest: :func:`recorded_time`),
too long for the book's default build, so it is run once by
``companion full-profile`` (resumable: rerun the same command after a stop) and its per-step
summary is committed: ``companion/assets/full_profile/`` holds

* ``qwen2.5-coder-1.5b.parquet``: one row per step, the columns chapter 7 reads
  (:data:`COLUMNS`; no logits, no top-k lists), and
* ``manifest.json``: how it was made (:func:`export`): the command, the code commit, the
  prompt set's sha256, the weights' sha256 and conversion version, dtype, batch, threads, CPU
  flags, library versions, date and wall time, and the data file's sha256.

The run is :data:`PROFILE`: the ``qwen2.5-coder`` preset's target alone (``--no-drafter``: the
paper's target-side setting) on the first 500 prompts of ``chat-and-stdlib`` (250 held-out chat
requests and 250 standard-library requests, in turn), 128 steps, batches of 16, two threads.
The default build's prompts (the first ``n`` of the same set) are a subset; a test recomputes a
few of them and compares with the committed rows (``tests/test_full_profile.py``).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from companion import atomic
from companion.assets import FULL_PROFILE_DIR


@dataclass(frozen=True)
class Profile:
    """The full profile's harvest, by the options of ``companion harvest``."""

    preset: str = "qwen2.5-coder"
    prompts: str = "chat-and-stdlib"
    n_prompts: int = 500
    n_steps: int = 128
    batch_size: int = 16
    threads: int = 2

    def harvest_argv(self, out: Path) -> list[str]:
        """The ``companion harvest`` arguments that run (or resume) it into ``out``."""
        return ["harvest", "--out", str(out), "--preset", self.preset, "--no-drafter", "--prompts", self.prompts,
                "--n-prompts", str(self.n_prompts), "--steps", str(self.n_steps), "--batch-size",
                str(self.batch_size), "--threads", str(self.threads)]


PROFILE = Profile()
DATA_FILE: Path = FULL_PROFILE_DIR / "qwen2.5-coder-1.5b.parquet"
MANIFEST_FILE: Path = FULL_PROFILE_DIR / "manifest.json"
DEFAULT_RUN_DIR = Path("runs") / "full-profile-qwen2.5-coder-1.5b"
COMMAND = "companion full-profile"
#: Per-step columns kept (with every ``cert_fwd[...]`` and ``tree_cert_fwd[...]`` of the harvest, and
#: their kernel-path versions).
COLUMNS: tuple[str, ...] = ("prompt_id", "prompt_tokens", "step", "token", "p_top1", "margin", "entropy",
                            "top10_mass", "top2_tie", "logit_top1", "logit_gap")
#: CPU flags that choose the kernels a bf16 model runs on x86 (recorded, not required).
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def kept_columns(names: list[str]) -> list[str]:
    """:data:`COLUMNS` and the forward certificates of every criterion (both conventions: exact ties and
    kernel paths) and tree width, in the harvest's order."""
    return [n for n in names if n in COLUMNS or n.startswith(("cert_fwd[", "path_cert_fwd[", "tree_cert_fwd[",
                                                                    "path_tree_cert_fwd["))]


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return [f for f in CPU_FLAGS if f in have]


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    return next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "unknown")


def _code_commit(outputs: Path | None = None) -> str:
    """``HEAD``'s commit, and the package's files that differ from it (so a reader can judge whether they matter).
    ``outputs``: the folder the caller is writing its results into, whose files are not counted."""
    here = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "companion"],
                               capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = sorted(line[3:] for line in dirty if line.strip())
    if outputs is not None:
        try:
            rel = Path(outputs).resolve().relative_to(here).as_posix().rstrip("/") + "/"
        except ValueError:
            rel = None
        if rel is not None:
            changed = [c for c in changed if not (c.rstrip("/") + "/").startswith(rel)]
    return head + (f" (uncommitted changes in {', '.join(changed)})" if changed else "")


def export(run_dir: Path, data_dir: Path = FULL_PROFILE_DIR) -> dict[str, Any]:
    """Write ``run_dir``'s per-step summary and its manifest into ``data_dir``; return the manifest.

    The run must be a complete harvest (:func:`companion.harvest.load_traces` checks every shard).
    Both files are written beside and renamed into place, the data first, so a reader never
    sees a manifest naming data that is not there.
    """
    from companion.harvest import load_traces
    from companion.harvest.store import read_manifest
    from companion.models.sizes import non_embedding_parameters

    harvest = read_manifest(run_dir)
    table = load_traces(run_dir)
    table = table.select(kept_columns(table.column_names))
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", compression_level=19)
    data = buffer.getvalue()
    config = harvest["config"]
    target = config["target"]
    runs = harvest.get("runs", [])
    manifest = {
        "format": "companion-full-profile/1",
        "command": COMMAND,
        "harvest_command": "companion " + " ".join(PROFILE.harvest_argv(DEFAULT_RUN_DIR)),
        "code_commit": _code_commit(outputs=data_dir),
        "prompt_set": {"name": harvest.get("prompt_set_name"), "sha256": config["prompt_set"]["digest"],
                       "n_prompts": config["prompt_set"]["n_prompts"]},
        "model": target.get("converted_from", {}).get("display_name", target["name"]),
        "parameters": target["parameters"],
        "non_embedding_parameters": non_embedding_parameters(target["name"], target["parameters"]),
        "weights_sha256": target.get("weights_sha256"),
        "converted_from": target.get("converted_from"),
        "dtype": config["dtype"],
        "batch_size": config["batch_size"],
        "threads": config["numerics"]["torch_threads"],
        "n_steps": config["n_steps"],
        "criteria": config["criteria"],
        "tree_widths": config["tree_widths"],
        "cpu": {"model": _cpu_model(), "flags": _cpu_flags(), "capability": config["numerics"].get("cpu_capability")},
        "versions": {k: harvest["environment"]["versions"].get(k) for k in ("python", "torch", "transformers")},
        "harvested": [r["started"] for r in runs],
        "wall_s": round(sum(float(r.get("wall_s", 0.0)) for r in runs), 1),
        "harvest_config_digest": harvest["config_digest"],
        "rows": table.num_rows,
        "columns": table.column_names,
        "data_file": DATA_FILE.name,
        "data_sha256": hashlib.sha256(data).hexdigest(),
        "data_bytes": len(data),
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(data_dir / DATA_FILE.name, data)
    atomic.write_text(data_dir / MANIFEST_FILE.name, json.dumps(manifest, indent=1) + "\n")
    return manifest


def recorded_time(data_dir: Path = FULL_PROFILE_DIR) -> str:
    """How long the committed run took, from its manifest: ``"23 minutes on 2 threads"``; ``"unknown"``
    without a readable manifest."""
    try:
        manifest = json.loads((data_dir / MANIFEST_FILE.name).read_text(encoding="utf-8"))
        return f"{float(manifest['wall_s']) / 60:.0f} minutes on {manifest['threads']} threads"
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


def load(data_dir: Path = FULL_PROFILE_DIR) -> tuple[pa.Table, dict[str, Any]]:
    """The committed per-step table and its manifest, the data checked against the manifest's sha256.

    Raises ``FileNotFoundError`` when the files are absent and ``ValueError`` when the data do
    not match their manifest.
    """
    manifest_path = data_dir / MANIFEST_FILE.name
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no full profile in {data_dir}: `{COMMAND}` makes it (the committed run took "
                                f"{recorded_time()})")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    data = (data_dir / manifest["data_file"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest["data_sha256"]:
        raise ValueError(f"{data_dir / manifest['data_file']} does not match the sha256 of {manifest_path}; "
                         f"restore it from the repository or rerun `{COMMAND}`")
    return pq.read_table(io.BytesIO(data)), manifest


#: How far the top logit of two runs of one bfloat16 model on one prefix may differ, in units in the
#: last place of that logit (see :func:`compare_steps`).
LOGIT_ULPS = 4


@dataclass(frozen=True)
class Agreement:
    """Two runs' steps compared prompt by prompt until their tokens part (:func:`compare_steps`);
    ``stopped_at_near_tie`` counts the prompts whose tokens parted at a near tie."""

    prompts: int
    steps: int
    stopped_at_near_tie: int
    max_logit_ulps: float
    max_log_p_ulps: float
    failures: tuple[str, ...]


def compare_steps(a: pa.Table, b: pa.Table, dtype: str = "bfloat16", ulps: float = LOGIT_ULPS) -> Agreement:
    """Compare two runs' rows (``prompt_id``, ``step``, ``token``, ``p_top1``, ``logit_top1``, ``logit_gap``).

    For every prompt in both, step by step from 0 while both have the step: the top logits must
    agree within ``ulps`` units in the last place of the larger (``|dz| <= ulps * ulp(z)``), the
    log top-1 probabilities within ``2 * ulps * ulp(z)``, and the greedy tokens must be equal
    except at a near tie in either run (:func:`companion.harvest.ties.near_ties`), where they may
    differ; the comparison of a prompt stops at the first step whose tokens differ, since every
    later prefix differs too.

    Why these tolerances. Two runs of the same bfloat16 model on the same prefix compute the same
    real values along other kernel paths when the batch, the threads or the CPU differ; every
    layer rounds to bfloat16 in its own order, so the logits move by a few ulps. Measured here,
    batches of 16 against 32 on one machine moved the top logit by at most 2 ulps over 107 steps,
    and the kernel paths of :mod:`companion.harvest.kernel_paths` by at most 3 over 2,716.
    ``ulps = 4`` (the near-tie band's width too, :mod:`companion.harvest.ties`) leaves room
    for other x86 CPUs (without bfloat16 instructions, other float32 accumulation orders). The
    probability follows from the logits: ``log p(1) = z(1) - logsumexp(z)``, and a shift of every
    logit by at most ``d`` moves ``logsumexp`` by at most ``d``, so ``log p(1)`` by at most ``2d``
    (the logits that carry the mass lie within a few nats of the top, where the spacing is at
    most that of the top logit).
    """
    import numpy as np

    from companion.harvest.ties import near_ties, ulp

    def rows(t: pa.Table) -> dict[str, dict[int, dict[str, Any]]]:
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for r in t.select(["prompt_id", "step", "token", "p_top1", "logit_top1", "logit_gap"]).to_pylist():
            out.setdefault(r["prompt_id"], {})[int(r["step"])] = r
        return out

    ra, rb = rows(a), rows(b)
    common = [pid for pid in ra if pid in rb]
    steps = stopped = 0
    worst_ulps = worst_logp = 0.0  # the log-probability gap in ulps of the top logit
    failures: list[str] = []
    for pid in common:
        s = 0
        while s in ra[pid] and s in rb[pid]:
            x, y = ra[pid][s], rb[pid][s]
            z = max(abs(x["logit_top1"]), abs(y["logit_top1"]))
            unit = float(ulp(z, dtype))
            d_ulps = abs(x["logit_top1"] - y["logit_top1"]) / unit
            d_logp = abs(math.log(x["p_top1"]) - math.log(y["p_top1"]))
            worst_ulps, worst_logp = max(worst_ulps, d_ulps), max(worst_logp, d_logp / unit)
            if d_ulps > ulps:
                failures.append(f"{pid} step {s}: top logits {x['logit_top1']} and {y['logit_top1']} differ by "
                                f"{d_ulps:g} ulps (> {ulps})")
            if d_logp > 2 * ulps * unit:
                failures.append(f"{pid} step {s}: log p(1) differ by {d_logp:.4g} (> {2 * ulps * unit:.4g})")
            steps += 1
            if x["token"] != y["token"]:  # the prefixes part here: nothing later is comparable
                tie = bool(near_ties(np.array([x["logit_top1"], y["logit_top1"]]),
                                     np.array([x["logit_gap"], y["logit_gap"]]), dtype).any())
                if tie:
                    stopped += 1
                else:
                    failures.append(f"{pid} step {s}: tokens {x['token']} and {y['token']} differ at no near tie")
                break
            s += 1
    return Agreement(len(common), steps, stopped, worst_ulps, worst_logp, tuple(failures))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``full-profile`` subcommand to the command line's parser."""
    p = subparsers.add_parser(
        "full-profile",
        help="run the paper's protocol at its size on the 1.5B (500 prompts x 128 steps; resumable) and "
             "write its per-step summary into the package",
        description="Harvest the full profile (the qwen2.5-coder preset's target alone on the first 500 prompts "
                    f"of chat-and-stdlib, 128 greedy steps, batches of 16, two threads; the committed run took "
                    f"{recorded_time()}; resumable: rerun to continue) and write its per-step summary and manifest to "
                    f"{FULL_PROFILE_DIR}. Exit status: 0 written, 1 the harvest did not complete, 2 refused.")
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                   help=f"the harvest's folder (default: {DEFAULT_RUN_DIR}; resumed if it holds this run)")
    p.add_argument("--out", type=Path, default=FULL_PROFILE_DIR,
                   help=f"where the summary and manifest go (default: the package's {FULL_PROFILE_DIR.name}/)")
    p.set_defaults(func=cmd_full_profile)


def cmd_full_profile(args: argparse.Namespace) -> int:
    """Run the ``full-profile`` subcommand: harvest the full profile, then write its summary."""
    from companion.harvest.cli import main as harvest_main

    status = harvest_main(PROFILE.harvest_argv(args.run_dir)[1:])
    if status != 0:
        return status
    manifest = export(args.run_dir, args.out)
    print(f"wrote {args.out / DATA_FILE.name} ({manifest['rows']:,} steps of {manifest['prompt_set']['n_prompts']} "
          f"prompts, {manifest['data_bytes'] / 1e6:.1f} MB) and its manifest", file=sys.stderr)
    return 0
