"""Evaluation: sample the test prompts with the ODE sampler and fixed seeds, score, write a grid."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image

from diffrl.config import Config
from diffrl.data.hf import EVAL_SPLITS
from diffrl.data.prompts import PromptSet, edit_mismatch, load_prompts
from diffrl.errors import DiffrlError
from diffrl.logging import Progress
from diffrl.models.base import ModelFamily
from diffrl.rewards.base import RewardSet
from diffrl.rollout import Audio, Media, quantize
from diffrl.sampling.sampler import image_size, initial_noise, sample_ode, sampling_sigmas


@dataclass
class EvalResult:
    """``rewards``: reward label -> ``(N,)`` scores; ``images``: ``(N, 3, H, W)`` (videos
    ``(N, 3, F, H, W)``) in [0, 1]; ``audio``: their sound (audio-video families), else None;
    ``sources``: an editing family's source images, uint8 ``(N, 3, H, W)`` laid out as the results
    (the grid shows them side by side), else None. A
    sample a reward failed has a NaN score and total, and ``errors`` says why; the means are over
    the samples scored."""

    prompts: list[str]
    images: torch.Tensor
    audio: Audio | None = None
    sources: torch.Tensor | None = None
    rewards: dict[str, torch.Tensor] = field(default_factory=dict)
    total: torch.Tensor | None = None
    errors: list[str] = field(default_factory=list)

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        out = {}
        if self.total is not None:
            out[f"{prefix}/reward_mean"] = _finite_mean(self.total)
            out[f"{prefix}/reward_failed"] = float((~torch.isfinite(self.total)).sum())
        for name, scores in self.rewards.items():
            out[f"{prefix}/{name}_mean"] = _finite_mean(scores)
        return out


def _finite_mean(scores: torch.Tensor) -> float:
    ok = torch.isfinite(scores)
    return scores[ok].mean().item() if ok.any() else float("nan")


def generate(
    family: ModelFamily,
    config: Config,
    prompts: PromptSet,
    samples_per_prompt: int,
    seed: int,
    batch_size: int,
    label: str = "sampling",
) -> tuple[list[int], Media]:
    """ODE-sample ``samples_per_prompt`` images per prompt; noise keyed by (seed, prompt, sample).

    Returns the prompt index of each sample and the samples decoded (:class:`Media`: images
    ``(N, 3, H, W)`` or videos in [0, 1], on the CPU, with their sound for audio-video families).
    """
    s = config.sampling
    height, width = image_size(config, family)
    if family.edits != prompts.edits:
        raise DiffrlError(edit_mismatch(family.name, family.edits, prompts.source or "the prompts"))
    jobs = [(i, j) for i in range(len(prompts)) for j in range(samples_per_prompt)]
    if not jobs or batch_size < 1:  # the commands check these; a caller's bug otherwise
        raise ValueError(
            f"nothing to sample: {len(prompts)} prompts x {samples_per_prompt} samples in batches of {batch_size}"
        )
    sigmas = sampling_sigmas(config, family)
    out = []
    progress = Progress(label, len(jobs), "img")
    family.transformer.eval()
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start : start + batch_size]
        texts = [prompts.prompts[i] for i, _ in chunk]
        cond = family.encode_prompts(texts, prompts.sources([i for i, _ in chunk], height, width))
        negative = family.negative(s.negative_prompt, s.guidance_scale, cond)
        noise = initial_noise(family, [(seed, "eval", i, j) for i, j in chunk], height, width)
        x0 = sample_ode(family, noise, cond, sigmas, s.guidance_scale, negative)
        media = family.decode_media(x0)
        audio = media.audio.compact() if media.audio is not None else None  # as rollouts keep it
        out.append(Media(media.images.cpu(), audio, media.fps))
        progress.update(start + len(chunk))
    return [i for i, _ in jobs], Media.cat(out)


def evaluate(family: ModelFamily, config: Config, rewards: RewardSet | None) -> EvalResult:
    e = config.eval
    prompts = load_prompts(e.prompts, EVAL_SPLITS).head(e.num_prompts)  # a datasets folder: its test split
    index, media = generate(family, config, prompts, e.samples_per_prompt, e.seed, e.batch_size, "eval")
    names = [prompts.prompts[i] for i in index]
    size = media.images.shape[-2:]
    result = EvalResult(names, media.images, media.audio, prompts.source_images(index, *size))
    meta = prompts.reward_metadata(index, *size)
    if rewards is not None:  # a reward that fails costs its samples' scores, not the run
        out = rewards.submit(media.images, names, meta, audio=media.audio).result()
        result.rewards, result.total, result.errors = out.per_reward, out.total, out.errors
        if out.errors:
            warnings.warn(
                f"eval: {int((~torch.isfinite(out.total)).sum())} sample(s) unscored: {out.errors[0]}",
                stacklevel=2,
            )
    return result


def paired_difference(scores: torch.Tensor, baseline: torch.Tensor) -> tuple[float, float]:
    """Two models' scores ``(N,)`` on the same prompts and noise -> the mean of their difference
    and its standard error (NaN for a single sample). Pairing removes the prompt-and-seed
    variation both share, so the error is far smaller than that of either mean."""
    if scores.shape != baseline.shape:
        raise ValueError(
            f"paired scores need equal shapes, got {tuple(scores.shape)} and {tuple(baseline.shape)}"
        )
    d = (scores - baseline).double()
    se = d.std(unbiased=True).item() / len(d) ** 0.5 if len(d) > 1 else float("nan")
    return d.mean().item(), se


def still(images: torch.Tensor) -> torch.Tensor:
    """Images ``(N, 3, H, W)`` as they are; videos ``(N, 3, F, H, W)`` as one still each: the first,
    middle and last frames side by side, ``(N, 3, H, 3 W)`` (fewer for shorter videos)."""
    if images.ndim != 5:
        return images
    f = images.shape[2]
    return torch.cat([images[:, :, i] for i in sorted({0, f // 2, f - 1})], dim=-1)


def to_pil(image: torch.Tensor) -> Image.Image:
    """``(3, H, W)`` (or a video ``(3, F, H, W)``, see :func:`still`) in [0, 1] -> PIL RGB."""
    image = still(image[None])[0]
    return Image.fromarray(quantize(image).permute(1, 2, 0).numpy())


def save_grid(
    images: torch.Tensor, path: Path, columns: int = 8, scale: int = 2, sources: torch.Tensor | None = None
) -> Path:
    """Tile ``images (N, 3, H, W)`` (or videos ``(N, 3, F, H, W)``, see :func:`still`) in [0, 1]
    into one PNG; with ``sources`` (uint8 ``(N, 3, H, W)``: what an editing family edited) each
    result follows its source, ``source | result``, a pair per cell."""
    images = still(images)
    if sources is not None:
        pairs = torch.stack([sources[: len(images)].float() / 255.0, images.float()], 1)
        images = pairs.flatten(0, 1)
        columns = max(2, columns - columns % 2)
    n = images.shape[0]
    columns = min(columns, n)
    rows = (n + columns - 1) // columns
    _, _, h, w = images.shape
    grid = np.ones((rows * (h + 2), columns * (w + 2), 3), dtype=np.uint8) * 255
    arr = quantize(images).permute(0, 2, 3, 1).numpy()
    for k in range(n):
        r, c = divmod(k, columns)
        grid[r * (h + 2) + 1 : r * (h + 2) + 1 + h, c * (w + 2) + 1 : c * (w + 2) + 1 + w] = arr[k]
    img = Image.fromarray(grid)
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def plot_eval_curve(evals: list[dict[str, float]], path: Path, key: str = "eval/reward_mean") -> None:
    """The eval reward against the iteration (and training time), saved as a PNG."""
    points = [e for e in evals if key in e]
    if not points:
        return
    fig = Figure(figsize=(5, 3.2))  # no pyplot: no global backend, no figure registry to close
    ax = fig.subplots()
    ax.plot([e["step"] for e in points], [e[key] for e in points], marker="o")
    ax.set_xlabel("iteration")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def eval_table(evals: list[dict[str, float]], key: str = "eval/reward_mean") -> str:
    """A plain-text table of the eval reward at each eval point."""
    lines = [f"{'iteration':>9}  {'train time':>10}  {key}"]
    for e in evals:
        if key in e:
            lines.append(f"{e['step']:>9}  {e.get('train_time_s', 0.0) / 60:>8.1f} m  {e[key]:.4f}")
    return "\n".join(lines)
