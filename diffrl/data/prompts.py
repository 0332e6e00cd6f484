"""Prompt sets: plain text (one prompt a line, as flow_grpo's train.txt/test.txt), JSONL
(``{"prompt": ..., "metadata": {...}}`` a line) or a Hugging Face ``datasets`` folder
(:mod:`diffrl.data.hf`).

A JSONL line's other top-level keys are the prompt's reward metadata too, merged with its
``"metadata"`` object (whose keys win), so flow_grpo's GenEval ``train_metadata.jsonl`` loads as
it ships: ``{"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a
photo of a bench"}`` gives the prompt and ``{"tag": ..., "include": ...}`` (flow_grpo passes the
whole line to the reward).

An editing data set is JSONL whose lines also name a source image,
``{"prompt": 'write the number "42" on the sign', "image": "signs/0001.png", "metadata": {...}}``:
the path is relative to the prompt file (or absolute). Every image is checked when the file is
read (it exists and decodes as an image), so a bad line is reported before any model loads.
"""

from __future__ import annotations

import difflib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

from diffrl.config import resolve_data_path
from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.rollout import Source
from diffrl.core.user_files import UserFileError, file_problem, read_text
from diffrl.data.hf import TRAIN_SPLITS, HFFolderError, find_hf_folder, read_prompt_rows, split_path
from diffrl.data.jsonl import JsonLineError, parse_json_line
from diffrl.data.lines import LINE_BREAK, MAX_PROMPT_CHARS, MAX_PROMPTS, prompt_problem, separator_problem

SOURCE_CACHE = 256
"""Source images a :class:`PromptSet` keeps decoded (the most recently used)."""

FORMATS = (
    'a .txt file (one prompt a line), a .jsonl file (one {"prompt": ...} object a line) or a '
    "Hugging Face datasets folder (save_to_disk or parquet files)"
)
TABLES = (".csv", ".tsv", ".parquet", ".arrow", ".xlsx", ".yaml", ".yml")
"""Suffixes of files that hold a table or a document, not one prompt a line."""
RESERVED = ("prompt", "metadata", "image")
"""A JSONL line's keys that are not reward metadata (``image``: an editing set's source)."""


def _key_problem(row: dict[str, Any]) -> str | None:
    """A JSONL line's key that looks like a misspelt reserved one (``metdata``, ``Prompt``): it
    would silently become reward metadata under its wrong name."""
    for key in row:
        if key in RESERVED or not isinstance(key, str):
            continue
        # a near miss only (an edit or two): "prompt_id" or "images_dir" are metadata of their own
        close = difflib.get_close_matches(key.lower(), RESERVED, n=1, cutoff=0.75)
        hint = f" Did you mean {close[0]!r}?" if close and abs(len(close[0]) - len(key)) <= 2 else ""
        if hint:
            return (
                f"key {quoted(key)} is not one of {', '.join(map(repr, RESERVED))}.{hint} (other keys are "
                'reward metadata: put a key of that name under "metadata": {...})'
            )
    return None


class PromptFileError(DiffrlError, ValueError):
    """A prompt file that is missing or has a malformed line."""


@dataclass
class PromptSet:
    prompts: list[str]
    metadata: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    """The file the prompts came from (for messages)."""
    images: list[Path | None] = field(default_factory=list)
    """Each prompt's source image file (an editing data set's ``"image"``), None for none."""

    def __post_init__(self):
        if not self.metadata:
            self.metadata = [{} for _ in self.prompts]
        if not self.images:
            self.images = [None for _ in self.prompts]
        self._sources: OrderedDict[tuple[int, int, int], Source] = OrderedDict()
        """The sources read last (at most :data:`SOURCE_CACHE`): a micro-group's rows share
        them, and its rewards read them again; a whole set at file resolution could fill memory."""

    @property
    def edits(self) -> bool:
        """True when the prompts carry source images (an editing data set)."""
        return any(image is not None for image in self.images)

    def sources(self, indices: list[int], height: int, width: int) -> list[Source] | None:
        """The source images of prompts ``indices``, centre-cropped to ``height : width``
        (:func:`load_source`, each read once); None for a set without images."""
        if not self.edits:
            return None
        out = []
        for i in indices:
            key = (i, height, width)
            if key not in self._sources:
                image = self.images[i]
                if image is None:
                    raise PromptFileError(
                        f"prompt {i + 1} of {self.source!r} has no image; every line of an editing set needs one"
                    )
                self._sources[key] = load_source(image, height, width)
                if len(self._sources) > SOURCE_CACHE:
                    self._sources.popitem(last=False)
            self._sources.move_to_end(key)
            out.append(self._sources[key])
        return out

    def source_images(self, indices: list[int], height: int, width: int) -> torch.Tensor | None:
        """The sources of prompts ``indices`` laid out as the results, uint8 ``(N, 3, height,
        width)`` (what grids set beside them); None for a set without images."""
        sources = self.sources(indices, height, width)
        return None if sources is None else torch.stack([s.resized(height, width) for s in sources])

    def reward_metadata(self, indices: list[int], height: int, width: int) -> list[dict[str, Any]]:
        """The metadata rewards get for prompts ``indices``: each line's ``"metadata"`` and, for
        an editing set, ``"source_image"`` (the source as uint8 ``(3, height, width)``, as the
        result is laid out, so an edit reward can compare the two) and ``"source_file"``."""
        sources = self.sources(indices, height, width)
        if sources is None:
            return [self.metadata[i] for i in indices]
        return [  # a copy each: a reward that changes its tensor changes no other row's
            {
                **self.metadata[i],
                "source_image": s.resized(height, width).clone(),
                "source_file": str(self.images[i]),
            }
            for i, s in zip(indices, sources)
        ]

    def __len__(self) -> int:
        return len(self.prompts)

    def head(self, n: int | None) -> PromptSet:
        """The first ``n`` prompts (``None``: all); asking for more than the set holds, or for
        fewer than one, is an error (no silent cap)."""
        if n is None:
            return self
        if not 1 <= n <= len(self):
            raise PromptFileError(
                f"asked for {n} prompts of {self.source or 'the prompt set'!r}, which holds "
                f"{len(self)}; ask for 1 to {len(self)}"
            )
        return PromptSet(self.prompts[:n], self.metadata[:n], self.source, self.images[:n])


def load_prompts(path: str | Path, splits: tuple[str, ...] = TRAIN_SPLITS) -> PromptSet:
    """Read ``.txt``, ``.jsonl`` or a ``datasets`` folder (``FOLDER#SPLIT``, else the first of
    ``splits`` it holds); every malformed line is reported with its number."""
    root, split = split_path(str(path))
    try:
        if find_hf_folder(root) is not None:
            prompts, metadata = read_prompt_rows(str(path), splits)
            return PromptSet(prompts, metadata, str(path))
    except HFFolderError as e:
        raise PromptFileError(f"prompt folder: {e}") from e
    if split is not None and root.is_dir():
        raise PromptFileError(
            f"prompt file {str(path)!r}: {str(root)!r} is not a datasets folder, so it has no split "
            f"{split!r}; give {FORMATS}"
        )
    file = resolve_data_path(str(path))
    if file.is_dir():
        raise PromptFileError(f"prompt file {str(path)!r} is a folder; give {FORMATS}")
    if (problem := file_problem(file)) is not None:  # a FIFO or a device: refused before it is opened
        raise PromptFileError(f"prompt file {str(path)!r} {problem}; give {FORMATS}")
    if file.suffix == ".json":
        raise PromptFileError(
            f"prompt file {str(path)!r} is .json; give {FORMATS} (for JSON, write one object a line "
            "and name the file .jsonl)"
        )
    if file.suffix.lower() in TABLES:  # read as text, its header would become a prompt
        raise PromptFileError(
            f"prompt file {str(path)!r} is a {file.suffix} table, which a prompt file is not (its "
            f"header and cells would become prompts); give {FORMATS}: e.g. save it as a datasets "
            "folder, or write one prompt a line"
        )
    try:  # a byte-order mark is not a prompt; a non-UTF-8 byte is reported by line and column
        text = read_text(file, "prompt file", f"give {FORMATS}")
    except UserFileError as e:
        raise PromptFileError(str(e)) from e
    if "\x00" in text:
        raise PromptFileError(f"prompt file {str(path)!r} holds NUL bytes: not a text file; give {FORMATS}")
    breaks = text.count("\n") + text.count("\r") - text.count("\r\n")
    if breaks > MAX_PROMPTS:
        raise PromptFileError(
            f"prompt file {str(path)!r} has {breaks:,} lines; a prompt file holds at most {MAX_PROMPTS:,} "
            "prompts (is it the right file?); split it"
        )
    lines = LINE_BREAK.split(text)
    while lines and not lines[-1].strip():  # blank lines at the end are no prompts
        lines.pop()
    prompts, metadata, images, problems = [], [], [], []
    jsonl = file.suffix == ".jsonl"
    for n, line in enumerate(lines, start=1):
        if problem := separator_problem(line):
            problems.append(f"line {n}, {problem}")
            continue
        if not line.strip():
            problems.append(f"line {n}: empty prompt line (remove it)")
            continue
        if len(line) > MAX_PROMPT_CHARS:
            problems.append(
                f"line {n}: {len(line):,} characters; a prompt line is at most {MAX_PROMPT_CHARS:,} "
                "(is it a prompt file?)"
            )
            continue
        if jsonl:
            try:
                row = parse_json_line(line)
            except JsonLineError as e:
                problems.append(f"line {n}: {e}")
                continue
            if isinstance(row, dict) and (problem := _key_problem(row)):
                problems.append(f"line {n}: {problem}")
                continue
            if (
                not isinstance(row, dict)
                or not isinstance(row.get("prompt"), str)
                or not row["prompt"].strip()
            ):
                problems.append(
                    f'line {n}: expected {{"prompt": "...", "metadata": {{...}}}} with a non-empty prompt'
                )
                continue
            meta = row.get("metadata", {})
            if not isinstance(meta, dict):
                problems.append(f"line {n}: metadata must be an object")
                continue
            image, problem = _image_field(row, file.parent)
            if problem:
                problems.append(f"line {n}: {problem}")
                continue
            prompts.append(row["prompt"])
            metadata.append({**{k: v for k, v in row.items() if k not in RESERVED}, **meta})
            images.append(image)
        else:
            prompts.append(line.strip())
            metadata.append({})
            images.append(None)
    if problems:
        shown = "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else "")
        raise PromptFileError(f"prompt file {str(path)!r} has {len(problems)} malformed line(s):\n  {shown}")
    if not prompts:
        raise PromptFileError(f"prompt file {str(path)!r} holds no prompts; give {FORMATS}")
    if any(images) and not all(images):
        n = images.index(None) + 1
        raise PromptFileError(
            f'prompt file {str(path)!r} line {n}: no "image", while other lines have one; an editing '
            'set needs a source image on every line ({"prompt": ..., "image": "file.png"})'
        )
    return PromptSet(prompts, metadata, str(path), images)


def edit_mismatch(family: str, edits: bool, where: str) -> str:
    """Why the prompts of ``where`` do not suit model family ``family`` (which ``edits`` images or
    not): an editing family without source images, or source images for one that does not edit."""
    if edits:
        return (
            f"model family {family!r} edits images: every prompt of {where} needs a source image "
            '(a .jsonl prompt file with lines {"prompt": ..., "image": "file.png"})'
        )
    return (
        f'{where} gives source images ("image"), but model family {family!r} does not edit images '
        "(it would ignore them); use an editing family (qwen_image_edit, flux_kontext) or drop the images"
    )


def given_prompts(prompts: list[str], images: list[str] | None = None) -> PromptSet:
    """Prompts given on the command line (``--prompt``), with their source images (``--image``,
    one per prompt, relative to the working directory) for an editing family. A prompt must be
    one line of text: an empty one, one with a line break (or a character some tools take for
    one) or a NUL is refused, as a prompt file's line would be."""
    problems = [
        f"--prompt {n} ({quoted(p, 60)}): {why}"
        for n, p in enumerate(prompts, 1)
        if (why := prompt_problem(p))
    ]
    if problems:
        raise PromptFileError("; ".join(problems))
    if images is None:
        return PromptSet(list(prompts), source="--prompt")
    if len(images) != len(prompts):
        raise PromptFileError(
            f"give one --image per --prompt (an editing family edits each prompt's image): got "
            f"{len(prompts)} prompts and {len(images)} images"
        )
    files, problems = [], []
    for n, image in enumerate(images, 1):
        path, problem = _image_field({"image": image}, Path.cwd())
        files.append(path)
        if problem:
            problems.append(f"--image {n}: {problem}")
    if problems:
        raise PromptFileError("; ".join(problems))
    return PromptSet(list(prompts), source="--prompt", images=files)


def _image_field(row: dict[str, Any], folder: Path) -> tuple[Path | None, str]:
    """A JSONL line's ``"image"``: the file (relative to the prompt file's ``folder``) and ""; or
    None and what is wrong with it."""
    if "image" not in row or row["image"] is None:
        return None, ""
    value = row["image"]
    if not isinstance(value, str) or not value.strip():
        return None, f'"image" must be a path to an image file (a string), got {json.dumps(value)}'
    image = folder / Path(value).expanduser()
    if (problem := file_problem(image)) is not None:  # a folder, a FIFO (PIL would wait), a loop
        problem = "no such file" if problem == "does not exist" else f"it {problem}"
        return None, f'"image" {value!r}: {problem} ({str(image)!r})'
    try:
        with Image.open(image) as img:
            img.verify()  # the header and the data's integrity, without decoding every pixel
    except Image.DecompressionBombError as e:  # its header claims billions of pixels
        return None, f'"image" {value!r} is too large an image to decode ({e}); resize it'
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        return None, f'"image" {value!r} is not a readable image ({e}); replace the file'
    return image, ""


def crop_box(w: int, h: int, height: int, width: int) -> tuple[int, int, int, int]:
    """``(left, top, crop_w, crop_h)``: the largest window of a ``w x h`` image with the aspect
    ratio ``height : width``, centred."""
    cw, ch = min(w, round(h * width / height)), min(h, round(w * height / width))
    return (w - cw) // 2, (h - ch) // 2, cw, ch


def image_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` of an image file, from its header (no pixels decoded)."""
    with Image.open(path) as img:
        return img.size


def load_source(path: Path, height: int, width: int) -> Source:
    """``path``'s image as a :class:`~diffrl.core.rollout.Source`: RGB, centre-cropped to the aspect
    ratio ``height : width`` (the largest such window of the image), not resized."""
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:  # a bomb: billions of pixels
        raise PromptFileError(f"cannot decode the source image {str(path)!r}: {e}; replace the file") from e
    left, top, cw, ch = crop_box(*img.size, height, width)
    if (cw, ch) != img.size:
        img = img.crop((left, top, left + cw, top + ch))
    pixels = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(ch, cw, 3).permute(2, 0, 1)
    return Source(pixels.contiguous(), f"{path.resolve()}@{left},{top},{cw}x{ch}")
