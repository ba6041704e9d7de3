"""Profiles and notebook parameters: what each chapter declares, what a run passes, checked before it runs."""
from __future__ import annotations


import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from companion.book.layout import ReproduceError, yaml_module
from companion.book.toc import Chapter

DEVICES = ("cpu", "cuda", "auto")


# --------------------------------------------------------------------------------------------
# Profiles and parameters


@dataclass
class Profile:
    """Parameters for every notebook (``parameters``) and per chapter (``notebooks``)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    notebooks: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: str = "note"   # what a chapter's failing prose claim does: "strict" fails the build, "note" shows it


def available_profiles(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "profiles").glob("*.yml"))


def load_profile(root: Path, name: str) -> Profile:
    """Load ``profiles/<name>.yml`` (or a YAML file given by path) and check its shape."""
    path = Path(name) if name.endswith((".yml", ".yaml")) else root / "profiles" / f"{name}.yml"
    if not path.is_file():
        known = ", ".join(available_profiles(root)) or "none"
        raise ReproduceError(f"unknown profile {name!r} (no {path}); available: {known}")
    yaml = yaml_module()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ReproduceError(f"profile {path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset "
                             f"{err.start}); save it as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        # PyYAML's message spans several lines (the problem, then where): keep the first and the place
        where = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        raise ReproduceError(f"cannot parse profile {path}: {' '.join(str(problem).split())}{at}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ReproduceError(f"profile {path} must be a YAML mapping with the keys description, parameters and "
                             f"notebooks, got {_yaml_kind(data)}")
    unknown = set(map(str, data)) - {"description", "parameters", "notebooks", "claims"}
    if unknown:
        raise ReproduceError(f"profile {path}: unknown keys {sorted(unknown)}; a profile holds description, "
                             "parameters, notebooks and claims")
    parameters = data.get("parameters") or {}
    notebooks = data.get("notebooks") or {}
    if not isinstance(parameters, dict) or not isinstance(notebooks, dict) or not all(
        isinstance(v, dict) for v in notebooks.values()
    ):
        raise ReproduceError(f"profile {path}: 'parameters' and each 'notebooks' entry must be mappings")
    claims = data.get("claims", "note")
    if claims not in ("strict", "note"):
        raise ReproduceError(f"profile {path}: claims must be 'strict' (a failing prose claim fails the build) or "
                             f"'note' (it is shown on the page), got {claims!r}")
    return Profile(Path(name).stem, str(data.get("description", "")), parameters,
                   {str(k): v for k, v in notebooks.items()}, claims)


def _yaml_kind(data: Any) -> str:
    """How a YAML document that is not a mapping reads, for a one-line refusal."""
    if isinstance(data, list):
        return f"a list of {len(data)} item{'s' if len(data) != 1 else ''}"
    return f"the {type(data).__name__} {data!r}"[:120]


def parse_value(text: str) -> Any:
    """A ``-p NAME VALUE`` value: YAML scalars (``8``, ``0.3``, ``true``, ``[1, 2]``), else the text."""
    yaml = yaml_module()
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


_NO_DEFAULT = object()


@dataclass(frozen=True)
class NotebookParameter:
    """One name assigned in a notebook's ``parameters`` cell: its default as written and as a value.

    ``value`` is the default evaluated as a Python literal, or ``_NO_DEFAULT`` when it is not a
    literal (an expression, or one name of a tuple unpacking); ``comment`` is the comment at the
    end of the assignment's line, else the comment lines right above it ("" if none).
    """

    name: str
    source: str
    value: Any
    comment: str

    @property
    def has_literal_default(self) -> bool:
        return self.value is not _NO_DEFAULT


def _parameters_cell(path: Path) -> str | None:
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return str(cell.source)
    return None


def notebook_parameters(path: Path) -> dict[str, NotebookParameter]:
    """The parameters a notebook declares in its papermill ``parameters`` cell, in order (empty if none).

    Read with ``ast`` rather than ``papermill.inspect_notebook``: papermill's line parser skips
    valid assignments whose comment contains ``=`` (e.g. ``vocab = 12  # needs V >= 10``),
    which would make a declared parameter look undeclared.
    """
    import ast
    import io
    import tokenize

    source = _parameters_cell(path)
    if source is None:
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise ReproduceError(f"{path.name}: the parameters cell is not valid Python: {err}") from err
    comments: dict[int, str] = {}
    full_line: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
                if not tok.line[:tok.start[1]].strip():
                    full_line.add(tok.start[0])
    except (tokenize.TokenError, SyntaxError):
        pass
    found: dict[str, NotebookParameter] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets, value = [node.target], node.value
        else:
            continue
        comment = comments.get(node.end_lineno, "") if node.end_lineno not in full_line else ""
        if not comment:
            above, line = [], node.lineno - 1
            while line in full_line:
                above.insert(0, comments[line])
                line -= 1
            comment = " ".join(above)
        text = ast.get_source_segment(source, value) if value is not None else ""
        for target in targets:
            single = isinstance(target, ast.Name) and value is not None and not isinstance(node, ast.AugAssign)
            literal: Any = _NO_DEFAULT
            if single:
                try:
                    literal = ast.literal_eval(value)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    literal = _NO_DEFAULT
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    shown = (text or "") if single else f"(set by: {ast.get_source_segment(source, node)})"
                    found[leaf.id] = NotebookParameter(leaf.id, shown, literal, comment)
    return found


def declared_parameters(path: Path) -> set[str]:
    """Names assigned in the notebook's papermill ``parameters`` cell (empty if it has none)."""
    return set(notebook_parameters(path))


_TYPE_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a mapping"}


def _kind(value: Any) -> type | None:
    """The parameter type a value belongs to: bool, int, float, str, list (lists and tuples), dict; else None."""
    for t in (bool, int, float, str, dict):
        if isinstance(value, t):
            return t
    if isinstance(value, (list, tuple)):
        return list
    return None


def value_fits_default(value: Any, default: Any) -> bool:
    """Whether ``value`` may replace a parameter whose default is ``default``.

    The rule: same kind as the default among bool, int, float, str, list, dict, except that an
    integer fits a float default; a None default (or one of another type) accepts anything;
    a list whose default's items are all of one kind must have items of that kind.
    """
    want = _kind(default)
    if default is None or want is None:
        return True
    got = _kind(value)
    if want is float and got is int:
        return True
    if got is not want:
        return False
    if want is list and default:
        kinds = {_kind(x) for x in default}
        if len(kinds) == 1:
            (item,) = kinds
            return all(value_fits_default(x, default[0]) for x in value) if item is not None else True
    return True


def _type_error(value: Any, param: NotebookParameter, chapter: str) -> str:
    want = _TYPE_NAMES.get(_kind(param.value) or object, type(param.value).__name__)
    if _kind(param.value) is list and param.value and _kind(value) is list:
        want = f"a list of {_TYPE_NAMES[_kind(param.value[0])].split(' (')[0].removeprefix('an ').removeprefix('a ')}s"
    hint = ' (quote it to pass a string: \'"..."\')' if isinstance(param.value, str) else ""
    return (f"{chapter} expects {want} for {param.name} (its default is {param.source}), "
            f"got {value!r}{hint}")


# Ranges the chapters' parameters share by name: a value outside one makes a chapter crash deep
# inside (a vocabulary of one token has no second token to rank), so it is refused before any
# notebook runs. (name test, smallest value, why)
_LOWER_BOUNDS: list[tuple[Any, int, str]] = [
    (lambda n: n == "seed", 0, "a seed is a non-negative integer"),
    (lambda n: n.endswith("vocab") or n.endswith("_vocabs"), 2, "a vocabulary needs at least 2 tokens"),
    (lambda n: n.startswith("n_") or n in ("batch_size", "max_new_tokens", "run_length"), 1,
     "a count must be at least 1"),
    (lambda n: n.endswith("widths"), 1, "a tree width is at least 1"),
]


def _range_error(name: str, value: Any, chapter: str) -> str | None:
    """Why ``value`` is out of the range its name implies (see ``_LOWER_BOUNDS``), or None."""
    items = value if isinstance(value, (list, tuple)) else [value]
    for test, low, why in _LOWER_BOUNDS:
        if not test(name):
            continue
        bad = [x for x in items if isinstance(x, (int, float)) and not isinstance(x, bool) and x < low]
        if bad:
            each = "every entry of " if isinstance(value, (list, tuple)) else ""
            return f"{chapter} needs {each}{name} >= {low} ({why}), got {value!r}"
    return None


def plan_parameters(
    chapters: list[Chapter],
    declared: dict[str, set[str]],
    profile: Profile,
    overrides: dict[str, Any],
    all_names: list[str],
    defaults: dict[str, dict[str, NotebookParameter]] | None = None,
    book_declared: set[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """The parameters to inject into each chapter: profile-wide values the notebook declares,
    then the profile's values for that chapter, then the command-line overrides.

    Profile-wide values a notebook does not declare are skipped (chapters share one profile),
    but a profile-wide name that no chapter of the book declares (``book_declared``: the names
    every existing chapter declares, selected or not) and that is close to a declared one the
    profile does not set itself (``difflib``, ratio >= 0.75: ``sed`` for ``seed``) is a typo and
    is refused; anything named
    explicitly for a chapter, or on the command line, must be declared.
    With ``defaults`` (:func:`notebook_parameters` of each chapter), every value must fit the
    type of the notebook's default (:func:`value_fits_default`), so a mistyped value is refused
    before any notebook runs.
    """
    unknown = set(profile.notebooks) - set(all_names)
    if unknown:
        raise ReproduceError(f"profile {profile.name!r} names unknown chapters: {sorted(unknown)}")
    if book_declared is not None:
        for name in sorted(map(str, set(profile.parameters) - book_declared)):
            # A name close to a declared one is a typo (sed for seed); others may be meant for chapters
            # this book does not have (test books share the repository's profiles), and stay skipped.
            # A declared name the profile sets as well is not what this one misspells (n_eval_prompts
            # beside n_prompts, in a book without chapter 10).
            close = difflib.get_close_matches(name, sorted(book_declared - set(profile.parameters)), n=1, cutoff=0.75)
            if close:
                raise ReproduceError(
                    f"profile {profile.name!r} sets {name} in 'parameters', which no chapter declares; did you "
                    f"mean {close[0]}? (declared: {', '.join(sorted(book_declared))})")
    plans: dict[str, dict[str, Any]] = {}
    for chapter in chapters:
        names = declared[chapter.name]
        params = {k: v for k, v in profile.parameters.items() if k in names}
        specific = profile.notebooks.get(chapter.name, {})
        undeclared = set(specific) - names
        if undeclared:
            raise ReproduceError(
                f"profile {profile.name!r} sets {sorted(undeclared)} for {chapter.name}, which declares "
                f"only {sorted(names)}"
            )
        params.update(specific)
        params.update({k: v for k, v in overrides.items() if k in names})
        if "device" in params and params["device"] not in DEVICES:
            raise ReproduceError(f"{chapter.name}: device must be one of {DEVICES}, got {params['device']!r}")
        for name, value in params.items():
            param = (defaults or {}).get(chapter.name, {}).get(name)
            if param is not None and param.has_literal_default and not value_fits_default(value, param.value):
                origin = (f"-p {name} {value!r}" if name in overrides else
                          f"profile {profile.name!r} sets {name} to {value!r}")
                raise ReproduceError(f"{origin}: {_type_error(value, param, chapter.name)}")
            problem = _range_error(name, value, chapter.name)
            if problem is not None:
                origin = (f"-p {name} {value!r}" if name in overrides else
                          f"profile {profile.name!r} sets {name} to {value!r}")
                raise ReproduceError(f"{origin}: {problem}")
        plans[chapter.name] = params
    for key in overrides:
        if not any(key in declared[c.name] for c in chapters):
            declared_any = sorted(set().union(*(declared[c.name] for c in chapters))) if chapters else []
            raise ReproduceError(
                f"-p {key}: no selected chapter declares this parameter (declared: {', '.join(declared_any)})"
            )
    return plans


def describe_device(device: str | None) -> tuple[str | None, str]:
    """Resolve ``auto`` and describe the hardware (:func:`companion.models.devices.describe_device`);
    an unavailable device is a :class:`ReproduceError`, found before anything runs."""
    from companion.models.devices import DeviceUnavailableError
    from companion.models.devices import describe_device as describe

    try:
        return describe(device)
    except DeviceUnavailableError as err:
        raise ReproduceError(str(err)) from None
