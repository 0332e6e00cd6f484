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
from diffrl.errors import DiffrlError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


class DatasetError(DiffrlError, ValueError):
    """An offline dataset that cannot be read."""


CAPTIONS = 'add NAME.txt beside each image or a metadata.jsonl row {"file_name": ..., "text": ...}'


class OfflineDataset(Protocol):
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        """``(image (3, H, W) in [0, 1], caption)``."""


def scan_image_folder(folder: str | Path) -> list[tuple[Path, str]]:
    """``(image file, caption)`` of every image in ``folder`` (from the file names and captions
    only: no image is decoded). Every image needs a non-empty caption."""
    root = Path(folder).expanduser()
    if root.is_file():
        raise DatasetError(
            f"dataset {str(folder)!r} is a file; give a folder of images with captions "
            f"({CAPTIONS}) or 'synthetic_text'"
        )
    if not root.is_dir():
        raise DatasetError(
            f"dataset folder {str(folder)!r} does not exist; give a folder of images with captions "
            "or 'synthetic_text'"
        )
    captions: dict[str, object] = {}
    meta = root / "metadata.jsonl"
    if meta.is_file():
        try:
            lines = meta.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise DatasetError(f"{str(meta)!r} is not UTF-8 text (byte {e.start}); {CAPTIONS}") from e
        bad = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                captions[row["file_name"]] = row.get("text", row.get("prompt"))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                bad.append(n)
        if bad:
            raise DatasetError(
                f"{str(meta)!r}: line(s) {', '.join(map(str, bad[:10]))}{' ...' if len(bad) > 10 else ''} "
                'are not {"file_name": ..., "text": ...} objects; fix or remove them'
            )
    items: list[tuple[Path, str]] = []
    missing, not_text = [], []
    for f in sorted(root.iterdir()):
        if f.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        cap = captions.get(f.name)
        if cap is None and f.with_suffix(".txt").is_file():
            try:
                cap = f.with_suffix(".txt").read_text(encoding="utf-8").strip()
            except UnicodeDecodeError:
                not_text.append(f.with_suffix(".txt").name)
                continue
        if cap is not None and not isinstance(cap, str):
            not_text.append(f"{f.name} (caption {cap!r})")
            continue
        if not cap:
            missing.append(f.name)
            continue
        items.append((f, cap))
    if not_text:
        raise DatasetError(
            f"{len(not_text)} caption(s) in {str(folder)!r} are not text (e.g. {not_text[0]}); "
            "a caption is a UTF-8 string"
        )
    if missing:
        raise DatasetError(
            f"{len(missing)} image(s) in {str(folder)!r} have no caption (e.g. {missing[0]}); {CAPTIONS}"
        )
    if not items:
        raise DatasetError(
            f"dataset folder {str(folder)!r} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}); "
            "give a folder of images with captions or 'synthetic_text'"
        )
    return items


class ImageFolderDataset:
    def __init__(self, folder: str | Path, height: int, width: int):
        self.folder = Path(folder)
        self.height, self.width = height, width
        self.items = scan_image_folder(folder)

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
