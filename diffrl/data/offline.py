"""Offline image datasets: the synthetic text world, its edit pairs (``synthetic_edit``: SFT of an
editing family), a folder of images + captions (SFT), or a folder of preference pairs (offline DPO).

An image folder (SFT) holds images (``.png``, ``.jpg``, ``.jpeg``,
``.webp``) and, for each, either a sidecar caption ``name.txt`` or a row in ``metadata.jsonl``
(``{"file_name": ..., "text": ...}``) or ``metadata.csv`` (a header row naming ``file_name`` and
the caption column): the Hugging Face imagefolder convention. The caption is the row's first of
``prompt``, ``text``, ``caption``; ``file_name`` is relative to the folder (``images/a.png``
names a file in a subfolder). A folder whose images lie in split subfolders (``train/``,
``test/``, each with its own metadata) is read at ``train/``; ``FOLDER#SPLIT`` names another.
A Hugging Face ``datasets`` folder (``save_to_disk`` or parquet, :mod:`diffrl.data.hf`) is SFT
data too: its ``train`` split's caption column and image column.

A pair folder (offline DPO) holds images and a ``metadata.jsonl`` with one pair
per line, ``{"prompt": "...", "chosen": "a.png", "rejected": "b.png"}``: the preferred and the
dispreferred image for the prompt, file names relative to the folder (other fields are ignored).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

import torch
from PIL import Image, UnidentifiedImageError

from diffrl.config import Config
from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.rollout import Source
from diffrl.core.user_files import UserFileError, file_problem, read_text
from diffrl.data.hf import (
    PROMPT_COLUMNS,
    TRAIN_SPLITS,
    HFFolder,
    HFFolderError,
    choose_split,
    find_hf_folder,
    image_cell,
    read_image_rows,
    split_path,
)
from diffrl.data.jsonl import JsonLineError, parse_json_line
from diffrl.data.lines import LINE_BREAK
from diffrl.data.prompts import load_prompts
from diffrl.data.synthetic_text import SyntheticEditDataset, SyntheticTextDataset, to_tensor

SYNTHETIC = {"synthetic_text": SyntheticTextDataset, "synthetic_edit": SyntheticEditDataset}
"""The built-in datasets, rendered from ``data.prompts`` (edit pairs for editing families)."""

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


class DatasetError(DiffrlError, ValueError):
    """An offline dataset that cannot be read."""


CAPTIONS = (
    'add NAME.txt beside each image, a metadata.jsonl row {"file_name": ..., "text": ...} or a '
    "metadata.csv row (columns file_name,text)"
)


PAIRS = (
    "a pair folder holds images and a metadata.jsonl with one row per pair, "
    '{"prompt": "...", "chosen": "FILE", "rejected": "FILE"} (files relative to the folder)'
)
PAIR_FIELDS = ("prompt", "chosen", "rejected")


class OfflineDataset(Protocol):
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> tuple[torch.Tensor, str] | tuple[torch.Tensor, str, Source]:
        """``(image (3, H, W) in [0, 1], caption)``, or ``(images (K, 3, H, W), caption)``: K
        images of one caption, best first (a preference pair: chosen, rejected); an edit pair
        adds its :class:`~diffrl.core.rollout.Source`, ``(target, instruction, source)``."""


def scan_image_folder(folder: str | Path) -> list[tuple[Path, str]]:
    """``(image file, caption)`` of every image in ``folder`` (``FOLDER#SPLIT``: its split
    subfolder; a folder of split subfolders alone: its ``train/``), from the file names,
    captions and each image's header: no image is decoded. Every image needs a non-empty
    caption, and must be a readable image file (:func:`image_problem`): a folder, FIFO or symlink
    loop named like an image, or a file that is no image, is refused with the others."""
    base, split = split_path(str(folder))
    if base.is_file():
        raise DatasetError(
            f"dataset {str(folder)!r} is a file; give a folder of images with captions "
            f"({CAPTIONS}) or 'synthetic_text'"
        )
    if not base.is_dir():
        problem = file_problem(base)  # a FIFO, a symlink loop: say what it is, not "does not exist"
        what = (
            "does not exist"
            if problem in (None, "does not exist")
            else problem.removesuffix(", not a regular file")
        )
        raise DatasetError(
            f"dataset folder {str(folder)!r} {what}; give a folder of images with captions or 'synthetic_text'"
        )
    root = _split_folder(base, split, str(folder))
    captions = _metadata_captions(root)
    items: list[tuple[Path, str]] = []
    missing, not_text, unreadable = [], [], []
    named = [root / name for name in captions if "/" in name and _present(root / name)]
    for f in sorted(root.iterdir()) + sorted(named):
        if f.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        if problem := image_problem(f):
            unreadable.append(f"image {f.relative_to(root).as_posix()} {problem}")
            continue
        cap = captions.get(f.relative_to(root).as_posix())
        sidecar = f.with_suffix(".txt")
        if cap is None and _present(sidecar):
            try:
                cap = read_text(sidecar, "caption file", "a caption is a UTF-8 text file").strip()
            except UserFileError as e:
                unreadable.append(str(e))
                continue
        if cap is not None and not isinstance(cap, str):
            not_text.append(f"{f.name} (caption {cap!r})")
            continue
        if not cap:
            missing.append(f.name)
            continue
        items.append((f, cap))
    if unreadable:
        raise DatasetError(
            f"{len(unreadable)} image or caption file(s) in {str(folder)!r} cannot be read: "
            f"{'; '.join(unreadable[:5])}{' ...' if len(unreadable) > 5 else ''}; remove or replace them"
        )
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


def _present(path: Path) -> bool:
    """Something is at ``path`` (a broken symlink too): what it is, :func:`image_problem` says."""
    return path.exists() or path.is_symlink()


def image_problem(path: Path) -> str | None:
    """Why ``path`` is no image file to train on, found from its header without decoding it
    (a folder, a FIFO, a symlink loop, an empty or unreadable file, one that is no image), or
    None. A file cut short after its header is found when it is decoded (:func:`load_image`)."""
    if (problem := file_problem(path)) is not None:
        return problem
    try:
        with Image.open(path):
            return None
    except Image.DecompressionBombError as e:  # its header claims billions of pixels
        return f"is too large an image to decode ({e})"
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        return f"is not an image ({e})"


def _has_images(folder: Path) -> bool:
    return any(f.suffix.lower() in IMAGE_SUFFIXES for f in folder.iterdir()) or any(
        (folder / m).is_file() for m in ("metadata.jsonl", "metadata.csv")
    )


def _split_folder(base: Path, split: str | None, given: str) -> Path:
    """The folder of an image folder's split: ``base`` itself when it holds images and no split is
    named, else its subfolder ``split`` (default ``train``, or the only one with images)."""
    if split is None and _has_images(base):
        return base
    splits = [d.name for d in sorted(base.iterdir()) if d.is_dir() and _has_images(d)]
    if not splits:
        return base  # no images anywhere: reported as such
    try:
        return base / choose_split(repr(str(base)), splits, split, TRAIN_SPLITS)
    except HFFolderError as e:
        raise DatasetError(f"dataset folder: {e}") from e


def _caption(row: dict) -> object:
    """A metadata row's caption: its first of :data:`PROMPT_COLUMNS` (None: none)."""
    return next((row[c] for c in PROMPT_COLUMNS if c in row), None)


def _file_key(name: object) -> str:
    """A metadata row's ``file_name`` as the folder's files are looked up: a relative POSIX path
    (``./a.png`` is ``a.png``); a name that is not a string is a ``TypeError`` (a bad row)."""
    if not isinstance(name, str):
        raise TypeError(f"file_name {name!r} is not a string")
    return PurePosixPath(name).as_posix()


def _metadata_captions(root: Path) -> dict[str, object]:
    """``file_name -> caption`` from ``root``'s ``metadata.jsonl`` or ``metadata.csv``."""
    files = [root / m for m in ("metadata.jsonl", "metadata.csv") if _present(root / m)]
    if len(files) > 1:
        raise DatasetError(f"{str(root)!r} has both metadata.jsonl and metadata.csv; keep one")
    if not files:
        return {}
    meta = files[0]
    try:
        text = read_text(meta, "metadata file", CAPTIONS)
    except UserFileError as e:
        raise DatasetError(str(e)) from e
    captions: dict[str, object] = {}
    if meta.suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        header = reader.fieldnames or []
        if "file_name" not in header or not any(c in header for c in PROMPT_COLUMNS):
            raise DatasetError(
                f"{str(meta)!r}: the header row must name a file_name column and a caption column "
                f"({' / '.join(PROMPT_COLUMNS)}); it has {', '.join(header) or 'none'}"
            )
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:  # csv keeps the last column of a name without a word
            raise DatasetError(
                f"{str(meta)!r}: the header row names column(s) {quoted(', '.join(twice))} twice; keep one"
            )
        for row in reader:
            key = _file_key(str(row["file_name"]).strip())
            if key in captions:
                raise DatasetError(
                    f"{str(meta)!r} line {reader.line_num}: file_name {quoted(key)} has a caption already "
                    "(one row per image); keep one"
                )
            captions[key] = _caption(row)
        return captions
    bad, problems = [], []
    for n, line in enumerate(LINE_BREAK.split(text), 1):  # U+2028 and the like are no line break
        if not line.strip():
            continue
        try:
            row = parse_json_line(line)
            key = _file_key(row["file_name"])
            if key in captions:
                problems.append(
                    f"line {n}: file_name {quoted(key)} has a caption already (one row per image)"
                )
            captions[key] = _caption(row)
        except JsonLineError as e:
            problems.append(f"line {n}: {e}")
        except (KeyError, TypeError, AttributeError):
            bad.append(n)
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise DatasetError(f"{str(meta)!r}: {'; '.join(problems[:10])}{more}; fix or remove them")
    if bad:
        raise DatasetError(
            f"{str(meta)!r}: line(s) {', '.join(map(str, bad[:10]))}{' ...' if len(bad) > 10 else ''} "
            'are not {"file_name": ..., "text": ...} objects; fix or remove them'
        )
    return captions


class ImageFolderDataset:
    """An image folder (SFT): item ``i`` is ``(image (3, H, W) in [0, 1], caption)``."""

    def __init__(self, folder: str | Path, height: int, width: int):
        self.folder = Path(folder)
        self.height, self.width = height, width
        self.items = scan_image_folder(folder)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        path, caption = self.items[i]
        return load_image(path, self.height, self.width), caption


def hf_folder(dataset: str) -> HFFolder | None:
    """``data.dataset`` as a Hugging Face ``datasets`` folder, or None when it is none."""
    try:
        return find_hf_folder(split_path(dataset)[0])
    except HFFolderError as e:
        raise DatasetError(f"dataset folder: {e}") from e


class HFImageDataset:
    """The ``train`` split (``FOLDER#SPLIT``: that one) of a ``datasets`` folder as SFT data: item
    ``i`` is ``(image (3, H, W) in [0, 1], caption)``, the image decoded when asked for."""

    def __init__(self, dataset: str, height: int, width: int, folder: HFFolder | None = None):
        self.height, self.width = height, width
        try:
            self.rows = read_image_rows(dataset, folder)
        except HFFolderError as e:
            raise DatasetError(f"dataset folder: {e}") from e

    def __len__(self) -> int:
        return len(self.rows.captions)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        try:
            image, name = image_cell(self.rows, i)
        except HFFolderError as e:
            raise DatasetError(str(e)) from e
        return load_image(image, self.height, self.width, name), self.rows.captions[i]


def scan_image_data(dataset: str) -> int:
    """How many captioned images SFT data ``dataset`` (an image folder or a ``datasets``
    folder) holds, checked without decoding an image."""
    folder = hf_folder(dataset)
    if folder is not None:
        return len(HFImageDataset(dataset, 1, 1, folder))
    return len(scan_image_folder(dataset))


@dataclass(frozen=True)
class PreferencePair:
    """One row of a pair folder's ``metadata.jsonl`` (``line``: its 1-based line number)."""

    prompt: str
    chosen: Path
    rejected: Path
    line: int


def scan_pair_folder(folder: str | Path) -> list[PreferencePair]:
    """Every pair of a pair folder's ``metadata.jsonl``, checked without decoding an image: each
    line a JSON object with a non-empty string ``prompt``, ``chosen`` and ``rejected``, naming two
    different image files of the folder (each a readable image by its header: :func:`image_problem`). Every problem is reported at once, by line and field."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        what = "is a file" if root.is_file() else "does not exist"
        raise DatasetError(f"pair folder {str(folder)!r} {what}; {PAIRS}")
    meta = root / "metadata.jsonl"
    if not _present(meta):
        raise DatasetError(f"pair folder {str(folder)!r} has no metadata.jsonl; {PAIRS}")
    try:
        lines = LINE_BREAK.split(read_text(meta, "pair file", PAIRS))
    except UserFileError as e:
        raise DatasetError(str(e)) from e
    pairs: list[PreferencePair] = []
    problems: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        pair, row_problems = _parse_pair_row(line, n, root)
        problems += [f"line {n}: {p}" for p in row_problems]
        if pair is not None:
            pairs.append(pair)
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise DatasetError(f"{str(meta)!r}: {'; '.join(problems[:10])}{more}; {PAIRS}")
    if not pairs:
        raise DatasetError(f"{str(meta)!r} holds no pairs; {PAIRS}")
    return pairs


def _parse_pair_row(line: str, n: int, root: Path) -> tuple[PreferencePair | None, list[str]]:
    """Line ``n`` of a pair folder's ``metadata.jsonl``: its pair, or None and its problems."""
    try:
        row = parse_json_line(line)
    except JsonLineError as e:
        return None, [str(e)]
    if not isinstance(row, dict):
        return None, [f"a JSON {type(row).__name__}, not an object"]
    missing = [f for f in PAIR_FIELDS if f not in row]
    if missing:
        fields = " / ".join(repr(f) for f in missing)
        return None, [f"no {fields} field (the row has {', '.join(map(repr, row)) or 'none'})"]
    problems = [
        f"field {f!r} must be a non-empty string, got {row[f]!r}"
        for f in PAIR_FIELDS
        if not isinstance(row[f], str) or not row[f].strip()
    ]
    if problems:
        return None, problems
    files = []
    for f in ("chosen", "rejected"):
        path = root / row[f]
        if not _present(path):
            problems.append(f"field {f!r}: image {row[f]!r} not found in {str(root)!r}")
        elif path.suffix.lower() not in IMAGE_SUFFIXES:
            problems.append(f"field {f!r}: {row[f]!r} is not an image ({', '.join(sorted(IMAGE_SUFFIXES))})")
        elif problem := image_problem(path):
            problems.append(f"field {f!r}: {row[f]!r} {problem}")
        files.append(path)
    if not problems and files[0].resolve() == files[1].resolve():
        problems.append(f"'chosen' and 'rejected' are the same file {row['chosen']!r}")
    if problems:
        return None, problems
    return PreferencePair(row["prompt"], files[0], files[1], n), []


class PreferencePairDataset:
    """A pair folder: item ``i`` is ``(images (2, 3, H, W) in [0, 1]: chosen then rejected, prompt)``."""

    def __init__(self, folder: str | Path, height: int, width: int):
        self.height, self.width = height, width
        self.pairs = scan_pair_folder(folder)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        pair = self.pairs[i]
        try:
            images = [load_image(path, self.height, self.width) for path in (pair.chosen, pair.rejected)]
        except DatasetError as e:
            raise DatasetError(f"metadata.jsonl line {pair.line}: {e}") from e
        return torch.stack(images), pair.prompt


def load_image(path: Path | io.BytesIO, height: int, width: int, name: str | None = None) -> torch.Tensor:
    """An image file (or its bytes, called ``name`` in messages) as ``(3, height, width)`` in
    [0, 1] (resized and center-cropped to fit). A path that is no regular file (a FIFO would
    make PIL wait for ever) is refused before it is opened."""
    if isinstance(path, Path) and (problem := file_problem(path)) is not None:
        raise DatasetError(f"cannot read image {str(path)!r}: it {problem}; remove or replace it")
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:  # a bomb: billions of pixels
        what = name or repr(str(path))
        raise DatasetError(f"cannot decode image {what}: {e}; remove or replace the file") from e
    if img.size != (width, height):
        img = _resize_center_crop(img, height, width)
    return to_tensor(img)


def _resize_center_crop(img: Image.Image, height: int, width: int) -> Image.Image:
    scale = max(width / img.width, height / img.height)
    img = img.resize(
        (max(width, round(img.width * scale)), max(height, round(img.height * scale))), Image.BICUBIC
    )
    left, top = (img.width - width) // 2, (img.height - height) // 2
    return img.crop((left, top, left + width, top + height))


def build_offline_dataset(config: Config, height: int, width: int, items: str = "images") -> OfflineDataset:
    """``data.dataset`` as the algorithm's collection spec reads it (``items``: ``images`` | ``pairs``)."""
    ds = config.data.dataset
    if ds in SYNTHETIC:
        prompts = load_prompts(config.data.prompts).prompts
        return SYNTHETIC[ds](prompts, config.data.dataset_size, config.run.seed, height, width)
    if items == "pairs":
        return PreferencePairDataset(ds, height, width)
    folder = hf_folder(ds)
    if folder is not None:
        return HFImageDataset(ds, height, width, folder)
    return ImageFolderDataset(ds, height, width)
