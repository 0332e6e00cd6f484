"""Reading a file the user named (a recipe, a prompt file, an image, a dataset's files) safely.

A path may name anything: a folder, a FIFO (opening it for reading waits for a writer: forever),
a device (``/dev/zero`` never ends), a socket, a symlink loop, a file this user may not read, one
of gigabytes, bytes that are not UTF-8. :func:`file_problem` says which, without opening the path;
:func:`read_text` and :func:`read_bytes` refuse all of them with a :class:`UserFileError` that
names the file and what to give instead, and never block: the file is opened non-blocking and
checked again once open (it may have been swapped since).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import stat
from pathlib import Path
from typing import Any

from safetensors import safe_open

from diffrl.core.errors import DiffrlError

MAX_TEXT_BYTES = 256 * 1024**2
"""The largest text file read whole (a prompt set of millions of lines is well below it)."""


class UserFileError(DiffrlError, ValueError):
    """A file the user named that cannot be read as one (the message names it and the fix)."""


def file_kind(mode: int) -> str:
    """A non-regular file's kind, for a message (``a FIFO (named pipe)``)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def file_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a regular file this process can read, in words (``does not exist``,
    ``is a folder``, ``is a FIFO (named pipe), not a regular file``, ``is a symlink loop``,
    ``cannot be read (permission denied)``), or None. Nothing is opened."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "is a symlink to a missing file" if path.is_symlink() else "does not exist"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symlink loop"
        if e.errno in (errno.EACCES, errno.EPERM):
            return "cannot be reached (permission denied on a folder above it)"
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        return f"is {file_kind(mode)}, not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def check_file(path: str | Path, what: str, fix: str) -> Path:
    """``path``, or a :class:`UserFileError`: ``{what} '{path}' {problem}; {fix}``."""
    if (problem := file_problem(path)) is not None:
        raise UserFileError(f"{what} {str(path)!r} {problem}; {fix}")
    return Path(path)


def read_bytes(path: str | Path, what: str, fix: str, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``), or a :class:`UserFileError`
    naming ``what`` and ``path`` and ending with ``fix``. Never blocks (a FIFO swapped in after
    the check is refused once open)."""
    check_file(path, what, fix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserFileError(f"{what} {str(path)!r} cannot be opened ({e.strerror or e}); {fix}") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserFileError(
                f"{what} {str(path)!r} is {file_kind(info.st_mode)}, not a regular file; {fix}"
            )
        if info.st_size > max_bytes:
            raise UserFileError(
                f"{what} {str(path)!r} is {info.st_size:,} bytes, more than the {max_bytes:,} read at "
                f"most (is it the right file?); {fix}"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise UserFileError(f"{what} {str(path)!r} cannot be read ({e.strerror or e}); {fix}") from e
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while read
        raise UserFileError(f"{what} {str(path)!r} is more than {max_bytes:,} bytes; {fix}")
    return data


def read_text(path: str | Path, what: str, fix: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """:func:`read_bytes`, decoded as UTF-8 (a byte-order mark dropped); bytes that are not UTF-8
    are a :class:`UserFileError` giving the line and column of the first."""
    data = read_bytes(path, what, fix, max_bytes)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise UserFileError(
            f"{what} {str(path)!r} is not UTF-8 text (line {line}, column {column}: byte "
            f"0x{data[start]:02x}); {fix}"
        ) from e


def read_json(path: str | Path, what: str, fix: str, max_bytes: int = MAX_TEXT_BYTES) -> Any:
    """:func:`read_text`, parsed as JSON; JSON that is not valid or is nested too deeply for
    Python's parser (``[`` * 100,000: a RecursionError) is a :class:`UserFileError` too."""
    text = read_text(path, what, fix, max_bytes)
    try:
        return json.loads(text)
    except RecursionError as e:
        raise UserFileError(f"{what} {str(path)!r} is JSON nested too deeply to read; {fix}") from e
    except ValueError as e:  # JSONDecodeError, and integers past Python's 4,300 digits
        raise UserFileError(f"{what} {str(path)!r} is not valid JSON ({str(e)[:200]}); {fix}") from e


def read_json_object(
    path: str | Path, what: str, fix: str, max_bytes: int = MAX_TEXT_BYTES
) -> dict[str, Any]:
    """:func:`read_json` that must hold a JSON object (``{...}``), as every config file does."""
    data = read_json(path, what, fix, max_bytes)
    if not isinstance(data, dict):
        raise UserFileError(
            f"{what} {str(path)!r} holds {_json_kind(data)}, not a JSON object ({{...}}); {fix}"
        )
    return data


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, str):
        return "a JSON string"
    if isinstance(value, bool):
        return "a JSON boolean"
    return "JSON null" if value is None else "a JSON number"


MAX_FOLDER_ENTRIES = 10_000
"""The most entries of one model folder checked (a model holds a few files, a sharded one hundreds)."""


MAX_LAYERS = 10_000
"""The most layers (blocks) a model part's ``config.json`` may declare: the deepest released
diffusion transformers and text encoders have a few hundred; building one, even its empty copy on
the meta device (``diffrl plan``), takes time in proportion (``num_layers: 10**9`` ran for good)."""


def _is_layer_count(key: str) -> bool:
    """``num_layers``, ``num_single_layers``, ``num_hidden_layers``, ``n_layers``, ``num_blocks``..."""
    return key.startswith(("num_", "n_")) and key.endswith(("layers", "blocks"))


def layer_count_problem(settings: Any) -> str | None:
    """What is wrong with a model config's layer counts (its own and its sub-configs',
    ``text_config``), or None: a count over :data:`MAX_LAYERS`."""
    if not isinstance(settings, dict):
        return None
    for key, value in settings.items():
        if isinstance(value, dict):
            inner = layer_count_problem(value) if key.endswith("config") else None
            if inner:
                return f"{key}.{inner}"
        elif _is_layer_count(key) and isinstance(value, int | float) and value > MAX_LAYERS:
            shown = str(value) if len(str(value)) <= 40 else f"a {len(str(value))}-digit number"
            return f"{key} is {shown}, more than the {MAX_LAYERS:,} layers any model has"
    return None


def check_model_files(folder: str | Path, what: str, fix: str) -> None:
    """Refuse the files directly in a model's folder (transformers' or diffusers' ``from_pretrained``
    reads them) that a loader would hang or crash on: a FIFO (a read waits for a writer), a
    device, a symlink loop, an unreadable file; a ``.json`` file that is not one JSON object of
    at most 256 MB (nested 100,000 deep, the libraries' parsers raise RecursionError), a
    ``config.json`` declaring more than :data:`MAX_LAYERS` layers; a
    ``.safetensors`` file whose header does not read (empty, garbage, a sparse file of zeros).
    Only headers are read of weights. A :class:`UserFileError`: ``{what} '{file}' {problem}; {fix}``."""
    with os.scandir(folder) as entries:
        for entry in itertools.islice(entries, MAX_FOLDER_ENTRIES):
            path = Path(entry.path)
            if path.is_dir():
                continue
            if path.suffix == ".json":
                problem = layer_count_problem(read_json_object(path, what, fix))
                if problem and path.name == "config.json":
                    raise UserFileError(f"{what} {str(path)!r}: {problem}; {fix}")
            elif path.suffix == ".safetensors":
                check_safetensors(path, what, fix)
            else:
                check_file(path, what, fix)


def check_safetensors(path: str | Path, what: str, fix: str) -> None:
    """Refuse ``path`` unless it is a regular file whose safetensors header reads (its tensors'
    offsets within the file); only the header is read."""
    check_file(path, what, fix)
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as e:  # noqa: BLE001 - safetensors' error type differs between its versions
        detail = " ".join(str(e).split())[:200]
        raise UserFileError(f"{what} {str(path)!r} is not a safetensors file ({detail}); {fix}") from e
