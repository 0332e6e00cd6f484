"""Rewards by short name, or a dotted path to a user's Reward class or function."""

from diffrl.registry import Registry

REWARDS = Registry(
    "reward",
    {
        "ocr": "diffrl.rewards.ocr:OCRReward",
        "remote": "diffrl.rewards.remote:RemoteReward",
    },
)
