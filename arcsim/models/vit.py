"""ViT-B/16 with torchvision's module names and parameter shapes (pre-norm encoder, class token)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim),
                                 nn.Dropout(0.0))

    def forward(self, x: Tensor) -> Tensor:
        y = self.ln_1(x)
        x = x + self.self_attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    def __init__(self, tokens: int, depth: int, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, tokens, dim).normal_(std=0.02))
        self.layers = nn.Sequential()
        for i in range(depth):
            self.layers.add_module(f"encoder_layer_{i}", EncoderBlock(dim, heads, hidden))
        self.ln = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(self.layers(x + self.pos_embedding))


class VisionTransformer(nn.Module):
    def __init__(self, image_size: int = 224, patch: int = 16, in_channels: int = 3, classes: int = 1000,
                 depth: int = 12, dim: int = 768, heads: int = 12, hidden: int = 3072) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image size {image_size} is not a multiple of the patch size {patch}")
        self.patch = patch
        self.conv_proj = nn.Conv2d(in_channels, dim, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder = Encoder((image_size // patch) ** 2 + 1, depth, dim, heads, hidden)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(dim, classes))

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])


def vit_b_16(image_size: int = 224, in_channels: int = 3, classes: int = 1000) -> VisionTransformer:
    return VisionTransformer(image_size, 16, in_channels, classes)
