"""Diversity and collapse monitors of a rollout, cheap enough for every iteration (the pixel ones
run no model; the CLIP ones one image forward per sample).

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
  below ``monitor/near_duplicate_threshold`` levels: their samples are near duplicates. The
  threshold is the larger of ``monitor.near_duplicate_std`` (default 2) and
  ``monitor.collapse_relative`` (default 0.5) times the run's first rollout's
  ``monitor/within_group_std`` (``base_spread``: the base model's own spread; the driver keeps it
  in the checkpoint), a threshold that scales with the model's own spread (measured on the tiny
  world in docs/trust.md).
- ``alarm/collapse``: 1.0 when that share reaches ``monitor.collapse_share`` (default 0.5), else
  0.0; the driver then prints a warning line (:func:`collapse_warning`).

The absolute threshold: 2 levels means "equal up to rounding and a faint shade" (the
quantisation step is 1 level). A group of the tiny world's base model has a within-group std of
60-80 levels at 8 px; a stochastic sampler's noise keeps a hacked run's groups around 17-27 there
(measured in docs/results/hacking.md): 2 levels never fires there, a quarter of the base's spread
does when a hacked run's groups fall below 15-20 levels.

With a CLIP (opt-in: ``monitor.clip``, a local ``CLIPModel`` folder, or ``monitor.clip_every``
alone for that of a ``pickscore``, ``clip_score`` or ``aesthetic`` reward of the run), every
``monitor.clip_every`` iterations, from
the unit-norm CLIP image embeddings ``e (B, D)`` of the same samples (a video's middle frame):

- ``monitor/clip_within_group_dist``: per prompt group, the mean over its sample pairs of the
  cosine distance ``1 - <e_i, e_j>``; then the mean over the groups with 2+ samples. 0: a
  prompt's samples are the same picture to CLIP; unrelated pictures sit near 1 (at most 2).
- ``monitor/clip_across_prompt_dist``: the same over the groups' mean embeddings, each
  re-normalised (2+ groups). Falls when every prompt draws the same thing.

The distance is GARDO's (arXiv 2512.24138; tinnerhrhe/GARDO, ``flow_grpo/stat_tracking.py``,
``PerPromptStatTracker.update``): ``1 - <e_i, e_j>`` of unit-norm image features within a prompt
group, where GARDO takes each sample's nearest neighbour (DINOv3 features) as a per-sample weight
of its advantage; the monitor averages it over all pairs of CLIP embeddings, a group's spread
rather than a sample's weight (written from that formula, not copied).

The monitor loads its own copy of the CLIP in the trainer process (the rewards' copies live in
reward workers that return only scores), in float32, and embeds at most the rollout's images,
32 per forward, under no_grad. It draws no random number (the load runs under a forked RNG), so
a run's weights are the same with and without it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from PIL import Image

from diffrl.config.schema import MonitorConfig
from diffrl.models.registry import resolve_device
from diffrl.rewards import clip_embed

POOL = 64
"""Images are average-pooled to at most this many pixels per side before the statistics."""
CLIP_CHUNK = 32
"""Images per CLIP forward of the CLIP monitor."""


def pooled(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``(B, 3, H, W)`` or ``(B, 3, F, H, W)`` -> float32 ``(B, D)``, each frame pooled to at
    most ``POOL`` x ``POOL``."""
    x = images.float()
    b, h, w = x.shape[0], x.shape[-2], x.shape[-1]
    x = x.reshape(b, -1, h, w)
    if h > POOL or w > POOL:
        x = F.adaptive_avg_pool2d(x, (min(h, POOL), min(w, POOL)))
    return x.flatten(1)


def near_duplicate_threshold(monitor: MonitorConfig, base_spread: float | None) -> float:
    """The within-group std (uint8 levels) below which a group counts as near duplicates."""
    relative = monitor.collapse_relative * base_spread if base_spread else 0.0
    return max(monitor.near_duplicate_std, relative)


def diversity_metrics(
    images: torch.Tensor,
    group_id: torch.Tensor,
    monitor: MonitorConfig | None = None,
    base_spread: float | None = None,
) -> dict[str, float]:
    """``images`` uint8 ``(B, 3, H, W)`` / ``(B, 3, F, H, W)``, ``group_id (B,)`` -> the
    ``monitor/*`` metrics and ``alarm/collapse`` of the module docstring (group metrics only where
    a group has 2+ samples, the across-prompt one where there are 2+ groups); ``base_spread``: the
    first rollout's ``monitor/within_group_std`` (None: this is the first)."""
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
        threshold = near_duplicate_threshold(monitor, base_spread)
        near = sum(s < threshold for s in within) / len(within)
        out["monitor/within_group_std"] = sum(within) / len(within)
        out["monitor/near_duplicate_groups"] = near
        out["monitor/near_duplicate_threshold"] = threshold
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
    threshold = metrics.get("monitor/near_duplicate_threshold", monitor.near_duplicate_std)
    why = (
        "monitor.near_duplicate_std"
        if threshold == monitor.near_duplicate_std
        else f"monitor.collapse_relative {monitor.collapse_relative:g} x the first rollout's spread"
    )
    what = (
        f"iteration {iteration}: collapse alarm: {metrics['monitor/near_duplicate_groups']:.0%} of the "
        f"prompt groups are near duplicates (within-group pixel std below {threshold:.3g} levels, "
        f"{why}; mean {metrics['monitor/within_group_std']:.2f})"
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


def mean_pairwise_cosine_distance(e: torch.Tensor) -> float:
    """``e (N, D)`` unit-norm, N >= 2 -> the mean over the ``N (N - 1)`` ordered pairs ``i != j``
    of ``1 - <e_i, e_j>`` (in float64)."""
    e = e.double()
    n = len(e)
    sims = e @ e.T
    return 1.0 - ((sims.sum() - sims.diagonal().sum()) / (n * (n - 1))).item()


def clip_diversity(embeddings: torch.Tensor, group_id: torch.Tensor) -> dict[str, float]:
    """``embeddings (B, D)`` (normalised here), ``group_id (B,)`` -> ``monitor/clip_within_group_dist``
    (groups with 2+ samples) and ``monitor/clip_across_prompt_dist`` (2+ groups) of the module
    docstring."""
    e = F.normalize(embeddings.double(), dim=-1)
    within, means = [], []
    for g in group_id.unique():
        rows = e[group_id == g]
        means.append(rows.mean(0))
        if len(rows) > 1:
            within.append(mean_pairwise_cosine_distance(rows))
    out = {}
    if within:
        out["monitor/clip_within_group_dist"] = sum(within) / len(within)
    if len(means) > 1:
        out["monitor/clip_across_prompt_dist"] = mean_pairwise_cosine_distance(
            F.normalize(torch.stack(means), dim=-1)
        )
    return out


class ClipEmbedder:
    """A ``CLIPModel`` folder's image tower and its image processor, loaded once in this process
    (:mod:`diffrl.rewards.clip_embed`'s loaders: a bad folder is a clear error naming it)."""

    def __init__(self, folder: str, processor: str | None, device: str):
        # the load itself may initialise weights it then overwrites: the run's random streams are
        # kept out of it, so turning the monitor on changes no draw of the run
        torch_device = resolve_device(device)
        cuda = [torch_device.index or 0] if torch_device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            self.model = clip_embed.load_clip_model("monitor.clip", folder, torch_device, torch.float32)
        self.processor = clip_embed.load_image_processor("monitor.clip", processor or folder)

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``(B, 3, H, W)`` (videos ``(B, 3, F, H, W)``: the middle frame) -> unit-norm
        ``(B, D)`` float32 on the CPU, :data:`CLIP_CHUNK` images per forward."""
        if images.dim() == 5:
            images = images[:, :, images.shape[2] // 2]
        arrays = images.permute(0, 2, 3, 1).contiguous().numpy()
        pictures = [Image.fromarray(a) for a in arrays]
        return clip_embed.in_batches(
            len(pictures),
            CLIP_CHUNK,
            lambda part: clip_embed.image_embeddings(
                self.model, clip_embed.pixel_values(self.processor, pictures[part])
            ),
        )


@functools.lru_cache(maxsize=1)
def clip_embedder(folder: str, processor: str | None, device: str) -> ClipEmbedder:
    """The run's CLIP monitor model, loaded on first use and kept (one at a time) for the
    following iterations."""
    return ClipEmbedder(folder, processor, device)


def clip_metrics(
    images: torch.Tensor, group_id: torch.Tensor, iteration: int, monitor: MonitorConfig | None = None
) -> dict[str, float]:
    """The CLIP monitors of ``images`` (uint8, as :func:`diversity_metrics`) on the iterations
    ``monitor.clip_every`` picks, when ``monitor.clip`` names a folder; else nothing."""
    monitor = monitor or MonitorConfig()
    every = monitor.clip_interval()
    if monitor.clip is None or every == 0 or iteration % every or len(images) == 0:
        return {}
    embedder = clip_embedder(monitor.clip, monitor.clip_processor, monitor.clip_device or "auto")
    return clip_diversity(embedder.embed(images.cpu()), group_id.cpu())
