"""Exponential moving average of the trainable weights."""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class EMA:
    def __init__(self, params: list[nn.Parameter], decay: float):
        self.params = params
        self.decay = decay
        self.shadow = [p.detach().clone() for p in params]

    @torch.no_grad()
    def update(self) -> None:
        for s, p in zip(self.shadow, self.params):
            s.lerp_(p.detach(), 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self):
        """Temporarily put the EMA weights into the live parameters."""
        backup = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, s in zip(self.params, self.shadow):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, backup):
                    p.copy_(b)
