"""The run record of ``companion reproduce`` and the reproduction-status page made from it.

Every successful notebook execution adds one entry to a JSON file (``_build/run-record.json``):
when it ran, for how long, on which device, with which profile and parameters, from which
source (hash) and commit, and which figures it wrote. ``render_status_markdown`` turns the
record into the MyST page the book shows under "Reproduction status".

The record is written atomically (temporary file, then rename), so a crash mid-run leaves
either the previous record or the new one, never a truncated file.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from companion.book.tables import table_directive
from companion.models.sizes import card_parameters

RECORD_SCHEMA = 1

@dataclass
class ChapterExecution:
    """One successful execution of one chapter notebook."""

    chapter: str                      # e.g. "03_strict_greedy"
    source: str                       # path of the source notebook, relative to the root
    source_sha256: str                # hash of the source notebook when it was executed
    profile: str                      # profile name, e.g. "cpu"
    parameters: dict[str, Any]        # parameters injected by papermill (after overrides)
    device: str | None                # "cpu"/"cuda" as injected; None: no device parameter
    device_name: str                  # human description of the hardware used
    started: str                      # ISO 8601, UTC
    seconds: float                    # wall-clock execution time
    figures: list[str] = field(default_factory=list)   # figure names (PNG+PDF in figures/)
    python: str = ""
    torch: str | None = None
    commit: str | None = None         # short git commit of the tree, "+dirty" if modified
    harvest: str | None = None        # the harvests analysed, from their manifests (:func:`harvest_description`)
    slowest_cells: list[dict[str, Any]] = field(default_factory=list)  # {"cell", "seconds", "source"}
    jobs: int = 1                     # chapters executing at once in that run
    defaults: list[list[str]] = field(default_factory=list)  # [name, default as written] of every declared
                                                              # parameter, in the notebook's order
    start_threads: int | None = None  # OMP_NUM_THREADS the run gave the kernel (None: torch's default)
    kernel_threads: list[int] = field(default_factory=list)  # torch threads of the kernel after its cells
    harvest_threads: list[str] = field(default_factory=list)  # per harvest analysed: processes x torch threads

    @property
    def preset(self) -> str | None:
        value = self.parameters.get("preset")
        return None if value is None else str(value)


@dataclass
class RunRecord:
    """All chapter runs, keyed by chapter name (the latest run of each chapter wins)."""

    chapters: dict[str, ChapterExecution] = field(default_factory=dict)

    def figure_owner(self, figure: str) -> str | None:
        """The chapter whose latest run wrote ``figure``, if any."""
        for name, run in self.chapters.items():
            if figure in run.figures:
                return name
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RECORD_SCHEMA,
            "chapters": {k: dataclasses.asdict(v) for k, v in sorted(self.chapters.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunRecord":
        if data.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"run record has schema {data.get('schema')!r}, expected {RECORD_SCHEMA}")
        known = {f.name for f in dataclasses.fields(ChapterExecution)}
        chapters = {}
        for name, entry in data.get("chapters", {}).items():
            chapters[name] = ChapterExecution(**{k: v for k, v in entry.items() if k in known})
        return cls(chapters)


def load_record(path: Path) -> RunRecord:
    """Read the record at ``path``; a missing file is an empty record."""
    if not path.exists():
        return RunRecord()
    try:
        return RunRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as err:
        raise ValueError(f"cannot read run record {path}: {err}") from err


def save_record(record: RunRecord, path: Path) -> None:
    """Write ``record`` to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _cell(text: str) -> str:
    """Escape text for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(source: str) -> str:
    """A cell's first line for a table cell inside backticks: no pipes, no backticks, short."""
    text = source.replace("`", "'").replace("|", "/")
    return text if len(text) <= 48 else text[:47] + "…"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _short_model(name: str) -> str:
    """A model path shortened to what identifies it (``.../default_pair/target`` -> ``default_pair/target``)."""
    parts = Path(name).parts
    return "/".join(parts[-2:]) if len(parts) > 2 else name


def weights_id(ident: dict[str, Any] | None, digits: int = 16) -> str | None:
    """What identifies a model's weights in a harvest manifest, shortened to ``digits`` hex digits:
    the sha256 of the GGUF file it was converted from (the file a reader can check against the
    package index), else of its weight file(s), else its hub revision, else the sha256 of its tensors."""
    if not ident:
        return None

    def short(h: str) -> str:
        return h[:digits] + "…" if len(h) > digits else h

    conv = ident.get("converted_from")
    if isinstance(conv, dict) and conv.get("gguf_sha256"):
        return f"GGUF sha256 {short(str(conv['gguf_sha256']))}"
    files = ident.get("weights_sha256")
    if isinstance(files, dict) and files:
        return "sha256 " + ", ".join(short(str(h)) for _, h in sorted(files.items()))
    if ident.get("revision"):
        return f"revision {short(str(ident['revision']))}"
    if ident.get("state_dict_sha256"):
        return f"tensors' sha256 {short(str(ident['state_dict_sha256']))}"
    return None


def describe_harvest(manifest: dict[str, Any], *, weights: bool = False) -> str:
    """One Markdown line describing a harvest from its manifest alone: what a chapter analysed.

    Preset, target and drafter (name and size), dtype, device, prompt source, prompts and
    steps, and the number of steps whose two largest target logits are exactly equal. Read from
    the manifest, never from the preset table, so that traces made elsewhere (another machine,
    other models via ``--target``) are described as they were made. ``weights``: each model's
    weights named by their sha256 too (:func:`weights_id`; the manifest holds the full digests).
    """
    cfg = manifest.get("config", {})
    env = manifest.get("environment", {})
    totals = manifest.get("totals", {})

    def model(ident: dict[str, Any] | None) -> str:
        if not ident:
            return "none"
        n = card_parameters(ident)
        size = f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"
        digest = weights_id(ident) if weights else None
        tail = f"; {digest}" if digest else ""
        conv = ident.get("converted_from")
        if isinstance(conv, dict) and conv.get("display_name"):
            return f"{conv['display_name']} ({conv.get('quantization', '?')} GGUF; {size} parameters{tail})"
        return f"`{_short_model(ident.get('name') or '(in memory)')}` ({size} parameters{tail})"

    preset = manifest.get("extra", {}).get("preset", "(none)")
    device = cfg.get("device_type", "?")
    if env.get("device_name") and env.get("device_name") != device:
        device = f"{device} ({env['device_name']})"
    prompts = cfg.get("prompt_set", {}).get("n_prompts", "?")
    source = manifest.get("prompt_set_name")
    text = (f"preset `{preset}`: target {model(cfg.get('target'))}, drafter {model(cfg.get('drafter'))}, "
            f"{cfg.get('dtype', '?')} on {device}; {prompts} prompts"
            + (f" of `{source}`" if source else "")
            + f" x up to {cfg.get('n_steps', '?')} greedy steps, {totals.get('rows', '?')} steps in all")
    if "top2_tie_steps" in totals:
        text += f", {totals['top2_tie_steps']} with an exact top-2 tie"
    return text


def _manifests(traces_dirs: Any) -> list[dict[str, Any]]:
    """The readable manifests of ``traces_dirs`` (one folder or several), each folder once, in order."""
    if not traces_dirs:
        return []
    dirs = [traces_dirs] if isinstance(traces_dirs, (str, os.PathLike)) else list(traces_dirs)
    found = []
    for d in dict.fromkeys(str(x) for x in dirs if x):
        try:
            found.append(json.loads((Path(d) / "manifest.json").read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return found


def harvest_threads(traces_dirs: Any) -> list[str]:
    """How each harvest in ``traces_dirs`` ran, from its manifest: ``"PRESET: P process(es) x T torch
    threads"`` on the CPU (the threads the harvest set for itself, whatever its chapter's kernel had),
    ``"PRESET: P process(es) on DEVICE"`` elsewhere."""
    out = []
    for manifest in _manifests(traces_dirs):
        cfg, env = manifest.get("config", {}), manifest.get("environment", {})
        world = int(env.get("world_size") or 1)
        device = str(cfg.get("device_type", "cpu"))
        threads = cfg.get("numerics", {}).get("torch_threads", env.get("torch_threads"))
        if device != "cpu":
            each = f" on {device}"
        elif threads is None:
            each = " (torch threads not recorded)"
        else:
            each = f" x {threads} torch thread{'s' if threads != 1 else ''}"
        preset = manifest.get("extra", {}).get("preset", "(no preset)")
        out.append(f"{preset}: {world} process{'es' if world != 1 else ''}{each}")
    return out


def harvest_description(traces_dirs: Any) -> str | None:
    """:func:`describe_harvest` (with the weights' sha256) of the manifest in each of ``traces_dirs`` (one
    folder or several, in order), joined by "; "; None if none is given or readable."""
    return "; ".join(describe_harvest(m, weights=True) for m in _manifests(traces_dirs)) or None


def _models(run: ChapterExecution) -> str:
    """Preset and models: from the manifests of the harvests the chapter analysed (given as
    ``traces_dir`` or made by ``chapter_traces``), else from the preset name and any *model*
    parameters of the chapter."""
    if run.harvest:
        given = run.parameters.get("traces_dir")
        return (f"traces `{given}`: " if given else "") + run.harvest
    parts = []
    if run.preset is not None:
        described = _preset_description(run.preset)
        parts.append(f"`{run.preset}`" + (f": {described}" if described else ""))
    for key, value in sorted(run.parameters.items()):
        if "model" in key and value not in (None, ""):
            parts.append(f"{key} = `{value}`")
    return "; ".join(parts)


def _preset_description(name: str) -> str | None:
    """The harvest preset's own description (:data:`companion.models.presets.PRESETS`), if known."""
    from companion.models.presets import PRESETS

    preset = PRESETS.get(name)
    return preset.description if preset else None


def _value(text: str) -> str:
    """A parameter's value inside backticks in a table cell."""
    return text.replace("`", "'").replace("\n", " ")


def _same(value: Any, default: str) -> bool:
    """Whether an injected ``value`` equals a notebook default written as ``default``."""
    import ast

    try:
        return bool(ast.literal_eval(default) == value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def _parameters(run: ChapterExecution) -> str:
    """Every parameter the run used: those it set to other values than the notebook's (with the
    notebook's default), then the notebook's defaults it kept, in the notebook's order."""
    if not run.defaults:   # a record written before the defaults were recorded: what was injected
        shown = [f"`{k}={_value(repr(v))}`" for k, v in sorted(run.parameters.items())]
        return ", ".join(shown) if shown else "(defaults of the notebook)"
    pairs = run.defaults.items() if isinstance(run.defaults, dict) else run.defaults   # a hand-edited record
    defaults = {str(name): str(text) for name, text in pairs}
    changed, kept = [], []
    for name, default in defaults.items():
        if name in run.parameters and not _same(run.parameters[name], default):
            changed.append(f"`{name}={_value(repr(run.parameters[name]))}` (notebook: `{_value(default)}`)")
        else:
            value = repr(run.parameters[name]) if name in run.parameters else default
            kept.append(f"`{name}={_value(value)}`")
    changed += [f"`{k}={_value(repr(v))}`" for k, v in sorted(run.parameters.items()) if k not in defaults]
    parts = []
    if changed:
        parts.append("**changed:** " + ", ".join(changed) + ".")
    if kept:
        parts.append("**as in the notebook:** " + ", ".join(kept) + ".")
    return " ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _threads(run: ChapterExecution) -> str:
    """The threads a chapter ran on: its kernel's torch threads (as the kernel noted them after its
    cells, and what the run started it with) and each harvest's processes and threads."""
    parts = []
    started = (f"the run started it with {run.start_threads}" if run.start_threads is not None
               else "the run left torch's default")
    if run.kernel_threads:
        low, high = min(run.kernel_threads), max(run.kernel_threads)
        count = _plural(low, "torch thread") if low == high else f"{low} to {high} torch threads"
        parts.append(f"kernel: {count} ({started})")
    elif run.start_threads is not None or run.defaults:
        parts.append(f"kernel: no torch ({started})" if run.defaults else f"kernel: {started}")
    parts += [f"harvest {h}" for h in run.harvest_threads]
    return "; ".join(parts) or "(not recorded)"


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError:
        return "not installed"
    return str(transformers.__version__)


def render_status_markdown(
    record: RunRecord,
    chapters: Iterable[tuple[str, str, str | None]],
    staged_figures: Iterable[str] = (),
) -> str:
    """The generated part of the reproduction-status page, as MyST Markdown.

    ``chapters`` lists every chapter of the table of contents in order as
    ``(name, link_target, current_sha256)``: ``link_target`` is the document path used for a
    link from the status page (or "" when the chapter is not in the built book) and
    ``current_sha256`` the hash of the source notebook now (None if it does not exist), used to
    flag results whose source has changed since they were executed.
    ``staged_figures`` names the figures copied next to the page (``../figures/NAME.png``).
    """
    chapters = list(chapters)
    staged = set(staged_figures)
    lines: list[str] = []
    runs = [record.chapters[name] for name, _, _ in chapters if name in record.chapters]

    lines.append("## Summary\n")
    if runs:
        last = max(r.started for r in runs)
        total = sum(r.seconds for r in runs)
        commits = sorted({r.commit for r in runs if r.commit})
        lines.append(
            f"{len(runs)} of {len(chapters)} chapters executed; total execution time "
            f"{_duration(total)}; latest run started {last}."
        )
        parallel = max(r.jobs for r in runs)
        if parallel > 1:
            lines.append(f" Chapters ran up to {parallel} at a time, so the wall time of a run was shorter than "
                         "this total; the threads each chapter used are in the Threads column below.")
        if commits:
            lines.append(" Source commit(s): " + ", ".join(f"`{c}`" for c in commits) + ".")
        paper = sorted({f"{r.chapter} (`{r.preset}`)" for r in runs if (r.preset or "").startswith("paper-")})
        lines.append(" The paper's presets (Qwen3 targets on a GPU): " + (
            "run by " + ", ".join(paper) + "." if paper else
            "not run in this build; every experiment chapter here ran on a smaller preset."))
        lines.append(f" `transformers` in the environment that built the book: {_transformers_version()}.")
        lines.append("\n")
    else:
        lines.append("No chapter has been executed yet: run `companion reproduce`.\n")

    lines.append("## Chapters\n")
    # Two tables, so that neither is wider than the page: when and where, then with what.
    run_rows = ["| Chapter | Executed (UTC) | Time | Device | Profile |", "|---|---|---|---|---|"]
    setup_rows: list[str] = []
    for name, link, sha in chapters:
        title = f"[{name}]({link})" if link else name
        run = record.chapters.get(name)
        if run is None:
            state = "notebook not written yet" if sha is None else "not executed yet"
            run_rows.append(f"| {title} | {state} | | | |")
            continue
        when = run.started
        if sha is not None and sha != run.source_sha256:
            when += " (source changed since)"
        device = run.device or "cpu (no device parameter)"
        if run.device_name:
            device += f" ({run.device_name})"
        run_rows.append("| " + " | ".join(_cell(x) for x in (title, when, _duration(run.seconds), device, run.profile or ""))
                        + " |")
        setup_rows.append("| " + " | ".join(_cell(x) for x in (title, _models(run) or "(none)", _parameters(run),
                                                                 _threads(run))) + " |")
    lines.append(table_directive("\n".join(run_rows), "Each chapter's latest run: when, how long, on which device and profile.",
                                 "tbl-status-runs"))
    cell_rows = []
    for name, link, _ in chapters:
        run = record.chapters.get(name)
        if run is None or not run.slowest_cells:
            continue
        title = f"[{name}]({link})" if link else name
        cells = "; ".join(f"cell {c['cell']}: {_duration(float(c['seconds']))}, `{_code(c['source'])}`"
                          for c in run.slowest_cells)
        cell_rows.append(f"| {_cell(title)} | {cells} |")
    if cell_rows:
        lines.append("### Where the time goes\n")
        lines.append("The slowest cells of each chapter's latest run (cells numbered from 0 in the notebook).\n")
        lines.append(table_directive("\n".join(["| Chapter | Slowest cells |", "|---|---|"] + cell_rows),
                                     "The slowest cells of each chapter's latest run.", "tbl-status-cells"))
    if setup_rows:
        lines.append("### Models, parameters and threads\n")
        lines.append("Every parameter of each chapter's latest run: the values the run set (with the notebook's "
                     "default beside them), then the notebook's defaults it kept. Threads: the torch threads of "
                     "the chapter's kernel after its cells, and those of each harvest it analysed, from the "
                     "harvest's manifest.\n")
        lines.append(table_directive("\n".join(["| Chapter | Preset and models | Parameters | Threads |",
                                               "|---|---|---|---|"] + setup_rows),
                                     "The models, parameters and threads of each chapter's latest run.",
                                     "tbl-status-setup"))

    lines.append("## Figures\n")
    figure_rows = []
    for name, link, _ in chapters:
        run = record.chapters.get(name)
        if run is None:
            continue
        for figure in run.figures:
            if figure in staged:
                files = (f"{{download}}`PNG <../figures/{figure}.png>`, "
                         f"{{download}}`PDF <../figures/{figure}.pdf>`")
            else:
                files = f"`figures/{figure}.png`, `figures/{figure}.pdf`"
            producer = f"[{name}]({link})" if link else name
            figure_rows.append(f"| `{figure}` | {producer} | {files} |")
    if figure_rows:
        lines.append(table_directive("\n".join(["| Figure | Produced by | Files |", "|---|---|---|"] + figure_rows),
                                     "Every figure of the book, the chapter that draws it, and its files.", "tbl-status-figures"))
    else:
        lines.append("No figure has been written yet.")
    lines.append("")

    lines.append("## Environment\n")
    if runs:
        latest = max(runs, key=lambda r: r.started)
        lines.append(f"- Python {latest.python}")
        lines.append(f"- torch {latest.torch or 'not installed'}")
    else:
        lines.append("- (filled in after the first run)")
    lines.append("")
    return "\n".join(lines)
