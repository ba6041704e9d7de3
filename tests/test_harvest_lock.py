"""The harvest folder's lock (``companion.harvest.lock``): a marker file created with O_CREAT|O_EXCL.

Checked here: processes that take it never overlap (a read-modify-write counter that loses
updates whenever two of them hold it at once), a holder killed on this machine is taken over at
once, a holder on another machine is taken over only once its heartbeat stops for ``stale_after``
seconds (and not while it beats), and a released lock leaves no file.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from companion.harvest.lock import exclusive, lock_path, machine_id, read_holder
from tests.conftest import ROOT

#: the lock module alone, by its path: it needs only the standard library, and importing the package
#: (torch) in every process would make this test slow on a busy machine
_IMPORT = """
import importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("lock", {path!r})
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
exclusive = lock.exclusive
""".format(path=str(ROOT / "companion" / "harvest" / "lock.py"))

_COUNTER = _IMPORT + """
out, counter, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    with exclusive(out):
        value = int(counter.read_text())
        time.sleep(0.002)  # widen the window a second writer would need
        counter.write_text(str(value + 1))
"""


def test_processes_holding_the_lock_never_overlap(tmp_path: Path) -> None:
    out, counter = tmp_path / "traces", tmp_path / "counter"
    counter.write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", _COUNTER, str(out), str(counter), "15"])
             for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert int(counter.read_text()) == 45, "two holders at once lost an update"
    assert not lock_path(out).exists()


def test_a_holder_killed_on_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    out = tmp_path / "traces"
    hold = _IMPORT + "with exclusive(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(600)\n"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert lock_path(out).exists(), "a killed holder leaves its file (nothing removes it)"
    waited: list[Path] = []
    start = time.monotonic()
    with exclusive(out, on_wait=waited.append):
        assert read_holder(lock_path(out))["pid"] == os.getpid()
    assert time.monotonic() - start < 5 and not waited


def _foreign_lock(out: Path) -> Path:
    path = lock_path(out, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": "node7", "machine": "another-boot-id:pid:[1]", "pid": os.getpid(),
                                "token": "theirs"}))
    assert machine_id() != "another-boot-id:pid:[1]"
    return path


def test_another_machines_holder_is_waited_for_while_it_beats_then_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "traces"
    path = _foreign_lock(out)
    beating = threading.Event()
    beating.set()

    def beat() -> None:  # the other node's heartbeat
        tick = 0
        while beating.is_set():
            tick += 1  # a new modification time at each beat, whatever the filesystem's resolution
            os.utime(path, (1_000_000 + tick, 1_000_000 + tick))
            time.sleep(0.1)

    got = threading.Event()

    def take() -> None:
        with exclusive(out, rank=1, stale_after=0.8):
            got.set()

    threading.Thread(target=beat, daemon=True).start()
    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert not got.wait(2.5), "took a lock whose holder on another node still beats"
    stopped = time.monotonic()
    beating.clear()
    assert got.wait(10), "never took over a lock whose heartbeat stopped"
    assert time.monotonic() - stopped >= 0.7
    taker.join(5)
    assert not path.exists()


def test_a_lock_file_someone_else_now_holds_is_not_removed_on_release(tmp_path: Path) -> None:
    out = tmp_path / "traces"
    with exclusive(out):
        # as if another waiter had judged this process dead and taken the lock over
        lock_path(out).write_text(json.dumps({"machine": "x", "pid": 1, "token": "new-holder"}))
    assert read_holder(lock_path(out))["token"] == "new-holder"
