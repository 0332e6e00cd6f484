"""Offline image datasets for SFT: the synthetic text world, or a folder of images + captions.

A folder holds images (``.png``, ``.jpg``, ``.jpeg``, ``.webp``) and, for each, either a
sidecar caption ``name.txt`` or a row in ``metadata.jsonl`` (``{"file_name": ..., "text": ...}``,
the Hugging Face imagefolder convention).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import torch
from PIL import Image, UnidentifiedImageError

from diffrl.config import Config
from diffrl.data.prompts import load_prompts
from diffrl.data.synthetic_text import SyntheticTextDataset, to_tensor

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


class DatasetError(ValueError):
    """An offline dataset that cannot be read."""


class OfflineDataset(Protocol):
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        """``(image (3, H, W) in [0, 1], caption)``."""


class ImageFolderDataset:
    def __init__(self, folder: str | Path, height: int, width: int):
        self.folder = Path(folder)
        self.height, self.width = height, width
        if not self.folder.is_dir():
            raise DatasetError(f"dataset folder {str(folder)!r} does not exist")
        captions: dict[str, str] = {}
        meta = self.folder / "metadata.jsonl"
        if meta.is_file():
            for n, line in enumerate(meta.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    captions[row["file_name"]] = row.get("text", row.get("prompt"))
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise DatasetError(
                        f"{meta}: line {n} is not {{'file_name': ..., 'text': ...}} ({e})"
                    ) from e
        self.items: list[tuple[Path, str]] = []
        missing = []
        for f in sorted(self.folder.iterdir()):
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            cap = captions.get(f.name)
            if cap is None and f.with_suffix(".txt").is_file():
                cap = f.with_suffix(".txt").read_text().strip()
            if not cap:
                missing.append(f.name)
                continue
            self.items.append((f, cap))
        if missing:
            raise DatasetError(
                f"{len(missing)} image(s) in {str(folder)!r} have no caption (e.g. {missing[0]}); add NAME.txt "
                'beside each image or a metadata.jsonl row {"file_name": ..., "text": ...}'
            )
        if not self.items:
            raise DatasetError(
                f"dataset folder {str(folder)!r} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})"
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        path, caption = self.items[i]
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
        except (UnidentifiedImageError, OSError) as e:
            raise DatasetError(f"cannot decode image {str(path)!r}: {e}; remove or replace the file") from e
        if img.size != (self.width, self.height):
            img = _resize_center_crop(img, self.height, self.width)
        return to_tensor(img), caption


def _resize_center_crop(img: Image.Image, height: int, width: int) -> Image.Image:
    scale = max(width / img.width, height / img.height)
    img = img.resize(
        (max(width, round(img.width * scale)), max(height, round(img.height * scale))), Image.BICUBIC
    )
    left, top = (img.width - width) // 2, (img.height - height) // 2
    return img.crop((left, top, left + width, top + height))


def build_offline_dataset(config: Config, height: int, width: int) -> OfflineDataset:
    ds = config.data.dataset
    if ds == "synthetic_text":
        prompts = load_prompts(config.data.prompts).prompts
        return SyntheticTextDataset(prompts, config.data.dataset_size, config.run.seed, height, width)
    return ImageFolderDataset(ds, height, width)
