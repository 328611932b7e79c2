"""A model of your own, for `--model examples/my_model.py:build` (docs/your-model.md).

``build`` returns a small decoder-only transformer that maps token ids to next-token logits, so it trains
on a built-in token dataset (``--dataset python-text``). ``build_hf`` returns a HuggingFace LLaMA from a
config (no weights, no download; needs ``pip install 'arcsim[hf]'``) and ``batches`` the dict batches it
takes, so its forward returns the loss itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


class TinyDecoder(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.blocks(self.embed(tokens), mask=causal, is_causal=True))


def build(vocab: int = 32_000, width: int = 128, depth: int = 2, heads: int = 4) -> nn.Module:
    return TinyDecoder(vocab, width, depth, heads)


def build_hf(width: int = 128, depth: int = 2, vocab: int = 32_000) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=depth,
                                        num_attention_heads=4, vocab_size=vocab, tie_word_embeddings=False))


def batches(batch_size: int, seed: int, length: int = 64, vocab: int = 32_000) -> Iterator[dict[str, torch.Tensor]]:
    """Endless dict batches as a HuggingFace causal LM takes them (here random ids; read your own data)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        ids = torch.randint(vocab, (batch_size, length), generator=gen)
        yield {"input_ids": ids, "labels": ids}
