"""How the API reference shows the library: short entries a reader can scan and search.

Three changes to what autodoc writes (loaded by ``companion_book``):

- a constant or attribute whose value prints longer than :data:`MAX_VALUE` characters is shown
  by name, type and description, without its value (``PASSAGES`` printed 8,215 characters);
- a dataclass or NamedTuple field without a docstring takes its description from the comment
  beside it in the source (``tokens_per_s: float  # transformers' wall clock``), or from the
  comment lines just above it; NamedTuple's "Alias for field number N" counts as no description.
  A field with no description at all gets no entry of its own (its name and type are in its
  class's signature and parameter list);
- an entry (and a module) shows its first paragraph, the one-line purpose; the rest of its
  docstring (formulas, parameters, examples) folds into a "Details" box that opens on a click. The text stays in the
  page (the browser's find-in-page opens the box) and in the book's search index.
"""
from __future__ import annotations

import ast
import functools
import inspect
import io
import re
import textwrap
import tokenize
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.ext.autodoc import AttributeDocumenter, DataDocumenter, ModuleDocumenter
from sphinx.util.docutils import SphinxDirective
from sphinx.util.inspect import object_description

#: The longest value (its repr, in characters) an entry's header still prints.
MAX_VALUE = 80
ALIAS = re.compile(r"^Alias for field number \d+$")
LITERAL = re.compile(r"(``[^`]+``)")
REST_SPECIAL = re.compile(r"([\\*`|]|(?<=\w)_(?!\w))")


def rest_text(comment: str) -> str:
    """A source comment as reStructuredText that reads as written: its double-backquoted literals
    kept, any other markup character escaped (a ``*`` or a trailing ``_`` would start emphasis or a
    link)."""
    return "".join(part if LITERAL.fullmatch(part) else REST_SPECIAL.sub(r"\\\1", part)
                   for part in LITERAL.split(comment))


def _value_too_long(obj: Any) -> bool:
    try:
        return len(object_description(obj)) > MAX_VALUE
    except Exception:  # a value whose repr fails is not worth printing either
        return True


class NamedDataDocumenter(DataDocumenter):
    """Module data: the value only when it is short."""

    def should_suppress_value_header(self) -> bool:
        return super().should_suppress_value_header() or _value_too_long(self.object)


class NamedAttributeDocumenter(AttributeDocumenter):
    """Class attributes: the value only when it is short; a field without a docstring described
    by the comment beside it in the source."""

    def should_suppress_value_header(self) -> bool:
        return super().should_suppress_value_header() or _value_too_long(self.object)

    def generate(self, *args: Any, **kwargs: Any) -> None:
        # A field with neither a docstring nor a comment gets no entry of its own: its name and
        # type are already in its class's signature and parameter list.
        if self.parse_name() and self.import_object() and not _described(self.get_doc()):
            return
        super().generate(*args, **kwargs)

    def get_doc(self) -> list[list[str]] | None:
        docs = super().get_doc()
        if _described(docs):
            return docs
        owner = self.parent if inspect.isclass(self.parent) else None
        comment = field_comments(owner).get(self.objpath[-1]) if owner is not None else None
        return [[rest_text(comment), ""]] if comment else docs


def _described(docs: list[list[str]] | None) -> bool:
    """Whether a docstring says something (NamedTuple's "Alias for field number N" does not)."""
    return any(line.strip() and not ALIAS.match(line.strip()) for doc in docs or [] for line in doc)


@functools.lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """The comment of each field assigned in the body of ``cls``: the one at the end of its line,
    else the comment lines right above it."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return {}
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1][:tok.start[1]].strip():
            trailing[tok.start[0]] = tok.string
    out: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        else:
            continue
        end = node.end_lineno or node.lineno
        found = [trailing[n] for n in range(node.lineno, end + 1) if n in trailing]
        if not found:   # a block of comment lines just above the field
            n = node.lineno - 1
            while n >= 1 and lines[n - 1].strip().startswith("#"):
                found.insert(0, lines[n - 1].strip())
                n -= 1
        text = " ".join(c.lstrip("#:").strip() for c in found).strip()
        if text:
            for name in names:
                out[name] = text
    return out


class details(nodes.General, nodes.Element):
    """A folded box (HTML ``<details>``) holding the rest of an entry's docstring."""


class DetailsDirective(SphinxDirective):
    """``.. companion-details::``: its content in a folded box."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        box = details()
        self.state.nested_parse(self.content, self.content_offset, box)
        return [box]


def fold_lines(lines: list[str]) -> list[str]:
    """reST lines of a docstring with everything past its first paragraph in ``.. companion-details::``."""
    while lines and not lines[0].strip():
        lines = lines[1:]
    cut = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    rest = lines[cut:]
    while rest and not rest[-1].strip():
        rest = rest[:-1]
    if not any(line.strip() for line in rest):
        return lines
    return lines[:cut] + ["", ".. companion-details::", ""] + [f"   {line}" if line.strip() else "" for line in rest] + [""]


class FoldedModuleDocumenter(ModuleDocumenter):
    """A module's docstring: its first paragraph in view, the rest folded."""

    def process_doc(self, docstrings: list[list[str]]) -> Any:
        return iter(fold_lines(list(super().process_doc(docstrings))))


def _visit_details(self: Any, node: details) -> None:
    self.body.append('<details class="companion-more"><summary>Details</summary>\n')


def _depart_details(self: Any, node: details) -> None:
    self.body.append("</details>\n")


def fold_details(app: Any, domain: str, objtype: str, contentnode: addnodes.desc_content) -> None:
    """object-description-transform: keep an entry's first paragraph in view (after a class's
    "Bases:" line) and fold the rest.

    Nested entries (a class's methods and attributes) and index entries stay outside the box.
    """
    if domain != "py":
        return
    kids = list(contentnode.children)
    start = 0
    if kids and isinstance(kids[0], nodes.paragraph) and kids[0].astext().startswith("Bases:"):
        start = 1   # a class's base classes (show-inheritance) come before its docstring
    if len(kids) > start and isinstance(kids[start], nodes.paragraph):
        start += 1
    folded = [k for k in kids[start:] if not isinstance(k, (addnodes.desc, addnodes.index))]
    if not folded:
        return
    box = details()
    for k in folded:
        contentnode.remove(k)
        box += k
    contentnode.insert(start, box)


def setup(app: Any) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.autodoc")
    app.add_autodocumenter(NamedDataDocumenter, override=True)
    app.add_autodocumenter(NamedAttributeDocumenter, override=True)
    app.add_autodocumenter(FoldedModuleDocumenter, override=True)
    app.add_directive("companion-details", DetailsDirective)
    # after autodoc's own handler (priority 500), which adds the type fields the box should hold
    app.connect("object-description-transform", fold_details, priority=900)
    app.add_node(details, html=(_visit_details, _depart_details))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
