"""SmolLM2's drafter recipe (companion.distill): the loss, the data, determinism and resume, refusals.

The recipe's stages run here on a toy target (seconds); the committed drafter is measured in
chapter 8 and by `companion build-drafter`."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from companion import cli
from companion.distill.config import DrafterConfig, apply_overrides
from companion.distill.data import harvest_answers, load_examples
from companion.distill.train import agreement, batch_plan, coarse_kl, make_drafter, train
from companion.harvest.toy import toy_pair
from companion.prompts import Prompt

TEXTS = ["def f(x):\n    return x + 1\n", "for i in range(3):\n    print(i)\n", "import os\nprint(os.sep)\n",
         "class A:\n    pass\n", "x = [1, 2, 3]\ny = sum(x)\n", "while True:\n    break\n"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    target, _, tok = toy_pair(vocab=384, hidden=48, layers=2)
    prompts = [Prompt(f"p{i}", t, -1, "test") for i, t in enumerate(TEXTS)]
    out = tmp_path_factory.mktemp("answers") / "answers"
    harvest_answers(target, tok, prompts, out, answer_steps=12, batch_size=3, progress=False)
    return target, tok, load_examples(out, tok, prompts)


SMALL = DrafterConfig(hidden_size=16, num_hidden_layers=1, intermediate_size=32, num_attention_heads=2,
                      num_key_value_heads=1, epochs=3, batch_size=2, warmup_steps=2, lr=1e-2, checkpoint_every=2)


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


def test_the_embedding_starts_from_the_targets_principal_directions(toy) -> None:
    target, _, _ = toy
    d = make_drafter(SMALL, target)
    emb = target.get_input_embeddings().weight.double()
    got = d.get_input_embeddings().weight.double()
    # Its columns span the target embedding's leading right-singular directions: projecting back loses
    # exactly the energy of the others.
    _, s, vh = torch.linalg.svd(emb, full_matrices=False)
    k = SMALL.hidden_size
    coef = torch.linalg.lstsq(got, emb @ vh[:k].T).solution
    assert torch.allclose(got @ coef, emb @ vh[:k].T, atol=1e-6)
    assert got.std().item() == pytest.approx(d.config.initializer_range, rel=1e-4)
    assert d.config.vocab_size == target.config.vocab_size and d.config.tie_word_embeddings


@pytest.mark.parametrize("override,message", [
    ("epochs=0", "epochs must be a whole number >= 1, got 0"),
    ("lr=nan", "lr must be a finite number"),
    ("lr=-1", "lr must be a finite number"),
    ("save_dtype=int8", "save_dtype must be one of bfloat16, float16, float32, got 'int8'"),
    ("hidden_size=abc", "--set hidden_size=abc: expected int"),
    ("seed=99999999999999999999999", "seed must be a whole number >= 0 and < 2**63"),
    ("num_attention_heads=5", "hidden_size (192) must be a multiple of num_attention_heads (5)"),
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
    """The committed drafter is at most 25 MB: parameters x bytes of the save dtype."""
    cfg = DrafterConfig()
    v, h, f, layers = 49152, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    head_dim = h // cfg.num_attention_heads
    per_layer = h * h * 2 + 2 * h * cfg.num_key_value_heads * head_dim + 3 * h * f + 2 * h
    params = v * h + layers * per_layer + h
    assert params * 2 <= 25e6, f"{params:,} parameters in bfloat16 is {params * 2 / 1e6:.1f} MB"
