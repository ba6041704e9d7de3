"""Configuration of the embedded pair's training recipe.

Two presets: :func:`default_config` (the chat recipe, which built the committed
``companion/assets/default_pair``) and :func:`shrunk_config` (a few seconds; used by the tests
and by ``companion retrain --shrink``).

The pair is built, offline and deterministically (same package versions, one thread), by::

    companion retrain --out companion/assets/default_pair --checkpoint-dir runs/default_pair_ckpt --no-progress

(rerun the same command after an interruption: each stage resumes from its last checkpoint). Its
corpus is the rule-generated chat corpus of the "closed" task set
(:mod:`companion.tiny_pair.closed_tasks`: 60,000 conversations, 1.9M tokens) plus a 15 % share of
training windows of standard-library source. The target sees 2000 x 8 x 256 = 4.1M tokens (loss
on the assistant's answers only), the drafter 600 x 8 x 256 = 1.2M tokens (distillation, forward
KL, on the same positions). Wall time of the committed build, single-threaded on a 2-core machine
(another build on the other core): target 34.3 min (~1990 tokens/s), drafter 5.6 min, tokenizer,
prompts and figures ~1 min: 41 minutes in all.

How the recipe got here (target on its own greedy answers to 64 held-out requests, 128 steps
at most; the goals: top-1 median >= 0.85 and mean >= 0.70, strict-greedy certificate median
>= 0.30 nats, EOS on >= 50 % of answers, drafter acceptance >= 75 %):

- standard-library source only (650 steps, the previous default): top-1 median 0.25, no EOS;
- chat corpus with loss on every token (1200 steps): median 0.54, mean 0.52, certificate 0.03;
- loss on answers only, one house style per task, 2000 steps: median 0.47, mean 0.53,
  certificate 0.07, EOS 86 %, drafter 69 %. Templates and short transformations were
  near-certain; answers that copy a free list item by item (repeat it, bullet it, write it as
  a Python list, list the names a code block defines) stayed at a top-1 near 0.1 and often ran
  on to the step limit (ordered copying likely needs induction-style attention, which this 5M
  model did not learn from ~4M tokens);
- without those tasks, with memorised facts instead (capitals, next day or month), drafter
  600 steps (the committed build): median 0.997, mean 0.704, certificate median 0.68 nats,
  EOS 97 %, drafter acceptance 80 %, mean answer 27 steps; transformers' assisted generation
  with 4 drafts per round accepts 2.11 of them a round. The uncertain steps that remain are
  the open-ended requests (explain a function: median top-1 0.10; continue code: 0.57) and
  long upper-cased lists (0.64).

Copying (2026-12-01). On the committed pair's own greedy answers to its 64 regime prompts, the
content is right on 11 % of them (``companion pair-report``, per-task table): 0 % on every task
that copies items from the request (upper, lower, reverse, sort, number, lookup, extract,
to_json, table, filter), 100 % on ``sequence``. The go/no-go probe
(``python -m companion.tiny_pair.copy_probe``: the target's architecture, fresh weights,
sequences of 16 random tokens out of 512 written twice, batch 32, AdamW at 1e-3, one thread) is
a clear go: the loss on the second copy falls from 6.28 (the first copy's, ~log 512) to 0.64 at
step 125 and 0.01 by step 300 (2.5 minutes), while the first copy stays at 6.26. Induction-style
copying forms abruptly and early once sequences are short and the batch holds many of them;
the earlier probe (long windows, few sequences per step) had seen no drop in 400 steps, and
neither did a first warm-up here on windows of 256 tokens of repeated multi-token words (batch 8;
second-copy loss 4.97 -> 4.62 in 250 steps). ``copy_warmup_steps`` therefore uses the probe's
setting (34-token windows, batch 32), and ``copy_share`` mixes repeated sequences into the chat
stage.

A trial build with both (``--set copy_warmup_steps=300 --set copy_share=0.1``, otherwise the
default recipe; 2026-12-01, stopped after the target stage) did not get there. The warm-up formed
copying (loss on the repeated sequences 7.33 -> 2.87 in 300 steps, 205 s: the second copy near 0),
but the chat stage undid it: at its end the target's loss on a second copy of 16 random tokens was
8.94 nats against 9.97 on the first (the committed target: 10.34 and 10.46), and its answers were
right on 8 % of the 64 regime requests (committed pair: 11 %), 0 % on every copy task, with the
top-10 mass at the 5th percentile 0.228 (committed: 0.243). A tenth of the chat stage's windows
(256 tokens, batch 8) holding repeated sequences is not enough to keep the skill: in windows of
that size it forms slowly or not at all (above), and the chat stage starts with a fresh optimiser
at 3e-3. Untried: the warm-up's short windows interleaved in every chat batch, a lower chat
learning rate after the warm-up, and answers that need no copying with deliberate ambiguity
(the issue's second way).

The closed task set (2026-12-01; the committed pair). The issue's second way: keep only requests
whose answer needs no copying (a memorised fact, or a rule over a small closed set: capitals and
their countries, the day or month before or after, named sequences, opposites, plurals,
categories, animals' sounds and young, days of a month, month numbers, fruit colours) and place
the ambiguity on purpose: each answer draws its wording (three), a fruit's colour where two are
common, and its closing (none or one of two) with fixed weights 0.55 / 0.30 / 0.15 (two
options: 0.65 / 0.35). Built with ``--set task_set=closed --set prompt_min_tokens=12`` on the
recipe of the time (both are the defaults now); two builds side by side, one per core, with the stdlib share at 0.15 (committed) and at
0. Measured on the target's own greedy answers to the 64 regime prompts (``pair-report``), goal
in brackets:

- committed build (stdlib 0.15): right on 100 % of the 64 requests, every task (>= 80 %); top-10
  mass p5 0.983 (>= 0.85), top-1 p5 0.525 (>= 0.25), width-8 tree forward certificate p5 0.941
  (>= 0.30), ``multiplicative:0.1`` forward p5 0.329 (>= 0.15); top-1 median 0.998 (>= 0.85) and
  mean 0.878 (>= 0.75); EOS on 100 % (>= 90 %); drafter strict-greedy acceptance 93.8 % (>= 75 %);
  assisted generation accepts 2.43 of 4 drafts a round; 12 MB of assets; answers 7.5 steps on
  average. On the first 256 prompts of the prompt set (every task 11-38 times) it is right on all
  256;
- the same without stdlib text: 100 % right (and on 256), top-10 p5 0.988, top-1 p5 0.543, tree:8
  p5 0.990, mult:0.1 p5 0.316, drafter acceptance 96.5 %;
- learning curve (the stdlib-0.15 build, 64 regime prompts): 98 % right at step 800 (every task
  >= 88 %), 100 % from step 1400; the build without stdlib text was at 88 % at step 800
  (``opposite``: 17 %, answering "The opposite of rich is rich.") and 98 % at step 1600.

Of the 64 regime requests, 59 also occur word for word among the training conversations (the world is
small; the other 5 are right too); chapter 7 counts them on every build and reports the others apart.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


#: The chat corpus's task sets (``TrainConfig.task_set``; :func:`companion.tiny_pair.chat_corpus.tasks_of`).
TASK_SETS = ("mixed", "closed")
#: The task set of the default recipe (the committed pair's).
DEFAULT_TASK_SET = "closed"


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one ``Qwen3ForCausalLM`` (embeddings tied, as in Qwen3's small models)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


@dataclass(frozen=True)
class StageSpec:
    """Optimiser schedule of one training stage: AdamW, linear warm-up, cosine decay to ``min_lr_ratio``."""

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained pair, given the corpus and the package versions."""

    seed: int = 0
    vocab_size: int = 4096
    max_files: int | None = None  # None: every selected stdlib file
    seq_len: int = 256  # training window; default prompts (<= 128 tokens) + 128 greedy steps fit
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    target: ModelSpec = ModelSpec(256, 5, 768, 4, 2, 64)
    drafter: ModelSpec = ModelSpec(80, 2, 224, 2, 1, 40)
    target_stage: StageSpec = StageSpec(steps=2000, batch_size=8, lr=3e-3, warmup_steps=60)
    drafter_stage: StageSpec = StageSpec(steps=600, batch_size=8, lr=5e-3, warmup_steps=25)
    save_dtype: str = "float16"
    # One thread: float reductions depend on the thread count, so this makes the result independent of the
    # machine's core count; and on a shared CPU two OpenMP threads that wait on each other run ~5x slower.
    num_threads: int = 1
    eval_max_tokens: int = 65536  # held-out tokens scored for the manifest figures
    n_prompts: int = 256
    prompt_min_tokens: int = 12  # templated user turn (the closed set's requests have ~18 tokens)
    prompt_max_tokens: int = 192
    greedy_prompts: int = 32  # prompts continued greedily for the on-policy figures
    greedy_steps: int = 64
    # Chat corpus (companion.tiny_pair.chat_corpus): conversations generated for training, share of training
    # windows taken from plain stdlib source, prompts of the held-out set and the regime's greedy steps.
    # Which tasks the chat corpus holds (chat_corpus.TASK_SETS): "mixed" (copying, facts and open-ended
    # requests) or "closed" (memorised facts and closed-set rules, with deliberate alternatives).
    task_set: str = DEFAULT_TASK_SET
    chat_conversations: int = 60000
    natural_share: float = 0.15
    answer_only_loss: bool = True  # chat windows: loss on the assistant's answers only (see train.answer_weights)
    eval_conversations: int = 2000
    regime_prompts: int = 64
    regime_steps: int = 128
    # Transformers' assisted generation on the regime prompts: drafts per round (constant schedule).
    assisted_num_tokens: int = 4
    # Copy curriculum (companion.tiny_pair.copy_probe): a first target stage of this many steps on
    # windows of repeated random word sequences, and this share of the chat stage's windows made
    # of them. 0 and 0.0: none (the committed pair).
    copy_warmup_steps: int = 0
    copy_share: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes carried into the manifest

    def __post_init__(self) -> None:
        # Every field in its range (FIELD_RULES), however the config was made: the defaults, --set,
        # a manifest read back by pair-report; so a bad value is one line before any work.
        if self.task_set not in TASK_SETS:
            raise ValueError(f"unknown chat task set {self.task_set!r}; expected one of {', '.join(TASK_SETS)}")
        for key, value in _flat(self).items():
            rule = FIELD_RULES.get(key)
            if rule is not None and not rule.holds(value):
                raise ValueError(f"config {key} must be {rule.describe()}, got {value!r}")
        if self.seq_len > self.max_position_embeddings:
            raise ValueError(f"config seq_len ({self.seq_len}) must be <= max_position_embeddings "
                             f"({self.max_position_embeddings}): a training window must fit the model's positions")
        if self.prompt_max_tokens < self.prompt_min_tokens:
            raise ValueError(f"config prompt_max_tokens ({self.prompt_max_tokens}) must be >= prompt_min_tokens "
                             f"({self.prompt_min_tokens})")
        for name in ("target", "drafter"):
            spec = getattr(self, name)
            if spec.num_attention_heads % spec.num_key_value_heads:
                raise ValueError(f"config {name}.num_attention_heads ({spec.num_attention_heads}) must be a multiple "
                                 f"of {name}.num_key_value_heads ({spec.num_key_value_heads})")
        if not isinstance(self.extra, dict):
            raise ValueError(f"config extra must be a mapping, got {type(self.extra).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """The config a manifest records; ``ValueError`` (one line) for a field this version does not know
        (a newer version's manifest), one it lacks, a group that is not a mapping, or a value out of range."""
        if not isinstance(d, dict):
            raise ValueError(f"a config must be a mapping, got {type(d).__name__}")
        d = dict(d)
        _check_names("config", d, cls)
        for name, spec_cls in (("target", ModelSpec), ("drafter", ModelSpec), ("target_stage", StageSpec),
                               ("drafter_stage", StageSpec)):
            if not isinstance(d[name], dict):
                raise ValueError(f"config {name} must be a mapping of its fields, got {d[name]!r}")
            _check_names(f"config {name}", d[name], spec_cls)
            d[name] = spec_cls(**d[name])
        return cls(**d)


def _check_names(what: str, d: dict[str, Any], cls: type) -> None:
    """``d`` names exactly the fields of ``cls``: a manifest records them all, and one this version does not
    know (or lacks) comes from another version, whose pair this version would describe wrongly."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(map(str, set(d) - set(names)))
    if unknown:
        raise ValueError(f"{what} has fields this version does not know: {', '.join(unknown)} "
                         "(written by another version of companion?)")
    missing = [n for n in names if n not in d]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)} (written by another version of companion?)")


@dataclass(frozen=True)
class FieldRule:
    """What a config field must be: its type (``bool``, ``int``, ``float``, ``str``), a range for numbers
    (``inf``: unbounded; ``lo_open``/``hi_open``: the bound excluded), the choices for text, whether
    ``None`` is allowed, whether an integer must be even."""

    kind: type
    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False
    even: bool = False
    noun: str = ""  # text fields: what a value names ("chat task set"), for "unknown chat task set 'x'"

    def describe(self) -> str:
        """The rule in words, as the refusals print it (``an integer >= 1``, ``a finite number in [0, 1)``)."""
        if self.kind is bool:
            text = "true or false"
        elif self.kind is str:
            text = "one of " + ", ".join(self.choices)
        elif self.kind is int:
            text = (f"an integer >= {int(self.lo)}" if math.isinf(self.hi)
                    else f"an integer in [{int(self.lo)}, {int(self.hi)}]")
            if self.even:
                text = "an even " + text.removeprefix("an ")
        else:
            upper = "inf)" if math.isinf(self.hi) else f"{self.hi:g}{')' if self.hi_open else ']'}"
            text = f"a finite number in {'(' if self.lo_open else '['}{self.lo:g}, {upper}"
        return text + (" or none" if self.optional else "")

    def holds(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.kind is bool:
            return isinstance(value, bool)
        if self.kind is str:
            return isinstance(value, str) and (not self.choices or value in self.choices)
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else (int, float)):
            return False
        if not math.isfinite(value) or (self.even and value % 2):
            return False
        above = self.lo < value if self.lo_open else self.lo <= value
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below


#: A byte-level BPE holds the 256 byte symbols and the pair's 6 special tokens before any merge
#: (companion.tiny_pair.tokenizer.SPECIAL_TOKENS; tests/test_hostile_input.py checks the count).
MIN_VOCAB = 256 + 6
#: Seeds reach torch.manual_seed (a 64-bit integer) with small offsets added (seed + 4 at most).
MAX_SEED = 2**62

_COUNT = FieldRule(int, 1)
_MODEL = {"hidden_size": _COUNT, "num_hidden_layers": _COUNT, "intermediate_size": _COUNT,
          "num_attention_heads": _COUNT, "num_key_value_heads": _COUNT,
          "head_dim": FieldRule(int, 2, even=True)}  # rotary embeddings rotate pairs of dimensions
_STAGE = {"steps": _COUNT, "batch_size": _COUNT, "lr": FieldRule(float, 0.0, lo_open=True),
          "warmup_steps": FieldRule(int, 0), "min_lr_ratio": FieldRule(float, 0.0, 1.0),
          "weight_decay": FieldRule(float, 0.0), "grad_clip": FieldRule(float, 0.0, lo_open=True)}
#: The range of every settable config field, by dotted key (the keys ``--set`` takes).
FIELD_RULES: dict[str, FieldRule] = {
    "seed": FieldRule(int, 0, MAX_SEED),
    "vocab_size": FieldRule(int, MIN_VOCAB),
    "max_files": FieldRule(int, 1, optional=True),
    "seq_len": FieldRule(int, 2),
    "max_position_embeddings": FieldRule(int, 2),
    "rope_theta": FieldRule(float, 0.0, lo_open=True),
    **{f"{group}.{k}": rule for group in ("target", "drafter") for k, rule in _MODEL.items()},
    **{f"{group}.{k}": rule for group in ("target_stage", "drafter_stage") for k, rule in _STAGE.items()},
    "save_dtype": FieldRule(str, choices=("float16", "bfloat16", "float32"), noun="save dtype"),
    "num_threads": _COUNT,
    "eval_max_tokens": _COUNT,
    "n_prompts": _COUNT,
    "prompt_min_tokens": _COUNT,
    "prompt_max_tokens": _COUNT,
    "greedy_prompts": _COUNT,
    "greedy_steps": _COUNT,
    "task_set": FieldRule(str, choices=TASK_SETS, noun="chat task set"),
    "chat_conversations": _COUNT,
    # shares s of the training windows: the other windows are scaled by s / (1 - s), so s < 1
    "natural_share": FieldRule(float, 0.0, 1.0, hi_open=True),
    "answer_only_loss": FieldRule(bool),
    "eval_conversations": _COUNT,
    "regime_prompts": _COUNT,
    "regime_steps": _COUNT,
    "assisted_num_tokens": _COUNT,
    "copy_warmup_steps": FieldRule(int, 0),
    "copy_share": FieldRule(float, 0.0, 1.0, hi_open=True),
}


def _flat(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Every field of ``cfg`` by dotted key, nested specs expanded (``target_stage.steps``)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_flat(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def default_config() -> TrainConfig:
    """The chat recipe (the committed pair predates it: see the module docstring)."""
    return TrainConfig()


def shrunk_config(seed: int = 0) -> TrainConfig:
    """A tiny recipe that runs in seconds: same code path, toy sizes."""
    return TrainConfig(
        seed=seed,
        vocab_size=384,
        max_files=24,
        seq_len=64,
        max_position_embeddings=128,
        target=ModelSpec(64, 2, 128, 2, 1, 32),
        drafter=ModelSpec(32, 1, 64, 2, 1, 16),
        target_stage=StageSpec(steps=40, batch_size=8, lr=1e-2, warmup_steps=4),
        drafter_stage=StageSpec(steps=30, batch_size=8, lr=1e-2, warmup_steps=3),
        eval_max_tokens=4096,
        n_prompts=16,
        prompt_min_tokens=16,
        prompt_max_tokens=48,
        greedy_prompts=4,
        greedy_steps=8,
        chat_conversations=400,
        eval_conversations=80,  # the closed set's answers are short: ~1,900 scored tokens
        regime_prompts=4,
        regime_steps=16,
    )


class ConfigOverrideError(KeyError, ValueError):
    """A ``--set KEY=VALUE`` that names no config field or whose value does not parse.

    A KeyError for callers that catch an unknown key as one, a ValueError for a bad value; its
    text is the plain message (KeyError alone would quote it).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def apply_overrides(cfg: TrainConfig, overrides: dict[str, str]) -> TrainConfig:
    """Return ``cfg`` with ``key=value`` overrides; dotted keys reach nested specs (``target_stage.steps=10``).

    Raises :class:`ConfigOverrideError` (one line naming the key) for an unknown key or a value
    that does not parse as the field's type.
    """
    d = cfg.to_dict()
    for key, raw in overrides.items():
        node = d
        parts = key.split(".")
        for i, p in enumerate(parts[:-1]):
            if p not in node or not isinstance(node[p], dict):
                raise ConfigOverrideError(f"{key}={raw}: unknown config key {key!r}; known: {_known(node, parts[:i])}")
            node = node[p]
        leaf = parts[-1]
        if isinstance(node.get(leaf), dict) and leaf != "extra":
            raise ConfigOverrideError(f"{key}={raw}: config key {key!r} is a group: set one of its fields "
                                      f"({_known(node[leaf], parts)})")
        if leaf not in node or isinstance(node[leaf], dict):
            raise ConfigOverrideError(f"{key}={raw}: unknown config key {key!r}; known: {_known(node, parts[:-1])}")
        node[leaf] = _parse_like(node[leaf], raw, key)
    try:
        return TrainConfig.from_dict(d)
    except ValueError as err:  # values in range one by one that do not fit together (seq_len > positions...)
        given = " ".join(f"{k}={v}" for k, v in overrides.items())
        raise ConfigOverrideError(f"{given}: {err}") from None


def _known(node: dict[str, Any], prefix: list[str]) -> str:
    """The settable keys under ``node``, dotted (nested specs shown as ``name.*``)."""
    lead = "".join(f"{p}." for p in prefix)
    return ", ".join(f"{lead}{k}.*" if isinstance(v, dict) else f"{lead}{k}" for k, v in node.items() if k != "extra")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _parse_like(old: Any, raw: str, key: str) -> Any:
    """``raw`` read as field ``key``'s type and checked against its range (:data:`FIELD_RULES`), so the
    refusal names the range at parse time; ``old`` is the field's current value, quoted in the message."""
    rule = FIELD_RULES.get(key)
    if rule is None:  # a field without a rule (none today): read like its current value, unchecked
        rule = FieldRule(type(old) if isinstance(old, (bool, int, float, str)) else str)
    expected = f"{key}={raw}: expected {rule.describe()} (now {old!r}), got {raw!r}"
    if raw.lower() == "none":
        if rule.optional:
            return None
        raise ConfigOverrideError(expected)
    if rule.kind is bool:
        # Anything but a recognised spelling used to read as False: refuse it instead.
        if raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        raise ConfigOverrideError(f"{key}={raw}: expected true or false, got {raw!r}")
    value: Any
    if rule.kind is int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigOverrideError(expected) from None
    elif rule.kind is float:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigOverrideError(expected) from None
    else:
        value = raw
    if not rule.holds(value):
        if rule.kind is str and rule.noun:
            raise ConfigOverrideError(f"{key}={raw}: unknown {rule.noun} {raw!r}; expected {rule.describe()}")
        raise ConfigOverrideError(expected)
    return value
