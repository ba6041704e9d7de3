"""One forward over a whole tree, and the caches compacted to the kept path.

:func:`tree_forward` feeds plain context tokens and tree nodes in one forward with the tree's 4D
attention mask and per-node position ids (:func:`~companion.speculative.tree.tree_attention`)
over a ``DynamicCache``. transformers 4.57 passes a 4D mask through unchanged
(``masking_utils._preprocess_mask_arguments`` returns it as given) to the eager and SDPA
attention kernels, which add it to the scores; flash attention ignores custom masks, so such a
model is refused (:func:`check_tree_support`, which also probes the model once: a node must see
only its ancestors).

Compaction (:func:`keep_slots`): after a round the cache holds the context and every node fed.
The kept path's nodes are *re-gathered* (their key and value rows selected along the sequence
axis, the rest dropped) rather than the cache cropped to the context and the kept tokens re-run:
a node's keys and values depend only on its ancestors and its position, exactly as in a causal
forward of its path, so the gathered rows are the ones that forward would have written (up to
the reassociation of a wider matrix product), and gathering costs a copy of the cache's tail
instead of a forward of ``depth`` tokens for each model every round.
"""
from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from companion.speculative.tree.shape import DraftTree, tree_attention

_SUPPORTED: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def _model_dtype(model: Any) -> torch.dtype:
    return getattr(model, "dtype", None) or next(model.parameters()).dtype


def tree_forward(model: Any, cache: DynamicCache, tree: DraftTree, chain: Sequence[int], nodes: Sequence[int],
                 cached_nodes: Sequence[int], past: int, keep: int) -> Tensor:
    """Logits (float32) of the last ``keep`` fed positions of one forward over ``chain`` context tokens then the
    tree nodes ``nodes``, over ``cache`` (``past`` context tokens, then ``cached_nodes``); see
    :func:`~companion.speculative.tree.tree_attention`."""
    mask, pos = tree_attention(tree, past, len(chain), nodes, cached_nodes, _model_dtype(model), model.device)
    ids = torch.tensor([list(chain) + [tree.tokens[i] for i in nodes]], dtype=torch.long, device=model.device)
    kwargs: dict[str, Any] = {"past_key_values": cache, "use_cache": True, "attention_mask": mask,
                              "position_ids": pos}
    if getattr(model, "_supports_logits_to_keep", lambda: False)():
        kwargs["logits_to_keep"] = keep
    out = model(input_ids=ids, **kwargs)
    return out.logits[0, -keep:].float()


def keep_slots(cache: DynamicCache, slots: Sequence[int] | Tensor) -> None:
    """Keep only the cache positions ``slots`` (increasing), in every layer, dropping the rest.

    When ``slots`` is ``0 .. k - 1`` this is ``cache.crop(k)``; otherwise each layer's keys and values are
    re-gathered along the sequence axis.
    """
    idx = torch.as_tensor(slots, dtype=torch.long)
    k = len(idx)
    if k == 0 or bool((idx == torch.arange(k)).all()):
        cache.crop(k)
        return
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is None or keys.numel() == 0:
            continue
        where = idx.to(keys.device)
        layer.keys = keys.index_select(-2, where)
        layer.values = layer.values.index_select(-2, where)


def check_tree_support(model: Any, what: str) -> None:
    """Refuse, in one line, a model whose forward cannot verify a tree: no ``attention_mask``/``position_ids``
    arguments, a flash-attention kernel (it ignores custom masks), a cache layer other than transformers' plain
    ``DynamicLayer`` (sliding windows), or a probe that fails: one forward of two tokens where the second may not
    see the first must give the second the logits it gets alone. The probe runs once per model object."""
    if model in _SUPPORTED:
        return
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    missing = [p for p in ("attention_mask", "position_ids", "past_key_values") if p not in params]
    name = type(model).__name__
    if missing:
        raise ValueError(f"{what} ({name}) takes no {', '.join(missing)}: it cannot verify a tree of drafts; "
                         "use a chain policy (companion.speculative.generate) or pass fallback='constant:K'")
    impl = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
    if impl.startswith("flash") or impl.startswith("paged"):
        raise ValueError(f"{what} ({name}) uses the {impl!r} attention kernel, which ignores a custom 4D mask; "
                         "load it with attn_implementation='sdpa' or 'eager' (or pass fallback='constant:K')")
    if getattr(getattr(model, "config", None), "sliding_window", None) and \
            getattr(model.config, "use_sliding_window", True) and impl:
        layer_types = getattr(model.config, "layer_types", None) or ()
        if any(t != "full_attention" for t in layer_types):
            raise ValueError(f"{what} ({name}) has sliding-window attention layers; tree verification keeps a plain "
                             "DynamicCache and supports full attention only (pass fallback='constant:K')")
    _probe(model, what)
    _SUPPORTED[model] = impl


def _probe(model: Any, what: str) -> None:
    tree = DraftTree()
    tree.add(-1, 1, 1, 0.0)
    tree.add(-1, 2, 2, 0.0)   # a sibling: must not see node 0
    with torch.inference_mode():
        both = tree_forward(model, DynamicCache(), tree, [0], [0, 1], [], 0, 2)[1]
        alone = model(input_ids=torch.tensor([[0, 2]], device=model.device)).logits[0, -1].float()
        leaked = model(input_ids=torch.tensor([[0, 1, 2]], device=model.device)).logits[0, -1].float()
    err = float((both - alone).abs().max())
    ref = float((leaked - alone).abs().max())
    if not err <= max(1e-3 * float(alone.abs().max()), 0.25 * ref):
        raise ValueError(f"{what} ({type(model).__name__}) ignores the 4D tree attention mask (a probe node saw its "
                         f"sibling: logits off by {err:.3g}); use a chain policy or pass fallback='constant:K'")
