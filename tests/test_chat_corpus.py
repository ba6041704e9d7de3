"""The rule-generated chat corpus: format, determinism, and the answers' correctness checked by parsing."""
from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.tiny_pair import chat_corpus as cc
from companion.tiny_pair import corpus as corpus_mod
from companion.tiny_pair.tokenizer import CHAT_TEMPLATE, EOS_TOKEN, train_bpe


@pytest.fixture(scope="module")
def material() -> cc.Material:
    return cc.make_material(corpus_mod.load_corpus(max_files=24))


@pytest.fixture(scope="module")
def tokenizer(material: cc.Material):
    texts = cc.conversations(material, 0, 300, "train", "mixed") + [f.text for f in corpus_mod.load_corpus(max_files=8)]
    return train_bpe(texts, 600)


def _items(s: str) -> list[str]:
    return [x.strip() for x in re.split(r", |; | \| |\n", s) if x.strip()]


def test_generate_is_a_pure_function_of_seed_index_and_stream(material: cc.Material) -> None:
    assert cc.generate(material, 3, 17, "train", "mixed") == cc.generate(material, 3, 17, "train", "mixed")
    a = [cc.generate(material, 0, i, "train", "mixed") for i in range(50)]
    assert a != [cc.generate(material, 1, i, "train", "mixed") for i in range(50)]
    assert a != [cc.generate(material, 0, i, "prompts", "mixed") for i in range(50)]


def test_every_task_occurs_and_conversations_have_the_chat_shape(material: cc.Material) -> None:
    seen = set()
    for i in range(3000):
        task, q, a = cc.generate(material, 0, i, "train", "mixed")
        seen.add(task)
        text = cc.conversation(q, a)
        assert text.startswith("<|im_start|>user\n") and text.endswith(a + EOS_TOKEN)
        assert text.count("<|im_start|>") == 2 and text.count(EOS_TOKEN) == 2
    assert seen == set(cc.TASKS)


def test_template_renders_exactly_the_training_prompt(tokenizer, material: cc.Material) -> None:
    assert tokenizer.chat_template == CHAT_TEMPLATE
    for i in range(20):
        _, q, a = cc.generate(material, 0, i, "train", "mixed")
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                 add_generation_prompt=True)
        assert rendered == cc.user_turn(q)
        full = tokenizer.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                             tokenize=False)
        assert full == cc.conversation(q, a) + "\n"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_prompt_tokens_are_a_prefix_of_the_conversation_tokens(tokenizer, material: cc.Material, i: int) -> None:
    """Decoding starts where training saw the answer start: no token straddles the prompt's end."""
    _, q, a = cc.generate(material, 0, i, "train", "mixed")
    p = tokenizer(cc.user_turn(q), add_special_tokens=False)["input_ids"]
    full = tokenizer(cc.conversation(q, a), add_special_tokens=False)["input_ids"]
    assert full[: len(p)] == p
    assert full[-1] == tokenizer.convert_tokens_to_ids(EOS_TOKEN) == tokenizer.eos_token_id


def _by_task(material: cc.Material, name: str, n: int = 40) -> list[tuple[str, str]]:
    fn = cc.TASKS[name][0]
    return [fn(random.Random(f"test:{name}:{i}"), material) for i in range(n)]


def _strip_lead(a: str) -> str:
    return a.split(": ", 1)[1] if ": " in a and a.index(": ") < 30 else a


def test_list_transformations_are_correct(material: cc.Material) -> None:
    for q, a in _by_task(material, "upper"):
        src = _items(q.split(": ", 1)[1] if ": " in q else q.split("\n", 1)[1])
        assert _items(_strip_lead(a)) == [x.upper() for x in src]
    for q, a in _by_task(material, "reverse"):
        assert _items(_strip_lead(a)) == _items(q.split(": ", 1)[1])[::-1]
    for q, a in _by_task(material, "sort"):
        got = _items(_strip_lead(a))
        assert got == sorted(_items(q.split(": ", 1)[1]), key=str.lower)
    for q, a in _by_task(material, "number"):
        lines = [ln for ln in a.split("\n") if re.match(r"\d+\. ", ln)]
        assert [ln.split(". ", 1)[1] for ln in lines] == _items(q.split(": ", 1)[1])
        assert [int(ln.split(".")[0]) for ln in lines] == list(range(1, len(lines) + 1))


def test_arithmetic_and_conversions_are_correct(material: cc.Material) -> None:
    for q, a in _by_task(material, "arith", 200):
        x, op, y = re.search(r"(\d+) ([-+x]) (\d+)", q).groups()
        want = {"+": int(x) + int(y), "-": int(x) - int(y), "x": int(x) * int(y)}[op]
        assert int(re.findall(r"-?\d+", a)[-1]) == want
    factors = {(s, d): f for s, d, f in cc.UNITS}
    for q, a in _by_task(material, "convert", 200):
        m = re.search(r"(\d+) (\w+) (?:to|in) (\w+)", q) or re.search(r"many (\w+) are in (\d+) (\w+)", q)
        if m.re.pattern.startswith("many"):
            dst, x, src = m.groups()
        else:
            x, src, dst = m.groups()
        assert int(re.findall(r"\d+", a)[-1]) == int(x) * factors[(src, dst)]


def test_lookup_answers_the_asked_field(material: cc.Material) -> None:
    for q, a in _by_task(material, "lookup", 100):
        key = re.search(r"(?:What is the|value of|the field) (\w+)", q).group(1)
        pairs = dict(re.findall(r'"?(\w+)"?\s*[:=]\s*"?([\w ]+?)"?(?=[,;}\n]|$)', q))
        assert a.endswith(pairs[key]) or a.endswith(pairs[key] + ".")


def test_next_day_or_month_is_the_calendar_successor(material: cc.Material) -> None:
    import calendar

    days, months = list(calendar.day_name), list(calendar.month_name)[1:]  # an independent oracle
    for q, a in _by_task(material, "next_name", 100):
        (x,) = [w for w in re.findall(r"\w+", q) if w in days + months]
        seq = days if x in days else months
        assert (" day " in q) == (seq is days), q
        assert a.rstrip(".").split()[-1] == seq[(seq.index(x) + 1) % len(seq)], (q, a)


def test_capital_answers_name_the_country_and_its_capital(material: cc.Material) -> None:
    table = dict(cc.CAPITALS)
    assert len(table) == len(cc.CAPITALS) and len(set(table.values())) == len(table)  # one capital per country
    for q, a in _by_task(material, "capital", 100):
        country = next(c for c in table if c in q)
        assert a.rstrip(".").endswith(table[country]), (q, a)
        assert sum(cap in a for cap in table.values()) == 1, a  # no other capital is named


def test_chat_prompts_respect_lengths_and_are_deterministic(tokenizer, material: cc.Material) -> None:
    ps = cc.build_chat_prompts(material, tokenizer, 0, 12, 40, 90, task_set="mixed")
    assert len(ps) == 12 and ps == cc.build_chat_prompts(material, tokenizer, 0, 12, 40, 90, task_set="mixed")
    for p in ps:
        assert 40 <= p.n_tokens <= 90 == 90
        assert p.n_tokens == len(tokenizer(p.text, add_special_tokens=False)["input_ids"])
        assert p.text.endswith(cc.GENERATION_PREFIX) and p.source.startswith("chat:")
    with pytest.raises(ValueError, match="were asked for"):
        cc.build_chat_prompts(material, tokenizer, 0, 5, 5000, 6000, max_tries=50, task_set="mixed")


def test_chat_prompts_are_distinct_even_when_the_generator_repeats(tokenizer) -> None:
    unit = cc.CodeUnit("f", "def f(x):\n    return x", "Return the argument unchanged.", ("f",))
    one = cc.Material((unit,), tuple(f"name{i}" for i in range(12)), (unit,))  # every code request is the same
    generated = [cc.user_turn(cc.generate(one, 0, i, "prompts", "mixed")[1]) for i in range(400)]
    assert len(set(generated)) < len(generated)  # the stream itself repeats
    ps = cc.build_chat_prompts(one, tokenizer, 0, 60, 1, 400, task_set="mixed")
    assert len({p.text for p in ps}) == len(ps) == 60
    assert [p.text for p in ps] == [generated[p.line] for p in ps]


def test_valid_answers_hold_the_generators_answer_in_every_wording(material: cc.Material) -> None:
    """``tasks_report.valid_answers``: the generated answer itself is valid, so is every other wording
    of the same content, with or without the closing sentence; another request's answer is not."""
    from companion.tiny_pair.tasks_report import answer_is_right, valid_answers

    seen: set[str] = set()
    for i in range(400):
        task, question, answer = cc.generate(material, 0, i, "prompts", "mixed")
        got_task, valid = valid_answers(material, 0, i, "prompts", "mixed")
        assert got_task == task and answer.strip() in valid, (task, answer, valid)
        assert answer_is_right(task, answer, valid, "mixed")
        closer = cc.CLOSERS.get(task, "")
        if closer:
            base = answer[: -len(closer)] if answer.endswith(closer) else answer
            assert base.strip() in valid and (base + closer).strip() in valid
        other_task, other_q, other = cc.generate(material, 0, i + 1000, "prompts", "mixed")
        if other_task == task and other.strip() not in valid:
            assert not answer_is_right(task, other, valid, "mixed")
        seen.add(task)
    assert {"upper", "lookup", "capital", "extract"} <= seen
    # extract: the same (field, value) pairs in the task's other layout are right, other values are not
    i = next(i for i in range(400) if cc.generate(material, 0, i, "prompts", "mixed")[0] == "extract")
    _, _, answer = cc.generate(material, 0, i, "prompts", "mixed")
    _, valid = valid_answers(material, 0, i, "prompts", "mixed")
    pairs = re.findall(r'"?([a-z]+)"?\s*:\s*"?([^",\n}]*)"?', answer)
    lines = "\n".join(f"{k}: {v}" for k, v in pairs)
    braces = "{" + ", ".join(f'"{k}": "{v}"' for k, v in pairs) + "}"
    assert answer_is_right("extract", lines, valid, "mixed") and answer_is_right("extract", braces, valid, "mixed")
    assert not answer_is_right("extract", lines.replace(pairs[0][1], pairs[0][1] + "x"), valid, "mixed")


def test_pair_task_table_refuses_another_standard_library(monkeypatch) -> None:
    """The requests are regenerated from the interpreter's standard library: on another one the
    table is not computed (None), rather than scored against different requests."""
    from companion.assets import DEFAULT_PAIR_DIR
    from companion.tiny_pair import tasks_report

    assert tasks_report.COPY_TASKS <= set(cc.TASKS)
    monkeypatch.setattr(corpus_mod, "corpus_digest", lambda files: "0" * 64)
    assert tasks_report.pair_task_table(DEFAULT_PAIR_DIR, n_prompts=2) is None
