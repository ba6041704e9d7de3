"""The stability profile: the default build's first prompts harvested again in other numerics, committed as data.

Chapter 12 asks how stable the paper's statistics are to the precision and to the batch a step is
computed in. The default build harvests its prompts in bfloat16 in one batch of 16; the full
profile (:mod:`companion.harvest.full_profile`) has the same prompts in bfloat16 in batches of
16 drawn from 500. This profile adds, on the first :attr:`Profile.n_prompts` of them, each prompt
decoded alone (batch 1, no padding) in bfloat16 and in float32 (:data:`VARIANTS`): the same
target alone (the paper's target-side setting), the same steps. On two CPU cores these harvests
take minutes (the committed run's wall times are in its manifest), too long for the default
build, so ``companion stability-profile`` runs them once (resumable) and
``companion/assets/stability_profile/`` holds

* one Parquet file per variant, one row per step with the columns chapter 12 reads
  (:func:`companion.harvest.full_profile.kept_columns`), and
* ``manifest.json``: the command, the code commit, the prompt set's sha256, the weights, the CPU,
  the library versions, and per variant its dtype, batch, threads, wall time and data sha256
  (:func:`export`); :func:`load` checks every file against it.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from companion import atomic
from companion.assets import STABILITY_PROFILE_DIR
from companion.harvest import full_profile


@dataclass(frozen=True)
class Variant:
    """One harvest of the profile: the dtype the model computes in and the batch size."""

    dtype: str
    batch_size: int

    @property
    def name(self) -> str:
        return f"{self.dtype}-b{self.batch_size}"

    @property
    def label(self) -> str:
        return f"{self.dtype}, batch {self.batch_size}"


#: The harvests of the profile.
VARIANTS: tuple[Variant, ...] = (Variant("bfloat16", 1), Variant("float32", 1))


@dataclass(frozen=True)
class Profile:
    """The prompts and steps every variant harvests, by the options of ``companion harvest``."""

    preset: str = "qwen2.5-coder"
    prompts: str = "chat-and-stdlib"
    n_prompts: int = 4
    n_steps: int = 48
    threads: int = 2

    def harvest_argv(self, variant: Variant, out: Path) -> list[str]:
        """The ``companion harvest`` arguments that run (or resume) ``variant`` into ``out``."""
        return ["harvest", "--out", str(out), "--preset", self.preset, "--no-drafter", "--prompts", self.prompts,
                "--n-prompts", str(self.n_prompts), "--steps", str(self.n_steps), "--batch-size",
                str(variant.batch_size), "--threads", str(self.threads), "--dtype", variant.dtype, "--no-progress"]


PROFILE = Profile()
MANIFEST_FILE: Path = STABILITY_PROFILE_DIR / "manifest.json"
DEFAULT_RUN_DIR = Path("runs") / "stability-profile"
COMMAND = "companion stability-profile"


def export(run_root: Path, data_dir: Path = STABILITY_PROFILE_DIR, profile: Profile = PROFILE,
           variants: tuple[Variant, ...] = VARIANTS) -> dict[str, Any]:
    """Write each variant's per-step summary (``run_root/<variant name>``, complete harvests) and one
    manifest into ``data_dir``; return the manifest. Data first, the manifest last, each renamed into place."""
    from companion.harvest import load_traces
    from companion.harvest.store import read_manifest

    entries, shared = [], None
    for v in variants:
        run_dir = run_root / v.name
        harvest = read_manifest(run_dir)
        table = load_traces(run_dir)
        table = table.select(full_profile.kept_columns(table.column_names))
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd", compression_level=19)
        data = buffer.getvalue()
        config = harvest["config"]
        target = config["target"]
        if config["dtype"] != v.dtype or config["batch_size"] != v.batch_size:
            raise ValueError(f"{run_dir} holds a harvest in {config['dtype']}, batch {config['batch_size']}, "
                             f"not {v.label}")
        common = {"model": target.get("converted_from", {}).get("display_name", target["name"]),
                  "converted_from": target.get("converted_from"),
                  "prompt_set": {"name": harvest.get("prompt_set_name"), "sha256": config["prompt_set"]["digest"],
                                 "n_prompts": config["prompt_set"]["n_prompts"]},
                  "n_steps": config["n_steps"], "criteria": config["criteria"], "tree_widths": config["tree_widths"]}
        if shared is None:
            shared = common
        elif common != shared:
            raise ValueError(f"{run_dir} is not a harvest of the same model, prompts and steps as the others")
        runs = harvest.get("runs", [])
        entries.append({"name": v.name, "dtype": v.dtype, "batch_size": v.batch_size,
                        "harvest_command": "companion " + " ".join(profile.harvest_argv(v, DEFAULT_RUN_DIR / v.name)),
                        "threads": config["numerics"]["torch_threads"],
                        "weights_sha256": target.get("weights_sha256"),
                        "harvested": [r["started"] for r in runs],
                        "wall_s": round(sum(float(r.get("wall_s", 0.0)) for r in runs), 1),
                        "harvest_config_digest": harvest["config_digest"],
                        "rows": table.num_rows, "columns": table.column_names,
                        "data_file": f"{v.name}.parquet", "data_sha256": hashlib.sha256(data).hexdigest(),
                        "data_bytes": len(data), "_data": data})
        versions = {k: harvest["environment"]["versions"].get(k) for k in ("python", "torch", "transformers")}
    manifest = {"format": "companion-stability-profile/1", "command": COMMAND,
                "code_commit": full_profile._code_commit(outputs=data_dir), **(shared or {}),
                "cpu": {"model": full_profile._cpu_model(), "flags": full_profile._cpu_flags()},
                "versions": versions,
                "variants": [{k: e[k] for k in e if k != "_data"} for e in entries]}
    data_dir.mkdir(parents=True, exist_ok=True)
    for e in entries:
        atomic.write_bytes(data_dir / e["data_file"], e["_data"])
    atomic.write_text(data_dir / MANIFEST_FILE.name, json.dumps(manifest, indent=1) + "\n")
    return manifest


def load(data_dir: Path = STABILITY_PROFILE_DIR) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """The committed tables by variant name and the manifest, each file checked against its sha256.

    Raises ``FileNotFoundError`` without a manifest and ``ValueError`` when a file does not match it.
    """
    manifest_path = data_dir / MANIFEST_FILE.name
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no stability profile in {data_dir}: `{COMMAND}` makes it")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    tables = {}
    for v in manifest["variants"]:
        data = (data_dir / v["data_file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != v["data_sha256"]:
            raise ValueError(f"{data_dir / v['data_file']} does not match the sha256 of {manifest_path}; "
                             f"restore it from the repository or rerun `{COMMAND}`")
        tables[v["name"]] = pq.read_table(io.BytesIO(data))
    return tables, manifest


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stability-profile",
        help="harvest the default build's first prompts alone in bfloat16 and in float32 (resumable) and write "
             "their per-step summaries into the package",
        description=f"Harvest the qwen2.5-coder preset's target alone on the first {PROFILE.n_prompts} prompts of "
                    f"{PROFILE.prompts}, {PROFILE.n_steps} greedy steps, {PROFILE.threads} threads, once per variant ("
                    + "; ".join(v.label for v in VARIANTS) + f"; resumable: rerun to continue), and write the "
                    f"per-step summaries and a manifest to {STABILITY_PROFILE_DIR}. Exit status: 0 written, 1 a "
                    "harvest did not complete, 2 refused.")
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                   help=f"the harvests' parent folder (default: {DEFAULT_RUN_DIR}; one folder per variant, resumed)")
    p.add_argument("--out", type=Path, default=STABILITY_PROFILE_DIR,
                   help=f"where the summaries and manifest go (default: the package's {STABILITY_PROFILE_DIR.name}/)")
    p.set_defaults(func=cmd_stability_profile)


def cmd_stability_profile(args: argparse.Namespace) -> int:
    from companion.harvest.cli import main as harvest_main

    for v in VARIANTS:
        status = harvest_main(PROFILE.harvest_argv(v, args.run_dir / v.name)[1:])
        if status != 0:
            return status
    manifest = export(args.run_dir, args.out)
    print(f"wrote {len(manifest['variants'])} variants of {manifest['prompt_set']['n_prompts']} prompts to {args.out}",
          file=sys.stderr)
    return 0
