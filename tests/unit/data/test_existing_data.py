"""Data people already have, read as it is: flow_grpo's prompt sets and Hugging Face ``datasets``
folders (save_to_disk, parquet, imagefolder with metadata.csv), as prompts and as SFT data."""

import csv
import io
import json
import sys

import datasets
import pytest
from PIL import Image

from diffrl.config import ConfigError
from diffrl.data.offline import (
    DatasetError,
    HFImageDataset,
    ImageFolderDataset,
    scan_image_data,
    scan_image_folder,
)
from diffrl.data.prompts import PromptFileError, load_prompts
from diffrl.evaluation.evaluate import evaluate
from diffrl.launch import train
from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.rewards.ocr import ocr_reward_from_text
from tests.conftest import tiny_overrides

# Lines copied from github.com/yifan123/flow_grpo (commit ac4c86e): dataset/ocr/test.txt lines 1, 2,
# 346, 457, 471 and the line of the café (non-ASCII); the file has no newline after its last line.
# (dataset/ocr/train.txt is the same format; the copy we could read lacked it.)
OCR_LINES = [
    'A high-fashion runway with a sleek, modern backdrop displaying "Spring Collection 2024". Models walk confidently on the catwalk, showcasing vibrant, floral prints and pastel tones, under soft, ambient lighting that enhances the fresh, spring vibe.',
    'A close-up of a sleek smartwatch on a wrist, the screen displaying "Step Goal Achieved" with a celebratory animation, set against a blurred cityscape at dusk, capturing the moment of accomplishment.',
    'A scientist stands in a dimly lit laboratory, the chalk in her hand pausing mid-air. Behind her, a chalkboard filled with complex equations, culminating in the number "42" at the bottom right corner, illuminated by a single spotlight.',
    'A secret agent stands in a dimly lit room, holding a sleek black briefcase. The combination lock is set to "007", reflecting a glint of light. The agent\'s eyes are focused, their hand poised over the lock, ready to unlock the contents of the mysterious case.',
    'A close-up of an antique silver engraved locket with the initials "J L" delicately carved inside, set against a soft, blurred background of vintage lace and roses, capturing the essence of timeless romance and mystery.',
    'A cozy café interior with a rustic wooden table, a steaming cup of coffee, and a small white card that reads "PasswordIsCoffee123" prominently displayed next to the coffee. Soft, warm lighting enhances the inviting atmosphere.',
]
OCR_TARGETS = ["Spring Collection 2024", "Step Goal Achieved", "42", "007", "J L", "PasswordIsCoffee123"]

# dataset/pickscore/test.txt lines 27 and 194: prompts that open with a quote (one with an emoji)
PICKSCORE_LINES = [
    '"A baby connected to a neural network in a bunker 😂"',
    '"The Handshake" film still, panavision, 8K, movie by Francis ford Coppola',
]

# dataset/geneval/test_metadata.jsonl lines 1, 5, 8, 16 (train_metadata.jsonl has the same fields);
# line 1 again, as the file repeats lines (1,659 of its 2,212)
GENEVAL_LINES = [
    '{"tag": "counting", "include": [{"class": "wine glass", "count": 2}], "exclude": [{"class": "wine glass", "count": 3}], "prompt": "a photo of two wine glasses"}',
    '{"tag": "single_object", "include": [{"class": "bowl", "count": 1}], "prompt": "a photo of a bowl"}',
    '{"tag": "position", "include": [{"class": "laptop", "count": 1}, {"class": "cow", "count": 1, "position": ["right of", 0]}], "prompt": "a photo of a cow right of a laptop"}',
    '{"tag": "colors", "include": [{"class": "cup", "count": 1, "color": "purple"}], "prompt": "a photo of a purple cup"}',
]


def test_flow_grpo_ocr_prompts_load_and_their_quoted_text_is_the_ocr_target(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(OCR_LINES), encoding="utf-8")  # no final newline
    ps = load_prompts(tmp_path / "train.txt")
    assert ps.prompts == OCR_LINES and ps.metadata == [{} for _ in OCR_LINES]
    for prompt, target in zip(ps.prompts, OCR_TARGETS):
        assert prompt.split('"')[1] == target  # flow_grpo/ocr.py: prompt.split('"')[1]
        assert ocr_reward_from_text(target.upper(), prompt) == 1.0  # case and spaces ignored
        assert ocr_reward_from_text("", prompt) == 0.0
    # the recognised text holding the target is a match; one wrong character of "007" costs 1/3
    assert ocr_reward_from_text("SECRET 007 AGENT", OCR_LINES[3]) == 1.0
    assert ocr_reward_from_text("008", OCR_LINES[3]) == pytest.approx(2 / 3)


def test_text_file_quirks_load(tmp_path):
    body = "\r\n".join([*PICKSCORE_LINES, "x" * 5000]) + "\r\n\r\n  \n"  # CRLF, long, blank end
    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))  # with a byte-order mark
    assert load_prompts(tmp_path / "p.txt").prompts == [*PICKSCORE_LINES, "x" * 5000]
    (tmp_path / "dup.txt").write_text("a\na\nb\n")  # repeated prompts are kept, as flow_grpo keeps them
    assert load_prompts(tmp_path / "dup.txt").prompts == ["a", "a", "b"]
    (tmp_path / "gap.txt").write_text("a\n\nb\n")  # a blank line inside is still an error
    with pytest.raises(PromptFileError, match="line 2: empty prompt line"):
        load_prompts(tmp_path / "gap.txt")


def test_geneval_metadata_lines_keep_their_keys_as_reward_metadata(tmp_path):
    lines = [*GENEVAL_LINES, GENEVAL_LINES[0]]
    (tmp_path / "train_metadata.jsonl").write_text("\n".join(lines))
    ps = load_prompts(tmp_path / "train_metadata.jsonl")
    rows = [json.loads(line) for line in lines]
    assert ps.prompts == [r["prompt"] for r in rows]
    assert ps.metadata == [{k: v for k, v in r.items() if k != "prompt"} for r in rows]
    assert ps.metadata[0]["exclude"] == [{"class": "wine glass", "count": 3}]
    assert ps.reward_metadata([2], 64, 64) == [ps.metadata[2]] and not ps.edits
    # an explicit "metadata" object is merged in, its keys winning
    row = {"prompt": "p", "tag": "counting", "metadata": {"tag": "mine", "k": 1}}
    (tmp_path / "m.jsonl").write_text(json.dumps(row))
    assert load_prompts(tmp_path / "m.jsonl").metadata == [{"tag": "mine", "k": 1}]


def _png_bytes(colour, size=(16, 8)):
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_save_to_disk_prompt_folders(tmp_path):
    rows = {"prompt": ['the text "AB"', 'the number "12"'], "tag": ["a", "b"], "score": [1.5, 2.0]}
    datasets.Dataset.from_dict(rows).save_to_disk(tmp_path / "one")
    ps = load_prompts(tmp_path / "one")
    assert ps.prompts == rows["prompt"] and ps.metadata == [
        {"tag": "a", "score": 1.5},
        {"tag": "b", "score": 2.0},
    ]

    splits = datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"text": ["t1", "t2", "t3"]}),
        test=datasets.Dataset.from_dict({"text": ["e1"], "image": [_png_bytes((1, 2, 3))]}),
    )
    splits.save_to_disk(tmp_path / "dict")
    assert load_prompts(tmp_path / "dict").prompts == ["t1", "t2", "t3"]  # data: train
    test = load_prompts(tmp_path / "dict", ("test", "validation"))  # eval: test
    assert test.prompts == ["e1"] and test.metadata == [{}]  # the bytes column is no metadata
    assert load_prompts(f"{tmp_path / 'dict'}#test").prompts == ["e1"]


def test_parquet_folders_read_without_writing_a_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    datasets.Dataset.from_dict({"caption": ["c1", "c2"], "n": [1, 2]}).to_parquet(
        hub / "train-00000-of-00002.parquet"
    )
    datasets.Dataset.from_dict({"caption": ["c3"], "n": [3]}).to_parquet(hub / "train-00001-of-00002.parquet")
    datasets.Dataset.from_dict({"caption": ["v1"], "n": [9]}).to_parquet(
        hub / "validation-00000-of-00001.parquet"
    )
    ps = load_prompts(tmp_path / "hub")
    assert ps.prompts == ["c1", "c2", "c3"] and ps.metadata == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert load_prompts(tmp_path / "hub", ("test", "validation")).prompts == ["v1"]
    flat = tmp_path / "flat"
    flat.mkdir()
    datasets.Dataset.from_dict({"prompt": ["x"]}).to_parquet(flat / "prompts.parquet")  # no split name
    assert load_prompts(flat).prompts == ["x"]
    assert not cache.exists()


def test_datasets_folder_errors_name_what_is_there(tmp_path, monkeypatch):
    datasets.Dataset.from_dict({"question": ["q"], "answer": ["a"]}).save_to_disk(tmp_path / "cols")
    with pytest.raises(PromptFileError, match="no prompt column .*its columns: question, answer"):
        load_prompts(tmp_path / "cols")
    splits = datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"prompt": ["a"]}),
        dev=datasets.Dataset.from_dict(
            {"prompt": []}, features=datasets.Features(prompt=datasets.Value("string"))
        ),
    )
    splits.save_to_disk(tmp_path / "dict")
    with pytest.raises(PromptFileError, match="no split 'tset'; its splits: 'train', 'dev'"):
        load_prompts(f"{tmp_path / 'dict'}#tset")
    with pytest.raises(PromptFileError, match="holds the splits 'train', 'dev', none of them 'test' or"):
        load_prompts(tmp_path / "dict", ("test", "validation"))
    with pytest.raises(PromptFileError, match="split 'dev' holds no rows"):
        load_prompts(f"{tmp_path / 'dict'}#dev")
    datasets.Dataset.from_dict({"prompt": ["ok", " "]}).save_to_disk(tmp_path / "blank")
    with pytest.raises(PromptFileError, match="1 empty or non-text prompt"):
        load_prompts(tmp_path / "blank")
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(PromptFileError, match=r'pip install "diffrl\[datasets\]"'):
        load_prompts(tmp_path / "cols")


def test_datasets_folders_as_sft_data(tmp_path):
    features = datasets.Features(image=datasets.Image(), text=datasets.Value("string"))
    rows = {"image": [_png_bytes((255, 0, 0)), _png_bytes((0, 0, 255))], "text": ["red", "blue"]}
    ds = datasets.Dataset.from_dict(
        {"text": rows["text"], "image": [{"bytes": b, "path": None} for b in rows["image"]]},
        features=features,
    )
    datasets.DatasetDict(train=ds, test=ds.select([0])).save_to_disk(tmp_path / "dict")
    data = HFImageDataset(str(tmp_path / "dict"), 32, 64)
    image, caption = data[1]
    assert len(data) == 2 and image.shape == (3, 32, 64) and caption == "blue"
    assert image[2].mean() > 0.99 and image[0].mean() < 0.01
    assert scan_image_data(f"{tmp_path / 'dict'}#test") == 1

    ds.to_parquet(tmp_path / "pq" / "train.parquet")  # a datasets.Image column in parquet
    image, caption = HFImageDataset(str(tmp_path / "pq"), 8, 16)[0]
    assert caption == "red" and image.shape == (3, 8, 16) and image[0].mean() > 0.99

    # a plain column "image" of file paths, relative to the folder
    Image.new("RGB", (16, 8), (0, 255, 0)).save(tmp_path / "g.png")
    datasets.Dataset.from_dict({"prompt": ["green"], "image": ["../g.png"]}).save_to_disk(tmp_path / "paths")
    image, caption = HFImageDataset(str(tmp_path / "paths"), 8, 16)[0]
    assert caption == "green" and image[1].mean() > 0.99

    datasets.Dataset.from_dict({"prompt": ["no image"]}).save_to_disk(tmp_path / "noimage")
    with pytest.raises(DatasetError, match="no image column .*its columns: prompt"):
        scan_image_data(str(tmp_path / "noimage"))


def test_imagefolder_with_metadata_csv_in_split_folders(tmp_path):
    for split, colours in (("train", [(255, 0, 0), (0, 255, 0)]), ("test", [(0, 0, 255)])):
        folder = tmp_path / split
        (folder / "images").mkdir(parents=True)
        names = [f"images/{i}.png" for i in range(len(colours))]
        for name, colour in zip(names, colours):
            Image.new("RGB", (20, 10), colour).save(folder / name)
        with open(folder / "metadata.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["file_name", "caption", "source"])
            writer.writerows([name, f'the text "{split}{i}"', "web"] for i, name in enumerate(names))
    ds = ImageFolderDataset(tmp_path, 32, 64)  # the train/ split
    assert len(ds) == 2 and [ds[i][1] for i in range(2)] == ['the text "train0"', 'the text "train1"']
    image, _ = ds[1]
    assert image.shape == (3, 32, 64) and image[1].mean() > 0.99
    assert [c for _, c in ImageFolderDataset(f"{tmp_path}#test", 8, 16).items] == ['the text "test0"']
    with pytest.raises(DatasetError, match="no split 'val'; its splits: 'test', 'train'"):
        scan_image_data(f"{tmp_path}#val")
    (tmp_path / "train" / "metadata.csv").write_text("name,text\na.png,x\n")
    with pytest.raises(DatasetError, match="must name a file_name column .*it has name, text"):
        scan_image_data(str(tmp_path))


def test_preflight_reports_datasets_folder_problems_with_the_others(tmp_path):
    datasets.Dataset.from_dict({"question": ["q"]}).save_to_disk(tmp_path / "cols")
    datasets.DatasetDict(train=datasets.Dataset.from_dict({"prompt": ["a"]})).save_to_disk(tmp_path / "dict")
    with pytest.raises(ConfigError) as e:
        load_config(
            {
                "algorithm": {"name": "sft"},
                "data": {"dataset": str(tmp_path / "cols"), "prompts": str(tmp_path / "cols")},
                "eval": {"prompts": f"{tmp_path / 'dict'}#test"},
                "sampling": {"num_steps": 0},
            }
        )
    text = str(e.value)
    assert "data.dataset: dataset folder:" in text and "its columns: question" in text
    assert "eval.prompts: prompt folder:" in text and "no split 'test'; its splits: 'train'" in text
    assert "sampling.num_steps must be in [1, 1000]" in text


def test_eval_reads_the_test_split(tmp_path):
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"prompt": ['the text "A"', 'the text "B"']}),
        validation=datasets.Dataset.from_dict({"prompt": ['the text "V"']}),
    ).save_to_disk(tmp_path / "dict")
    folder = str(tmp_path / "dict")
    cfg = load_config(
        {
            "data": {"prompts": folder},
            "sampling": {"num_steps": 2},
            "eval": {"prompts": folder, "num_prompts": 1, "samples_per_prompt": 1},
        }
    )
    assert evaluate(load_family(cfg), cfg, None).prompts == ['the text "V"']
    with pytest.raises(ConfigError, match="eval.num_prompts is 2, but eval.prompts .* holds 1 prompts"):
        load_config({"eval": {"prompts": folder, "num_prompts": 2}})


def test_a_tiny_sft_run_trains_on_a_datasets_folder(tmp_path):
    captions = ['the text "AB"', 'the number "12"', 'the text "C"', 'the number "7"']
    images = [{"bytes": _png_bytes((60 * i, 0, 0), (64, 32)), "path": None} for i in range(4)]
    features = datasets.Features(image=datasets.Image(), prompt=datasets.Value("string"))
    datasets.Dataset.from_dict({"prompt": captions, "image": images}, features=features).save_to_disk(
        tmp_path / "sft"
    )
    overrides = tiny_overrides(tmp_path, **{"data.dataset": str(tmp_path / "sft"), "eval.enabled": False})
    result = train(load_config("recipes/tiny_sft.yaml", overrides))
    assert [h["step"] for h in result.history] == [1, 2]
    assert all(h["train/loss"] > 0 for h in result.history)


def test_image_folder_metadata_names_files_as_paths(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "./a.png", "text": "hi"}) + "\n")
    assert scan_image_folder(tmp_path) == [(tmp_path / "a.png", "hi")]  # ./a.png is a.png, listed once
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": 5, "text": "hi"}) + "\n")
    with pytest.raises(DatasetError, match="line.s. 1 are not"):
        scan_image_folder(tmp_path)
