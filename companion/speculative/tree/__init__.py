"""Draft trees at decode time: a tree of drafts verified in one target forward with a tree attention mask.

:func:`generate_tree` decodes with a tree policy (``TREE_FORMS``: ``static``, ``spine``, ``dynamic``,
``certified``); :mod:`.shape` holds the tree and its mask, :mod:`.verify` the one-forward verification and the
cache compaction, :mod:`.model` the expected accepted length and cost model of a tree, the oracle and the
replay of tree rounds from recorded ranks.
"""
from companion.speculative.tree.decoder import TreeResult, bf16_parting, generate_tree
from companion.speculative.tree.policies import (
    TREE_FORMS,
    Certified,
    Dynamic,
    Expansion,
    Static,
    TreeOutcome,
    TreePolicy,
    is_tree_spec,
    parse_tree_policy,
)
from companion.speculative.tree.shape import DraftTree, tree_attention
from companion.speculative.tree.verify import check_tree_support, keep_slots, tree_forward

__all__ = [
    "TREE_FORMS",
    "Certified",
    "DraftTree",
    "Dynamic",
    "Expansion",
    "Static",
    "TreeOutcome",
    "TreePolicy",
    "TreeResult",
    "bf16_parting",
    "check_tree_support",
    "generate_tree",
    "is_tree_spec",
    "keep_slots",
    "parse_tree_policy",
    "tree_attention",
    "tree_forward",
]
