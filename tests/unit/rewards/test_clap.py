"""The ``clap`` reward on a tiny random CLAP written by ``save_pretrained``: the score is the cosine
of CLAP's audio and text embeddings (checked through ``ClapModel.forward``'s ``logits_per_audio``,
another path through the model), the sound is resampled band-limited, averaged to mono and cut
deterministically, and bad params are reported before anything loads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import ClapFeatureExtractor

from diffrl.core.rollout import Audio, resample
from diffrl.rewards.clap import ClapScore
from tests.unit.rewards.tiny_clap import MAX_SECONDS, write_clap
from tests.unit.rewards.tiny_clip import preflight_problems

PROMPTS = ["the dog", "a cat", "the sea at night"]
RATE = 24_000  # LTX-2's vocoder rate: CLAP resamples it to 48 kHz


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("clap") / "clap-htsat-unfused"
    return path, write_clap(path, seed=2)


@pytest.fixture(scope="module")
def reward(folder):
    return ClapScore(str(folder[0]), batch_size=2)


def sounds(n: int, seconds: float, channels: int = 2, seed: int = 0) -> Audio:
    """``n`` clips of tones plus noise in [-1, 1], each its own pitch."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * RATE)) / RATE
    tones = torch.stack([torch.sin(2 * math.pi * (220 + 110 * i) * t) for i in range(n)])
    noise = 0.1 * torch.randn(n, channels, t.numel(), generator=gen)
    return Audio((0.5 * tones[:, None] + noise).clamp(-1, 1), RATE)


def formula(folder, reward, audio: Audio, prompts) -> torch.Tensor:
    """cos(e_a, e_t) as ``ClapModel.forward`` gives it: ``logits_per_audio`` / exp(logit_scale_a), of
    the mono mean resampled to 48 kHz and cut to the extractor's window."""
    mono = resample(audio.waveform.double().mean(1), audio.sample_rate, 48_000)[:, : 48_000 * MAX_SECONDS]
    path, model = folder
    features = ClapFeatureExtractor.from_pretrained(path)
    feats = features(list(mono.numpy()), sampling_rate=48_000, return_tensors="pt")
    text = reward.tokenizer(list(prompts), padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(
            input_ids=text.input_ids,
            attention_mask=text.attention_mask,
            input_features=feats.input_features,
            is_longer=feats["is_longer"],
        )
    return (out.logits_per_audio / model.logit_scale_a.exp()).diagonal()


def test_score_is_the_cosine_of_claps_audio_and_text_embeddings(folder, reward):
    audio = sounds(3, 0.4)
    scores = reward(torch.zeros(3, 3, 2, 8, 8), PROMPTS, [{}] * 3, audio=audio)
    torch.testing.assert_close(scores, formula(folder, reward, audio, PROMPTS), atol=1e-5, rtol=0)
    assert scores.std() > 1e-4 and scores.abs().max() <= 1.0


def test_batch_size_does_not_change_scores(folder, reward):
    audio = sounds(3, 0.3, seed=1)
    whole = ClapScore(str(folder[0]), batch_size=8)
    torch.testing.assert_close(
        reward(None, PROMPTS, [{}] * 3, audio=audio),
        whole(None, PROMPTS, [{}] * 3, audio=audio),
        atol=1e-5,
        rtol=0,
    )


def test_a_clip_longer_than_the_window_is_cut_to_its_start_every_time(folder, reward):
    long = sounds(2, MAX_SECONDS + 0.5, seed=3)
    once = reward(None, PROMPTS[:2], [{}] * 2, audio=long)
    # the extractor's own truncation would draw a random crop: here the same score every call
    torch.testing.assert_close(once, reward(None, PROMPTS[:2], [{}] * 2, audio=long), atol=0, rtol=0)
    torch.testing.assert_close(once, formula(folder, reward, long, PROMPTS[:2]), atol=1e-5, rtol=0)


def test_a_fused_clap_scores_the_same_every_call_and_in_any_batch(tmp_path):
    """A fused CLAP's extractor marks a random clip of each call as longer than its window when none
    is; the reward passes none as longer (each is cut to the window), so its scores do not move."""
    path = tmp_path / "clap-htsat-fused"
    write_clap(path, seed=5, fused=True)
    audio, prompts = sounds(4, 0.3, seed=6), ["the dog", "a cat", "rain", "the sea"]
    fused = ClapScore(str(path), batch_size=4)
    first = fused(None, prompts, [{}] * 4, audio=audio)
    for _ in range(3):
        torch.testing.assert_close(fused(None, prompts, [{}] * 4, audio=audio), first, atol=0, rtol=0)
    one = ClapScore(str(path), batch_size=1)
    torch.testing.assert_close(one(None, prompts, [{}] * 4, audio=audio), first, atol=1e-5, rtol=0)


def direct_resample(x: torch.Tensor, orig: int, new: int, j: int) -> float:
    """Output sample ``j`` of a band-limited resampling of ``x (S,)`` written as the sum it is:
    ``y(t) = sum_m x[m] (b / o) sinc(b (m / o - t)) cos^2(pi b (m / o - t) / 12)`` over
    ``|b (m / o - t)| <= 6``, with ``o : n`` the reduced rates, ``b = 0.99 min(o, n)`` and
    ``t = j / n`` (torchaudio's Hann-windowed sinc, evaluated point by point)."""
    g = math.gcd(orig, new)
    o, n = orig // g, new // g
    b = 0.99 * min(o, n)
    total = 0.0
    for m in range(len(x)):
        u = b * (m / o - j / n)
        if abs(u) <= 6:
            sinc = 1.0 if u == 0 else math.sin(math.pi * u) / (math.pi * u)
            total += float(x[m]) * (b / o) * sinc * math.cos(math.pi * u / 12) ** 2
    return total


@pytest.mark.parametrize("orig, new", [(24_000, 48_000), (48_000, 16_000), (44_100, 48_000)])
def test_resampling_is_the_windowed_sinc_sum(orig, new):
    x = torch.randn(300, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    y = resample(x[None], orig, new)[0]
    assert y.shape == (math.ceil(300 * new / orig),)
    for j in (0, 1, 7, len(y) // 2, len(y) - 1):
        assert abs(float(y[j]) - direct_resample(x, orig, new, j)) < 1e-12, j


def test_resampling_keeps_a_tone_and_its_length():
    t = torch.arange(2400, dtype=torch.float64) / RATE
    tone = torch.sin(2 * math.pi * 1000 * t)
    up = resample(tone[None, None], RATE, 48_000)[0, 0]
    assert up.shape == (4800,)
    t2 = torch.arange(4800, dtype=torch.float64) / 48_000
    inner = slice(200, -200)  # away from the zero-padded ends
    err = (up - torch.sin(2 * math.pi * 1000 * t2))[inner].abs().max()
    assert err < 5e-3, err
    down = resample(tone[None], RATE, 16_000)[0]  # a rational ratio (3:2)
    assert down.shape == (1600,)
    assert torch.equal(resample(tone, RATE, RATE), tone)
    with pytest.raises(ValueError, match="reduce to 11111:24000"):  # a kernel of 267M numbers
        resample(tone, 22_222, 48_000)


def test_silent_samples_are_refused(reward):
    with pytest.raises(ValueError, match="scores sound"):
        reward(torch.zeros(1, 3, 8, 8), ["x"], [{}])


def test_params_are_checked_before_loading(folder, tmp_path):
    assert preflight_problems("clap", {"model": str(folder[0])}) == []
    (tmp_path / "clip").mkdir()
    (tmp_path / "clip" / "config.json").write_text('{"model_type": "clip"}')
    [problem] = preflight_problems("clap", {"model": str(tmp_path / "clip")})
    assert "holds a 'clip' model" in problem and "ClapModel" in problem
    [problem] = preflight_problems("clap", {"model": str(folder[0]), "batch_size": 0})
    assert "(clap).params.batch_size must be in [1, 4096] (images per forward pass), got 0" in problem
    [problem] = preflight_problems("clap", {"modle": "x"})
    assert "did you mean 'model'?" in problem.lower()


def test_mono_is_the_mean_of_the_channels(reward):
    audio = sounds(1, 0.2, channels=2, seed=4)
    mono = Audio(audio.waveform.mean(1, keepdim=True).repeat(1, 2, 1), RATE)
    torch.testing.assert_close(
        np.stack(reward.mono(audio)), np.stack(reward.mono(mono)), atol=1e-6, rtol=0, check_dtype=False
    )
