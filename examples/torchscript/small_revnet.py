#!/usr/bin/python3
"""Writes small_revnet.pt, the model of examples/fmnist_torchscript.yaml: your
own PyTorch model, trained by stagewise. Run with Debian's python3-torch:

    /usr/bin/python3 examples/torchscript/small_revnet.py

What stagewise needs (docs/torchscript.md): a scripted module whose attribute
`blocks` is an nn.ModuleList, in order, the last block returning one logit per
class. A block that also exports `inverse(y)` is reversible: PETRA and the
rebuild mode rebuild its input from its output instead of storing it.
"""
import os
import torch
from torch import nn


class Coupling(nn.Module):
    """Additive coupling: (x1, x2) -> (x2 + F(x1), x1), inverted exactly."""

    def __init__(self, channels: int):
        super().__init__()
        half = channels // 2
        self.f = nn.Sequential(nn.Conv2d(half, half, 3, padding=1, bias=False),
                               nn.BatchNorm2d(half), nn.ReLU(),
                               nn.Conv2d(half, half, 3, padding=1, bias=False),
                               nn.BatchNorm2d(half))

    def forward(self, x):
        x1, x2 = x.chunk(2, 1)
        return torch.cat([x2 + self.f(x1), x1], 1)

    @torch.jit.export
    def inverse(self, y):
        y1, y2 = y.chunk(2, 1)
        return torch.cat([y2, y1 - self.f(y2)], 1)


def conv_bn_relu(cin: int, cout: int, stride: int):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class Head(nn.Module):
    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(x.mean([2, 3]))


class SmallRevNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.blocks = nn.ModuleList([
            conv_bn_relu(1, 16, 1),   # 28x28
            Coupling(16), Coupling(16),
            conv_bn_relu(16, 32, 2),  # 14x14
            Coupling(32), Coupling(32),
            conv_bn_relu(32, 64, 2),  # 7x7
            Coupling(64),
            Head(64, classes),
        ])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


if __name__ == "__main__":
    torch.manual_seed(0)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "small_revnet.pt")
    torch.jit.script(SmallRevNet()).save(path)
    print(f"wrote {path}")
