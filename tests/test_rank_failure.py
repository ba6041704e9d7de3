"""A rank that dies mid-harvest: rerunning the same command gives the rows of an uninterrupted run.

``companion harvest`` under ``torchrun`` deals shard ``i`` to rank ``i mod world``; every shard is
written whole (a temporary file renamed into place) with its checksum, and a rerun keeps the sound
shards and computes the rest. Here two ranks harvest the embedded closed-world pair on the CPU,
rank 1 is killed (SIGKILL, as an out-of-memory kill or a lost node would end it) once a shard is
on disk, ``torchrun`` stops the other, and the same command is run again. The book's "Beyond one
machine" page (``book/beyond_one_machine.md``) describes this.

The second test rehearses the page's two-node recipe on this machine: ``companion prefetch``,
then two ``torchrun`` invocations as two "nodes" (``--nnodes 2 --nproc-per-node 1``, one c10d
rendezvous on a free localhost port, gloo between the ranks) with ``HF_HUB_OFFLINE=1``, the
worker of rank 1 killed mid-harvest (its lock file left behind, as a lost node leaves it),
``companion harvest-status`` reporting the folder incomplete, both commands run again, the status
complete, and the rows those of one uninterrupted process.
"""
from __future__ import annotations

import json
import os
import signal
import socket
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


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The harvest of ARGS by one process, never interrupted: the rows both tests compare with."""
    from companion.cli import main
    from companion.harvest import read_manifest

    whole = tmp_path_factory.mktemp("one-process") / "traces"
    assert main(["harvest", "--out", str(whole), *ARGS]) == 0
    assert read_manifest(whole)["status"] == "complete"
    return whole


def _rank_pid(launcher: int, rank: int, local_rank: int | None = None) -> int | None:
    """The process among ``launcher``'s descendants whose environment says ``RANK=<rank>`` (and
    ``LOCAL_RANK=<local_rank>``, by default ``rank``)."""
    local_rank = rank if local_rank is None else local_rank
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
        if f"RANK={rank}".encode() in env and f"LOCAL_RANK={local_rank}".encode() in env:
            return pid
    return None


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank's process in /proc")
def test_a_killed_rank_resumes_to_the_rows_of_an_uninterrupted_run(tmp_path: Path, one_process: Path) -> None:
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
    assert read_manifest(one_process)["config_digest"] == manifest["config_digest"]
    assert load_traces(out).equals(load_traces(one_process))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_node_torchrun(out: Path, port: int) -> list[str]:
    """The page's multi-node command for one node, with one process per node and the rendezvous on localhost."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"rehearsal-{port}",
            "--max-restarts", "0", "-m", "companion", "harvest", "--out", str(out), *ARGS]


def _launch_nodes(out: Path) -> list[subprocess.Popen]:
    cmd = two_node_torchrun(out, _free_port())
    return [subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True) for _ in range(2)]


def _finish(nodes: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    try:
        results = []
        for node in nodes:
            out, err = node.communicate(timeout=timeout)
            results.append((node.returncode, out, err))
        return results
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank's process in /proc")
def test_the_two_node_recipe_rehearsed_on_one_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     one_process: Path) -> None:
    from companion.cli import main
    from companion.harvest import load_traces, read_manifest
    from companion.harvest.lock import lock_path
    from companion.harvest.store import existing_shards

    # 1. the pre-fetch: one process loads the models and prompts, then the ranks run offline
    assert main(["prefetch", "--preset", "closed-world", "--n-prompts", "12"]) == 0
    fetched = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert fetched["prompts"] == 12 and fetched["drafter"] is not None

    # 2. both "nodes" launched; rank 1's worker killed once one of its shards is on disk
    out = tmp_path / "shared" / "traces"
    nodes = _launch_nodes(out)
    killed = None
    deadline = time.monotonic() + 240
    try:
        while killed is None and all(n.poll() is None for n in nodes) and time.monotonic() < deadline:
            pid = next(filter(None, (_rank_pid(n.pid, 1, local_rank=0) for n in nodes)), None)
            if pid is not None and (out / "shards").is_dir() and any(
                    p.name.endswith(".rank1.parquet") for p in existing_shards(out).values()):
                os.kill(pid, signal.SIGKILL)
                killed = pid
            time.sleep(0.02)
    finally:
        first = _finish(nodes, 240)
    errors = "\n".join(err[-1500:] for _, _, err in first)
    assert killed is not None, f"rank 1 was never seen with a shard on disk:\n{errors}"
    assert all(code != 0 for code, _, _ in first), f"a node reported success although rank 1 died:\n{errors}"
    kept = len(existing_shards(out))
    assert 0 < kept < 12, f"{kept} shards after the kill: the test needs a harvest cut in the middle"
    assert lock_path(out, 1).exists(), "the killed rank's lock file is left behind (taken over on the rerun)"
    assert main(["harvest-status", str(out)]) == 1
    assert read_manifest(out)["status"] != "complete"
    capsys.readouterr()

    # 3. the same two commands again (a new rendezvous): the sound shards kept, the rest computed
    again = _finish(_launch_nodes(out), 400)
    assert all(code == 0 for code, _, _ in again), "\n".join(err[-3000:] for _, _, err in again)
    assert main(["harvest-status", "--json", str(out)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["status"] == "complete" and status["shards"] == status["shards_total"] == 12
    assert status["runs"][-1]["world_size"] == 2 and status["locks"] == []
    assert not lock_path(out, 1).exists() and not lock_path(out).exists()

    # 4. one process, never interrupted: the same rows
    assert read_manifest(one_process)["config_digest"] == read_manifest(out)["config_digest"]
    assert status["rows"] == read_manifest(one_process)["totals"]["rows"]
    assert load_traces(out).equals(load_traces(one_process))
