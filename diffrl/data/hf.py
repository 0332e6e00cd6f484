"""Hugging Face ``datasets`` folders, read as they are: prompt sets and SFT image data.

Two layouts of a folder (:func:`find_hf_folder` tells them apart):

- what ``save_to_disk`` writes: a ``Dataset`` folder (``state.json``, ``dataset_info.json``,
  ``data-*.arrow``), one split; or a ``DatasetDict`` folder (``dataset_dict.json`` and a
  ``Dataset`` folder per split);
- parquet files, as a Hub dataset repository holds them: ``data/train-00000-of-00001.parquet``,
  ``train.parquet``, ``train/part-0.parquet``, ... A file's split is the name before its
  ``-NNNNN-of-NNNNN`` shard number, else the file's name when it is a split name
  (:data:`SPLIT_NAMES`), else the folder holding it (not the root, not ``data/``); any other
  file is in ``train``.

A split is named by ``FOLDER#SPLIT``. Without one, ``data.prompts`` and ``data.dataset`` read
``train`` (:data:`TRAIN_SPLITS`), ``eval.prompts`` ``test`` else ``validation``
(:data:`EVAL_SPLITS`); a folder of one split reads that one.

Columns: the prompt (or caption) is the first of :data:`PROMPT_COLUMNS` present; a prompt set
keeps every other column but images and raw bytes as each prompt's reward metadata. SFT images
come from a ``datasets.Image`` column (else a column named ``image``): encoded bytes or a file path
(relative to the folder).

``save_to_disk`` folders are memory-mapped by ``datasets.load_from_disk``; parquet files are read
by pyarrow (``datasets.load_dataset("parquet")`` would write an Arrow copy into the cache folder).
Neither touches the network or ``~/.cache``.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffrl.config import resolve_data_path
from diffrl.core.errors import DiffrlError
from diffrl.core.user_files import UserFileError, file_problem, read_text
from diffrl.data.lines import MAX_PROMPT_CHARS
from diffrl.logging.quiet import quiet_libraries

PROMPT_COLUMNS = ("prompt", "text", "caption")
"""The prompt (caption) column: the first of these a split has."""
TRAIN_SPLITS = ("train",)
"""The split ``data.prompts`` and ``data.dataset`` read when the path names none."""
EVAL_SPLITS = ("test", "validation")
"""The split ``eval.prompts`` reads when the path names none (the first present)."""
SPLIT_NAMES = ("train", "test", "validation", "valid", "dev", "eval")
"""Parquet file names taken as split names (``test.parquet`` is split ``test``)."""
INSTALL = 'pip install "diffrl[datasets]"'
SHARD = re.compile(r"^(?P<split>[\w.]+?)-\d+-of-\d+")
"""A Hub shard's name: ``train-00000-of-00003.parquet`` (sometimes with a suffix after it)."""


class HFFolderError(DiffrlError, ValueError):
    """A ``datasets`` folder that cannot be read as asked (a missing split, column, package)."""


@dataclass(frozen=True)
class HFFolder:
    """A ``datasets`` folder on disk and its splits (not read yet)."""

    root: Path
    kind: str
    """``disk`` (``save_to_disk`` of a Dataset or a DatasetDict) or ``parquet``."""
    splits: dict[str, list[Path]]
    """Each split's ``Dataset`` folder (``disk``) or parquet files (``parquet``)."""


@dataclass
class HFSplit:
    """One split of a ``datasets`` folder, read (its image cells not decoded)."""

    table: Any
    """A ``pyarrow.Table`` (memory-mapped for a ``save_to_disk`` folder)."""
    features: Any
    """Its ``datasets.Features`` (column types, e.g. which columns are images)."""
    root: Path
    """The folder image paths are relative to."""
    where: str
    """``'FOLDER' split 'NAME'``, for messages."""

    @property
    def columns(self) -> list[str]:
        return list(self.table.column_names)


def split_path(path: str) -> tuple[Path, str | None]:
    """``FOLDER#SPLIT`` -> ``(FOLDER, SPLIT)``; a path without ``#``, or one that exists as
    written (a file name may hold a ``#``), -> ``(path, None)``."""
    file = resolve_data_path(path)
    if "#" in path and not file.exists():
        base, _, split = path.rpartition("#")
        return resolve_data_path(base), split.strip() or None
    return file, None


def find_hf_folder(root: Path) -> HFFolder | None:
    """``root`` as a ``datasets`` folder, or None when it is not one (no ``dataset_dict.json``,
    no ``state.json`` + ``dataset_info.json``, no parquet file up to two folders down)."""
    if not root.is_dir():
        return None
    index = root / "dataset_dict.json"
    if _present(index):
        try:
            names = json.loads(read_text(index, "datasets file", RESAVE))["splits"]
            splits = {str(s): [root / str(s)] for s in names}
        except UserFileError as e:
            raise HFFolderError(str(e)) from e
        except (json.JSONDecodeError, KeyError, TypeError, RecursionError) as e:  # nested 100,000 deep too
            raise HFFolderError(
                f"{str(index)!r} is not a DatasetDict's index ({type(e).__name__}: {str(e)[:200]}); write the "
                "folder again with DatasetDict.save_to_disk"
            ) from e
        return HFFolder(root, "disk", splits)
    if _present(root / "state.json") and _present(root / "dataset_info.json"):
        _check_disk_files(root)
        try:
            name = json.loads(read_text(root / "state.json", "datasets file", RESAVE)).get("_split")
        except (json.JSONDecodeError, AttributeError, UserFileError, RecursionError):
            name = None  # load_from_disk reports a broken state.json
        return HFFolder(root, "disk", {str(name or "train"): [root]})
    files = sorted({*root.glob("*.parquet"), *root.glob("*/*.parquet"), *root.glob("*/*/*.parquet")})
    if not files:
        return None
    splits: dict[str, list[Path]] = {}
    for f in files:
        splits.setdefault(_parquet_split(f, root), []).append(f)
    return HFFolder(root, "parquet", splits)


RESAVE = "write the folder again with save_to_disk (or give the parquet files)"


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _check_disk_files(folder: Path) -> None:
    """Every file of a ``save_to_disk`` split folder is a regular file: a FIFO among them would
    make ``datasets`` wait for ever."""
    files = [folder / "state.json", folder / "dataset_info.json", *sorted(folder.glob("*.arrow"))]
    bad = [f"{f.name} {p}" for f in files if (p := file_problem(f)) is not None]
    if bad:
        raise HFFolderError(f"datasets folder {str(folder)!r}: {'; '.join(bad[:5])}; {RESAVE}")


def _parquet_split(file: Path, root: Path) -> str:
    """The split a parquet file belongs to (see the module's docstring)."""
    shard = SHARD.match(file.stem)
    if shard:
        return shard["split"]
    if file.stem in SPLIT_NAMES:
        return file.stem
    folders = [p for p in file.relative_to(root).parts[:-1] if p != "data"]
    return folders[-1] if folders else "train"


def choose_split(where: str, splits: list[str], wanted: str | None, defaults: tuple[str, ...]) -> str:
    """The split to read: ``wanted`` (it must exist), else the first of ``defaults`` present,
    else the only one."""
    listed = ", ".join(repr(s) for s in splits) or "none"
    if wanted is not None:
        if wanted not in splits:
            raise HFFolderError(f"{where} has no split {wanted!r}; its splits: {listed}")
        return wanted
    for name in defaults:
        if name in splits:
            return name
    if len(splits) == 1:
        return splits[0]
    raise HFFolderError(
        f"{where} holds the splits {listed}, none of them {' or '.join(map(repr, defaults))}; "
        f"name the one to read as {where.strip(chr(39))}#SPLIT"
    )


def _datasets():
    """The ``datasets`` package, imported only when a ``datasets`` folder is read: it is an
    optional dependency (``diffrl[datasets]``) and takes seconds to import."""
    try:
        import datasets
    except ImportError as e:
        raise HFFolderError(
            f"reading a Hugging Face datasets folder needs the datasets package; {INSTALL}"
        ) from e
    quiet_libraries()  # no "Loading dataset" bars of datasets' in a run's log
    return datasets


def read_split(
    path: str, defaults: tuple[str, ...], columns: Any = None, folder: HFFolder | None = None
) -> HFSplit:
    """The split of ``datasets`` folder ``path`` (``FOLDER#SPLIT``, else the first of
    ``defaults``) with its ``columns`` (a callable picking them from the ``datasets.Features``;
    None: all). A split without rows is an error."""
    datasets = _datasets()
    import pyarrow as pa  # installed with datasets
    import pyarrow.parquet as pq

    root, wanted = split_path(path)
    folder = folder or find_hf_folder(root)
    if folder is None:
        raise HFFolderError(f"{str(path)!r} is not a datasets folder")
    name = choose_split(repr(str(root)), list(folder.splits), wanted, defaults)
    where = f"{str(root)!r} split {name!r}"
    if folder.kind == "disk":
        if folder.splits[name][0].is_dir():
            _check_disk_files(folder.splits[name][0])
        if _no_shards(folder.splits[name][0]):  # load_from_disk fails on it (an IndexError)
            raise HFFolderError(f"{where} holds no rows; give a split with data")
        try:
            ds = datasets.load_from_disk(str(folder.splits[name][0]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
            # its JSON files of the wrong shape, or nested 100,000 deep, too
            detail = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            raise HFFolderError(
                f"{where} cannot be read by datasets.load_from_disk ({detail}); write it again with save_to_disk"
            ) from e
        if isinstance(ds, datasets.DatasetDict):  # a split folder that is itself a DatasetDict
            raise HFFolderError(f"{where} is a DatasetDict, not one split; name a split inside it")
        features, table = ds.features, ds.data.table
        if columns is not None:
            table = table.select(columns(features))
    else:
        files = folder.splits[name]
        schemas = [_parquet_schema(f, where, pq, pa) for f in files]
        for f, schema in zip(files[1:], schemas[1:]):
            if not schema.equals(schemas[0]):
                raise HFFolderError(
                    f"{where}: its parquet files {files[0].name} and {f.name} have different columns "
                    f"or types ({_columns(schemas[0])} against {_columns(schema)}); give files of one schema"
                )
        try:
            features = datasets.Features.from_arrow_schema(schemas[0])
            keep = None if columns is None else columns(features)
            table = pa.concat_tables([pq.read_table(f, columns=keep) for f in files])
        except (pa.ArrowInvalid, OSError) as e:
            raise HFFolderError(
                f"{where}: its parquet files ({', '.join(f.name for f in files)}) cannot be read as one "
                f"table ({e}); replace the damaged file"
            ) from e
    if table.num_rows == 0:
        raise HFFolderError(f"{where} holds no rows; give a split with data")
    return HFSplit(table, features, folder.root, where)


def _parquet_schema(file: Path, where: str, pq: Any, pa: Any) -> Any:
    """``file``'s schema, or an :class:`HFFolderError` naming the file: not a regular file (a
    FIFO would make pyarrow wait for ever), empty, or no parquet file."""
    if (problem := file_problem(file)) is not None:
        raise HFFolderError(f"{where}: parquet file {str(file)!r} {problem}; remove or replace it")
    try:
        return pq.read_schema(file)
    except (pa.ArrowInvalid, OSError) as e:
        raise HFFolderError(
            f"{where}: {str(file)!r} is not a readable parquet file ({e}); remove it, or write it again"
        ) from e


def _columns(schema: Any) -> str:
    text = ", ".join(f"{f.name}: {f.type}" for f in schema)
    return text if len(text) <= 200 else text[:197] + "..."


def _no_shards(folder: Path) -> bool:
    """True when ``save_to_disk`` wrote no data file in ``folder`` (a split without rows)."""
    try:  # bounded and never waiting on a FIFO; JSON nested 100,000 deep is no state either
        state = json.loads(read_text(folder / "state.json", "datasets file", RESAVE))
    except (UserFileError, json.JSONDecodeError, RecursionError):
        return False  # load_from_disk reports it
    return isinstance(state, dict) and state.get("_data_files") == []


def prompt_column(names: list[str], where: str) -> str:
    """The prompt (caption) column of a split with the columns ``names``."""
    for name in PROMPT_COLUMNS:
        if name in names:
            return name
    raise HFFolderError(
        f"{where} has no prompt column ({' / '.join(PROMPT_COLUMNS)}); its columns: "
        f"{', '.join(names) or 'none'}; rename the prompt column to 'prompt'"
    )


def _is_media(feature: Any) -> bool:
    """A column of images, sound, video or raw bytes: not reward metadata."""
    datasets = _datasets()
    media = tuple(getattr(datasets, n) for n in ("Image", "Audio", "Video", "Pdf") if hasattr(datasets, n))
    if isinstance(feature, media):
        return True
    if isinstance(feature, datasets.Value):
        return feature.dtype in ("binary", "large_binary")
    if isinstance(feature, dict):
        return any(_is_media(f) for f in feature.values())
    inner = getattr(feature, "feature", None)  # List / Sequence / LargeList
    return inner is not None and _is_media(inner)


def _text_columns(where: str):
    """A ``columns`` picker for :func:`read_split`: the prompt column and every column but media."""

    def pick(features: Any) -> list[str]:
        names = list(features)
        prompt_column(names, where)
        return [n for n in names if not _is_media(features[n])]

    return pick


def read_prompt_rows(path: str, defaults: tuple[str, ...]) -> tuple[list[str], list[dict[str, Any]]]:
    """A ``datasets`` folder's prompts and each one's metadata (its other columns but media)."""
    root, _ = split_path(path)
    split = read_split(path, defaults, _text_columns(repr(str(root))))
    column = prompt_column(split.columns, split.where)
    prompts = split.table.column(column).to_pylist()
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()]
    if bad:
        rows = ", ".join(str(i) for i in bad[:10]) + (" ..." if len(bad) > 10 else "")
        raise HFFolderError(
            f"{split.where}: column {column!r} has {len(bad)} empty or non-text prompt(s) (rows {rows}); "
            "every row needs a prompt"
        )
    bad = [i for i, p in enumerate(prompts) if "\x00" in p or len(p) > MAX_PROMPT_CHARS]
    if bad:  # as a prompt file's line: no NUL, at most MAX_PROMPT_CHARS characters
        rows = ", ".join(str(i) for i in bad[:10]) + (" ..." if len(bad) > 10 else "")
        raise HFFolderError(
            f"{split.where}: column {column!r} has {len(bad)} prompt(s) holding a NUL byte or over "
            f"{MAX_PROMPT_CHARS:,} characters (rows {rows}); fix those rows"
        )
    others = [n for n in split.columns if n != column]
    values = {n: split.table.column(n).to_pylist() for n in others}
    metadata = [{n: values[n][i] for n in others} for i in range(len(prompts))]
    return prompts, metadata


@dataclass
class ImageRows:
    """An SFT split's captions and its image column (cells decoded one at a time)."""

    captions: list[str]
    images: Any
    """The image column, a ``pyarrow.ChunkedArray`` of encoded images or paths."""
    root: Path
    where: str
    column: str


def _image_column(features: Any, where: str) -> str:
    datasets = _datasets()
    names = list(features)
    images = [n for n in names if isinstance(features[n], datasets.Image)]
    if images:
        return "image" if "image" in images else images[0]
    if "image" in names:
        return "image"
    kinds = ", ".join(f"{n} ({type(features[n]).__name__})" for n in names)
    raise HFFolderError(
        f"{where} has no image column (a datasets.Image column, or one named 'image'); its "
        f"columns: {kinds or 'none'}"
    )


def read_image_rows(path: str, folder: HFFolder | None = None) -> ImageRows:
    """A ``datasets`` folder's training split as SFT data: captions and images (not decoded)."""
    root, _ = split_path(path)
    where = repr(str(root))

    def pick(features: Any) -> list[str]:
        return [prompt_column(list(features), where), _image_column(features, where)]

    split = read_split(path, TRAIN_SPLITS, pick, folder)
    caption, image = pick(split.features)
    captions = split.table.column(caption).to_pylist()
    bad = [i for i, c in enumerate(captions) if not isinstance(c, str) or not c.strip()]
    if bad:
        raise HFFolderError(
            f"{split.where}: column {caption!r} has {len(bad)} empty or non-text caption(s) (e.g. row "
            f"{bad[0]}); every image needs a caption"
        )
    return ImageRows(captions, split.table.column(image), split.root, split.where, image)


def image_cell(rows: ImageRows, i: int) -> tuple[io.BytesIO | Path, str]:
    """Row ``i``'s image as something PIL opens (its bytes, or its file) and a name for messages."""
    value = rows.images[i].as_py()
    name = f"{rows.where} row {i} column {rows.column!r}"
    if isinstance(value, dict):  # a datasets.Image cell: {"bytes": ..., "path": ...}
        if value.get("bytes"):
            return io.BytesIO(value["bytes"]), name
        value = value.get("path")
    if isinstance(value, bytes | bytearray):
        return io.BytesIO(value), name
    if isinstance(value, str) and value:
        file = Path(value).expanduser()
        return (file if file.is_absolute() else rows.root / file), name
    raise HFFolderError(f"{name} holds no image (got {value!r}); give image bytes or a file path")
