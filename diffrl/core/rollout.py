"""The types that pass between the loop's stages, at the bottom of the layers (every layer may use them).

```
Collector --RolloutBatch--> rewards --> algorithm.postprocess_rewards --TrainSignals-->
algorithm.build_train_data --TrainExamples--> Actor (micro-batches) --> algorithm.compute_loss
```

:class:`CollectionSpec` is what an algorithm asks the collector for; :class:`Conditioning` the
encoded prompts a family produces and every batch carries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from diffrl.core.batching import Batch


@dataclass
class Conditioning:
    """Encoded prompts: named tensors with the batch on dim 0.

    What the tensors are is the family's business, e.g. for SD3-like models
    ``{"encoder_hidden_states": (B, L, D), "pooled_projections": (B, P)}``.
    """

    tensors: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def select(self, index: Sequence[int] | torch.Tensor) -> Conditioning:
        idx = torch.as_tensor(index, dtype=torch.long)
        return Conditioning({k: v[idx.to(v.device)] for k, v in self.tensors.items()})

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Conditioning:
        return Conditioning(
            {
                k: v.to(device=device, dtype=dtype if v.is_floating_point() else None)
                for k, v in self.tensors.items()
            }
        )

    @classmethod
    def cat(cls, parts: Sequence[Conditioning]) -> Conditioning:
        return cls({k: torch.cat([p.tensors[k] for p in parts]) for k in parts[0].tensors})

    def repeat(self, n: int) -> Conditioning:
        return Conditioning({k: v.expand(n, *v.shape[1:]) for k, v in self.tensors.items()})


@dataclass(frozen=True)
class Source:
    """A prompt's source image: what an editing family (``FamilyDescription.edits``) edits.

    ``pixels (3, H, W)`` uint8 on the CPU: the prompt file's image, centre-cropped to the aspect
    ratio of the output (``sampling.height : sampling.width``) and otherwise at the file's
    resolution (the family resizes it as its pipeline does); ``key`` names it for the prompt
    caches (the file and the crop).
    """

    pixels: torch.Tensor
    key: str

    def resized(self, height: int, width: int) -> torch.Tensor:
        """The source as uint8 ``(3, height, width)`` (antialiased bilinear): what rewards and
        eval grids set beside the result (it has the output's aspect ratio already)."""
        if tuple(self.pixels.shape[1:]) == (height, width):
            return self.pixels
        x = F.interpolate(self.pixels[None].float(), (height, width), mode="bilinear", antialias=True)
        return x[0].round().clamp(0, 255).to(torch.uint8)


RESAMPLE_ZERO_CROSSINGS = 6
"""Zero crossings of the sinc on each side (torchaudio's ``lowpass_filter_width`` default)."""
RESAMPLE_ROLLOFF = 0.99
"""The filter's cutoff as a fraction of the lower Nyquist frequency (torchaudio's default)."""
RESAMPLE_MAX_KERNEL = 2**22
"""The most numbers a resampling kernel may hold (32 MB of float64): rates in awkward ratios (e.g.
22222 to 48000 Hz, reduced 11111:24000) would need hundreds of millions."""


def resample(waveform: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """``waveform (..., samples)`` at ``orig`` Hz -> ``(..., ceil(samples * new / orig))`` at ``new``
    Hz, band-limited: torchaudio's ``functional.resample`` (``sinc_interp_hann``) written out
    (pytorch/audio, ``torchaudio/functional/functional.py``, ``_get_sinc_resample_kernel`` and
    ``_apply_sinc_resample_kernel``). float64 internally."""
    if orig == new:
        return waveform
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    base = min(orig, new) * RESAMPLE_ROLLOFF
    width = math.ceil(RESAMPLE_ZERO_CROSSINGS * orig / base)
    size = new * (2 * width + orig)
    if size > RESAMPLE_MAX_KERNEL:
        raise ValueError(
            f"resampling {orig * g} Hz to {new * g} Hz: the rates reduce to {orig}:{new}, whose "
            f"band-limited kernel would hold {size:,} numbers; give the sound at a rate in a simpler "
            "ratio to it (e.g. 16000, 22050, 24000, 44100 or 48000 Hz)"
        )
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = (torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + idx) * base
    t = t.clamp(-RESAMPLE_ZERO_CROSSINGS, RESAMPLE_ZERO_CROSSINGS)
    window = torch.cos(t * math.pi / RESAMPLE_ZERO_CROSSINGS / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t) * window * (base / orig)
    shape, length = waveform.shape, waveform.shape[-1]
    x = F.pad(waveform.reshape(-1, 1, length).double(), (width, width + orig))
    y = F.conv1d(x, kernel, stride=orig).transpose(1, 2).reshape(x.shape[0], -1)
    out = y[:, : math.ceil(new * length / orig)]
    return out.reshape(*shape[:-1], out.shape[-1]).to(waveform.dtype)


@dataclass
class Audio:
    """Sound with the batch on dim 0: ``waveform (B, channels, samples)`` in [-1, 1] at
    ``sample_rate`` Hz (what an audio-video family's vocoder writes, e.g. ``ltx2``'s).

    Rollouts and evals keep it as float16 on the CPU (:meth:`compact`: half of float32's bytes; a
    relative precision of 2^-11, about 12 bits near full scale, below what 16-bit PCM holds but
    far finer than a reward model's features resolve); rewards get float32 copies (:meth:`float`)."""

    waveform: torch.Tensor
    sample_rate: int

    def __len__(self) -> int:
        return len(self.waveform)

    @property
    def seconds(self) -> float:
        """The duration of each clip."""
        return self.waveform.shape[-1] / self.sample_rate

    def select(self, index: Sequence[int] | torch.Tensor) -> Audio:
        idx = torch.as_tensor(index, dtype=torch.long)
        return Audio(self.waveform[idx.to(self.waveform.device)], self.sample_rate)

    def to(self, device: torch.device | str) -> Audio:
        return Audio(self.waveform.to(device), self.sample_rate)

    def resample(self, rate: int) -> Audio:
        """The same sound at ``rate`` Hz (:func:`resample`; itself when the rate is already that)."""
        if rate == self.sample_rate:
            return self
        return Audio(resample(self.waveform, self.sample_rate, rate), rate)

    def compact(self) -> Audio:
        """float16 on the CPU, clamped to [-1, 1] (what a rollout keeps)."""
        return Audio(self.waveform.detach().clamp(-1.0, 1.0).to("cpu", torch.float16), self.sample_rate)

    def float(self) -> Audio:
        """A float32 CPU copy of its own (what a reward is given)."""
        return Audio(self.waveform.detach().to("cpu", torch.float32, copy=True), self.sample_rate)

    @classmethod
    def cat(cls, parts: Sequence[Audio]) -> Audio:
        rates = {p.sample_rate for p in parts}
        if len(rates) != 1:
            raise ValueError(f"cannot join audio at different sample rates {sorted(rates)}")
        return cls(torch.cat([p.waveform for p in parts]), parts[0].sample_rate)


@dataclass
class Media:
    """What a family decodes latents to (:meth:`~diffrl.models.base.ModelFamily.decode_media`):
    ``images (B, 3, H, W)`` or videos ``(B, 3, F, H, W)`` in [0, 1]; ``audio`` the sound that goes
    with them (audio-video families; None: silent); ``fps`` the videos' frame rate (None: stills,
    or a family that does not say)."""

    images: torch.Tensor
    audio: Audio | None = None
    fps: float | None = None

    def __len__(self) -> int:
        return len(self.images)

    @classmethod
    def cat(cls, parts: Sequence[Media]) -> Media:
        audio = [p.audio for p in parts]
        if any(a is None for a in audio) and not all(a is None for a in audio):
            raise ValueError("cannot join media with and without sound")
        return cls(
            torch.cat([p.images for p in parts]),
            None if audio[0] is None else Audio.cat(audio),
            parts[0].fps,
        )


@dataclass
class RewardScores:
    """Each reward's raw scores, ``(B,)`` by label (:func:`diffrl.rewards.base.reward_labels`): what
    per-reward advantages normalise one by one before the weighted sum."""

    scores: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return len(next(iter(self.scores.values()))) if self.scores else 0

    def select(self, index: Sequence[int] | torch.Tensor) -> RewardScores:
        idx = torch.as_tensor(index, dtype=torch.long)
        return RewardScores({k: v[idx.to(v.device)] for k, v in self.scores.items()})

    def to(self, device: torch.device | str) -> RewardScores:
        return RewardScores({k: v.to(device) for k, v in self.scores.items()})

    @classmethod
    def cat(cls, parts: Sequence[RewardScores]) -> RewardScores:
        return cls({k: torch.cat([p.scores[k] for p in parts]) for k in parts[0].scores})


@dataclass(frozen=True)
class CollectionSpec:
    """What the collector must produce for an algorithm."""

    online: bool
    """True: sample from the policy; False: read ``data.dataset`` (no sampling, no reward)."""
    needs_reward: bool
    sampler: str = "ode"
    """A name in :data:`diffrl.sampling.kernels.KERNELS` (or a dotted path): a stochastic kernel
    (``sde``, ``cps``) steps the steps ``step_strategy`` picks and Euler the others; a deterministic
    one (``ode``, ``heun``) steps every step."""
    noise_level: float = 0.0
    step_strategy: Callable[[int, int, int], list[int]] | None = None
    """``(num_steps, rollout_id, seed) -> stochastic step indices``; None: no stochastic step."""
    keep_trajectory: bool = False
    """Record (x_t, x_{t+Δ}) of the stochastic steps (reverse-process policy gradients only)."""
    keep_log_prob: bool = False
    """Record the log-prob of each recorded transition under the sampling policy."""
    offline_items: Literal["images", "pairs"] = "images"
    """Offline: what a ``data.dataset`` folder holds, captioned ``images`` (SFT) or preference
    ``pairs`` (offline DPO; see :mod:`diffrl.data.offline`)."""
    keep_mean: bool = False
    """Record the mean of each recorded transition's Gaussian under the sampling policy (GRPO-Guard's
    RatioNorm needs the old policy's mean; it costs one more latent per recorded step)."""

    def provides(self) -> frozenset[str]:
        """The optional :class:`RolloutBatch` fields a collector following this spec fills."""
        fields = set()
        if self.online:
            fields |= {"images", "sigmas"} | ({"rewards"} if self.needs_reward else set())
        if self.online and self.keep_trajectory and self.step_strategy is not None:
            fields |= {"traj_x", "traj_next", "traj_step", "traj_sigma", "traj_sigma_next"}
            if self.keep_log_prob:
                fields.add("traj_log_prob")
            if self.keep_mean:
                fields.add("traj_mean")
        return frozenset(fields)


@dataclass
class RolloutBatch(Batch):
    """What the collector produced: one row per sample.

    ``x0``: clean latents ``(B, *latent)``; ``cond``: the prompts' conditioning;
    ``images``: decoded ``(B, 3, H, W)`` (videos ``(B, 3, F, H, W)``), uint8 0..255 (online rollouts;
    :func:`quantize`); ``audio``: the sound of audio-video families' rollouts, float16
    ``(B, channels, samples)`` on the CPU (:meth:`Audio.compact`), None for silent ones;
    ``group_id``: samples of the same prompt share a group (group-relative advantages);
    ``micro_group``: which sampling forward batch the sample was in;
    ``rewards``: ``(B,)`` weighted reward (online rollouts); ``reward_scores``: each reward's raw
    ``(B,)`` scores (set with ``rewards`` by the driver);
    ``sigmas``: ``(B, num_steps + 1)`` the sigma schedule the sample was drawn with (online rollouts).
    Trajectory, only when the spec keeps it, for the K stochastic steps:
    ``traj_x, traj_next: (B, K, *latent)``; ``traj_step (B, K)`` step indices;
    ``traj_sigma, traj_sigma_next (B, K)``; ``traj_log_prob (B, K)`` when the spec keeps log-probs;
    ``traj_mean (B, K, *latent)`` the transitions' means (float32) when the spec keeps them.
    ``sources``: an offline edit pair's source images, one per row (in ``cond`` already; kept
    for SFT, which encodes the prompts again), else None (online rollouts keep only ``cond``: the
    sources at file resolution would travel back from every rollout engine).
    ``policy_version``: ``(B,)`` int64, the version of the weights that drew each sample (the
    number of updates they had had), stamped by whatever sampled it; the trainer's version minus
    it is the sample's staleness (``rollout/staleness``; 1 with ``train.off_policy_steps: 1``).
    """

    prompts: list[str]
    metadata: list[dict[str, Any]]
    prompt_index: torch.Tensor
    sample_index: torch.Tensor
    group_id: torch.Tensor
    micro_group: torch.Tensor
    x0: torch.Tensor
    cond: Conditioning
    images: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    sigmas: torch.Tensor | None = None
    traj_x: torch.Tensor | None = None
    traj_next: torch.Tensor | None = None
    traj_step: torch.Tensor | None = None
    traj_sigma: torch.Tensor | None = None
    traj_sigma_next: torch.Tensor | None = None
    traj_log_prob: torch.Tensor | None = None
    traj_mean: torch.Tensor | None = None
    reward_scores: RewardScores | None = None
    audio: Audio | None = None
    sources: list[Source] | None = None
    policy_version: torch.Tensor | None = None


@dataclass
class TrainSignals(Batch):
    """Reward-derived scalars per sample (GRPO advantages, NFT r, AWM weights), ``(B,)`` each."""

    values: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.values.values()))) if self.values else 0

    def select(self, index) -> TrainSignals:
        idx = torch.as_tensor(index, dtype=torch.long)
        return TrainSignals({k: v[idx] for k, v in self.values.items()})

    @classmethod
    def cat(cls, parts) -> TrainSignals:
        keys = parts[0].values.keys() if parts else ()
        return cls({k: torch.cat([p.values[k] for p in parts]) for k in keys})


class TrainExamples(Batch):
    """Base for an algorithm's own example dataclass (its fields are per-example).

    Subclasses must have a ``sample_id (N,)`` field: the row of the :class:`RolloutBatch` each
    example came from, so the loop can split a rollout into optimizer steps by whole samples.
    """

    sample_id: torch.Tensor


@dataclass
class RolloutStats:
    reward_failed: int = 0
    errors: list[str] = field(default_factory=list)
    sampling_time: float = 0.0
    reward_wait_time: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    """Runner-specific rollout metrics (e.g. ``rollout/reissued``)."""


def quantize(images: torch.Tensor) -> torch.Tensor:
    """Images or videos in [0, 1] -> uint8 on the CPU, as an image file holds them (a quarter of
    float32's bytes: what rollouts keep and send to reward workers; OCR reads uint8 anyway)."""
    return (images.detach().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).cpu()
