"""Diversity and collapse monitors of a rollout, cheap enough for every iteration (no model forward).

From the decoded uint8 images the rollout keeps (``RolloutBatch.images``, ``(B, 3, H, W)`` or videos
``(B, 3, F, H, W)``), average-pooled to at most ``POOL`` x ``POOL`` pixels first (the spread of
shapes and colours, not of pixel noise, and a bounded cost at any resolution):

- ``monitor/within_group_std``: per prompt group, each pixel's std over the group's samples
  (population, ddof 0), averaged over pixels; then the mean over the groups with 2+ samples.
  In uint8 levels (0..255). Falls when a prompt's samples become alike (mode collapse).
- ``monitor/across_prompt_std``: each pixel's std over the groups' mean images, averaged over
  pixels (2+ groups). Falls when every prompt draws the same picture.
- ``monitor/image_std``: each image's std over its own pixels, the mean over the batch. Falls when
  images become flat (what a JPEG-compressibility reward pays for).
- ``monitor/near_duplicate_groups``: the share of groups (2+ samples) whose within-group std is
  below ``monitor.near_duplicate_std`` levels (default 2): their samples are near duplicates.
- ``alarm/collapse``: 1.0 when that share reaches ``monitor.collapse_share`` (default 0.5), else
  0.0; the driver then prints a warning line (:func:`collapse_warning`).

The default threshold: 2 levels means "equal up to rounding and a faint shade" (the quantisation
step is 1 level). A group of the tiny world's base model has a within-group std of 60-80 levels
at 8 px; a stochastic sampler's noise keeps a hacked run's groups around 20 there (measured in
docs/results/hacking.md), so a small world's alarm needs a threshold of its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffrl.config.schema import MonitorConfig

POOL = 64
"""Images are average-pooled to at most this many pixels per side before the statistics."""


def pooled(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``(B, 3, H, W)`` or ``(B, 3, F, H, W)`` -> float32 ``(B, D)``, each frame pooled to at
    most ``POOL`` x ``POOL``."""
    x = images.float()
    b, h, w = x.shape[0], x.shape[-2], x.shape[-1]
    x = x.reshape(b, -1, h, w)
    if h > POOL or w > POOL:
        x = F.adaptive_avg_pool2d(x, (min(h, POOL), min(w, POOL)))
    return x.flatten(1)


def diversity_metrics(
    images: torch.Tensor, group_id: torch.Tensor, monitor: MonitorConfig | None = None
) -> dict[str, float]:
    """``images`` uint8 ``(B, 3, H, W)`` / ``(B, 3, F, H, W)``, ``group_id (B,)`` -> the
    ``monitor/*`` metrics and ``alarm/collapse`` of the module docstring (group metrics only where
    a group has 2+ samples, the across-prompt one where there are 2+ groups)."""
    monitor = monitor or MonitorConfig()
    if len(images) == 0:
        return {}
    x = pooled(images)
    out = {"monitor/image_std": x.std(dim=1, unbiased=False).mean().item()}
    groups = group_id.unique()
    within, means = [], []
    for g in groups:
        rows = x[group_id == g]
        means.append(rows.mean(0))
        if len(rows) > 1:
            within.append(rows.std(dim=0, unbiased=False).mean().item())
    if within:
        near = sum(s < monitor.near_duplicate_std for s in within) / len(within)
        out["monitor/within_group_std"] = sum(within) / len(within)
        out["monitor/near_duplicate_groups"] = near
        out["alarm/collapse"] = float(near >= monitor.collapse_share)
    if len(means) > 1:
        out["monitor/across_prompt_std"] = torch.stack(means).std(dim=0, unbiased=False).mean().item()
    return out


def collapse_warning(
    metrics: dict[str, float], iteration: int, monitor: MonitorConfig | None = None
) -> str | None:
    """The warning line of an iteration whose collapse alarm fired, else None."""
    if metrics.get("alarm/collapse", 0.0) < 1.0:
        return None
    monitor = monitor or MonitorConfig()
    what = (
        f"iteration {iteration}: collapse alarm: {metrics['monitor/near_duplicate_groups']:.0%} of the "
        f"prompt groups are near duplicates (within-group pixel std below "
        f"{monitor.near_duplicate_std:g} levels; mean {metrics['monitor/within_group_std']:.2f})"
    )
    if iteration == 0:  # the base's own samples: nothing is trained yet, so nothing is hacked
        return (
            f"{what} in the base model's own samples, before any update: the alarm cannot tell a "
            "collapse from them; lower monitor.near_duplicate_std below their spread"
        )
    return (
        f"{what}; the reward is likely being hacked: watch a held-out reward (eval.watch), add a KL "
        "(algorithm.params.kl_beta) or a regulariser (docs/algorithms.md), or stop the run"
    )
