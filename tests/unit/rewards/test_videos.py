"""Videos ``(B, 3, F, H, W)`` through the image-oriented rewards: an image reward scores each
frame and each video gets the mean; a video reward gets the videos whole (the eval grids' stills:
``train/test_evaluate.py``)."""

from __future__ import annotations

import torch

from diffrl.config import RewardConfig
from diffrl.rewards.base import Reward, RewardSet

CALLS: list[tuple[tuple[int, ...], list[str]]] = []


def mean_pixel(images, prompts, metadata):
    """An image reward (the signature of a user's function)."""
    CALLS.append((tuple(images.shape), list(prompts)))
    return images.mean(dim=(1, 2, 3)).tolist()


def frame_count(images, prompts, metadata):
    return [float(images.shape[2])] * len(images)


frame_count.video = True


def wrong_length(images, prompts, metadata):
    return [0.0] * len(prompts[:1])


class VideoMean(Reward):
    video = True

    def __call__(self, images, prompts, metadata):
        return images.mean(dim=(1, 2, 3, 4))


def videos() -> torch.Tensor:
    """Two videos of three frames whose frames have the brightness 0.1 f + 0.5 v."""
    v = torch.zeros(2, 3, 3, 4, 4)
    for i in range(2):
        for f in range(3):
            v[i, :, f] = 0.1 * f + 0.5 * i
    return v


def rewards(*names: str) -> RewardSet:
    return RewardSet([RewardConfig(name=f"tests.unit.rewards.test_videos:{n}") for n in names])


def test_an_image_reward_scores_each_frame_and_averages_per_video():
    CALLS.clear()
    out = rewards("mean_pixel")(videos(), ["a", "b"], [{"k": 1}, {"k": 2}])
    torch.testing.assert_close(out.total, torch.tensor([0.1, 0.6]))
    assert CALLS == [((6, 3, 4, 4), ["a", "a", "a", "b", "b", "b"])]  # video-major, prompt per frame
    images = videos()[:, :, 0]  # images pass through unchanged
    torch.testing.assert_close(
        rewards("mean_pixel")(images, ["a", "b"], [{}, {}]).total, torch.tensor([0.0, 0.5])
    )


def test_a_video_reward_gets_whole_videos():
    out = rewards("frame_count", "VideoMean")(videos(), ["a", "b"], [{}, {}])
    torch.testing.assert_close(out.per_reward[next(iter(out.per_reward))], torch.tensor([3.0, 3.0]))
    torch.testing.assert_close(out.total, torch.tensor([3.1, 3.6]))


def test_a_wrong_number_of_frame_scores_is_a_reward_error():
    out = rewards("wrong_length").submit(videos(), ["a", "b"], [{}, {}]).result()
    assert out.total.isnan().all() and "one score per frame (6,)" in out.errors[0]
