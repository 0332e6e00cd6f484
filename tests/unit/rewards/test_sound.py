"""Sound through the reward interface: a reward that hears (``Reward.audio``) gets the clips whole
and their audio as float32; every other reward sees frames only, as before; rollouts keep the
sound as float16 through select and cat; a reward that hears is refused on a silent family."""

from __future__ import annotations

import pytest
import torch

from diffrl.config import ConfigError, RewardConfig
from diffrl.core.rollout import Audio, Media
from diffrl.distributed.ray.reward_worker import RewardWorker
from diffrl.preflight import load_config
from diffrl.rewards.base import Reward, RewardSet
from tests.conftest import ROOT

HERE = "tests.unit.rewards.test_sound"
SEEN: dict[str, dict] = {}  # what each reward was given (they run on call threads of their own)


def loudness(images, prompts, metadata, audio, scale=1.0):
    """A user's function that hears: the mean absolute sample per clip."""
    SEEN["loudness"] = {
        "images": tuple(images.shape),
        "dtype": audio.waveform.dtype,
        "rate": audio.sample_rate,
    }
    return (scale * audio.waveform.abs().mean(dim=(1, 2))).tolist()


loudness.audio = True


def brightness(images, prompts, metadata, **kwargs):
    """An image reward: takes ``**kwargs`` yet must never be handed the sound."""
    SEEN["brightness"] = {"images": tuple(images.shape), "kwargs": sorted(kwargs)}
    return images.mean(dim=(1, 2, 3)).tolist()


class Pitch(Reward):
    audio = True

    def __call__(self, images, prompts, metadata, audio=None):
        return audio.waveform[:, 0, 1] - audio.waveform[:, 0, 0]


def clips() -> tuple[torch.Tensor, Audio]:
    """Two videos of 3 frames (brightness 0.25, 0.75) with stereo sound of loudness 0.5 and 0.25,
    kept as a rollout keeps them (uint8 frames, float16 sound)."""
    video = torch.tensor([0.25, 0.75]).view(2, 1, 1, 1, 1).expand(2, 3, 3, 4, 4)
    wave = torch.tensor([0.5, -0.25]).view(2, 1, 1) * torch.tensor([1.0, -1.0, 1.0, -1.0]).repeat(2, 2, 10)
    return (video * 255).round().to(torch.uint8), Audio(wave, 16_000).compact()


def test_a_reward_that_hears_gets_whole_clips_and_float32_sound_the_others_frames_only():
    SEEN.clear()
    video, audio = clips()
    names = [f"{HERE}:loudness", f"{HERE}:brightness", f"{HERE}:Pitch"]
    rewards = RewardSet([RewardConfig(n, params={"scale": 2.0} if "loud" in n else {}) for n in names])
    out = rewards.submit(video, ["a", "b"], [{}, {}], audio).result()
    rewards.close()
    assert not out.errors
    torch.testing.assert_close(out.per_reward[names[0]], torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(out.per_reward[names[1]], torch.tensor([0.25, 0.75]), atol=3e-3, rtol=0)
    torch.testing.assert_close(out.per_reward[names[2]], torch.tensor([-1.0, 0.5]))
    hear, see = SEEN["loudness"], SEEN["brightness"]
    assert hear == {"images": (2, 3, 3, 4, 4), "dtype": torch.float32, "rate": 16_000}  # whole clips
    assert see == {"images": (6, 3, 4, 4), "kwargs": []}  # frames, and no sound


def test_silent_rollouts_score_as_before():
    video, _ = clips()
    rewards = RewardSet([RewardConfig(f"{HERE}:brightness")])
    out = rewards.submit(video, ["a", "b"], [{}, {}]).result()
    rewards.close()
    torch.testing.assert_close(out.total, torch.tensor([0.25, 0.75]), atol=3e-3, rtol=0)


def test_sound_is_kept_compact_and_follows_its_rows():
    _, audio = clips()
    assert audio.waveform.dtype == torch.float16 and audio.waveform.device.type == "cpu"
    assert audio.seconds == 40 / 16_000
    joined = Audio.cat([audio.select([1]), audio.select([0])])
    torch.testing.assert_close(joined.waveform, audio.waveform.flip(0))
    media = Media.cat(
        [Media(torch.zeros(1, 3, 2, 2), audio.select([0])), Media(torch.ones(1, 3, 2, 2), audio.select([1]))]
    )
    assert len(media) == 2 and torch.equal(media.audio.waveform, audio.waveform)
    loud = Audio(torch.full((1, 1, 4), 3.0), 8_000).compact()
    assert loud.waveform.max() == 1.0  # clamped to the [-1, 1] of a PCM file


def test_joining_sound_at_two_rates_is_refused():
    with pytest.raises(ValueError, match="different sample rates"):
        Audio.cat([Audio(torch.zeros(1, 1, 4), 8_000), Audio(torch.zeros(1, 1, 4), 16_000)])


def test_a_reward_that_hears_is_refused_on_a_silent_family():
    with pytest.raises(ConfigError) as e:
        load_config(str(ROOT / "recipes" / "tiny_demo.yaml"), [f"rewards=[{{name: '{HERE}:loudness'}}]"])
    assert "scores sound, but model family 'tiny' makes none" in str(e.value)


def test_a_ray_reward_worker_passes_the_sound_on():
    """What a Ray reward worker runs (here in this process: the actor wraps this class as is)."""
    video, audio = clips()
    worker = RewardWorker(RewardConfig(f"{HERE}:loudness"), threads=1)
    out = worker.score(video, ["a", "b"], [{}, {}], audio)
    worker.rewards.close()
    torch.testing.assert_close(out.total, torch.tensor([0.5, 0.25]))


def test_a_remote_reward_that_hears_is_refused_on_a_silent_family():
    """``remote`` hears when its params say so (``Reward.hears``), and is checked like any other."""
    remote = "rewards=[{name: remote, params: {url: 'http://127.0.0.1:9', audio: true}}]"
    with pytest.raises(ConfigError) as e:
        load_config(str(ROOT / "recipes" / "tiny_demo.yaml"), [remote])
    assert "(remote) scores sound, but model family 'tiny' makes none" in str(e.value)
    silent = remote.replace("audio: true", "audio: false")
    with pytest.raises(ConfigError) as e:  # only the unreachable server is reported then
        load_config(str(ROOT / "recipes" / "tiny_demo.yaml"), [silent])
    assert "scores sound" not in str(e.value) and "no reward server answers" in str(e.value)


def deaf_signature(images, prompts, metadata):
    return [0.0] * len(prompts)


deaf_signature.audio = True


class OldSubmit(Reward):
    audio = True

    def __call__(self, images, prompts, metadata, audio=None):
        return torch.zeros(len(prompts))

    def submit(self, images, prompts, metadata, timeout=None):  # the pre-sound signature
        return super().submit(images, prompts, metadata, timeout)


def test_a_reward_that_hears_without_an_audio_parameter_is_refused_before_the_run():
    for name, what in (
        ("deaf_signature", "give it an audio parameter"),
        ("OldSubmit", "its submit is called with audio="),
    ):
        with pytest.raises(ConfigError) as e:
            load_config(
                str(ROOT / "recipes" / "ltx2_grpo.yaml"),
                [f"rewards=[{{name: '{HERE}:{name}'}}]"],
                check_files=False,
            )
        assert what in str(e.value), str(e.value)
