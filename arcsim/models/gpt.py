"""A GPT-2-small-shaped decoder (12 layers, 768 wide, 12 heads, 50,257 tokens, tied output embedding)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        n, t, c = x.shape
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in self.c_attn(x).split(c, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(n, t, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(dim, 4 * dim))
        self.mlp.add_module("act", nn.GELU(approximate="tanh"))
        self.mlp.add_module("c_proj", nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 50257, context: int = 1024, depth: int = 12, dim: int = 768,
                 heads: int = 12) -> None:
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.shape[1] > self.context:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the context of {self.context}")
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt2_small(vocab: int = 50257) -> GPT:
    return GPT(vocab)
