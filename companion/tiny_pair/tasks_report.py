"""Per task: does the embedded target do what it is asked, and what do its uncertain steps look like?

For each held-out prompt of the pair's prompt set (``source = "chat:<task>"``, ``line`` its index in
the generator's "prompts" stream), the target answers greedily (at most ``max_steps`` tokens, to its
first end-of-turn token). Two things are measured:

* **content exact-match**: the answer, stripped of surrounding white space, is one the generator
  could have written for that request. The request is regenerated from ``(seed, line)``; every
  alternative the task offers is a valid answer (the "mixed" set's wordings, each with or without
  its closing sentence; the "closed" set's wordings, closings and open choices of content), so
  only what the request fixes decides. "mixed" ``extract`` answers are compared as their
  ``(field, value)`` pairs, in either of the task's two layouts;
* **the regime of its steps**, on the target's own greedy answer: top-1 probability, top-10 mass,
  the width-8 greedy-tree forward certificate and the ``multiplicative:0.1`` forward certificate
  (the 5th percentile of each is what the uncertain steps look like).
"""
from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from companion.prompts import Prompt
from companion.tiny_pair import chat_basics as basics
from companion.tiny_pair import chat_corpus as chat_mod
from companion.tiny_pair.config import DEFAULT_TASK_SET

#: Tasks whose answer carries items of the request into the answer (repeats, reorders, reformats or
#: looks them up): they need copying from the prompt, not only memorised facts or a template.
COPY_TASKS = frozenset({"upper", "lower", "reverse", "sort", "number", "lookup", "extract", "to_json", "table",
                        "filter", "acronym"})

#: The statistics of each task's steps, by name (quantiles in percent).
STEP_STATS = ("top1_p5", "top1_median", "top10_p5", "tree8_fwd_p5", "mult01_fwd_p5")


def valid_answers(material: chat_mod.Material, seed: int, line: int, stream: str = "prompts",
                  task_set: str = DEFAULT_TASK_SET) -> tuple[str, set[str]]:
    """``(task, answers)``: every answer the generator could write to request ``line`` of ``stream``.

    The task is rerun with the same random stream; each wording or content choice (``_answer``) is
    replaced by a placeholder of its own after drawing the same random numbers, so the content is the
    generator's own; then every placeholder is replaced by each of its options, the last choice first
    (a choice's options may contain the placeholders of earlier choices, never of later ones).
    """
    options: list[tuple[str, tuple[str, ...]]] = []
    original = basics._answer

    def recording(rng: random.Random, house: str, *others: str, weights=None) -> str:
        original(rng, house, *others, weights=weights)  # the same draws, so everything after it is the same
        placeholder = chr(0xE000 + len(options))  # private-use characters: never in a generated text
        options.append((placeholder, (house, *others)))
        return placeholder

    basics._answer = recording
    try:
        task, question, answer = chat_mod.generate(material, seed, line, stream, task_set)
    finally:
        basics._answer = original
    closer = chat_mod.closer_of(task_set, task)
    base = answer[: -len(closer)] if closer and answer.endswith(closer) else answer
    bases = {base}
    for placeholder, opts in reversed(options):
        bases = {b.replace(placeholder, o) for b in bases for o in opts}
    out = {b.strip() for b in bases} | {(b + closer).strip() for b in bases}
    return task, out


_PAIR = re.compile(r'"?([A-Za-z_]+)"?\s*:\s*"?([^",\n}]*)"?')


def _fields(text: str) -> list[tuple[str, str]]:
    return [(k.strip(), v.strip()) for k, v in _PAIR.findall(text)]


def answer_is_right(task: str, answer: str, valid: set[str], task_set: str = DEFAULT_TASK_SET) -> bool:
    """The greedy answer (white space stripped) against the task's valid answers (see the module docstring)."""
    text = answer.strip()
    if text in valid:
        return True
    if task_set == "mixed" and task == "extract":  # two layouts of the same (field, value) pairs
        closer = chat_mod.closer_of(task_set, task).strip()
        body = text[: -len(closer)].strip() if closer and text.endswith(closer) else text
        return any(_fields(body) == _fields(v[: -len(closer)] if closer and v.endswith(closer) else v) for v in valid)
    return False


def task_table(target: Any, tokenizer: Any, prompts: Sequence[Prompt], material: chat_mod.Material, seed: int,
               max_steps: int = 128, eos_ids: Sequence[int] | None = None,
               answers: list[dict[str, Any]] | None = None, task_set: str = DEFAULT_TASK_SET) -> dict[str, dict[str, Any]]:
    """``{task: {"n", "exact_match", "top1_p5", ...}}`` over ``prompts`` (and ``"all"`` over every step).

    ``task_set``: the generator's task set the prompts were drawn from (the build's ``TrainConfig.task_set``).
    ``answers``: if given, one ``{"task", "request", "answer", "right"}`` per prompt is appended to it."""
    from companion.kl_certificates import certificates

    eos = sorted(set(eos_ids if eos_ids is not None else [tokenizer.eos_token_id]))
    per: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for prompt in prompts:
        if not prompt.source.startswith("chat:") or prompt.line is None:
            continue
        task, valid = valid_answers(material, seed, int(prompt.line), "prompts", task_set)
        gen, logits = greedy_answer(target, tokenizer, prompt.text, max_steps, eos)
        text = tokenizer.decode(gen[:-1] if gen and gen[-1] in eos else gen, skip_special_tokens=True)
        probs = torch.softmax(logits, -1)
        top = probs.topk(10, dim=-1).values
        certs = certificates(logits, ["multiplicative:0.1"], "forward", tree_widths=[8], from_logits=True)
        rows = {"top1": top[:, 0].numpy(), "top10": top.sum(-1).numpy(),
                "tree8": certs[("tree:8", "forward")].numpy(),
                "mult01": certs[("multiplicative:0.1", "forward")].numpy()}
        right = answer_is_right(task, text, valid, task_set)
        if answers is not None:
            answers.append({"task": task, "request": request_of(prompt.text), "answer": text.strip(), "right": right})
        for key in (task, "all"):
            per[key]["right"].append(right)
            for name, values in rows.items():
                per[key][name].append(values)
    out: dict[str, dict[str, Any]] = {}
    for key, d in sorted(per.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        cat = {name: np.concatenate(d[name]) for name in ("top1", "top10", "tree8", "mult01")}
        out[key] = {
            "n": len(d["right"]),
            "steps": int(cat["top1"].size),
            "exact_match": float(np.mean(d["right"])),
            "top1_p5": float(np.percentile(cat["top1"], 5)),
            "top1_median": float(np.median(cat["top1"])),
            "top10_p5": float(np.percentile(cat["top10"], 5)),
            "tree8_fwd_p5": float(np.percentile(cat["tree8"], 5)),
            "mult01_fwd_p5": float(np.percentile(cat["mult01"], 5)),
        }
    return out


def format_task_table(table: dict[str, dict[str, Any]]) -> list[str]:
    """Text lines: one row per task, then all steps."""
    head = f"  {'task':<16}{'n':>4}{'steps':>7}{'right':>8}{'top1 p5':>9}{'median':>8}{'top10 p5':>10}" \
           f"{'tree:8 p5':>11}{'mult:0.1 p5':>13}"
    lines = [head]
    for task, r in table.items():
        lines.append(f"  {task:<16}{r['n']:>4}{r['steps']:>7}{r['exact_match']:>8.0%}{r['top1_p5']:>9.3f}"
                     f"{r['top1_median']:>8.3f}{r['top10_p5']:>10.3f}{r['tree8_fwd_p5']:>11.3f}{r['mult01_fwd_p5']:>13.3f}")
    return lines


def request_of(templated: str) -> str:
    """The user's words of a templated prompt (between the user header and the end of the turn)."""
    head = f"{chat_mod.IM_START}user\n"
    body = templated[len(head):] if templated.startswith(head) else templated
    return body.split(chat_mod.IM_END, 1)[0]


def pair_task_table(pair_dir: Any, n_prompts: int | None = None,
                    answers: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]] | None:
    """:func:`task_table` of a saved pair on the first ``n_prompts`` of its prompt set (default: the
    regime's), or None when this interpreter's standard library is not the pair's training
    corpus (the requests, some of whose items come from it, could not be regenerated exactly).

    Each entry of ``answers`` also says whether its request occurs word for word among the
    build's training conversations (``"seen"``): held-out prompts are fresh draws of the
    generator, but a closed world has few distinct requests."""
    from pathlib import Path

    from companion.models import load_pair
    from companion.tiny_pair import corpus as corpus_mod
    from companion.tiny_pair.evaluate import torch_threads
    from companion.tiny_pair.pair_folder import pair_config, read_pair_manifest, read_pair_prompts

    pair_dir = Path(pair_dir)
    manifest = read_pair_manifest(pair_dir)
    cfg = pair_config(manifest, pair_dir / "manifest.json")
    files = corpus_mod.load_corpus(max_files=cfg.max_files)
    if corpus_mod.corpus_digest(files) != manifest["corpus"]["digest_sha256"]:
        return None
    train, held = corpus_mod.split_corpus(files)
    target, _, tok = load_pair(pair_dir / "target", False, device="cpu", dtype=torch.float32)
    prompts = read_pair_prompts(pair_dir)[: n_prompts or cfg.regime_prompts]
    eos = sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")})
    # the pair's own thread count (one): a model this small only loses from a second thread, and
    # a lot when another process holds the other core
    kept: list[dict[str, Any]] = []
    with torch_threads(cfg.num_threads):
        table = task_table(target, tok, prompts, chat_mod.make_material(held), cfg.seed, cfg.regime_steps, eos,
                           kept, cfg.task_set)
    if answers is not None:
        # the closed set's tasks draw nothing from the stdlib material (tests/test_closed_tasks.py), so the
        # held-out one regenerates its training requests as well, without parsing the training split
        material = chat_mod.make_material(held if cfg.task_set == "closed" else train)
        seen = training_requests(material, cfg.seed, cfg.chat_conversations, cfg.task_set)
        answers.extend({**a, "seen": a["request"] in seen} for a in kept)
    return table


def training_requests(material: chat_mod.Material, seed: int, n: int, task_set: str) -> set[str]:
    """The user's words of the ``n`` training conversations of a build (``material``: its training split)."""
    return {chat_mod.generate(material, seed, i, "train", task_set)[1] for i in range(n)}


def greedy_answer(target: Any, tokenizer: Any, prompt_text: str, max_steps: int,
                  eos: Sequence[int]) -> tuple[list[int], torch.Tensor]:
    """``(tokens, logits)``: the target's greedy answer to ``prompt_text`` (at most ``max_steps`` tokens, up to and
    including its first token in ``eos``) and, teacher-forced in one forward, its float64 logits at each of them."""
    ids = tokenizer(prompt_text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    with torch.no_grad():
        seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_steps, do_sample=False,
                              eos_token_id=list(eos), pad_token_id=tokenizer.pad_token_id)
        gen = seq[0, n:].tolist()
        hits = [i for i, t in enumerate(gen) if t in eos]
        gen = gen[: hits[0] + 1] if hits else gen
        logits = target(input_ids=seq[:, : n + len(gen)]).logits[0, n - 1:-1].double()
    return gen, logits


def uncertain_steps(target: Any, tokenizer: Any, prompt_text: str, max_steps: int = 128,
                    eos_ids: Sequence[int] | None = None, threshold: float = 0.9, k: int = 3) -> list[dict[str, Any]]:
    """The steps of the target's greedy answer to ``prompt_text`` whose top-1 probability is below ``threshold``.

    One ``{"step", "before", "top"}`` per such step: its index in the answer, the answer's text up to
    it, and its ``k`` likeliest tokens as ``(text, probability)`` pairs (``softmax`` of the logits in
    float64), likeliest first. The answer ends at its first end-of-turn token (``eos_ids``).
    """
    eos = sorted(set(eos_ids if eos_ids is not None else [tokenizer.eos_token_id]))
    gen, logits = greedy_answer(target, tokenizer, prompt_text, max_steps, eos)
    probs = torch.softmax(logits, -1)
    out = []
    for step in range(len(gen)):
        top = probs[step].topk(k)
        if float(top.values[0]) < threshold:
            out.append({"step": step, "before": tokenizer.decode(gen[:step], skip_special_tokens=True),
                        "top": [(tokenizer.decode([int(i)]), float(v)) for v, i in zip(top.values, top.indices)]})
    return out
