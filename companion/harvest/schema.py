"""The trace schema: one row per decoding step, one column per (statistic, criterion or width).

Everything about the columns lives in :data:`SCHEMA`; the Arrow schema of a harvest
(:func:`arrow_schema`), the list of concrete column names (:func:`column_names`) and the
page-ready Markdown table (:func:`schema_markdown`) are all generated from it, so the
documentation cannot drift from the files.

Notation: at step ``t`` of prompt ``i`` the target's next-token distribution is ``p`` (softmax of
its logits, ``V`` tokens), the drafter's is ``q``; ``p(1) >= p(2) >= ...`` are ``p`` sorted;
``g`` is the target's greedy token and ``d`` the drafter's. Both are *id-based* argmaxes
(``torch.argmax``: the lowest id among exact ties), as every greedy decoder implements them.
A criterion ``c`` accepts a token ``y`` iff ``p_y >= tau_c(p)`` (``>`` for typical acceptance);
``rho*_c`` is its exact certificate (``companion.certify.certificates``).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

Per = Literal["step", "criterion", "width"]


@dataclass(frozen=True)
class Column:
    """One column template.

    ``name`` contains ``{spec}`` (one column per criterion spec) or ``{m}`` (one per tree width)
    when ``per`` says so; ``type`` is an Arrow type name (``list<...>`` columns hold ``top_k``
    entries); ``drafter`` marks columns present only when a drafter is run.
    """

    name: str
    type: str
    per: Per
    drafter: bool
    meaning: str


SCHEMA: tuple[Column, ...] = (
    Column("prompt_id", "string", "step", False, "Identifier of the prompt (from the prompt set)."),
    Column("prompt_index", "int32", "step", False, "0-based position of the prompt in the prompt set as given."),
    Column("prompt_tokens", "int32", "step", False, "Number of tokens of the prompt (no padding)."),
    Column("step", "int32", "step", False,
           "0-based decoding step: the row describes the distributions of the (step+1)-th generated token."),
    Column("token", "int32", "step", False,
           "g: the target's greedy token, an id-based argmax of its logits (lowest id among exact ties); "
           "the token appended to the sequence."),
    Column("p_top1", "float64", "step", False, "p(1): the target's top-1 probability."),
    Column("margin", "float64", "step", False, "p(1) - p(2): the target's top-2 margin (0 on exact ties)."),
    Column("entropy", "float64", "step", False, "H(p) = -sum p log p of the target, in nats."),
    Column("top10_mass", "float64", "step", False, "p(1) + ... + p(10): the target's top-10 mass."),
    Column("top2_tie", "bool", "step", False,
           "The target's two largest logits are exactly equal (bf16 produces such ties); g is then "
           "decided by token id alone. Counted in the manifest."),
    Column("logit_top1", "float64", "step", False,
           "z(1): the target's largest logit, as the model computed it (in its dtype); the scale of its rounding."),
    Column("logit_gap", "float64", "step", False,
           "z(1) - z(2): the gap between the target's two largest logits (0 on exact ties). A gap within "
           "companion.harvest.ties.tie_band(z(1)) can flip between the kernel paths of one decoder (a near tie)."),
    Column("top_probs", "list<float64>", "step", False,
           "p(1), ..., p(k): the target's top-k probabilities (k = top_k, default 64), decreasing."),
    Column("top_ids", "list<int32>", "step", False,
           "Token ids of top_probs (the order among exactly tied probabilities is unspecified)."),
    Column("top_tail", "float64", "step", False,
           "The target's mass beyond top_probs, summed on its own rather than as 1 - sum(top_probs), so that "
           "certificates recomputed from the stored top-k keep their digits (reverse ones above ~30 nats)."),
    Column("cert_fwd[{spec}]", "float64", "criterion", False,
           "rho*_c(p) for D = KL(p||q): any drafter with KL(p||q) below it has its greedy draft accepted "
           "by criterion c, whatever the tie-breaks (worst case: 0 for greedy on a top2_tie step); +inf when c "
           "rejects nothing."),
    Column("cert_rev[{spec}]", "float64", "criterion", False, "rho*_c(p) for D = KL(q||p) (reverse)."),
    Column("path_cert_fwd[{spec}]", "float64", "criterion", False,
           "rho*_c(p) under kernel paths: as cert_fwd[c], with two logits whose gap is within "
           "companion.harvest.ties.tie_band(z(1)) of the model's dtype counted as tied (0 for greedy on a near "
           "tie; thresholds that compare two probabilities move by that factor). Never above cert_fwd[c]: a draft "
           "it certifies is accepted whichever kernel path (decode step, verification forward, batch) verifies it, "
           "as far as the band covers the paths' differences."),
    Column("path_cert_rev[{spec}]", "float64", "criterion", False, "The same for D = KL(q||p)."),
    Column("tree_cert_fwd[{m}]", "float64", "width", False,
           "Exact certificate, in KL(p||q), that g is among the drafter's top-m (greedy tree of width m)."),
    Column("tree_cert_rev[{m}]", "float64", "width", False, "The same in KL(q||p)."),
    Column("path_tree_cert_fwd[{m}]", "float64", "width", False,
           "tree_cert_fwd[m] under kernel paths: the decoder's token may be any token whose logit is within "
           "companion.harvest.ties.tie_band(z(1)) of the largest, and the drafter's top-m must hold every one "
           "(0 when more than m are). Never above tree_cert_fwd[m]."),
    Column("path_tree_cert_rev[{m}]", "float64", "width", False, "The same in KL(q||p)."),
    Column("kl_fwd", "float64", "step", True, "KL(p||q) in nats (float64 from the full logits)."),
    Column("kl_rev", "float64", "step", True, "KL(q||p) in nats."),
    Column("tv", "float64", "step", True,
           "TV(p, q) = sum |p - q| / 2; speculative sampling accepts a draft x ~ q with probability 1 - TV."),
    Column("draft_token", "int32", "step", True, "d: the drafter's greedy token (id-based argmax of its logits)."),
    Column("draft_p", "float64", "step", True, "p_d: the target's probability of the drafter's token."),
    Column("draft_logit_top1", "float64", "step", True, "The drafter's largest logit, as the model computed it."),
    Column("draft_logit_gap", "float64", "step", True,
           "The gap between the drafter's two largest logits (0 on exact ties): its near ties, as logit_gap's."),
    Column("draft_rank", "int32", "step", True,
           "Rank of d under the target, 1-based, exact ties to the lowest id (first index wins, as argmax): "
           "1 + #{z : p_z > p_d} + #{z < d : p_z == p_d}."),
    Column("token_rank_in_draft", "int32", "step", True,
           "Rank of the target's greedy token g (column token) under the drafter, exact ties to the lowest id: "
           "1 + #{z : q_z > q_g} + #{z < g : q_z == q_g}."),
    Column("accepted[{spec}]", "bool", "criterion", True,
           "A decoder accepts the drafter's token d under criterion c: p_d >= tau_c(p) (> for typical) and, for the "
           "rank conditions, ties by token id as argmax: greedy iff draft_token == token, topm:M iff draft_rank <= M, "
           "topk-delta:K,D iff draft_rank <= K too."),
    Column("certified_fwd[{spec}]", "bool", "criterion", True,
           "KL(p||q) < cert_fwd[c] (KL with its rounding bound): acceptance of d is certified. Soundness: "
           "certified implies accepted."),
    Column("certified_rev[{spec}]", "bool", "criterion", True, "KL(q||p) < cert_rev[c]."),
    Column("path_certified_fwd[{spec}]", "bool", "criterion", True,
           "KL(p||q) < path_cert_fwd[c]: certified under kernel paths."),
    Column("path_certified_rev[{spec}]", "bool", "criterion", True, "KL(q||p) < path_cert_rev[c]."),
    Column("covered[{m}]", "bool", "width", True,
           "The target's greedy token g (column token) is among the drafter's top-m, exact ties to the lowest id: "
           "token_rank_in_draft <= m (tree_cert_*[m] certifies it for every tie-break)."),
    Column("tree_certified_fwd[{m}]", "bool", "width", True,
           "KL(p||q) < tree_cert_fwd[m]. Soundness: tree-certified implies covered."),
    Column("tree_certified_rev[{m}]", "bool", "width", True, "KL(q||p) < tree_cert_rev[m]."),
    Column("path_tree_certified_fwd[{m}]", "bool", "width", True,
           "KL(p||q) < path_tree_cert_fwd[m]: tree-certified under kernel paths."),
    Column("path_tree_certified_rev[{m}]", "bool", "width", True, "KL(q||p) < path_tree_cert_rev[m]."),
)
"""Every column of a trace, in file order. Expand with :func:`column_names` / :func:`arrow_schema`."""

_TYPES = {
    "string": pa.string(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}


def _arrow_type(type_name: str, top_k: int) -> pa.DataType:
    if type_name.startswith("list<"):
        inner = _TYPES[type_name[5:-1]]
        return pa.list_(inner, top_k)  # fixed-size list: every row holds exactly top_k entries
    return _TYPES[type_name]


def expand(column: Column, criteria: Sequence[str], widths: Sequence[int]) -> list[str]:
    """Concrete names of one template: one per criterion spec or tree width, or the name itself."""
    if column.per == "criterion":
        return [column.name.format(spec=s) for s in criteria]
    if column.per == "width":
        return [column.name.format(m=m) for m in widths]
    return [column.name]


def short_divergence(divergence: str) -> str:
    """``"fwd"`` or ``"rev"``, the suffix of the column names of a divergence."""
    if divergence in ("forward", "fwd"):
        return "fwd"
    if divergence in ("reverse", "rev"):
        return "rev"
    raise ValueError(f"divergence must be 'forward' or 'reverse', got {divergence!r}")


def column(kind: str, key: str | int, divergence: str | None = None) -> str:
    """The name of a per-criterion or per-width column, formatted from its template in :data:`SCHEMA`.

    ``kind`` is the template's stem (``"cert"``, ``"tree_cert"``, ``"accepted"``, ``"certified"``,
    ``"covered"``, ``"tree_certified"``), ``key`` a criterion spec or a tree width, and
    ``divergence`` (``"forward"``/``"reverse"``) is required for the stems that come in both:
    ``column("cert", "greedy", "forward") == "cert_fwd[greedy]"``.
    """
    stem = kind if divergence is None else f"{kind}_{short_divergence(divergence)}"
    template = _TEMPLATES.get(stem)
    if template is None:
        known = sorted({t.split("[")[0].removesuffix("_fwd").removesuffix("_rev") for t in _TEMPLATES})
        raise ValueError(f"no column template {stem!r} (kinds: {', '.join(known)}; cert, tree_cert, "
                         "certified and tree_certified need a divergence)")
    return template.name.format(spec=key) if template.per == "criterion" else template.name.format(m=int(key))


def column_names(criteria: Sequence[str], widths: Sequence[int], drafter: bool) -> list[str]:
    """All column names of a harvest with these criterion specs, tree widths and drafter presence."""
    return [n for c in SCHEMA if drafter or not c.drafter for n in expand(c, criteria, widths)]


def arrow_schema(criteria: Sequence[str], widths: Sequence[int], drafter: bool, top_k: int) -> pa.Schema:
    """The Arrow schema of the shards of such a harvest (columns in :data:`SCHEMA` order)."""
    fields = []
    for c in SCHEMA:
        if c.drafter and not drafter:
            continue
        t = _arrow_type(c.type, top_k)
        fields.extend(pa.field(n, t, nullable=False) for n in expand(c, criteria, widths))
    return pa.schema(fields)


def schema_markdown(example_criteria: Iterable[str] = ("additive:0.3",), example_widths: Iterable[int] = (4,)) -> str:
    """A Markdown table of :data:`SCHEMA` for the book: one line per template, with an example name."""
    crit = list(example_criteria)[:1] or ["greedy"]
    wid = list(example_widths)[:1] or [1]
    lines = [
        "| column | type | drafter only | example | meaning |",
        "|---|---|---|---|---|",
    ]
    for c in SCHEMA:
        example = expand(c, crit, wid)[0]
        meaning = c.meaning.replace("|", "\\|")
        lines.append(f"| `{c.name}` | {c.type} | {'yes' if c.drafter else ''} | `{example}` | {meaning} |")
    return "\n".join(lines) + "\n"


_TEMPLATES: dict[str, Column] = {c.name.split("[")[0]: c for c in SCHEMA if c.per != "step"}
