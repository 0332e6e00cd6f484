import pytest
import torch

from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.train.actor import Actor


@pytest.fixture(scope="module")
def actor():
    """A tiny LoRA actor with EMA and an optimizer state with moments (one per test module)."""
    cfg = load_config({"model": {"path": "random", "lora": {"rank": 2}}, "train": {"ema_decay": 0.9}})
    actor = Actor(load_family(cfg), cfg)
    actor.params[0].grad = torch.ones_like(actor.params[0])
    actor.optimizer.step()  # an optimizer state with moments
    return actor
