"""Devices: which one a run uses, whether this machine has it, and how to describe it.

One home for what the harvest command line, the chapters' harvest cache, ``load_pair`` and
``companion reproduce`` all need: ``None`` or ``"auto"`` means CUDA when torch sees a GPU, else
the CPU. torch is imported on use, so the book's tooling can describe a CPU without it.
"""
from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Iterator
from typing import Any


class DeviceUnavailableError(ValueError):
    """The requested device is not one torch knows, or this machine does not have it."""


def check_device(requested: str | None) -> None:
    """Raise :class:`DeviceUnavailableError` (message without the option name) unless ``requested``
    is ``None``/``"auto"``, ``cpu``, or a CUDA or MPS device this machine has."""
    if requested in (None, "auto"):
        return
    import torch

    try:
        dev = torch.device(requested)
    except (RuntimeError, ValueError):
        raise DeviceUnavailableError("expected cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(f"torch {torch.__version__} sees no CUDA device; "
                                         "use --device cpu, or a CUDA build of torch on a machine with a GPU")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceUnavailableError(f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceUnavailableError("torch sees no Apple GPU (MPS); use --device cpu")
    elif dev.type != "cpu":
        raise DeviceUnavailableError("expected cpu, cuda, cuda:N or mps")


def resolve_device(requested: Any = None, *, local_rank: int = 0, world: int = 1):
    """The ``torch.device`` of a run: as requested, else CUDA when present (one GPU per local rank
    when several processes share a machine), else the CPU. ``"auto"`` is the same as ``None``."""
    import torch

    if requested is None or requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count()) if world > 1 else torch.device("cuda")
        return torch.device("cpu")
    dev = torch.device(requested)
    if dev.type == "cuda" and dev.index is None and world > 1:
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return dev


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask on Linux, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_description() -> str:
    """``"x86_64, 2 cores"``: the machine, as the status page shows it."""
    return f"{platform.machine() or 'CPU'}, {os.cpu_count()} cores"


def describe_device(device: str | None) -> tuple[str | None, str]:
    """Resolve ``"auto"`` to ``"cuda"`` or ``"cpu"`` and describe the hardware: ``(device, description)``.

    ``None`` (a chapter without a device parameter) stays ``None``. Raises
    :class:`DeviceUnavailableError` for ``"cuda"`` without a GPU or without torch.
    """
    if device is None or device == "cpu":
        return device, cpu_description()
    try:
        import torch
    except ImportError:
        if device == "auto":
            return "cpu", cpu_description()
        raise DeviceUnavailableError("device 'cuda' requested but torch is not installed") from None
    available = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if available else "cpu"
    if device == "cuda":
        if not available:
            raise DeviceUnavailableError(
                "device 'cuda' requested but torch sees no CUDA device "
                f"(torch {torch.__version__}); install a CUDA build of torch or use the cpu profile")
        return device, torch.cuda.get_device_name(0)
    return device, cpu_description()


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with exactly ``n`` torch intra-op threads (float reductions depend on the count), then restore."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


#: Set to 0 or 1 to override :func:`cpu_has_bf16` (to rehearse the fp32 fallback on a CPU that has bf16).
CPU_BF16_ENV = "COMPANION_CPU_BF16"
_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX-512 and AMX bf16, Arm's BF16 extension


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (``/proc/cpuinfo`` flags; ``$COMPANION_CPU_BF16`` overrides).

    Without such instructions torch still runs bf16 models, converting to float32 and back at
    every operation, which is slower than float32 itself; the models whose registry dtype is
    bf16 then load in float32 (:func:`companion.models.loading.load_pair` says so in one line).
    """
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            flags = {f for line in fh if line.startswith(("flags", "Features")) for f in line.split(":", 1)[1].split()}
    except OSError:
        return platform.machine().lower() in ("arm64",) and platform.system() == "Darwin"  # Apple M2 and later
    return any(f in flags for f in _BF16_FLAGS)
