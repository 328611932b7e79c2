"""Small models for real data on a CPU: an MLP and a two-convolution CNN."""

from __future__ import annotations

from torch import Tensor, nn


class MLP(nn.Module):
    def __init__(self, in_features: int, classes: int, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """conv(3×3, 16) → conv(3×3, 32) → 2×2 max-pool → fc(64) → fc(classes)."""

    def __init__(self, in_channels: int, side: int, classes: int) -> None:
        super().__init__()
        pooled = side // 2
        self.features = nn.Sequential(nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * pooled * pooled, 64), nn.ReLU(),
                                        nn.Linear(64, classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))

