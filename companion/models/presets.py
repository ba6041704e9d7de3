"""The presets: named pairs of models and how a harvest of each runs, one registry for loading and harvesting.

The presets are data, ``companion/assets/presets.json``, read and checked here. ``load_pair(NAME)``
(:func:`companion.models.loading.load_pair`) makes and loads a preset's pair, and ``companion harvest
--preset NAME`` (:mod:`companion.harvest.plan`) plans the same pair on the preset's prompts.

======================== ============================ ============================ ===============================
preset                   target                       drafter                      prompts
======================== ============================ ============================ ===============================
``qwen2.5-coder``        Qwen2.5-Coder-1.5B-Instruct  Qwen2.5-Coder-0.5B-Instruct  the project's chat requests
``qwen2.5-coder-0.5b``   Qwen2.5-Coder-0.5B-Instruct  none                         the project's chat requests
``smollm2``              SmolLM2-135M-Instruct        distilled here               the project's chat requests
``closed-world``         embedded target              embedded drafter             the embedded held-out prompt set
``paper-qwen3-1.7b``     Qwen/Qwen3-1.7B              Qwen/Qwen3-0.6B              500 UltraChat-200k prompts
``paper-qwen3-4b``       Qwen/Qwen3-4B                Qwen/Qwen3-0.6B              the same 500 prompts
======================== ============================ ============================ ===============================

``default`` is the former name of ``closed-world`` and still means it. ``qwen2.5-coder`` is the
book's main pair on a CPU: Qwen's own Q4_K_M GGUF files of Qwen2.5-Coder-1.5B-Instruct and
0.5B-Instruct (Apache-2.0), dequantised to bfloat16 (float32 on a CPU without bf16), from the
package index (:mod:`companion.models.weights.convert`); their vocabulary (151,936) is the size of
Qwen3's. ``qwen2.5-coder-0.5b`` is the 0.5B as a target on its own, and ``smollm2`` the small model
with the drafter this project distilled for it (the weights, likewise, from the package index).
Their prompts are written for this project in the paper's shape (chat requests of many kinds, at
least 64 tokens with the chat template; :mod:`companion.prompts.chat_requests`), taken in turn
with coding requests quoting the standard library (:mod:`companion.prompts.stdlib_requests`).
The paper presets sample UltraChat-200k as :mod:`companion.prompts.ultrachat` says.

All of them decode 128 greedy steps per prompt and compute the paper's criteria
(:data:`companion.certify.criteria.PAPER_CRITERIA`) and trees ``m = 1, 2, 4, 8``. The paper ran no
drafter; Qwen3-0.6B is this companion's extension (``--no-drafter`` reproduces the paper's
target-only setting exactly). A prompt's trace ends at its first EOS (``<|im_end|>`` or
``<|endoftext|>``, from the model's generation config), which is how "128 steps each" can total
"about 63k" for 500 prompts rather than 64,000 (``--no-stop-at-eos`` decodes past it). On CUDA
the models run in bfloat16, their native dtype; the statistics are float64 from the logits (see
:mod:`companion.harvest.stats`).

A part's source (:class:`Source`) is one of

* ``{"pretrained": ID}``: a hub id or a local folder, given to ``from_pretrained`` as it is;
* ``{"asset": PATH}``: a folder shipped in ``companion/assets`` (the closed-world pair);
* ``{"package_index": MODEL}``: a model of the package-index registry
  (:mod:`companion.models.weights.registry`), fetched and converted once, on first use;
* ``{"distilled": PATH}``: the drafter this project distilled, committed in ``companion/assets``
  without the embedding it shares with its target, put together with the converted target on first use.

:func:`register_preset` adds a preset of local folders or hub ids for this process.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from companion.certify.criteria import PAPER_CRITERIA

#: The folder that ``asset`` and ``distilled`` sources name their folders in.
ASSETS_DIR: Path = Path(__file__).resolve().parents[1] / "assets"
#: The registry: ``companion/assets/presets.json``.
REGISTRY_FILE: Path = ASSETS_DIR / "presets.json"
SOURCE_KINDS: tuple[str, ...] = ("pretrained", "asset", "package_index", "distilled")
#: What a chapter runs on when its preset's models are not in the cache (a quick setup skipped them).
FALLBACK_PRESET = "smollm2"


@dataclass(frozen=True)
class Source:
    """Where one part of a pair comes from: ``kind`` (one of :data:`SOURCE_KINDS`) and its ``name``."""

    kind: str
    name: str

    @property
    def folder(self) -> Path | None:
        """The committed folder of an ``asset`` or ``distilled`` source (None for the other kinds)."""
        return ASSETS_DIR / self.name if self.kind in ("asset", "distilled") else None


@dataclass(frozen=True)
class Preset:
    """A named pair of models and the parameters of a harvest of it.

    ``target``, ``drafter`` and ``tokenizer`` are what a harvest hands to ``load_pair``: the hub id
    or folder of a ``pretrained`` part, else this preset's own name, which ``load_pair`` resolves
    (``drafter`` None: the preset has no drafter; ``tokenizer`` None: the pair's own).
    """

    name: str
    description: str
    target_source: Source
    drafter_source: Source | None = None
    tokenizer_source: Source | None = None
    prompts: str = "default"  # a companion prompt set name, or "ultrachat"
    n_prompts: int | None = None  # None: the whole prompt set
    min_prompt_tokens: int = 0
    n_steps: int = 128
    criteria: tuple[str, ...] = PAPER_CRITERIA
    tree_widths: tuple[int, ...] = (1, 2, 4, 8)
    seed: int = 0
    enable_thinking: bool = False

    @property
    def target(self) -> str:
        """The target's model name (its Hugging Face id, or the preset's name for a built model)."""
        return self.target_source.name if self.target_source.kind == "pretrained" else self.name

    @property
    def drafter(self) -> str | None:
        """The drafter's model name (as for the target), or None for a target alone."""
        if self.drafter_source is None:
            return None
        return self.drafter_source.name if self.drafter_source.kind == "pretrained" else self.name

    @property
    def tokenizer(self) -> str | None:
        """The Hugging Face id of the tokenizer, or None when it comes with the model."""
        source = self.tokenizer_source
        return source.name if source is not None and source.kind == "pretrained" else None

    @property
    def embedded(self) -> bool:
        """Whether the pair is the one committed in ``companion/assets`` (the closed world)."""
        return self.target_source.kind == "asset"

    @property
    def registry_models(self) -> tuple[str, ...]:
        """The package-index models the pair is made from (target first)."""
        return tuple(s.name for s in (self.target_source, self.drafter_source)
                     if s is not None and s.kind == "package_index")


_HARVEST_FIELDS: dict[str, tuple[type, ...]] = {
    "prompts": (str,), "n_prompts": (int, type(None)), "min_prompt_tokens": (int,), "n_steps": (int,),
    "criteria": (list,), "tree_widths": (list,), "seed": (int,), "enable_thinking": (bool,),
}
_PART_FIELDS = ("target", "drafter", "tokenizer")


def _source(value: Any, where: str) -> Source | None:
    if value is None:
        return None
    if not (isinstance(value, dict) and len(value) == 1):
        raise ValueError(f"{where}: expected null or one of {{{', '.join(SOURCE_KINDS)}: NAME}}, got {value!r}")
    (kind, name), = value.items()
    if kind not in SOURCE_KINDS or not isinstance(name, str) or not name:
        raise ValueError(f"{where}: expected one of {', '.join(SOURCE_KINDS)} with a non-empty name, got {value!r}")
    return Source(kind, name)


def parse_presets(data: Any, where: str = "the presets") -> dict[str, Preset]:
    """The presets of a registry document (see the module docstring), aliases after their preset;
    ``ValueError`` naming the first fault."""
    if not isinstance(data, dict) or not isinstance(data.get("presets"), dict) or not data["presets"]:
        raise ValueError(f"{where} has no 'presets' object")
    out: dict[str, Preset] = {}
    for name, entry in data["presets"].items():
        at = f"{where}: preset {name!r}"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} is not an object")
        unknown = set(entry) - {"description", "aliases", *_PART_FIELDS, *_HARVEST_FIELDS}
        if unknown:
            raise ValueError(f"{at}: unknown fields {', '.join(sorted(unknown))}")
        if not isinstance(entry.get("description"), str) or "target" not in entry:
            raise ValueError(f"{at} needs a description and a target")
        fields: dict[str, Any] = {}
        for key, types in _HARVEST_FIELDS.items():
            if key in entry:
                if not isinstance(entry[key], types) or isinstance(entry[key], bool) != (bool in types):
                    raise ValueError(f"{at}: {key} is {entry[key]!r}")
                fields[key] = tuple(entry[key]) if isinstance(entry[key], list) else entry[key]
        target = _source(entry["target"], f"{at}: target")
        if target is None or target.kind == "distilled":
            raise ValueError(f"{at}: the target must be a pretrained, asset or package_index model")
        preset = Preset(name, entry["description"], target, _source(entry.get("drafter"), f"{at}: drafter"),
                        _source(entry.get("tokenizer"), f"{at}: tokenizer"), **fields)
        aliases = entry.get("aliases", {})
        if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
            raise ValueError(f"{at}: aliases must map names to descriptions")
        for key in (name, *aliases):
            if key in out:
                raise ValueError(f"{where}: the name {key!r} is given twice")
        out[name] = preset
        out.update({alias: replace(preset, name=alias, description=text) for alias, text in aliases.items()})
    return out


def _read(path: Path) -> dict[str, Preset]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RuntimeError(f"cannot read the presets, {path} ({type(err).__name__}: {err}); "
                           "restore it from the repository") from None
    return parse_presets(data, str(path))


#: Every preset by name: the registry's, then any :func:`register_preset` added.
PRESETS: dict[str, Preset] = _read(REGISTRY_FILE)
BUILT_IN: frozenset[str] = frozenset(PRESETS)


def preset_names() -> list[str]:
    """Names accepted by ``load_pair`` and ``companion harvest --preset``."""
    return sorted(PRESETS)


def get_preset(name: str) -> Preset:
    """The harvest preset named ``name``; a ValueError naming the known ones otherwise."""
    if name not in PRESETS:
        raise ValueError(f"unknown harvest preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def register_preset(name: str, target: str, drafter: str | None = None, tokenizer: str | None = None) -> None:
    """Make ``load_pair(name)`` load the given parts (hub ids or local folders), in this process.

    A built-in name cannot be registered; re-registering a name with a different spec is an error.
    """
    preset = Preset(name, "registered by register_preset", Source("pretrained", target),
                    Source("pretrained", drafter) if drafter else None,
                    Source("pretrained", tokenizer) if tokenizer else None)
    if name in BUILT_IN:
        raise ValueError(f"preset {name!r} is built in and cannot be registered again")
    if name in PRESETS and PRESETS[name] != preset:
        raise ValueError(f"preset {name!r} already registered as {PRESETS[name]}")
    PRESETS[name] = preset


def preset_or_fallback(name: str, say: Callable[[str], None] = print) -> str:
    """``name``, or :data:`FALLBACK_PRESET` when ``name``'s package-index models are not converted here.

    Nothing is fetched: a setup run with ``COMPANION_SKIP_QWEN=1`` left the Qwen pair out, and the
    chapters then run on SmolLM2 after one line (to ``say``) that names the command that fetches it.
    Other presets (hub ids, the closed world) and names that are no preset are returned as they are.
    """
    from companion.models.weights import converted_dir, source
    from companion.models.weights.convert import cache_is_current

    models = PRESETS[name].registry_models if name in PRESETS else ()
    # converted at all (sizes): a damaged folder is converted again when it is loaded (ensure_converted)
    missing = [m for m in models if not cache_is_current(converted_dir(source(m)), source(m), check_bytes=False)]
    if not missing or name == FALLBACK_PRESET:
        return name
    say(f"note: the preset {name!r} needs {', '.join(missing)}, not converted on this machine (a setup with "
        f"COMPANION_SKIP_QWEN=1 skips them): `companion fetch-weights` fetches them (about 3 minutes); this run uses "
        f"the preset {FALLBACK_PRESET!r} instead")
    return FALLBACK_PRESET


def check_default_assets(parts: Iterable[str] = ("target", "drafter", "prompts")) -> None:
    """Raise ``FileNotFoundError`` with instructions when a part of the embedded pair is not in this checkout."""
    from companion.models.tiny_pair import ASSET_DIR

    files = {"target": ASSET_DIR / "target" / "config.json", "drafter": ASSET_DIR / "drafter" / "config.json",
             "tokenizer": ASSET_DIR / "tokenizer", "prompts": ASSET_DIR / "prompts.jsonl"}
    wanted = list(parts)
    if "target" in wanted:
        wanted.append("tokenizer")
    missing = [str(files[p]) for p in wanted if not files[p].exists()]
    if missing:
        raise FileNotFoundError(
            "the 'closed-world' preset needs the embedded pair, which is not in this checkout "
            f"(missing: {', '.join(missing)}). Restore it from the repository (`git checkout -- {ASSET_DIR}`), "
            "or give the models and prompts yourself: --target DIR --drafter DIR --prompts FILE.jsonl")
