"""LLaMA decoders as the ARC-Top-K and GaLore C4 experiments train them (GaLore's ``configs/llama_*.json``).

Defined here, as the ViT is, rather than built with transformers: the zoo then needs no optional
package, builds in a second, and its parameter names are transformers' own (``model.layers.0.self_attn.
q_proj.weight`` …), so a test loads a ``LlamaForCausalLM``'s weights into it and requires the same logits.
Pre-norm blocks with RMSNorm, rotary position embeddings (θ = 10,000, halves rotated), SwiGLU MLPs, no
biases, untied input and output embeddings; weights drawn N(0, 0.02²), norms at one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arcsim.models.llama_shapes import LLAMA_SHAPES, LlamaShape


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.heads, self.head_dim = shape.heads, shape.hidden // shape.heads
        self.q_proj = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.k_proj = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.v_proj = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.o_proj = nn.Linear(shape.hidden, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(n, t, self.heads, self.head_dim).transpose(1, 2)

        q, k = _rotate(heads(self.q_proj), cos, sin), _rotate(heads(self.k_proj), cos, sin)
        out = F.scaled_dot_product_attention(q, k, heads(self.v_proj), is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(n, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.self_attn = Attention(shape)  # registered in transformers' order (DDP buckets follow it)
        self.mlp = SwiGLU(shape)
        self.input_layernorm = RMSNorm(shape.hidden, shape.norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden, shape.norm_eps)


class Llama(nn.Module):
    """Token ids [N, T] → next-token logits [N, T, vocab]."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.shape = shape
        self.model = Decoder(shape)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        head_dim = shape.hidden // shape.heads
        inv_freq = 1.0 / shape.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.float32)
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]  # a buffer
        angles = torch.outer(positions, inv_freq.float())
        cos, sin = (torch.cat((f(angles), f(angles)), dim=-1).to(self.lm_head.weight.dtype)
                    for f in (torch.cos, torch.sin))
        x = self.model.embed_tokens(tokens)
        for block in self.model.layers:
            x = block(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def llama(name: str, vocab: int | None = None) -> Llama:
    """A zoo LLaMA by name (``llama_60m`` …); ``vocab`` for a tokenizer of another size."""
    shape = LLAMA_SHAPES[name]
    return Llama(shape if vocab is None else LlamaShape(**{**shape.__dict__, "vocab": vocab}))
