"""What a harvest will run on: a preset and its overrides resolved into names and prompts, then loaded.

One path for everything that harvests: ``companion harvest`` (``companion.harvest.cli``) and
the chapters' cache (``companion.book.harvest_cache``) both call :func:`plan_harvest` and
:func:`load_planned`, so a preset means the same models, tokenizer and prompts wherever it is
named. Planning loads no model; every mistake it can find raises :class:`PlanError` with one
line that names the option at fault (the CLI turns it into exit status 2).
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from companion.models import presets as pr
from companion.prompts import ultrachat as uc
from companion.prompts.sets import Prompt


class PlanError(ValueError):
    """A preset or option that cannot be harvested; the message is one line for the user."""


@dataclass(frozen=True)
class HarvestPlan:
    """A harvest's inputs by name, before any model is loaded.

    ``prompts`` is None when they are an UltraChat selection, made by :func:`load_planned` once
    the tokenizer is loaded (the selection measures lengths in it) from ``ultrachat`` (a local
    file or folder; None: the ``datasets`` library) with ``n_prompts``, ``min_prompt_tokens``
    and ``enable_thinking``.
    """

    preset: str
    target: str
    drafter: str | None
    tokenizer: str | None
    prompts: list[Prompt] | None
    prompt_set_name: str
    n_steps: int
    criteria: list[str]
    tree_widths: list[int]
    seed: int
    n_prompts: int | None = None
    min_prompt_tokens: int = 0
    enable_thinking: bool = False
    ultrachat: Path | None = None


def plan_harvest(
    preset: str = "closed-world",
    *,
    target: str | None = None,
    drafter: str | None = None,
    no_drafter: bool = False,
    tokenizer: str | None = None,
    prompts: str | os.PathLike[str] | None = None,
    n_prompts: int | None = None,
    ultrachat: str | os.PathLike[str] | None = None,
    min_prompt_tokens: int | None = None,
    enable_thinking: bool = False,
    n_steps: int | None = None,
    criteria: Sequence[str] | None = None,
    tree_widths: Sequence[int] | None = None,
    seed: int | None = None,
) -> HarvestPlan:
    """Resolve ``preset`` and the overrides (each None: the preset's) into a :class:`HarvestPlan`.

    The embedded pair is named by its folders, so that ``no_drafter`` means none (a preset name
    would bring its drafter); a target given without a drafter harvests no drafter unless the
    preset names a hub drafter.
    """
    from companion.models.loading import local_folder_problem, looks_like_local_path
    from companion.models.tiny_pair import ASSET_DIR

    try:
        spec = pr.get_preset(preset)
    except (KeyError, ValueError) as err:
        raise PlanError(_one_line(err)) from None
    if no_drafter and drafter:
        raise PlanError(f"--drafter {drafter} and --no-drafter contradict each other: give one")
    needed = []
    if spec.embedded and not target:
        needed.append("target")
    embedded_drafter = spec.embedded and not (drafter or no_drafter or target)
    if embedded_drafter:
        needed.append("drafter")
    if spec.prompts == "default" and not prompts:
        needed.append("prompts")
    try:
        pr.check_default_assets(needed)
    except FileNotFoundError as err:
        raise PlanError(_one_line(err)) from None

    target_name = target or (str(ASSET_DIR / "target") if spec.embedded else spec.target)
    if no_drafter:
        drafter_name = None
    elif drafter:
        drafter_name = drafter
    elif spec.embedded:
        drafter_name = str(ASSET_DIR / "drafter") if embedded_drafter else None
    else:
        drafter_name = spec.drafter
    tokenizer_name = tokenizer or spec.tokenizer
    if tokenizer_name is None and not target and spec.embedded:
        tokenizer_name = str(ASSET_DIR / "tokenizer")
    for option, name, kind in (("--target", target, "model"), ("--drafter", drafter, "model"),
                               ("--tokenizer", tokenizer, "tokenizer")):
        if name and looks_like_local_path(name):
            problem = local_folder_problem(name, kind)
            if problem is not None:
                raise PlanError(f"{option} {name}: {problem}; pass a folder written by save_pretrained, "
                                "or a hub id such as Qwen/Qwen3-1.7B")

    chosen = list(criteria) if criteria else list(spec.criteria)
    if len(set(chosen)) != len(chosen):
        raise PlanError(f"--criteria: each criterion once, got {';'.join(chosen)}")
    prompt_list, set_name = _plan_prompts(spec, prompts, n_prompts, ultrachat)
    return HarvestPlan(
        preset=spec.name, target=target_name, drafter=drafter_name, tokenizer=tokenizer_name, prompts=prompt_list,
        prompt_set_name=set_name, n_steps=n_steps if n_steps is not None else spec.n_steps, criteria=chosen,
        tree_widths=list(tree_widths) if tree_widths else list(spec.tree_widths),
        seed=spec.seed if seed is None else seed,
        n_prompts=n_prompts if n_prompts is not None else (spec.n_prompts or 500) if prompt_list is None else None,
        min_prompt_tokens=spec.min_prompt_tokens if min_prompt_tokens is None else min_prompt_tokens,
        enable_thinking=enable_thinking or spec.enable_thinking,
        ultrachat=Path(ultrachat) if ultrachat is not None else None,
    )


def _plan_prompts(spec: pr.Preset, prompts: str | os.PathLike[str] | None, n_prompts: int | None,
                  ultrachat: str | os.PathLike[str] | None) -> tuple[list[Prompt] | None, str]:
    """The prompts (None for an UltraChat selection, made once the tokenizer is loaded) and the set's name."""
    from companion.prompts.sets import load_prompts

    if not prompts and spec.prompts == "ultrachat":
        if ultrachat is not None and not Path(ultrachat).exists():
            raise PlanError(f"--ultrachat {ultrachat}: no such file or folder")
        if ultrachat is None and importlib.util.find_spec("datasets") is None:
            raise PlanError(f"the {spec.name} preset draws its prompts from {uc.ULTRACHAT}, which needs the "
                            "`datasets` library (pip install datasets) or local files: --ultrachat PATH, or "
                            "--prompts FILE")
        return None, f"{uc.ULTRACHAT}:{uc.ULTRACHAT_SPLIT}"
    source = prompts or spec.prompts
    try:
        loaded = load_prompts(source)
    except FileNotFoundError:
        from companion.prompts.sets import PRESET_PROMPT_FILES, PRESET_PROMPT_MIXES

        raise PlanError(f"--prompts {source}: no such file (nor a prompt set name: "
                        f"{', '.join(sorted(PRESET_PROMPT_FILES | PRESET_PROMPT_MIXES))})") from None
    except (ValueError, OSError) as err:
        raise PlanError(_one_line(err)) from None
    name = str(source)
    if n_prompts is not None:
        if n_prompts > len(loaded):
            raise PlanError(f"--n-prompts {n_prompts}: the prompt set {name} has only {len(loaded)} prompts")
        loaded = loaded[:n_prompts]
        name = f"{name}[:{n_prompts}]"
    return loaded, name


def load_planned(plan: HarvestPlan, *, device: Any = None, dtype: Any = None) -> tuple[Any, Any, Any, list[Prompt]]:
    """``(target, drafter or None, tokenizer, prompts)`` of ``plan``, loaded on ``device`` in ``dtype``.

    Raises what :func:`companion.models.loading.load_pair` raises (``WeightsUnavailableError``,
    ``ValueError`` on mismatched tokenizers, ``OSError``) and
    :class:`companion.prompts.ultrachat.PromptsUnavailableError`.
    """
    from companion.models.loading import load_pair, load_tokenizer

    prompts = plan.prompts
    if prompts is None:  # UltraChat: the selection measures lengths in the target's tokenizer
        tokenizer = load_tokenizer(plan.tokenizer or plan.target)
        prompts = uc.select_ultrachat_prompts(
            uc.ultrachat_rows(plan.ultrachat), tokenizer, n=plan.n_prompts or 500,
            min_tokens=plan.min_prompt_tokens, seed=plan.seed, enable_thinking=plan.enable_thinking)
    # A model preset named as its own drafter (smollm2) brings the drafter the preset resolves to.
    own = plan.drafter is not None and plan.drafter == plan.target
    target, drafter, tokenizer = load_pair(plan.target, None if own else (plan.drafter or False), plan.tokenizer,
                                           device=device, dtype=dtype)
    if getattr(tokenizer, "chat_template", None):
        # the chat requests in the answering model's own template (the file holds SmolLM2's)
        from companion.prompts.families import retemplated

        prompts = retemplated(prompts, tokenizer)
    return target, drafter, tokenizer, prompts


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
