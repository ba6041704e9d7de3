"""Small random target/drafter pairs and a byte-level tokenizer: for tests and benchmarks, no downloads.

:func:`byte_tokenizer` is a byte-level BPE with no merges (every string round-trips, one token
per byte, ids 2..257; ``<|endoftext|>`` = 0, ``<|pad|>`` = 1, left padding). :func:`toy_pair`
builds a random Qwen3 target and a drafter that is a noisy copy of it (so the two distributions
are close, as a distilled drafter's are, and certificates are met on some steps and missed on
others), and :func:`save_pair` writes them as ``save_pretrained`` folders that
:func:`companion.models.loading.load_pair` and ``companion harvest --target/--drafter`` load.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

EOS, PAD = "<|endoftext|>", "<|pad|>"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A 258-token byte-level tokenizer (no merges) with eos/pad, left padding."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {EOS: 0, PAD: 1} | {ch: i + 2 for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   clean_up_tokenization_spaces=False, model_max_length=1 << 30)
    fast.padding_side = "left"
    return fast


# A Qwen3-style chat template (ChatML turns; the assistant turn opens with an empty thinking
# block when thinking is off, as Qwen3's own template does), written for the stand-ins.
QWEN3_STYLE_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """:func:`byte_tokenizer` with a Qwen3-style chat template (the markers are spelled in bytes)."""
    tok = byte_tokenizer()
    tok.chat_template = QWEN3_STYLE_CHAT_TEMPLATE
    return tok


def toy_target(vocab: int = 512, hidden: int = 64, layers: int = 2, *, seed: int = 0, logit_scale: float = 1.5,
               max_positions: int = 512) -> Qwen3ForCausalLM:
    """A random Qwen3 target with peaked, varied distributions (``logit_scale`` sharpens them)."""
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                         max_position_embeddings=max_positions, tie_word_embeddings=False, eos_token_id=0,
                         pad_token_id=1, bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        # Output-row norms spread over a decade: a few frequent tokens, a long tail (as real LMs).
        # Untied embeddings: tied large norms would make every token predict itself.
        g = torch.Generator().manual_seed(seed + 1)
        spread = torch.exp(torch.empty(vocab, 1).uniform_(-1.2, 1.2, generator=g))
        model.lm_head.weight.mul_(spread * logit_scale / (0.02 * hidden ** 0.5))
    return model.eval()


def noisy_copy(model: Qwen3ForCausalLM, noise: float = 0.1, *, seed: int = 1) -> Qwen3ForCausalLM:
    """A copy of ``model`` with every weight perturbed by ``noise`` times its own standard deviation."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            scale = p.std() if p.numel() > 1 else p.abs()
            p.add_(torch.randn(p.shape, generator=g) * noise * scale)
    return out.eval()


def toy_pair(vocab: int = 512, hidden: int = 64, layers: int = 2, *, seed: int = 0, noise: float = 0.1,
             logit_scale: float = 1.5) -> tuple[Qwen3ForCausalLM, Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """``(target, drafter, tokenizer)``: a random target, its noisy copy, the byte tokenizer."""
    target = toy_target(vocab, hidden, layers, seed=seed, logit_scale=logit_scale)
    return target, noisy_copy(target, noise, seed=seed + 7), byte_tokenizer()


def save_pair(folder: str | Path, target: Qwen3ForCausalLM, drafter: Qwen3ForCausalLM | None,
              tokenizer: PreTrainedTokenizerFast) -> dict[str, Path]:
    """Write ``target/``, ``drafter/`` (each with the tokenizer, as hub repos have) and ``tokenizer/``."""
    root = Path(folder)
    paths = {"target": root / "target", "tokenizer": root / "tokenizer"}
    target.save_pretrained(paths["target"])
    tokenizer.save_pretrained(paths["target"])
    tokenizer.save_pretrained(paths["tokenizer"])
    if drafter is not None:
        paths["drafter"] = root / "drafter"
        drafter.save_pretrained(paths["drafter"])
        tokenizer.save_pretrained(paths["drafter"])
    return paths
