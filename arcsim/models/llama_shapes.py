"""The LLaMA decoders' shapes (arcsim.models.llama builds them), apart from torch: the zoo lists them without it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    intermediate: int
    heads: int
    layers: int
    vocab: int = 32_000
    norm_eps: float = 1e-6
    rope_theta: float = 10_000.0


# GaLore's configs/llama_{60m,130m,350m,1b}.json (hidden_size, intermediate_size, num_attention_heads,
# num_hidden_layers; vocab 32,000, RMSNorm ε 1e-6)
LLAMA_SHAPES = {
    "llama_60m": LlamaShape(512, 1376, 8, 8),
    "llama_130m": LlamaShape(768, 2048, 12, 12),
    "llama_350m": LlamaShape(1024, 2736, 16, 24),
    "llama_1b": LlamaShape(2048, 5461, 32, 24),
}
