"""Evaluation: sample the test prompts with the ODE sampler and fixed seeds, score, write a grid
(each sample captioned with its prompt and reward)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image, ImageDraw, ImageFont, PngImagePlugin

from diffrl.config import Config
from diffrl.core.errors import DiffrlError
from diffrl.core.rollout import Audio, Media, quantize
from diffrl.data.hf import EVAL_SPLITS
from diffrl.data.prompts import PromptSet, edit_mismatch, load_prompts
from diffrl.logging import Progress
from diffrl.models.base import FamilyRuntime
from diffrl.rewards.base import RewardSet
from diffrl.sampling.sampler import image_size, initial_noise, sample_ode, sampling_sigmas


@dataclass
class EvalResult:
    """``rewards``: reward label -> ``(N,)`` scores; ``images``: ``(N, 3, H, W)`` (videos
    ``(N, 3, F, H, W)``) in [0, 1]; ``audio``: their sound (audio-video families), else None;
    ``sources``: an editing family's source images, uint8 ``(N, 3, H, W)`` laid out as the results
    (the grid shows them side by side), else None. A
    sample a reward failed has a NaN score and total, and ``errors`` says why; the means are over
    the samples scored. ``seed``, ``index`` (each sample's prompt index in the prompt set) and
    ``source`` (the prompt set, e.g. ``eval.prompts``) say how each sample's noise was drawn, so its
    grid caption can say how to draw it again (:class:`Caption`); None when unknown."""

    prompts: list[str]
    images: torch.Tensor
    audio: Audio | None = None
    sources: torch.Tensor | None = None
    rewards: dict[str, torch.Tensor] = field(default_factory=dict)
    total: torch.Tensor | None = None
    errors: list[str] = field(default_factory=list)
    seed: int | None = None
    index: list[int] | None = None
    source: str | None = None
    watch: dict[str, torch.Tensor] = field(default_factory=dict)
    """``eval.watch``'s scores, reward label -> ``(N,)``: judged, never in ``total``."""
    extra: dict[str, float] = field(default_factory=dict)
    """Metrics measured against other evals (paired gains, alarms, keep-best), logged with it."""

    def captions(self) -> list[Caption]:
        """Each sample's grid caption: its prompt, total reward (none when unscored) and, when
        known, its seed and (prompt, sample) index: :func:`generate` keys sample ``j`` of prompt
        ``i`` by ``(seed, i, j)``."""
        totals = self.total.tolist() if self.total is not None else [None] * len(self.prompts)
        keys = sample_keys(self.index) if self.index is not None else [None] * len(self.prompts)
        return [
            Caption(p, r, self.seed if k is not None else None, k)
            for p, r, k in zip(self.prompts, totals, keys, strict=True)
        ]

    def shown(self, limit: int) -> str:
        """What a grid of the first ``limit`` samples holds: ``32 of 64 samples shown`` (a grid
        cut short), or ``all 64 samples``."""
        drawn = len(self.prompts)
        return f"{limit} of {drawn} samples shown" if limit < drawn else f"all {drawn} samples"

    def grid_note(self, limit: int) -> GridNote:
        """The note under a grid of the first ``limit`` samples: :meth:`shown` and how to draw a
        tile again (:func:`redraw_hint`)."""
        hint = redraw_hint(self.seed, self.source) if self.seed is not None and self.index else ""
        return GridNote(self.shown(limit), hint)

    def save_grid(self, path: Path, limit: int) -> Path:
        """The grid of the first ``limit`` samples (``eval.grid_images``), each captioned, with
        :meth:`grid_note` under it."""
        return save_grid(
            self.images[:limit],
            path,
            sources=self.sources,
            captions=self.captions(),
            note=self.grid_note(limit),
        )

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        out = {}
        if self.total is not None:
            out[f"{prefix}/reward_mean"] = _finite_mean(self.total)
            out[f"{prefix}/reward_failed"] = float((~torch.isfinite(self.total)).sum())
        for name, scores in self.rewards.items():
            out[f"{prefix}/{name}_mean"] = _finite_mean(scores)
        for name, scores in self.watch.items():
            out[f"{prefix}/watch/{name}_mean"] = _finite_mean(scores)
        return {**out, **self.extra}

    def per_sample(self) -> dict[str, torch.Tensor]:
        """Each sample's scores by the key of their mean in :meth:`metrics`: ``eval/reward_mean``
        (the total), ``eval/<label>_mean``, ``eval/watch/<label>_mean``."""
        out = {"eval/reward_mean": self.total} if self.total is not None else {}
        out.update({f"eval/{k}_mean": v for k, v in self.rewards.items()})
        out.update({f"eval/watch/{k}_mean": v for k, v in self.watch.items()})
        return out


def _finite_mean(scores: torch.Tensor) -> float:
    ok = torch.isfinite(scores)
    return scores[ok].mean().item() if ok.any() else float("nan")


def generate(
    family: FamilyRuntime,
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
    if family.description.edits != prompts.edits:
        raise DiffrlError(
            edit_mismatch(family.description.name, family.description.edits, prompts.source or "the prompts")
        )
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


def evaluate(
    family: FamilyRuntime, config: Config, rewards: RewardSet | None, watch: RewardSet | None = None
) -> EvalResult:
    """Sample the eval prompts (:func:`generate`) and score them with ``rewards`` (the total) and
    ``watch`` (``eval.watch``: held-out judges, scored on the same images, not in the total)."""
    e = config.eval
    prompts = load_prompts(e.prompts, EVAL_SPLITS).head(e.num_prompts)  # a datasets folder: its test split
    index, media = generate(family, config, prompts, e.samples_per_prompt, e.seed, e.batch_size, "eval")
    names = [prompts.prompts[i] for i in index]
    size = media.images.shape[-2:]
    result = EvalResult(names, media.images, media.audio, prompts.source_images(index, *size))
    result.seed, result.index, result.source = e.seed, index, e.prompts  # for the grid's captions
    meta = prompts.reward_metadata(index, *size)
    # both sets score at once; a reward that fails costs its samples' scores, not the run
    watched = watch.submit(media.images, names, meta, audio=media.audio, groups=index) if watch else None
    if rewards is not None:
        out = rewards.submit(media.images, names, meta, audio=media.audio, groups=index).result()
        result.rewards, result.total, result.errors = out.per_reward, out.total, out.errors
        if out.errors:
            warnings.warn(
                f"eval: {int((~torch.isfinite(out.total)).sum())} sample(s) unscored: {out.errors[0]}",
                stacklevel=2,
            )
    if watched is not None:
        seen = watched.result()
        result.watch = seen.per_reward
        if seen.errors:
            warnings.warn(f"eval.watch: some samples unscored: {seen.errors[0]}", stacklevel=2)
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


@dataclass(frozen=True)
class GridNote:
    """What a grid says beneath its tiles: ``shown``, how many samples it holds of how many were
    drawn (``32 of 64 samples shown``), and ``hint``, how to draw a tile again (may be empty)."""

    shown: str
    hint: str = ""

    SHOWN_KEY: ClassVar[str] = "diffrl:shown"
    HINT_KEY: ClassVar[str] = "diffrl:redraw"
    """The PNG text fields that keep them, for a page that shows the grid (evaluation/report.py)."""

    def text(self) -> str:
        return f"{self.shown}; {self.hint}" if self.hint else self.shown


def sample_keys(index: Sequence[int]) -> list[tuple[int, int]]:
    """Each sample's ``(prompt index, sample index)`` from its prompt index (:func:`generate`
    returns them in order: the samples of a prompt one after another)."""
    seen: dict[int, int] = {}
    keys = []
    for i in index:
        keys.append((i, seen.get(i, 0)))
        seen[i] = seen.get(i, 0) + 1
    return keys


def redraw_hint(seed: int, source: str | None) -> str:
    """How to draw a tile ``#i`` (``#i.j``: sample ``j`` of prompt ``i``, counted from 0) again:
    ``diffrl sample`` keys its noise as eval does, by (seed, prompt index, sample index)."""
    prompts = source if source else "PROMPTS"
    return (
        f"tile #i.j (#i: j=0) is prompt i, sample j, noise of seed {seed}: the last image of "
        f"`diffrl sample CHECKPOINT --prompts {prompts} --num-prompts i+1 --samples-per-prompt j+1 "
        f"--seed {seed}`"
    )


@dataclass(frozen=True)
class Caption:
    """What a grid cell says under its image: the prompt (wrapped to two lines, cut with an
    ellipsis); when ``reward`` is given, a line with the sample's total reward (NaN: the sample
    could not be scored); when ``seed`` and ``index`` (prompt index, sample index) are given, a
    line ``seed 1234 · #12`` (``#12.1`` for a prompt's second sample) that, with the grid's note
    (:func:`redraw_hint`), says how to draw the sample again."""

    prompt: str
    reward: float | None = None
    seed: int | None = None
    index: tuple[int, int] | None = None

    def reward_line(self) -> str | None:
        if self.reward is None:
            return None
        return "r=nan (failed)" if not math.isfinite(self.reward) else f"r={self.reward:.3f}"

    def seed_line(self) -> str | None:
        if self.seed is None:
            return None
        if self.index is None:
            return f"seed {self.seed}"
        i, j = self.index
        return f"seed {self.seed} · #{i}" + (f".{j}" if j else "")


Font = ImageFont.ImageFont | ImageFont.FreeTypeFont

PROMPT_LINES = 2
"""A caption's prompt lines at most (the rest is cut, ending in an ellipsis)."""


def caption_font(cell_width: int) -> Font:
    """Pillow's built-in font (no font file needed), 11 px under tiles up to ~130 px wide and
    growing with wider ones (at most 28 px), so a caption reads at the grid's size."""
    return ImageFont.load_default(size=max(11, min(cell_width // 12, 28)))


def wrap(text: str, font: Font, width: float, max_lines: int = PROMPT_LINES) -> list[str]:
    """``text`` in lines that fit ``width`` pixels in ``font`` (words that do not fit are split),
    at most ``max_lines``, the last one ending in "…" when text is left over. Bounded whatever the
    text's length: only the characters that could fill ``max_lines + 1`` lines are measured (a
    glyph is taken to be at least 1/4 px wide), so a prompt of a million characters costs what a
    few lines cost."""
    words = " ".join(text.split())
    budget = (max_lines + 1) * (4 * int(width) + 8)
    cut_off = len(words) > budget
    lines: list[str] = []
    line = ""
    for word in words[:budget].split(" "):
        while word and len(lines) <= max_lines:
            trial = f"{line} {word}" if line else word
            if font.getlength(trial) <= width:
                line, word = trial, ""
            elif line:  # the word goes on the next line
                lines.append(line)
                line = ""
            else:  # a word wider than the line: as much of it as fits
                cut = 1
                while cut < len(word) and font.getlength(word[: cut + 1]) <= width:
                    cut += 1
                lines.append(word[:cut])
                word = word[cut:]
    if line:
        lines.append(line)
    if len(lines) <= max_lines and not (cut_off and lines):
        return lines
    last = lines[min(len(lines), max_lines) - 1]
    while last and font.getlength(last + "…") > width:
        last = last[:-1]
    return [*lines[: min(len(lines), max_lines) - 1], last.rstrip() + "…"]


def caption_lines(caption: Caption | str, font: Font, width: float) -> list[str]:
    """The lines drawn under a cell: the prompt's (at most :data:`PROMPT_LINES`), then the
    reward's and the seed's."""
    if isinstance(caption, str):
        caption = Caption(caption)
    lines = wrap(caption.prompt, font, width) if caption.prompt.strip() else []
    for line in (caption.reward_line(), caption.seed_line()):
        if line is not None:  # a narrow tile breaks "seed 1234 · #12" rather than cut it
            lines += wrap(line, font, width, max_lines=2)
    return lines


def save_grid(
    images: torch.Tensor,
    path: Path,
    columns: int = 8,
    scale: float | None = None,
    sources: torch.Tensor | None = None,
    captions: Sequence[Caption | str] | None = None,
    note: GridNote | None = None,
) -> Path:
    """Tile ``images (N, 3, H, W)`` (or videos ``(N, 3, F, H, W)``, see :func:`still`) in [0, 1]
    into one PNG; with ``sources`` (uint8 ``(N, 3, H, W)``: what an editing family edited) each
    result follows its source, ``source | result``, a pair per cell. With ``captions`` (one per
    image, the first ``N`` are used), each cell gets a strip beneath it saying its prompt (and its
    reward, see :class:`Caption`), drawn after scaling so the text is at the PNG's resolution.
    ``note``: a line under the whole grid (:class:`GridNote`), also kept in the PNG's text
    fields (:func:`read_grid_note`).
    ``scale``: the tiles' zoom; ``None``: :func:`grid_scale` (small images enlarged, large ones
    shrunk, so that a grid of a 1024-px model stays a few megapixels)."""
    images = still(images)
    n = images.shape[0]
    if captions is not None and len(captions) < n:
        raise ValueError(f"{len(captions)} captions for {n} images: give one per image")
    per_cell = 1
    if sources is not None:
        pairs = torch.stack([sources[:n].float() / 255.0, images.float()], 1)
        images = pairs.flatten(0, 1)
        columns = max(2, columns - columns % 2)
        per_cell = 2
    tiles = images.shape[0]
    columns = min(columns, tiles)
    rows = (tiles + columns - 1) // columns
    _, _, h, w = images.shape
    scale = grid_scale(h, w) if scale is None else scale
    grid = np.ones((rows * (h + 2), columns * (w + 2), 3), dtype=np.uint8) * 255
    arr = quantize(images).permute(0, 2, 3, 1).numpy()
    for k in range(tiles):
        r, c = divmod(k, columns)
        grid[r * (h + 2) + 1 : r * (h + 2) + 1 + h, c * (w + 2) + 1 : c * (w + 2) + 1 + w] = arr[k]
    img = Image.fromarray(grid)
    if scale != 1:  # whole pixels enlarged as blocks; shrunk with a filter
        resample = Image.NEAREST if scale > 1 and scale == int(scale) else Image.BILINEAR
        img = img.resize((round(img.width * scale), round(img.height * scale)), resample)
    if captions is not None:
        row_h, cell_w = img.height / rows, img.width / (columns // per_cell)
        img = _captioned(img, list(captions[:n]), rows, columns // per_cell, row_h, cell_w)
    info = None
    if note is not None:
        img = _with_note(img, note, caption_font(round(img.width / (columns // per_cell))))
        info = PngImagePlugin.PngInfo()
        info.add_text("Description", note.text())  # PNG's own field: what image viewers show
        info.add_text(GridNote.SHOWN_KEY, note.shown)
        info.add_text(GridNote.HINT_KEY, note.hint)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, pnginfo=info)
    return path


def read_grid_note(path: Path) -> GridNote | None:
    """The note :func:`save_grid` wrote under the grid at ``path`` (None for none, or no PNG)."""
    try:
        with warnings.catch_warnings():  # the text chunks only: no pixel is decoded
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                text = dict(getattr(img, "text", {}))
    except (OSError, ValueError, Image.DecompressionBombError):  # not a PNG, or billions of pixels
        return None
    if GridNote.SHOWN_KEY not in text:
        return None
    return GridNote(text[GridNote.SHOWN_KEY], text.get(GridNote.HINT_KEY, ""))


def _with_note(grid: Image.Image, note: GridNote, font: Font) -> Image.Image:
    """``grid`` with ``note`` beneath it: what it shows on a line of its own, then the hint
    wrapped across the grid's width."""
    pad = max(4, grid.width // 200)
    ascent, descent = font.getmetrics()
    line_h = ascent + descent + 1
    lines = wrap(note.shown, font, grid.width - 2 * pad, max_lines=2)
    lines += wrap(note.hint, font, grid.width - 2 * pad, max_lines=4) if note.hint.strip() else []
    out = Image.new("RGB", (grid.width, grid.height + 2 * pad + line_h * len(lines)), "white")
    out.paste(grid, (0, 0))
    draw = ImageDraw.Draw(out)
    for i, text in enumerate(lines):
        draw.text((pad, grid.height + pad + i * line_h), text, fill=(60, 60, 60), font=font)
    return out


GRID_TILE = 512
"""The longest side, in px, of a tile in an eval grid (tiles of smaller images are enlarged up to
2x, as far as this allows; larger images are shrunk to it)."""


def grid_scale(height: int, width: int) -> float:
    """The zoom of a ``height x width`` tile in a grid: 2 for the tiny world's 32-128 px images
    (their pixels as 2x2 blocks), 1 up to :data:`GRID_TILE`, shrunk to it above."""
    side = max(height, width)
    if 2 * side <= GRID_TILE:
        return 2.0
    return min(1.0, GRID_TILE / side)


def _captioned(
    grid: Image.Image, captions: list[Caption | str], rows: int, cells: int, row_h: float, cell_w: float
) -> Image.Image:
    """``grid`` (``rows`` of ``cells`` cells, each ``cell_w`` x ``row_h`` px, fractional for a
    shrunk grid) with a caption strip under each row; every strip is as tall as the longest
    caption needs."""
    width = int(cell_w)
    font = caption_font(width)
    pad = max(2, width // 40)
    ascent, descent = font.getmetrics()
    line_h = ascent + descent + 1
    lines = [caption_lines(c, font, width - 2 * pad) for c in captions]
    strip = pad * 2 + line_h * max((len(x) for x in lines), default=0)
    out = Image.new("RGB", (grid.width, grid.height + rows * strip), "white")
    draw = ImageDraw.Draw(out)
    for r in range(rows):
        y0, y1 = round(r * row_h), round((r + 1) * row_h)
        top = y0 + r * strip
        out.paste(grid.crop((0, y0, grid.width, y1)), (0, top))
        for c in range(cells):
            k = r * cells + c
            for i, text in enumerate(lines[k] if k < len(lines) else []):
                xy = (round(c * cell_w) + pad, top + (y1 - y0) + pad + i * line_h)
                draw.text(xy, text, fill=(20, 20, 20), font=font)
    return out


def eval_grid_path(run_dir: Path, step: int) -> Path:
    """Where a run keeps the grid of its eval at ``step``."""
    return run_dir / "eval" / f"step_{step:05d}.png"


def plot_eval_curve(evals: list[dict[str, float]], path: Path, key: str = "eval/reward_mean") -> None:
    """The eval reward against the iteration (and training time), saved as a PNG."""
    # finite values only: matplotlib cannot place ticks around an inf (a hand-edited curve)
    points = [e for e in evals if isinstance(e.get(key), int | float) and math.isfinite(e[key])]
    if not points:
        return
    fig = Figure(figsize=(5, 3.2))  # no pyplot: no global backend, no figure registry to close
    ax = fig.subplots()
    ax.plot([e["step"] for e in points], [e[key] for e in points], marker="o")
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole: no 0.25 ticks
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
