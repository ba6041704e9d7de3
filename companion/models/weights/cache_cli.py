"""``companion cache``: what the weights cache holds, which of it is in use, and pruning the rest.

The cache (:func:`companion.models.weights.convert.cache_root`: ``$COMPANION_CACHE``, else
``~/.cache/companion``) holds, side by side:

* **model** folders ``<model>-<sha256[:16]>-v<N>``, each with the record
  (``companion-conversion.json``) its conversion wrote: the model, its display name, the GGUF's
  sha256, the conversion version and the tokenizer folder it copied;
* **tokenizer** folders ``tokenizer-<group>-<hash>-v<N>``, shared by the models of a group;
* **drafter** folders ``smollm2_drafter-<sha16>-<target folder>``: SmolLM2's committed drafter
  assembled with its target's embedding (:mod:`companion.models.weights.distilled_drafter`);
* **leftovers** of interrupted writes: ``.<folder>.partial-<pid>`` folders,
  ``<folder>.old-<pid>`` folders (:func:`companion.atomic.replace_dir`) of a folder named as this
  code names them, and in ``downloads/`` a registry model's GGUF file, its ``.<file>.partial-<pid>``
  and its ``.download-<model>-<pid>`` work folder (a conversion deletes its download; the next
  conversion of that model removes what a killed one left);
* lock files ``.<name>.lock`` (not listed, never deleted) and anything else (**unknown**: listed,
  never deleted, and named as left alone by ``--prune``): a folder or file of another name, a
  copy of a model, tokenizer or drafter folder under another name than its record gives it.

An entry is **current** when the code would use it now: the folder
``converted_dir(source(model))`` of each registry model when :func:`cache_is_current` holds
(sizes only: the sha256 of its files are checked when it is next used), the
tokenizer folder that a current model's record names, and the drafter folder built from the
committed drafter for the current SmolLM2 conversion. Every other model, tokenizer or drafter
folder is **stale**, and with the leftovers is what ``--prune`` deletes, after printing each one.
A current or unknown entry is never deleted, nor anything outside the cache root (symbolic links
are neither followed nor deleted). Each deletion holds the locks the code that writes the entry
takes (the model's, the folder's own, for a tokenizer those of its group's models too) and looks
again under them, so that a folder a conversion finished since the listing is kept; an entry
whose lock another process holds is skipped with a line saying so.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from companion.models.weights.errors import WeightsUnavailableError, one_line
from companion.models.weights.integrity import foreign_files

#: The model whose conversion SmolLM2's committed drafter is assembled for (``companion.models.loading``' smollm2 preset).
DRAFTER_TARGET = "smollm2-135m-instruct"

_PARTIAL = re.compile(r"^\.(?P<of>.+)\.partial-\d+$")
_OLD = re.compile(r"^(?P<of>.+)\.old-\d+$")
_MODEL_FOLDER = re.compile(r"^(?P<model>.+)-[0-9a-f]{16}-v\d+$")
_DOWNLOAD_WORK = re.compile(r"^\.download-(?P<model>.+)-\d+$")


@dataclass
class Entry:
    """One thing in the cache: its path, kind, size, what wrote it, and whether it is in use."""

    path: Path
    name: str  # the path relative to the cache root
    kind: str  # model, tokenizer, drafter, leftover, download, unknown
    size: int
    about: str  # what wrote it
    status: str  # current, stale, unknown
    why: str = ""  # why it is stale (empty when current or unknown)
    locks: list[str] = field(default_factory=list)  # lock names (``.<name>.lock``) its writer takes


def human_size(n: int) -> str:
    """Bytes in decimal units, three significant digits (``517 MB``, ``3.55 GB``)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{n} B"


def disk_size(path: Path) -> int:
    """Bytes of ``path`` and everything under it, symbolic links counted as themselves (never followed)."""
    try:
        total = path.lstat().st_size
    except OSError:
        return 0
    if path.is_symlink() or not path.is_dir():
        return total
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_size
    return total


def current_drafter_name(target_folder_name: str) -> str | None:
    """The folder name :func:`~companion.models.weights.distilled_drafter.drafter_dir` gives the committed drafter
    for the target folder ``target_folder_name``; None when no drafter is committed."""
    from companion.assets import SMOLLM2_DRAFTER_DIR

    manifest = SMOLLM2_DRAFTER_DIR / "manifest.json"
    if not manifest.is_file():
        return None
    try:
        weights = str(json.loads(manifest.read_text())["files_sha256"]["model.safetensors"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise WeightsUnavailableError(f"{manifest} is not a drafter manifest ({type(err).__name__}: {err}), so the "
                                      "drafter folder in use is unknown; restore it from the repository") from None
    return f"{SMOLLM2_DRAFTER_DIR.name}-{weights[:16]}-{target_folder_name}"


@dataclass(frozen=True)
class InUse:
    """What the code would use now in a cache: the registry, the current model folders (by name), the
    tokenizer folders their records name, and the committed drafter's folder (None: no drafter)."""

    known: dict
    models: frozenset[str]
    tokenizers: frozenset[str]
    drafter: str | None


def in_use(root: Path) -> InUse:
    """:class:`InUse` of the cache ``root``, as it is now."""
    from companion.models.weights.convert import cache_is_current, converted_dir, read_record
    from companion.models.weights.registry import sources

    known = sources()
    models = frozenset(converted_dir(src, root).name for src in known.values()
                       if cache_is_current(converted_dir(src, root), src, check_bytes=False))
    tokenizers = frozenset(str((read_record(root / n) or {}).get("tokenizer")) for n in models)
    drafter = (current_drafter_name(converted_dir(known[DRAFTER_TARGET], root).name)
               if DRAFTER_TARGET in known else None)
    return InUse(known, models, tokenizers, drafter)


def survey(root: Path) -> list[Entry]:
    """Every entry of the cache ``root`` (lock files aside), classified; models first, then by name."""
    use = in_use(root)
    entries = [e for path in sorted(root.iterdir()) for e in classify(path, use)]
    order = {"model": 0, "tokenizer": 1, "drafter": 2, "leftover": 3, "download": 4, "unknown": 5}
    return sorted(entries, key=lambda e: (order[e.kind], e.name))


def classify(path: Path, use: InUse) -> list[Entry]:
    """The entry ``path`` of the cache root (the files of ``downloads/`` for that folder; none for a lock file)."""
    from companion.models.weights.convert import CONVERSION_VERSION, TOKENIZER_VERSION, read_record

    name = path.name
    if name.startswith(".") and name.endswith(".lock") and path.is_file() and not path.is_symlink():
        return []
    size = disk_size(path)
    if path.is_symlink():
        return [Entry(path, name, "unknown", size, "a symbolic link (never followed)", "unknown")]
    if name == "downloads" and path.is_dir():
        return _downloads(path, use.known)
    leftover = _PARTIAL.match(name) or _OLD.match(name)
    if leftover and path.is_dir() and _MODEL_FOLDER.match(leftover.group("of")):
        of = leftover.group("of")
        how = "an interrupted write" if leftover.re is _PARTIAL else "a replaced folder not yet removed"
        return [Entry(path, name, "leftover", size, f"{how} of {of}", "stale", "a leftover", _locks_of(of))]
    if leftover:
        return [Entry(path, name, "unknown", size, "named like a leftover, but of no folder this code writes",
                      "unknown")]
    record = read_record(path) if path.is_dir() else None
    if record is None:
        return [Entry(path, name, "unknown", size, "no record of what wrote it", "unknown")]
    if "gguf_sha256" in record and "model" in record:
        model = str(record["model"])
        about = (f"model {model} ({record.get('display_name', '?')}), GGUF sha256 "
                 f"{str(record['gguf_sha256'])[:16]}..., conversion v{record.get('conversion_version', '?')}")
        own = f"{model}-{str(record['gguf_sha256'])[:16]}-v{record.get('conversion_version')}"
        if name != own:
            return [Entry(path, name, "unknown", size, f"a copy of {about} under another name than the {own} this "
                          "code writes", "unknown")]
        src = use.known.get(model)
        why = ("" if name in use.models else
               f"{model} is not in the registry" if src is None else
               f"conversion v{record.get('conversion_version')}, this code writes v{CONVERSION_VERSION}"
               if record.get("conversion_version") != CONVERSION_VERSION else
               f"GGUF sha256 is not the registry's ({src.sha256[:16]}...)" if record["gguf_sha256"] != src.sha256
               else "damaged (a file it records is missing or at another size): would be converted again")
        return [Entry(path, name, "model", size, about, "stale" if why else "current", why, [model, name])]
    if "tokenizer_fingerprint" in record:
        group = str(record.get("group", "?"))
        about = (f"tokenizer of group {group}, fingerprint {str(record['tokenizer_fingerprint'])[:16]}..., "
                 f"v{record.get('tokenizer_version', '?')}")
        own = f"tokenizer-{group}-{str(record['tokenizer_fingerprint'])[:16]}-v{record.get('tokenizer_version')}"
        if name != own:
            return [Entry(path, name, "unknown", size, f"a copy of a {about} under another name than the {own} this "
                          "code writes", "unknown")]
        why = "" if name in use.tokenizers else (
            f"tokenizer v{record.get('tokenizer_version')}, this code writes v{TOKENIZER_VERSION}"
            if record.get("tokenizer_version") != TOKENIZER_VERSION else "no current model's record names it")
        group_models = [m for m, s in use.known.items() if s.group == group]
        return [Entry(path, name, "tokenizer", size, about, "stale" if why else "current", why, [name, *group_models])]
    if "drafter_files_sha256" in record:
        weights = str((record.get("drafter_files_sha256") or {}).get("model.safetensors", "?"))
        about = f"drafter, weights sha256 {weights[:16]}..., for target {record.get('target', '?')}"
        if not re.fullmatch(rf".+-[0-9a-f]{{16}}-{re.escape(str(record.get('target')))}", name):
            return [Entry(path, name, "unknown", size, f"a copy of a {about} under another name than this code "
                          "writes", "unknown")]
        why = "" if name == use.drafter else (
            "no drafter is committed" if use.drafter is None else
            f"an old drafter build (the one in use: {use.drafter})")
        return [Entry(path, name, "drafter", size, about, "stale" if why else "current", why, [name])]
    return [Entry(path, name, "unknown", size, "a record of no kind this code writes", "unknown")]


def _locks_of(folder_name: str) -> list[str]:
    """The locks the writer of the folder ``folder_name`` may hold: its own, and a model conversion's."""
    model = _MODEL_FOLDER.match(folder_name)
    return [folder_name] + ([model.group("model")] if model else [])


def _downloads(folder: Path, known: dict) -> list[Entry]:
    """The files left in ``downloads/``: a conversion deletes its GGUF once converted, or failed. Only the names a
    download of a registry model writes are downloads; anything else there is unknown (never deleted)."""
    by_file = {src.file: name for name, src in known.items()}
    out = []
    for path in sorted(folder.iterdir()):
        name = f"downloads/{path.name}"
        if path.is_symlink():
            out.append(Entry(path, name, "unknown", disk_size(path), "a symbolic link (never followed)", "unknown"))
            continue
        partial = _PARTIAL.match(path.name)
        work = _DOWNLOAD_WORK.match(path.name)
        model = (work.group("model") if work and work.group("model") in known and path.is_dir() else
                 by_file.get(partial.group("of")) if partial and path.is_file() else
                 by_file.get(path.name) if path.is_file() else None)
        if model is None:
            out.append(Entry(path, name, "unknown", disk_size(path), "not a download of a registry model", "unknown"))
            continue
        # a download belongs to a running conversion while its model's lock is held
        out.append(Entry(path, name, "download", disk_size(path), f"a download of {model}", "stale",
                         "a leftover download", [model]))
    return out


@contextlib.contextmanager
def holding(root: Path, names: list[str]) -> Iterator[str | None]:
    """Take, without waiting, the locks ``.<name>.lock`` of ``root`` that exist; yield the first one another
    process holds (then none is kept), else None while holding them all.

    A lock file that does not exist is held by nobody: every writer creates its lock before the
    folders it guards, so a stale entry's missing lock file needs no creating.
    """
    import fcntl

    with contextlib.ExitStack() as stack:
        for name in dict.fromkeys(names):
            path = root / f".{name}.lock"
            if not path.is_file() or path.is_symlink():
                continue
            handle = stack.enter_context(open(path, "a"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    yield path.name
                    return
                raise
            stack.callback(fcntl.flock, handle, fcntl.LOCK_UN)
        yield None


def _inside(root: Path, path: Path) -> bool:
    """Whether ``path`` is an entry of ``root`` or of a real (not linked) ``root/downloads``, and no link itself:
    what may be deleted."""
    parents = {root.resolve()} | ({(root / "downloads").resolve()} if not (root / "downloads").is_symlink() else set())
    return not path.is_symlink() and path.parent.resolve() in parents


def prune(root: Path, entries: list[Entry], *, dry_run: bool, out: TextIO | None = None) -> tuple[int, int]:
    """Delete the stale ``entries`` (printing each first, on ``out``: stdout by default); their count and bytes.
    Never a current or unknown one: each unknown one is named as left alone."""
    out = out or sys.stdout
    count = freed = 0
    for e in entries:
        if e.status == "unknown" and not dry_run:
            print(f"left alone {e.name}: not written by the companion ({e.about})", file=out)
        if e.status != "stale" or not _inside(root, e.path):
            continue
        if dry_run:
            print(f"would delete {e.name} ({human_size(e.size)}): {e.why}", file=out)
            count, freed = count + 1, freed + e.size
            continue
        with holding(root, e.locks) as busy:
            if busy is not None:
                print(f"skipped {e.name}: its lock {busy} is held by another process", file=out)
                continue
            if not e.path.exists():  # removed meanwhile (a conversion cleaning up its own leftovers)
                continue
            if e.kind in ("model", "tokenizer", "drafter"):  # a conversion may have finished since the survey
                now = classify(e.path, in_use(root))
                if not now or now[0].status != "stale":
                    print(f"kept {e.name}: it is in use now", file=out)
                    continue
                foreign = foreign_files(e.path) if e.path.is_dir() else []
                if foreign:  # someone else's files (a harvest written into it): never deleted along
                    print(f"kept {e.name}: it holds {len(foreign)} file(s) the companion did not write (first: "
                          f"{foreign[0]}): move them out of the cache, then prune again", file=out)
                    continue
            print(f"deleting {e.name} ({human_size(e.size)}): {e.why}", file=out, flush=True)
            if e.path.is_dir():
                shutil.rmtree(e.path)
            else:
                e.path.unlink()
        count, freed = count + 1, freed + e.size
    return count, freed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache", help="list the weights cache's folders (sizes, what wrote them, which are in use); prune stale ones",
        description="List what the weights cache ($COMPANION_CACHE, default ~/.cache/companion) holds: each "
                    "converted model, tokenizer and drafter folder with its size and what wrote it, leftovers of "
                    "interrupted writes, and anything unknown; 'current' marks what the code would use now. "
                    "--prune deletes the stale ones (old conversions, other GGUF files, old drafter builds, "
                    "leftovers), printing each first; never a current or unknown one, and never one whose lock "
                    "another process holds.")
    p.add_argument("--prune", action="store_true", help="delete the stale entries")
    p.add_argument("--dry-run", action="store_true", help="with --prune: print what would be deleted, delete nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``companion cache [--prune [--dry-run]]``: 0 when done, 2 with one line on stderr otherwise."""
    from companion.models.weights.convert import cache_root, cache_root_problem

    root = cache_root()
    try:
        if args.dry_run and not args.prune:
            raise WeightsUnavailableError("--dry-run shows what --prune would delete: pass both")
        if not root.exists() and not root.is_symlink():
            print(f"cache: {root} does not exist (nothing cached yet)")
            return 0
        if (problem := cache_root_problem(root)) is not None:
            raise WeightsUnavailableError(problem)
        entries = survey(root)
        total = sum(e.size for e in entries)
        stale = [e for e in entries if e.status == "stale"]
        print(f"cache: {root}: {human_size(total)} in {len(entries)} entries, "
              f"{human_size(sum(e.size for e in stale))} of it in {len(stale)} stale")
        for e in entries:
            why = f" [{e.why}]" if e.why else ""
            print(f"{e.status:<8} {human_size(e.size):>8}  {e.name}  {e.about}{why}")
        if args.prune:
            count, freed = prune(root, entries, dry_run=args.dry_run)
            verb = "would delete" if args.dry_run else "deleted"
            print(f"cache: {verb} {count} entr{'y' if count == 1 else 'ies'}, {human_size(freed)}")
    except OSError as err:  # WeightsUnavailableError is one
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); an entry being deleted may be half deleted: run `companion cache --prune` "
              "again to finish", file=sys.stderr)
        return 130
    return 0
