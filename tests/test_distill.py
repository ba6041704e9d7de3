"""SmolLM2's drafter recipe (companion.models.distill): the loss, the data, determinism and resume, refusals.

The recipe's stages run here on a toy target (seconds); the committed drafter is measured in
chapter 8 and by `companion build-drafter`."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from companion import cli
from companion.models.distill.config import DrafterConfig, apply_overrides
from companion.models.distill.data import harvest_answers, load_examples
from companion.models.distill.train import agreement, batch_plan, coarse_kl, make_drafter, train
from companion.harvest.toy import byte_tokenizer
from companion.prompts.sets import Prompt

TEXTS = ["def f(x):\n    return x + 1\n", "for i in range(3):\n    print(i)\n", "import os\nprint(os.sep)\n",
         "class A:\n    pass\n", "x = [1, 2, 3]\ny = sum(x)\n", "while True:\n    break\n"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_llama(vocab: int = 384, hidden: int = 48, layers: int = 3) -> LlamaForCausalLM:
    """A random Llama target with tied embeddings, as SmolLM2 has (the drafter copies Llama layers)."""
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=0, pad_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(40.0)  # peaked distributions, so that greedy answers vary
    return model.eval()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    target, tok = toy_llama(), byte_tokenizer()
    prompts = [Prompt(f"p{i}", t, -1, "test") for i, t in enumerate(TEXTS)]
    out = tmp_path_factory.mktemp("answers") / "answers"
    harvest_answers(target, tok, prompts, out, answer_steps=12, batch_size=3, progress=False)
    return target, tok, load_examples(out, tok, prompts)


SMALL = DrafterConfig(init_layers="2,0", shortlist_size=200, epochs=3, batch_size=2, warmup_steps=2, lr=1e-2,
                      checkpoint_every=2)


def test_coarse_kl_is_the_kl_of_the_coarsened_distributions() -> None:
    """Against a direct computation: p and q summed outside the top set into one bucket, then KL."""
    g = torch.Generator().manual_seed(0)
    logits_p, logits = torch.randn(5, 40, generator=g) * 2, torch.randn(5, 40, generator=g)
    p = logits_p.double().softmax(-1)
    top_probs, top_ids = p.topk(8, -1)
    tail = 1 - top_probs.sum(-1)
    got = float(coarse_kl(logits, top_ids, top_probs.float(), tail.float()))
    q = logits.double().softmax(-1)
    ref = []
    for r in range(5):
        qt = q[r, top_ids[r]]
        pc = torch.cat([top_probs[r], tail[r:r + 1]])
        qc = torch.cat([qt, 1 - qt.sum().reshape(1)])
        ref.append(float((pc * (pc / qc).log()).sum()))
    assert got == pytest.approx(sum(ref) / 5, rel=1e-5)
    # Zero when the drafter is the target, and never negative.
    assert float(coarse_kl(logits_p, top_ids, top_probs.float(), tail.float())) == pytest.approx(0.0, abs=1e-5)


def test_examples_line_up_with_the_harvest(toy) -> None:
    target, tok, examples = toy
    assert len(examples) == len(TEXTS)
    for e in examples:
        prompt_len = len(tok(TEXTS[int(e.prompt_id[1:])], add_special_tokens=False)["input_ids"])
        assert e.n_prompt == prompt_len and e.ids.numel() == e.n_prompt + e.n_answer
        # The answer is the target's greedy text: at every answer step, the target's argmax of the prefix.
        with torch.no_grad():
            logits = target(e.ids[None, :-1]).logits[0, e.n_prompt - 1:]
        assert logits.argmax(-1).tolist() == e.ids[e.n_prompt:].tolist()
        assert torch.allclose(e.top_probs.sum(-1) + e.tail, torch.ones(e.n_answer), atol=1e-5)


def test_training_lowers_the_loss_and_resumes_to_the_same_bits(toy, tmp_path) -> None:
    target, tok, examples = toy
    a = make_drafter(SMALL, target)
    before = agreement(a, examples, tok.pad_token_id)
    log = train(a, examples, SMALL, checkpoint=None, pad_id=tok.pad_token_id, progress=False)
    after = agreement(a, examples, tok.pad_token_id)
    assert log["steps"] == len(batch_plan(len(examples), SMALL)) == 9
    assert after["coarse_kl"] < before["coarse_kl"], (before, after)
    # Interrupted after 4 steps (a checkpoint is saved every 2), then resumed: the same weights, bit for bit.
    ckpt = tmp_path / "train.pt"
    b = make_drafter(SMALL, target)
    short = dataclasses.replace(SMALL)
    plan = batch_plan(len(examples), short)

    class Stop(Exception):
        pass

    calls = {"n": 0}
    original = torch.optim.AdamW.step

    def stop_after_four(self, *args, **kwargs):
        if calls["n"] == 4:
            raise Stop
        calls["n"] += 1
        return original(self, *args, **kwargs)

    torch.optim.AdamW.step = stop_after_four
    try:
        with pytest.raises(Stop):
            train(b, examples, short, checkpoint=ckpt, pad_id=tok.pad_token_id, progress=False)
    finally:
        torch.optim.AdamW.step = original
    assert torch.load(ckpt, weights_only=False)["step"] == 4
    c = make_drafter(SMALL, target)
    train(c, examples, short, checkpoint=ckpt, pad_id=tok.pad_token_id, progress=False, log=lambda m: None)
    for (name, x), (_, y) in zip(a.state_dict().items(), c.state_dict().items()):
        assert torch.equal(x, y), f"{name} differs after resuming"
    assert len(plan) == 9


def test_a_checkpoint_of_another_recipe_is_refused(toy, tmp_path) -> None:
    target, tok, examples = toy
    ckpt = tmp_path / "train.pt"
    train(make_drafter(SMALL, target), examples[:2], dataclasses.replace(SMALL, epochs=1), checkpoint=ckpt,
          pad_id=tok.pad_token_id, progress=False)
    with pytest.raises(ValueError, match="another recipe or data set"):
        train(make_drafter(SMALL, target), examples[:2], SMALL, checkpoint=ckpt, pad_id=tok.pad_token_id,
              progress=False)


def test_the_drafter_starts_as_the_chosen_layers_of_the_target_with_its_embedding_frozen(toy) -> None:
    target, tok, examples = toy
    d = make_drafter(SMALL, target)
    for mine, theirs in zip(d.model.layers, (2, 0)):
        ref = target.model.layers[theirs].state_dict()
        assert all(torch.equal(v, ref[k]) for k, v in mine.state_dict().items())
    assert torch.equal(d.model.norm.weight, target.model.norm.weight)
    emb = target.get_input_embeddings().weight
    assert torch.equal(d.model.embed_tokens.weight, emb) and not d.model.embed_tokens.weight.requires_grad
    # Training moves the layers, never the shared embedding (it is not stored with the drafter).
    layer_before = d.model.layers[0].mlp.up_proj.weight.clone()
    train(d, examples[:2], dataclasses.replace(SMALL, epochs=1), checkpoint=None, pad_id=tok.pad_token_id,
          progress=False)
    assert torch.equal(d.model.embed_tokens.weight, emb)
    assert not torch.equal(d.model.layers[0].mlp.up_proj.weight, layer_before)


def test_every_layer_in_order_and_a_full_shortlist_is_the_target_itself(toy) -> None:
    """An oracle for the copying and the head: all of the target's layers, in order, scoring every id."""
    target, _, examples = toy
    cfg = dataclasses.replace(SMALL, init_layers="0,1,2", shortlist_size=target.config.vocab_size)
    d = make_drafter(cfg, target).eval()
    ids = examples[0].ids[None]
    with torch.no_grad():
        assert torch.allclose(d(ids).logits, target(ids).logits, atol=1e-5, rtol=0)


def test_the_drafter_recipe_refuses_a_target_it_cannot_copy(toy) -> None:
    target, _, _ = toy
    with pytest.raises(ValueError, match=r"init_layers '0,3': the target has layers 0 to 2"):
        make_drafter(dataclasses.replace(SMALL, init_layers="0,3"), target)
    with pytest.raises(ValueError, match="shortlist_size 999 is larger than the target's vocabulary"):
        make_drafter(dataclasses.replace(SMALL, shortlist_size=999), target)
    from companion.harvest.toy import toy_target

    with pytest.raises(ValueError, match="copies the layers of a Llama target; this target is a qwen3"):
        make_drafter(SMALL, toy_target(vocab=384, hidden=48, layers=2))


@pytest.mark.parametrize("override,message", [
    ("epochs=0", "epochs must be a whole number >= 1, got 0"),
    ("lr=nan", "lr must be a finite number"),
    ("lr=-1", "lr must be a finite number"),
    ("save_dtype=int8", "save_dtype must be one of bfloat16, float16, float32, got 'int8'"),
    ("shortlist_size=abc", "--set shortlist_size=abc: expected int"),
    ("shortlist_size=0", "shortlist_size must be a whole number >= 1, got 0"),
    ("init_layers=0,0", "init_layers must be distinct layer numbers >= 0 separated by commas"),
    ("init_layers=first", "init_layers must be distinct layer numbers >= 0 separated by commas"),
    ("seed=99999999999999999999999", "seed must be a whole number >= 0 and < 2**63"),
    ("bogus=1", "--set bogus: no such knob"),
])
def test_bad_recipe_knobs_are_one_line_before_any_work(override, message, tmp_path, capsys) -> None:
    key, _, value = override.partition("=")
    with pytest.raises(ValueError, match=None) as err:
        apply_overrides(DrafterConfig(), {key: value})
    assert message in str(err.value) and "\n" not in str(err.value)
    status = cli.main(["build-drafter", "--out", str(tmp_path / "d"), "--set", override, "--no-progress"])
    err_text = capsys.readouterr().err.strip()
    assert status == 2 and message in err_text and err_text.count("\n") == 0
    assert list(tmp_path.iterdir()) == [], "nothing is written for a refused recipe"


def test_build_drafter_refuses_an_out_that_is_a_file(tmp_path, capsys) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert cli.main(["build-drafter", "--out", str(f), "--no-progress"]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_default_recipe_fits_the_asset_budget() -> None:
    """The committed drafter is at most 25 MB: its own parameters (SmolLM2's layer shape) x bytes of the save dtype."""
    from companion.models.distill.config import init_layer_list

    cfg = DrafterConfig()
    h, f, heads, kv, head_dim = 576, 1536, 9, 3, 64  # SmolLM2-135M-Instruct's config.json
    per_layer = 2 * h * heads * head_dim + 2 * h * kv * head_dim + 3 * h * f + 2 * h
    params = len(init_layer_list(cfg)) * per_layer + h + 1
    assert params * 2 <= 25e6, f"{params:,} parameters in bfloat16 is {params * 2 / 1e6:.1f} MB"


def _data_benchmark():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_drafter_data.py"
    spec = importlib.util.spec_from_file_location("bench_drafter_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_data_benchmark_fits_its_trend_line_and_refuses_bad_lists() -> None:
    bench = _data_benchmark()
    a, b = bench._trend([37, 74, 148, 296], [0.25 + 0.02 * math.log2(n) for n in (37, 74, 148, 296)])
    assert (a, b) == pytest.approx((0.25, 0.02), abs=1e-12), (a, b)
    assert bench._numbers("297,37,74,37", "sizes", 1, 297) == [37, 74, 297]
    for text, words in (("0,5", "between 1 and 297"), ("x", "whole numbers"), ("", "whole numbers")):
        with pytest.raises(ValueError, match=words):
            bench._numbers(text, "sizes", 1, 297)


def test_the_data_benchmark_refuses_a_folder_without_answers_in_one_line(tmp_path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_drafter_data.py"), "--answers", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == "", (run.returncode, run.stdout, run.stderr)
    assert run.stderr.strip().count("\n") == 0 and "no harvest manifest" in run.stderr, run.stderr


def test_the_held_out_share_is_the_last_tenth_and_matches_the_committed_build() -> None:
    from companion.assets import SMOLLM2_DRAFTER_DIR
    from companion.models.distill.build import split_validation

    assert split_validation(list(range(10))) == (list(range(9)), [9])
    assert split_validation([1]) == ([], [1])  # at least one held out
    data = json.loads((SMOLLM2_DRAFTER_DIR / "manifest.json").read_text())["data"]
    fit, val = split_validation(list(range(data["requests"])))
    assert (len(fit), len(val)) == (data["fit_requests"], data["validation_requests"]), data
    assert fit + val == list(range(data["requests"]))
