"""Rewards by short name, or a dotted path to a user's Reward class or function."""

from diffrl.core.registry import Registry

REWARDS = Registry(
    "reward",
    {
        "ocr": "diffrl.rewards.ocr:OCRReward",
        "judge": "diffrl.rewards.judge:JudgeReward",
        "pickscore": "diffrl.rewards.pickscore:PickScore",
        "clip_score": "diffrl.rewards.clip_score:ClipScore",
        "aesthetic": "diffrl.rewards.aesthetic:Aesthetic",
        "hpsv2": "diffrl.rewards.hpsv2:HPSv2",
        "image_reward": "diffrl.rewards.image_reward:ImageReward",
        "jpeg_compressibility": "diffrl.rewards.jpeg:JpegCompressibility",
        "jpeg_incompressibility": "diffrl.rewards.jpeg:JpegIncompressibility",
        "remote": "diffrl.rewards.remote:RemoteReward",
        "clap": "diffrl.rewards.clap:ClapScore",
        "openai_judge": "diffrl.rewards.openai_judge:OpenAIJudge",
    },
)
