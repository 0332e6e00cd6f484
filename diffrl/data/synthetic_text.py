"""The synthetic text world: prompts such as ``the number "4071"`` rendered into small images.

Strings are 2-3 digits. Each rendering draws a font (two DejaVu faces shipped with matplotlib),
a size, a position and text/background colours from a generator keyed by
(seed, example index), so the same index always gives the same image. Text is left-aligned with a
few pixels of jitter (see :func:`draw_style`).

The shipped splits ``data/tiny_text/{train,test}.txt`` are disjoint; rebuild them with
``python -m diffrl.data.synthetic_text`` (deterministic).

The synthetic edit world (editing families): a sign showing one number, the instruction
``replace the number with "42"`` (:func:`edit_prompt_for`: the OCR reward reads the quoted text),
and the same sign with the new number as the target. ``data.dataset: synthetic_edit`` serves the
pairs for SFT; ``python -m diffrl.data.synthetic_text --edit-set DIR`` writes an editing prompt
set (``prompts.jsonl`` + the source PNGs) for online RL and eval.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from diffrl.core.rollout import Source
from diffrl.core.seeding import derive_seed

ALPHABET = "0123456789"
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf")
SPLITS_DIR = Path(__file__).resolve().parent / "tiny_text"


def prompt_for(text: str) -> str:
    # one template, so the quoted characters sit at the same token positions in every prompt
    return f'the number "{text}"'


def edit_prompt_for(text: str) -> str:
    """The edit instruction that turns a sign into one showing ``text``."""
    return f'replace the number with "{text}"'


def target_text(prompt: str) -> str:
    """The string between the first pair of double quotes (as flow_grpo's OCR reward)."""
    parts = prompt.split('"')
    if len(parts) < 3:
        raise ValueError(f'prompt {prompt!r} has no quoted target text (write it as: the text "AB12")')
    return parts[1]


@functools.cache
def _font(name: str, size: int) -> ImageFont.FreeTypeFont:
    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name
    return ImageFont.truetype(str(path), size)


@dataclass(frozen=True)
class TextStyle:
    font: str
    size: int
    x: int
    y: int
    fg: tuple[int, int, int]
    bg: tuple[int, int, int]


def draw_style(text: str, rng: random.Random, height: int, width: int) -> TextStyle:
    """Font, size, a left-aligned position with a few pixels of jitter, and colours.

    Text starts near the left edge, so character k sits at roughly the same place in every image:
    with the start anywhere in the image a 2M-parameter model did not learn to read the prompt in
    ~1000 steps (measured; see docs/results/tiny_base.md), which leaves RL nothing to improve.
    """
    font = rng.choice(FONT_FILES)
    size = rng.randint(int(height * 0.5), int(height * 0.56))
    left, top, right, bottom = _font(font, size).getbbox(text)
    while right - left > width - 8 and size > 8:  # shrink until it fits
        size -= 1
        left, top, right, bottom = _font(font, size).getbbox(text)
    x = 2 + rng.randint(0, 4) - left
    y = (height - (bottom - top)) // 2 + rng.randint(-2, 2) - top
    bg = tuple(rng.randint(170, 255) for _ in range(3))
    fg = tuple(rng.randint(0, 90) for _ in range(3))
    return TextStyle(font, size, x, y, fg, bg)  # type: ignore[arg-type]


def render(text: str, style: TextStyle, height: int, width: int) -> Image.Image:
    img = Image.new("RGB", (width, height), style.bg)
    ImageDraw.Draw(img).text((style.x, style.y), text, font=_font(style.font, style.size), fill=style.fg)
    return img


def to_tensor(img: Image.Image) -> torch.Tensor:
    """PIL RGB -> ``(3, H, W)`` float in [0, 1]."""
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()


class SyntheticTextDataset:
    """Example ``i``: prompt ``prompts[i % len(prompts)]`` rendered in the style keyed by (seed, i)."""

    def __init__(self, prompts: list[str], size: int | None, seed: int, height: int, width: int):
        self.prompts = prompts
        self.size = size or len(prompts)
        self.seed = seed
        self.height, self.width = height, width

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        prompt = self.prompts[i % len(self.prompts)]
        text = target_text(prompt)
        style = draw_style(
            text, random.Random(derive_seed(self.seed, "synthetic_text", i)), self.height, self.width
        )
        return to_tensor(render(text, style, self.height, self.width)), prompt


class SyntheticEditDataset:
    """Example ``i``: the sign of another prompt's text (drawn by (seed, i)) as the source, the
    instruction to write ``prompts[i % len(prompts)]``'s text, and that text in the same style as
    the target: ``(target (3, H, W) in [0, 1], instruction, source)``."""

    def __init__(self, prompts: list[str], size: int | None, seed: int, height: int, width: int):
        self.texts = [target_text(p) for p in prompts]
        self.size = size or len(prompts)
        self.seed = seed
        self.height, self.width = height, width

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str, Source]:
        source, target, style = self.pair(i)
        h, w = self.height, self.width
        pixels = torch.from_numpy(np.array(render(source, style, h, w))).permute(2, 0, 1).contiguous()
        key = f"synthetic_edit:{self.seed}:{i}:{h}x{w}"
        return to_tensor(render(target, style, h, w)), edit_prompt_for(target), Source(pixels, key)

    def pair(self, i: int) -> tuple[str, str, TextStyle]:
        """Example ``i``'s source text, target text and style."""
        rng = random.Random(derive_seed(self.seed, "synthetic_edit", i))
        target = self.texts[i % len(self.texts)]
        source = rng.choice([t for t in self.texts if t != target] or [target[::-1]])
        longer = max(source, target, key=len)  # one style that fits both texts
        return source, target, draw_style(longer, rng, self.height, self.width)


def write_edit_set(out: Path, prompts: list[str], seed: int, height: int, width: int) -> Path:
    """An editing prompt set of :class:`SyntheticEditDataset`'s examples, one per prompt: the
    sources as ``out/images/NNNN.png`` and ``out/prompts.jsonl`` lines
    ``{"prompt": ..., "image": "images/NNNN.png", "metadata": {"source_text": ...}}``."""
    data = SyntheticEditDataset(prompts, None, seed, height, width)
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(len(data)):
        source, target, style = data.pair(i)
        name = f"images/{i:04d}.png"
        render(source, style, height, width).save(out / name)
        lines.append(
            json.dumps(
                {"prompt": edit_prompt_for(target), "image": name, "metadata": {"source_text": source}}
            )
        )
    path = out / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def make_splits(n_train: int = 900, n_test: int = 100, seed: int = 2026) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    seen: set[str] = set()
    texts: list[str] = []
    while len(texts) < n_train + n_test:
        length = rng.choice((2, 3))
        text = "".join(rng.choice(ALPHABET) for _ in range(length))
        if text not in seen:
            seen.add(text)
            texts.append(text)
    prompts = [prompt_for(t) for t in texts]
    return prompts[n_test:], prompts[:n_test]


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Write the train/test prompt splits of the synthetic text world"
    )
    parser.add_argument("--out", type=Path, default=SPLITS_DIR)
    parser.add_argument("--n-train", type=int, default=900)
    parser.add_argument("--n-test", type=int, default=100)
    parser.add_argument(
        "--edit-set",
        type=Path,
        metavar="DIR",
        help="instead, write an editing prompt set of a split's texts into DIR (--split)",
    )
    parser.add_argument("--split", choices=("train", "test"), default="train", help="with --edit-set")
    parser.add_argument("--size", type=int, nargs=2, default=(64, 64), metavar=("H", "W"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.edit_set is not None:
        prompts = [p for p in (SPLITS_DIR / f"{args.split}.txt").read_text().split("\n") if p]
        prompts = prompts[: args.n_train if args.split == "train" else args.n_test]
        path = write_edit_set(args.edit_set, prompts, args.seed, *args.size)
        print(
            f"wrote {path} ({len(prompts)} edits of {args.size[0]}x{args.size[1]} signs, {args.split} split)"
        )
        return
    train, test = make_splits(args.n_train, args.n_test)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train.txt").write_text("\n".join(train) + "\n")
    (args.out / "test.txt").write_text("\n".join(test) + "\n")
    print(f"wrote {len(train)} train and {len(test)} test prompts to {args.out}")


if __name__ == "__main__":
    main()
