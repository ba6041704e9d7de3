"""Trace harvesting: per-step statistics of a target (and a drafter) along greedy decoding.

``harvest(target, drafter, tokenizer, prompts, out_dir, ...)`` greedy-decodes every prompt with
the target, runs the drafter teacher-forced on the same prefixes, and for every step records
what the two full next-token distributions imply (top-k, margin, entropy, the exact certificate
of every criterion and tree width, KL both ways, TV, whether each criterion accepts the
drafter's token and whether that was certified) without ever keeping a distribution: one row
per step in Parquet shards, with a JSON manifest. ``load_traces(out_dir)`` reads them back as a
``pyarrow.Table``. The command line is ``companion harvest`` (see ``companion.harvest.cli``);
the columns are documented in :mod:`companion.harvest.schema`; presets and every choice the
paper leaves open in :mod:`companion.models.presets` and ``README.md`` beside this file.
"""
from companion.harvest.core import TREE_WIDTHS, harvest
from companion.harvest.schema import SCHEMA, arrow_schema, column_names, schema_markdown
from companion.harvest.stats import StepStatistics, divergences
from companion.harvest.store import HarvestConfigError, load_traces, read_manifest

__all__ = [
    "SCHEMA",
    "TREE_WIDTHS",
    "HarvestConfigError",
    "StepStatistics",
    "arrow_schema",
    "column_names",
    "divergences",
    "harvest",
    "load_traces",
    "read_manifest",
    "schema_markdown",
]
