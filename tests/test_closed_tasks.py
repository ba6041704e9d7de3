"""The "closed" chat task set that wrote the closed-world pair's prompts: answers right by independent
oracles, a closed vocabulary, its deliberate alternatives drawn with their stated weights and all
recognised as valid answers; the committed tokenizer's template is the corpus's chat format; and
the committed target answers its held-out requests right, as its manifest says."""
from __future__ import annotations

import calendar
import collections
import functools
import random
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.models.tiny_pair import chat_corpus as cc
from companion.models.tiny_pair import closed_tasks as ct
from companion.models.tiny_pair import corpus as corpus_mod
from companion.models.tiny_pair.tasks_report import answer_is_right, valid_answers

DAYS, MONTHS = list(calendar.day_name), list(calendar.month_name)[1:]  # oracles independent of the module


@pytest.fixture(scope="module")
def material() -> cc.Material:
    return cc.make_material(corpus_mod.load_corpus(max_files=24))


def _by_task(material: cc.Material, name: str, n: int = 200) -> list[tuple[str, str]]:
    fn = ct.CLOSED_TASKS[name][0]
    return [fn(random.Random(f"closed-test:{name}:{i}"), material) for i in range(n)]


def test_every_closed_task_occurs_in_the_chat_shape(material: cc.Material) -> None:
    seen = collections.Counter()
    for i in range(3000):
        task, q, a = cc.generate(material, 0, i, "train", "closed")
        seen[task] += 1
        text = cc.conversation(q, a)
        assert text.startswith("<|im_start|>user\n") and text.endswith(a + "<|im_end|>")
    assert set(seen) == set(ct.CLOSED_TASKS)
    total = sum(w for _, w in ct.CLOSED_TASKS.values())
    for name, (_, w) in ct.CLOSED_TASKS.items():  # sampled in proportion to the table's weights
        assert abs(seen[name] / 3000 - w / total) < 0.025, (name, seen[name], w / total)


def test_unknown_task_set_is_refused(material: cc.Material) -> None:
    with pytest.raises(ValueError, match="unknown chat task set 'open'"):
        cc.generate(material, 0, 0, "train", "open")


def test_closed_is_the_only_task_set_and_the_default(material: cc.Material) -> None:
    closed = [cc.generate(material, 0, i, "train", "closed") for i in range(50)]
    assert closed == [cc.generate(material, 0, i) for i in range(50)]  # "closed" is the default
    assert {t for t, _, _ in closed} <= set(ct.CLOSED_TASKS) and cc.TASK_SETS == ("closed",)
    with pytest.raises(ValueError, match="unknown chat task set 'mixed'; expected one of closed"):
        cc.tasks_of("mixed")  # the earlier recipe's set, retired with it


@pytest.fixture(scope="module")
def committed_tokenizer():
    from transformers import AutoTokenizer

    from companion.models.tiny_pair import ASSET_DIR

    return AutoTokenizer.from_pretrained(ASSET_DIR / "tokenizer")


def test_the_committed_template_renders_the_corpus_format(committed_tokenizer, material: cc.Material) -> None:
    """The pair's tokenizer writes a request as the generator does, so a templated prompt is a training prompt."""
    from companion.models.tiny_pair.tokenizer import CHAT_TEMPLATE, EOS_TOKEN

    tok = committed_tokenizer
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == EOS_TOKEN
    for i in range(20):
        _, q, a = cc.generate(material, 0, i, "train")
        assert tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                       add_generation_prompt=True) == cc.user_turn(q)
        full = tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                       tokenize=False)
        assert full == cc.conversation(q, a) + "\n"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_prompt_tokens_are_a_prefix_of_the_conversation_tokens(committed_tokenizer, i: int) -> None:
    """Decoding starts where training saw the answer start: no token straddles the prompt's end."""
    tok = committed_tokenizer
    _, q, a = cc.generate(_material(), 0, i, "train")
    p = tok(cc.user_turn(q), add_special_tokens=False)["input_ids"]
    full = tok(cc.conversation(q, a), add_special_tokens=False)["input_ids"]
    assert full[: len(p)] == p and full[-1] == tok.eos_token_id


def test_the_committed_target_answers_its_held_out_requests_right() -> None:
    """The manifest's claim (right on every regime prompt), on the first 24 prompts of the pair's set,
    each regenerated from its ``line`` and judged against every answer its task allows."""
    import json

    from companion.models.loading import load_pair
    from companion.prompts.sets import load_prompts
    from companion.models.tiny_pair import ASSET_DIR
    from companion.models.tiny_pair.tasks_report import greedy_answer, request_of

    seed = json.loads((ASSET_DIR / "manifest.json").read_text())["config"]["seed"]
    target, _, tok = load_pair("closed-world")
    eos = sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")})
    wrong = []
    for p in load_prompts("default")[:24]:  # the pair's own prompt set
        task, valid = valid_answers(_material(), seed, p.line)
        assert p.source == f"chat:{task}" and cc.user_turn(request_of(p.text)) == p.text, p.prompt_id
        tokens, _ = greedy_answer(target, tok, p.text, 64, eos)
        assert tokens and tokens[-1] in eos, f"{p.prompt_id}: no end of turn within 64 steps"
        answer = tok.decode(tokens[:-1], skip_special_tokens=True)
        if not answer_is_right(task, answer, valid):
            wrong.append((p.prompt_id, answer))
    assert not wrong, wrong


def test_closed_tasks_ignore_the_standard_library_material(material: cc.Material) -> None:
    """No request or answer draws on stdlib code: the same conversation under another material."""
    unit = cc.CodeUnit("f", "def f(x):\n    return x", "Return the argument unchanged.", ("f",))
    other = cc.Material((unit,), ("name",), (unit,))
    for i in range(300):
        assert cc.generate(material, 0, i, "eval", "closed") == cc.generate(other, 0, i, "eval", "closed")


def _last_word(a: str) -> str:
    # Letters or digits: a month-number answer can be just "2." (hypothesis found i = 151312).
    return re.findall(r"[A-Za-z0-9]+", a.split("\n\n")[0])[-1]


def test_calendar_answers_are_right(material: cc.Material) -> None:
    for q, a in _by_task(material, "next_name"):
        (x,) = [w for w in re.findall(r"\w+", q) if w in DAYS + MONTHS]
        seq = DAYS if x in DAYS else MONTHS
        step = 1 if ("after" in q or "next" in q) else -1
        want = seq[(seq.index(x) + step) % len(seq)]
        assert want in a and [w for w in re.findall(r"\w+", a) if w in seq and w != x] == [want], (q, a)
    for q, a in _by_task(material, "month_number"):
        if m := re.search(r"number (\d+)|month (\d+) of", q):
            k = int(m.group(1) or m.group(2))
            assert MONTHS[k - 1] in a, (q, a)
        else:
            (month,) = [w for w in re.findall(r"\w+", q) if w in MONTHS]
            assert int(re.findall(r"\d+", a)[-1]) == MONTHS.index(month) + 1, (q, a)
    for q, a in _by_task(material, "days_in_month"):
        (month,) = [w for w in re.findall(r"\w+", q) if w in MONTHS]
        days = calendar.monthrange(2023, MONTHS.index(month) + 1)[1]  # a common year
        assert int(re.findall(r"\d+", a)[0]) == days, (q, a)
        assert ("leap year" in a) == (month == "February"), (q, a)


def test_sequences_continue_with_the_asked_number_of_items(material: cc.Material) -> None:
    for q, a in _by_task(material, "sequence"):
        n = int(re.search(r"(\d+) more|next (\d+)", q).group(1) or re.search(r"next (\d+)", q).group(1))
        shown = q.split("items", 1)[1].lstrip(": ?").rstrip(", .").split(", ")
        shown = [s for s in shown if s != "..."]
        seq = DAYS if shown[0] in DAYS else MONTHS if shown[0] in MONTHS else list(string.ascii_uppercase)
        start = seq.index(shown[-1]) + 1
        want = [seq[(start + j) % len(seq)] for j in range(n)]
        body = a.split("\n\n")[0]
        assert body.split(": ")[-1].split(", ") == want, (q, a)


def test_fact_answers_are_right(material: cc.Material) -> None:
    capitals = dict(cc.CAPITALS)
    for q, a in _by_task(material, "capital"):
        country = next(c for c in capitals if re.search(rf"\b{c}\b", q) or capitals[c] in q.split(" is the")[0])
        assert capitals[country] in a or country in a
        assert sum(cap in a for cap in capitals.values()) <= 1 and (capitals[country] in a or country + "." in a)
    opposite = dict(ct.OPPOSITES) | {o: w for w, o in ct.OPPOSITES}
    assert len(opposite) == 2 * len(ct.OPPOSITES)  # every word in one pair only
    for q, a in _by_task(material, "opposite"):
        w = re.search(r"opposite of (\w+)|antonym of \"(\w+)\"", q)
        w = w.group(1) or w.group(2)
        assert _last_word(a).lower() == opposite[w], (q, a)
    plurals = dict(ct.PLURALS)
    for q, a in _by_task(material, "plural"):
        w = re.search(r"plural of (\w+)|form of \"(\w+)\"|one (\w+)\?", q)
        w = w.group(1) or w.group(2) or w.group(3)
        assert _last_word(a).lower() == plurals[w], (q, a)
    for q, a in _by_task(material, "animal"):
        animal = re.search(r"(?:does an? |baby |young )(\w+)", q).group(1)
        sound, young = {x: (s, y) for x, s, y in ct.ANIMAL_FACTS}[animal]
        assert _last_word(a) == (young if ("baby" in q or "young" in q) else sound), (q, a)
    colors = dict(ct.FRUIT_COLORS)
    for q, a in _by_task(material, "fruit_color"):
        fruit = re.search(r"ripe (\w+)", q).group(1)
        assert _last_word(a) in colors[fruit], (q, a)


def test_category_answers_name_the_one_right_category(material: cc.Material) -> None:
    members = [w for ws in ct.CATEGORIES.values() for w in ws]
    assert len(members) == len(set(members))  # no word in two categories
    for q, a in _by_task(material, "category"):
        x = next(w for w in members if re.search(rf"\b{w}\b", q.split(":")[0] if "category" in q else q))
        cat = next(c for c, ws in ct.CATEGORIES.items() if x in ws)
        assert _last_word(a) == cat and re.search(rf"\b{cat}\b", q), (q, a)


def test_answers_use_a_closed_vocabulary(material: cc.Material) -> None:
    """Every word of every answer comes from the module's tables or a few dozen template words."""
    words = collections.Counter()
    for i in range(6000):
        words.update(re.findall(r"[A-Za-z]+", cc.generate(material, 0, i, "train", "closed")[2]))
    assert len(words) < 450, len(words)


@functools.lru_cache(maxsize=1)
def _material() -> cc.Material:  # not a fixture: hypothesis would print all of it on a failure
    return cc.make_material(corpus_mod.load_corpus(max_files=24))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10**6))
def test_valid_answers_enumerate_every_alternative(i: int) -> None:
    """The generated answer is valid; so is every combination of the alternatives it chose among
    (3 wordings x the fruit's colours x 3 closings); an answer with other content is not."""
    material = _material()
    task, q, answer = cc.generate(material, 0, i, "prompts", "closed")
    got, valid = valid_answers(material, 0, i, "prompts", "closed")
    assert got == task and answer.strip() in valid
    assert answer_is_right(task, answer, valid, "closed")
    n_content = len(dict(ct.FRUIT_COLORS)[re.search(r"ripe (\w+)", q).group(1)]) if task == "fruit_color" else 1
    assert len(valid) == 3 * n_content * len(ct.CLOSINGS), (q, sorted(valid))
    assert not any(ch >= "\ue000" for v in valid for ch in v)  # every placeholder was replaced
    other_task, _, other = cc.generate(material, 0, i + 1, "prompts", "closed")
    body, other_body = answer.split("\n\n")[0], other.split("\n\n")[0]
    if other_task != task or _last_word(body) != _last_word(other_body):
        if other.strip() not in valid:
            assert not answer_is_right(task, other, valid, "closed")


def test_alternatives_are_drawn_with_their_weights(material: cc.Material) -> None:
    """The closing and the wording of each answer follow :data:`W3` (a chat model's few plausible
    continuations, most likely one clear)."""
    closings = collections.Counter()
    first_words = collections.defaultdict(collections.Counter)
    for i in range(6000):
        task, _, a = cc.generate(material, 0, i, "train", "closed")
        tail = a[a.find("\n\n"):] if "\n\n" in a else ""
        closings[tail] += 1
        if task == "opposite":
            first_words[task][a.split()[0]] += 1
    freq = [closings[c] / 6000 for c in ct.CLOSINGS]
    assert all(abs(f - w) < 0.02 for f, w in zip(freq, ct.W3)), freq
    opp = first_words["opposite"]
    n = sum(opp.values())
    assert abs(opp["The"] / n - ct.W3[0]) < 0.05 and abs(opp["It"] / n - ct.W3[1]) < 0.05, opp


def test_weighted_choice_checks_its_weights() -> None:
    with pytest.raises(ValueError, match="2 weights for 3 options"):
        cc._answer(random.Random(0), "a", "b", "c", weights=(0.5, 0.5))
