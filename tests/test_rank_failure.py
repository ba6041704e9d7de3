"""A rank that dies mid-harvest: rerunning the same command gives the rows of an uninterrupted run.

``companion harvest`` under ``torchrun`` deals shard ``i`` to rank ``i mod world``; every shard is
written whole (a temporary file renamed into place) with its checksum, and a rerun keeps the sound
shards and computes the rest. Here two ranks harvest the embedded closed-world pair on the CPU,
rank 1 is killed (SIGKILL, as an out-of-memory kill or a lost node would end it) once a shard is
on disk, ``torchrun`` stops the other, and the same command is run again. The book's "Beyond one
machine" page (``book/beyond_one_machine.md``) describes this.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

#: 12 shards of one prompt each, 6 per rank: each rank writes its shards over a few seconds, time to
#: kill one after the first shard lands and before the last.
ARGS = ["--preset", "closed-world", "--n-prompts", "12", "--steps", "48", "--batch-size", "1",
        "--prompts-per-shard", "1", "--threads", "1", "--device", "cpu", "--no-progress"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    return env


def torchrun(out: Path) -> list[str]:
    """The command of the page: two processes on this machine, ``companion harvest`` in each."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "companion", "harvest", "--out", str(out), *ARGS]


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The process among ``launcher``'s descendants whose environment says ``RANK=<rank>``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    todo, seen = [launcher], []
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            seen.append(child)
            todo.append(child)
    for pid in seen:
        try:
            env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + str(rank).encode() in env:
            return pid
    return None


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank's process in /proc")
def test_a_killed_rank_resumes_to_the_rows_of_an_uninterrupted_run(tmp_path: Path) -> None:
    from companion.cli import main
    from companion.harvest import load_traces, read_manifest
    from companion.harvest.store import existing_shards

    out = tmp_path / "two-ranks"
    launcher = subprocess.Popen(torchrun(out), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    try:
        killed = None
        deadline = time.monotonic() + 240
        while killed is None and launcher.poll() is None and time.monotonic() < deadline:
            pid = _rank_pid(launcher.pid, 1)
            if pid is not None and (out / "shards").is_dir() and existing_shards(out):
                os.kill(pid, signal.SIGKILL)
                killed = pid
            time.sleep(0.02)
        _, err = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert killed is not None, f"rank 1 was never seen with a shard on disk:\n{err[-2000:]}"
    assert launcher.returncode != 0, "torchrun reported success although rank 1 was killed"
    first = read_manifest(out)
    assert first.get("status") != "complete"
    kept = len(existing_shards(out))
    assert 0 < kept < 12, f"{kept} shards after the kill: the test needs a harvest cut in the middle"

    # the same command again: the sound shards are kept, the rest computed
    again = subprocess.run(torchrun(out), env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    manifest = read_manifest(out)
    assert manifest["status"] == "complete" and len(existing_shards(out)) == 12
    assert manifest["runs"][-1]["world_size"] == 2

    # one process, never interrupted: the same rows
    whole = tmp_path / "one-process"
    assert main(["harvest", "--out", str(whole), *ARGS]) == 0
    assert read_manifest(whole)["config_digest"] == manifest["config_digest"]
    assert load_traces(out).equals(load_traces(whole))
