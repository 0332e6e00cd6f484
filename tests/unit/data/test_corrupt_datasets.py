"""Damaged data a user may point a run at (issue 36, class 9): image folders, pair folders,
editing prompt sets, Hugging Face ``datasets`` folders, recipes and prompt files.

Every case is refused before any model loads, with a :class:`~diffrl.core.errors.DiffrlError` that
names the file and the fix, and nothing waits: a FIFO where a file is expected is refused before
it is opened (reading it would wait for a writer for ever). A file cut short after its image
header is the one thing found only when it is decoded (by the run, still a clear error)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PIL import Image

from diffrl.config.binding import read_recipe
from diffrl.core.errors import DiffrlError
from diffrl.core.user_files import UserFileError, file_problem, read_text
from diffrl.data.offline import ImageFolderDataset, PreferencePairDataset, load_image
from diffrl.data.prompts import load_prompts


@contextmanager
def no_hang(seconds: int = 60) -> Iterator[None]:
    """Fail (rather than hang the suite) if the block waits longer than ``seconds``."""

    def hung(signum, frame):
        raise AssertionError(f"waited more than {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def png(path: Path, size: tuple[int, int] = (8, 8)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (200, 10, 10)).save(path)


def fifo(path: Path) -> None:
    os.mkfifo(path)


def folder(path: Path) -> None:
    path.mkdir()


def loop(path: Path) -> None:
    path.symlink_to(path.name)


def text(content: str | bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    return write


def truncated(path: Path) -> None:
    png(path, (64, 64))
    path.write_bytes(path.read_bytes()[:60])


NOT_A_FILE = {
    "fifo": (fifo, "is a FIFO (named pipe), not a regular file"),
    "folder": (folder, "is a folder"),
    "symlink-loop": (loop, "is a symlink loop"),
}
NOT_AN_IMAGE = {
    **NOT_A_FILE,
    "text": (text("hello"), "is not an image (cannot identify image file"),
    "empty": (text(b""), "is not an image (cannot identify image file"),
}


def expect_refusal(load: Callable[[], object], *said: str) -> str:
    with no_hang(), pytest.raises(DiffrlError) as refused:
        load()
    message = str(refused.value)
    for piece in said:
        assert piece in message, message
    return message


# ---- an image folder (SFT) ----------------------------------------------------------------------


def image_folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    png(root / "b.png")
    (root / "b.txt").write_text("a caption")
    return root


@pytest.mark.parametrize(("make", "said"), NOT_AN_IMAGE.values(), ids=list(NOT_AN_IMAGE))
def test_an_image_folder_refuses_an_image_that_is_none(make, said, tmp_path):
    root = image_folder(tmp_path)
    make(root / "a.png")
    (root / "a.txt").write_text("c")
    expect_refusal(
        lambda: ImageFolderDataset(root, 8, 8),
        "1 image or caption file(s)",
        f"image a.png {said}",
        "remove or replace",
    )


@pytest.mark.parametrize(("make", "said"), NOT_A_FILE.values(), ids=list(NOT_A_FILE))
def test_an_image_folder_refuses_a_caption_file_that_is_none(make, said, tmp_path):
    root = image_folder(tmp_path)
    png(root / "a.png")
    make(root / "a.txt")
    expect_refusal(lambda: ImageFolderDataset(root, 8, 8), "caption file", "a.txt", said)


@pytest.mark.parametrize(("make", "said"), NOT_A_FILE.values(), ids=list(NOT_A_FILE))
def test_an_image_folder_refuses_a_metadata_file_that_is_none(make, said, tmp_path):
    root = image_folder(tmp_path)
    make(root / "metadata.jsonl")
    expect_refusal(lambda: ImageFolderDataset(root, 8, 8), "metadata file", "metadata.jsonl", said)


def test_an_image_folder_refuses_a_metadata_row_naming_a_folder(tmp_path):
    root = image_folder(tmp_path)
    (root / "sub" / "x.png").mkdir(parents=True)
    (root / "metadata.jsonl").write_text('{"file_name": "sub/x.png", "text": "c"}\n')
    expect_refusal(lambda: ImageFolderDataset(root, 8, 8), "image sub/x.png is a folder")


def test_a_caption_that_is_not_utf8_is_refused_with_its_line(tmp_path):
    root = image_folder(tmp_path)
    png(root / "a.png")
    (root / "a.txt").write_bytes(b"fine\ncaf\xe9\n")
    expect_refusal(
        lambda: ImageFolderDataset(root, 8, 8), "a.txt", "is not UTF-8 text (line 2, column 4: byte 0xe9)"
    )


def test_an_image_cut_short_is_refused_when_it_is_decoded(tmp_path):
    root = image_folder(tmp_path)
    truncated(root / "a.png")
    (root / "a.txt").write_text("c")
    data = ImageFolderDataset(root, 8, 8)  # its header reads: the scan cannot tell
    expect_refusal(lambda: data[0], "cannot decode image", "a.png", "remove or replace the file")


def test_an_image_swapped_for_a_fifo_after_the_scan_is_refused_not_waited_for(tmp_path):
    root = image_folder(tmp_path)
    data = ImageFolderDataset(root, 8, 8)
    (root / "b.png").unlink()
    os.mkfifo(root / "b.png")
    expect_refusal(lambda: data[0], "b.png", "is a FIFO")
    expect_refusal(lambda: load_image(root / "b.png", 8, 8), "is a FIFO")


# ---- a pair folder (offline DPO) ----------------------------------------------------------------


def pair_folder(tmp_path: Path) -> Path:
    root = tmp_path / "pairs"
    png(root / "b.png")
    (root / "metadata.jsonl").write_text(
        json.dumps({"prompt": "x", "chosen": "a.png", "rejected": "b.png"}) + "\n"
    )
    return root


@pytest.mark.parametrize(("make", "said"), NOT_AN_IMAGE.values(), ids=list(NOT_AN_IMAGE))
def test_a_pair_folder_refuses_an_image_that_is_none(make, said, tmp_path):
    root = pair_folder(tmp_path)
    make(root / "a.png")
    expect_refusal(lambda: PreferencePairDataset(root, 8, 8), "line 1: field 'chosen': 'a.png'", said)


@pytest.mark.parametrize(("make", "said"), NOT_A_FILE.values(), ids=list(NOT_A_FILE))
def test_a_pair_folder_refuses_a_metadata_file_that_is_none(make, said, tmp_path):
    root = pair_folder(tmp_path)
    png(root / "a.png")
    (root / "metadata.jsonl").unlink()
    make(root / "metadata.jsonl")
    expect_refusal(lambda: PreferencePairDataset(root, 8, 8), "pair file", "metadata.jsonl", said)


# ---- an editing prompt set (JSONL lines with source images) -------------------------------------

EDIT_IMAGES = {
    "fifo": (fifo, "it is a FIFO (named pipe), not a regular file"),
    "folder": (folder, "it is a folder"),
    "symlink-loop": (loop, "it is a symlink loop"),
    "missing": (lambda p: None, "no such file"),
    "text": (text("hello"), "is not a readable image (cannot identify image file"),
    "empty": (text(b""), "is not a readable image"),
    "truncated": (truncated, "is not a readable image"),
}


@pytest.mark.parametrize(("make", "said"), EDIT_IMAGES.values(), ids=list(EDIT_IMAGES))
def test_an_editing_prompt_set_refuses_a_source_image_that_is_none(make, said, tmp_path):
    png(tmp_path / "b.png")
    make(tmp_path / "a.png")
    lines = [{"prompt": "x", "image": "a.png"}, {"prompt": "y", "image": "b.png"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    expect_refusal(lambda: load_prompts(tmp_path / "p.jsonl"), "line 1:", "'a.png'", said)


# ---- recipes and prompt files -------------------------------------------------------------------

NOT_TEXT = {**NOT_A_FILE, "device": (None, "is a device, not a regular file")}


@pytest.mark.parametrize(("make", "said"), NOT_TEXT.values(), ids=list(NOT_TEXT))
def test_a_prompt_file_that_is_no_file_is_refused_unopened(make, said, tmp_path):
    path = Path("/dev/zero") if make is None else tmp_path / "p.txt"
    if make is not None:
        make(path)
    expect_refusal(lambda: load_prompts(path), "prompt file", said)


@pytest.mark.parametrize(("make", "said"), [NOT_TEXT["fifo"], NOT_TEXT["device"]], ids=["fifo", "device"])
def test_a_recipe_that_is_no_file_is_refused_unopened(make, said, tmp_path):
    path = Path("/dev/zero") if make is None else tmp_path / "r.yaml"
    if make is not None:
        make(path)
    expect_refusal(lambda: read_recipe(path), said, "give a recipe .yaml file")


def test_a_prompt_file_that_is_not_utf8_says_where(tmp_path):
    (tmp_path / "p.txt").write_bytes(b"a cat\na dog \xff\n")
    expect_refusal(
        lambda: load_prompts(tmp_path / "p.txt"), "is not UTF-8 text (line 2, column 7: byte 0xff)"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_prompt_file_is_refused(tmp_path):
    (tmp_path / "p.txt").write_text("a cat\n")
    (tmp_path / "p.txt").chmod(0)
    expect_refusal(lambda: load_prompts(tmp_path / "p.txt"), "cannot be read (permission denied)")


# ---- Hugging Face datasets folders --------------------------------------------------------------

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
PROMPTS = {"prompt": ["a", "b"]}


def parquet(path: Path, columns: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns or PROMPTS), path)


HF_CASES = {
    "empty-shard": (
        lambda d: (
            parquet(d / "data/train-00000-of-00002.parquet"),
            (d / "data/train-00001-of-00002.parquet").write_bytes(b""),
        ),
        "train-00001-of-00002.parquet' is not a readable parquet file",
    ),
    "corrupt-shard": (
        lambda d: (
            parquet(d / "data/train-00000-of-00002.parquet"),
            (d / "data/train-00001-of-00002.parquet").write_bytes(b"PAR1" + b"\0" * 40 + b"PAR1"),
        ),
        "train-00001-of-00002.parquet' is not a readable parquet file",
    ),
    "two-schemas": (
        lambda d: (
            parquet(d / "data/train-00000-of-00002.parquet"),
            parquet(d / "data/train-00001-of-00002.parquet", {"prompt": [1]}),
        ),
        "have different columns or types (prompt: string against prompt: int64); give files of one schema",
    ),
    "two-column-sets": (
        lambda d: (
            parquet(d / "data/train-00000-of-00002.parquet"),
            parquet(d / "data/train-00001-of-00002.parquet", {"text": ["q"]}),
        ),
        "(prompt: string against text: string)",
    ),
    "parquet-fifo": (
        lambda d: fifo(d / "train.parquet"),
        "train.parquet' is a FIFO (named pipe), not a regular file",
    ),
    "parquet-symlink-loop": (lambda d: loop(d / "train.parquet"), "train.parquet' is a symlink loop"),
    "zero-rows": (
        lambda d: parquet(d / "train.parquet", {"prompt": pa.array([], pa.string())}),
        "holds no rows",
    ),
    "dataset-dict-fifo": (lambda d: fifo(d / "dataset_dict.json"), "dataset_dict.json' is a FIFO"),
    "dataset-dict-not-utf8": (
        lambda d: text(b"\xff")(d / "dataset_dict.json"),
        "dataset_dict.json' is not UTF-8 text",
    ),
}


@pytest.mark.parametrize(("make", "said"), HF_CASES.values(), ids=list(HF_CASES))
def test_a_datasets_folder_that_is_damaged_is_refused_naming_the_file(make, said, tmp_path):
    pytest.importorskip("datasets")
    root = tmp_path / "hf"
    root.mkdir()
    make(root)
    expect_refusal(lambda: load_prompts(root), said)


@pytest.mark.parametrize("damaged", ["arrow-fifo", "state-fifo", "info-fifo", "state-folder"])
def test_a_save_to_disk_folder_with_a_file_that_is_none_is_refused(damaged, tmp_path):
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "ds"
    datasets.Dataset.from_dict(PROMPTS).save_to_disk(str(root))
    name = {"state-fifo": "state.json", "info-fifo": "dataset_info.json", "state-folder": "state.json"}.get(
        damaged
    )
    target = root / name if name else next(root.glob("*.arrow"))
    target.unlink()
    (folder if damaged == "state-folder" else fifo)(target)
    expect_refusal(
        lambda: load_prompts(root), f"{target.name} is a", "write the folder again with save_to_disk"
    )


# ---- the shared helper --------------------------------------------------------------------------


def test_file_problem_names_what_a_path_is(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "dangling").symlink_to("nowhere")
    assert file_problem(tmp_path / "f") is None
    assert file_problem(tmp_path / "nowhere") == "does not exist"
    assert file_problem(tmp_path / "dangling") == "is a symlink to a missing file"
    assert file_problem(tmp_path) == "is a folder, not a file"
    assert file_problem(Path("/dev/null")) == "is a device, not a regular file"


def test_read_text_bounds_size_and_drops_a_byte_order_mark(tmp_path):
    (tmp_path / "f").write_bytes(b"\xef\xbb\xbfhello")
    assert read_text(tmp_path / "f", "file", "fix") == "hello"
    with pytest.raises(UserFileError, match=r"is 8 bytes, more than the 4 read at most .*; fix"):
        read_text(tmp_path / "f", "file", "fix", max_bytes=4)
