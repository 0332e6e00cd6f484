import json

import pytest
from PIL import Image

from diffrl.data.offline import DatasetError, ImageFolderDataset


def test_image_folder(tmp_path):
    Image.new("RGB", (64, 64), (255, 0, 0)).save(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("a red square")
    Image.new("RGB", (32, 32), (0, 255, 0)).save(tmp_path / "b.jpg")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "b.jpg", "text": "green"}) + "\n")
    ds = ImageFolderDataset(tmp_path, 32, 64)
    assert len(ds) == 2
    img, cap = ds[0]
    assert img.shape == (3, 32, 64) and cap == "a red square" and img[0].mean() > 0.99


def test_image_folder_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        ImageFolderDataset(tmp_path / "nope", 32, 64)
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    with pytest.raises(DatasetError, match="no caption"):
        ImageFolderDataset(tmp_path, 32, 64)
    (tmp_path / "a.txt").write_text("cap")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    (tmp_path / "broken.txt").write_text("cap")
    with pytest.raises(DatasetError, match="broken.png is not an image"):  # found by its header, at once
        ImageFolderDataset(tmp_path, 32, 64)
    Image.new("RGB", (64, 64)).save(tmp_path / "broken.png")
    (tmp_path / "broken.png").write_bytes((tmp_path / "broken.png").read_bytes()[:60])  # cut short
    ds = ImageFolderDataset(tmp_path, 32, 64)
    with pytest.raises(DatasetError, match="cannot decode image .*broken.png"):
        ds[1]
