"""More hostile inputs (issue 36): model and reward folders whose files are not what their loaders
read (JSON nested 100,000 deep, a FIFO, a 2 GB sparse file, bytes that are not UTF-8, a JSON array
where an object belongs, empty or garbage weights, a missing part). Each is exit 2 with an
``error:`` line naming the file, never exit 70 or a hang.

Rows use :class:`tests.integration.test_bad_inputs.Case` and run in process through
:func:`diffrl.cli.main`; a row that got past validation and would train fails (training is
replaced by a refusal). The tiny-model rows run ``diffrl sample`` on a damaged copy of the shipped
tiny base (its parts load before the damaged one: about a second); the SD3 rows are refused at
validation, from the JSON files of the shipped SD3.5 configs (no weights).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from diffrl.models.base import SHIPPED_CONFIGS
from tests.integration.test_bad_inputs import BAD, ROOT, Case, run_and_check

TINY_BASE = ROOT / "diffrl" / "models" / "assets" / "tiny_base"
GRPO = "recipes/tiny_grpo_ocr_small.yaml"
DEEP = "[" * 100_000
"""JSON nested 100,000 deep (``json.loads`` raises RecursionError)."""
FIX = "replace the folder with the model's own files"


def _damage(file: Path, how: str | bytes) -> None:
    """``how``: the new content, or ``fifo``, ``sparse`` (2 GB of zeros on no disk), ``loop``
    (a symlink to itself), ``gone`` (the file or folder removed)."""
    if isinstance(how, bytes):
        file.write_bytes(how)
        return
    if file.is_dir():
        shutil.rmtree(file)
    elif file.exists() or file.is_symlink():
        file.unlink()
    if how == "fifo":
        os.mkfifo(file)
    elif how == "sparse":
        with open(file, "wb") as f:
            f.truncate(2 * 1024**3)
    elif how == "loop":
        file.symlink_to(file)
    elif how != "gone":
        file.write_text(how)


def tiny(rel: str, how: str | bytes):
    """``prepare``: {tmp}/model, a copy of the shipped tiny base whose ``rel`` is damaged."""

    def prepare(tmp: Path) -> None:
        shutil.copytree(TINY_BASE, tmp / "model")
        _damage(tmp / "model" / rel, how)

    return prepare


def sd3(rel: str, how: str | bytes):
    """``prepare``: {tmp}/sd3, the shipped SD3.5 Medium JSON files with a scheduler, ``rel`` damaged."""

    def prepare(tmp: Path) -> None:
        shutil.copytree(SHIPPED_CONFIGS / "stable-diffusion-3.5-medium", tmp / "sd3")
        (tmp / "sd3" / "scheduler").mkdir()
        (tmp / "sd3" / "scheduler" / "scheduler_config.json").write_text(
            '{"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}'
        )
        _damage(tmp / "sd3" / rel, how)

    return prepare


CLIP_REWARD = "rewards=[{name: clip_score, params: {model: '{tmp}/clip'}}]"
SAMPLE = ["sample", "{tmp}/model", "--prompt", "a", "--out", "{tmp}/out"]
TRAIN_SD3 = ["train", GRPO, "model.family=sd3", "model.path={tmp}/sd3"]
TOKENIZER = "model.path: the tokenizer/ file '{tmp}/model/tokenizer/tokenizer.json'"
TOKENIZER_CONFIG = "model.path: the tokenizer/ file '{tmp}/model/tokenizer/tokenizer_config.json'"
TEXT_ENCODER = "model.path: the text_encoder/ file '{tmp}/model/text_encoder/config.json'"
TRANSFORMER = "model.path: the transformer/ file '{tmp}/model/transformer/config.json'"
WEIGHTS = "model.path: the transformer/ file '{tmp}/model/transformer/diffusion_pytorch_model.safetensors'"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


BOMB_PNG = (
    b"\x89PNG\r\n\x1a\n"
    + _chunk(b"IHDR", struct.pack(">IIBBBBB", 20_000, 20_000, 8, 2, 0, 0, 0))
    + _chunk(b"IDAT", zlib.compress(b"\0" * 10))
    + _chunk(b"IEND", b"")
)
"""A 70-byte PNG whose header claims 20,000 x 20,000 pixels (PIL's DecompressionBombError on open)."""


def config_value(folder: str, key: str, value):
    """``prepare``: {tmp}/model, a copy of the shipped tiny base (``folder`` "tiny") or of the
    shipped SD3.5 Medium JSON files (``"sd3"``) whose transformer config sets ``key`` to ``value``."""

    def prepare(tmp: Path) -> None:
        shutil.copytree(
            TINY_BASE if folder == "tiny" else SHIPPED_CONFIGS / "stable-diffusion-3.5-medium", tmp / "model"
        )
        file = tmp / "model" / "transformer" / "config.json"
        file.write_text(json.dumps({**json.loads(file.read_text()), key: value}))

    return prepare


def saved_dataset(rel: str, text: str, dict_folder: bool = False):
    """``prepare``: {tmp}/ds, a prompt set written by ``save_to_disk`` (a ``DatasetDict``'s when
    ``dict_folder``) whose file ``rel`` then holds ``text``."""

    def prepare(tmp: Path) -> None:
        import datasets

        data = datasets.Dataset.from_dict({"prompt": ["a", "b"]})
        (datasets.DatasetDict({"train": data}) if dict_folder else data).save_to_disk(str(tmp / "ds"))
        (tmp / "ds" / rel).write_text(text)

    return prepare


def fifo(name: str):
    return lambda tmp: os.mkfifo(tmp / name)


def loop(name: str):
    return lambda tmp: (tmp / name).symlink_to(tmp / name)


# one row a line: the table reads down its columns
# fmt: off
CASES: list[Case] = [
    # ---- class 9: a model folder's JSON files, refused naming the file before a library reads them
    Case("c9-tokenizer-json-nested-deep", SAMPLE, BAD, f"{TOKENIZER} is JSON nested too deeply to read; {FIX}", prepare=tiny("tokenizer/tokenizer.json", DEEP)),
    Case("c9-tokenizer-json-not-utf8", SAMPLE, BAD, f"{TOKENIZER} is not UTF-8 text (line 1, column 1: byte 0xff)", prepare=tiny("tokenizer/tokenizer.json", b"\xff\xfe{}")),
    Case("c9-tokenizer-json-a-list", SAMPLE, BAD, f"{TOKENIZER} holds a JSON array, not a JSON object", prepare=tiny("tokenizer/tokenizer.json", "[1, 2]")),
    Case("c9-tokenizer-json-2gb-sparse", SAMPLE, BAD, f"{TOKENIZER} is 2,147,483,648 bytes, more than the 268,435,456 read at most", prepare=tiny("tokenizer/tokenizer.json", "sparse")),
    Case("c9-tokenizer-json-symlink-loop", SAMPLE, BAD, f"{TOKENIZER} is a symlink loop", prepare=tiny("tokenizer/tokenizer.json", "loop")),
    Case("c9-tokenizer-config-nested-deep", SAMPLE, BAD, f"{TOKENIZER_CONFIG} is JSON nested too deeply", prepare=tiny("tokenizer/tokenizer_config.json", DEEP)),
    Case("c9-tokenizer-config-a-list", SAMPLE, BAD, f"{TOKENIZER_CONFIG} holds a JSON array", prepare=tiny("tokenizer/tokenizer_config.json", "[1, 2]")),
    Case("c9-text-encoder-config-nested-deep", SAMPLE, BAD, f"{TEXT_ENCODER} is JSON nested too deeply", prepare=tiny("text_encoder/config.json", DEEP)),
    Case("c9-text-encoder-config-a-list", SAMPLE, BAD, f"{TEXT_ENCODER} holds a JSON array", prepare=tiny("text_encoder/config.json", "[1, 2]")),
    Case("c9-text-encoder-config-not-utf8", SAMPLE, BAD, f"{TEXT_ENCODER} is not UTF-8 text", prepare=tiny("text_encoder/config.json", b"\xff\xfe{}")),
    Case("c9-transformer-config-a-list", SAMPLE, BAD, f"{TRANSFORMER} holds a JSON array", prepare=tiny("transformer/config.json", "[1, 2]")),
    Case("c9-transformer-config-not-utf8", SAMPLE, BAD, f"{TRANSFORMER} is not UTF-8 text", prepare=tiny("transformer/config.json", b"\xff\xfe{}")),
    Case("c9-transformer-config-2gb-sparse", SAMPLE, BAD, f"{TRANSFORMER} is 2,147,483,648 bytes", prepare=tiny("transformer/config.json", "sparse")),
    # ---- class 4: a FIFO where a model's file belongs (a library's read would wait for a writer)
    Case("c4-tokenizer-json-a-fifo", SAMPLE, BAD, f"{TOKENIZER} is a FIFO (named pipe), not a regular file", prepare=tiny("tokenizer/tokenizer.json", "fifo")),
    Case("c4-text-encoder-config-a-fifo", SAMPLE, BAD, f"{TEXT_ENCODER} is a FIFO (named pipe)", prepare=tiny("text_encoder/config.json", "fifo")),
    Case("c4-transformer-config-a-fifo", SAMPLE, BAD, f"{TRANSFORMER} is a FIFO (named pipe)", prepare=tiny("transformer/config.json", "fifo")),
    Case("c4-weights-a-fifo", SAMPLE, BAD, f"{WEIGHTS} is a FIFO (named pipe)", prepare=tiny("transformer/diffusion_pytorch_model.safetensors", "fifo")),
    # ---- class 9: weights that are no safetensors file, a part missing
    Case("c9-weights-empty", SAMPLE, BAD, f"{WEIGHTS} is not a safetensors file (", prepare=tiny("transformer/diffusion_pytorch_model.safetensors", b"")),
    Case("c9-weights-garbage", SAMPLE, BAD, f"{WEIGHTS} is not a safetensors file (", prepare=tiny("transformer/diffusion_pytorch_model.safetensors", bytes(range(256)) * 4)),
    Case("c9-weights-2gb-sparse", SAMPLE, BAD, f"{WEIGHTS} is not a safetensors file (", prepare=tiny("transformer/diffusion_pytorch_model.safetensors", "sparse")),
    Case("c4-model-family-file-2gb-sparse", SAMPLE, BAD, "'{tmp}/model': the model's '{tmp}/model/diffrl_model.json' is 2,147,483,648 bytes, more than the 1,048,576 read at most", prepare=tiny("diffrl_model.json", "sparse")),
    Case("c9-model-without-text-encoder", SAMPLE, BAD, "model.path: '{tmp}/model' has no text_encoder/ folder (the model's text_encoder); copy the whole model folder", prepare=tiny("text_encoder", "gone")),
    Case("c9-model-without-tokenizer", SAMPLE, BAD, "model.path: '{tmp}/model' has no tokenizer/ folder", prepare=tiny("tokenizer", "gone")),
    Case("c9-model-weights-of-another-shape", SAMPLE, BAD, "model.path: '{tmp}/model': its text_encoder/ cannot be loaded as a CLIPTextModelWithProjection (", prepare=tiny("text_encoder/config.json", '{"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 2, "projection_dim": 8}')),
    Case("c4-plan-transformer-config-a-fifo", ["plan", "recipes/sd35_grpo_ocr.yaml", "model.path={tmp}/sd3"], BAD, "model.path: '{tmp}/sd3' has no transformer/config.json here", prepare=sd3("transformer/config.json", "fifo")),
    # ---- class 9: a diffusers folder's model_index.json and scheduler config, refused at validation
    Case("c9-model-index-nested-deep", TRAIN_SD3, BAD, "model.path: the pipeline's file '{tmp}/sd3/model_index.json' is JSON nested too deeply to read", prepare=sd3("model_index.json", DEEP)),
    Case("c9-model-index-a-list", TRAIN_SD3, BAD, "model.path: the pipeline's file '{tmp}/sd3/model_index.json' holds a JSON array", prepare=sd3("model_index.json", "[1, 2]")),
    Case("c9-scheduler-config-nested-deep", TRAIN_SD3, BAD, "model.path: the scheduler's file '{tmp}/sd3/scheduler/scheduler_config.json' is JSON nested too deeply", prepare=sd3("scheduler/scheduler_config.json", DEEP)),
    Case("c9-scheduler-config-names-no-scheduler", TRAIN_SD3, BAD, "scheduler_config.json' names no diffusers scheduler (_class_name None)", prepare=sd3("scheduler/scheduler_config.json", '{"shift": 3.0}')),
    Case("c9-scheduler-config-names-a-module", TRAIN_SD3, BAD, "names no diffusers scheduler (_class_name 'utils')", prepare=sd3("scheduler/scheduler_config.json", '{"_class_name": "utils"}')),
    Case("c4-scheduler-config-a-fifo", TRAIN_SD3, BAD, "model.path: the scheduler's file '{tmp}/sd3/scheduler/scheduler_config.json' is a FIFO (named pipe)", prepare=sd3("scheduler/scheduler_config.json", "fifo")),
    # ---- class 9: images whose header claims 400 M pixels (PIL's DecompressionBombError was exit 70)
    Case("c9-dataset-image-decompression-bomb", ["train", "recipes/tiny_sft.yaml", "data.dataset={tmp}/images"], BAD, "image a.png is too large an image to decode (Image size (400000000 pixels) exceeds limit", files={"images/a.png": BOMB_PNG, "images/a.txt": "a"}),
    Case("c9-edit-source-image-decompression-bomb", ["sample", "base", "--prompts", "{tmp}/p.jsonl"], BAD, "line 1: \"image\" 'a.png' is too large an image to decode (Image size (400000000 pixels)", files={"a.png": BOMB_PNG, "p.jsonl": '{"prompt": "a", "image": "a.png"}\n'}),
    # ---- class 9: a FIFO or a symlink loop given as a folder is named as such (was: "does not exist", "no such file")
    Case("c9-dataset-a-fifo", ["train", "recipes/tiny_sft.yaml", "data.dataset={tmp}/images"], BAD, "dataset folder '{tmp}/images' is a FIFO (named pipe); give a folder of images", prepare=fifo("images")),
    Case("c9-dataset-a-symlink-loop", ["train", "recipes/tiny_sft.yaml", "data.dataset={tmp}/images"], BAD, "dataset folder '{tmp}/images' is a symlink loop; give a folder of images", prepare=loop("images")),
    Case("c9-sample-target-a-fifo", ["sample", "{tmp}/model", "--prompt", "a"], BAD, "'{tmp}/model' (is a FIFO (named pipe), not a regular file) is not 'base', a recipe .yaml, a checkpoint", prepare=fifo("model")),
    Case("c9-eval-target-a-symlink-loop", ["eval", "{tmp}/model"], BAD, "'{tmp}/model' (is a symlink loop) is not 'base', a recipe .yaml", prepare=loop("model")),
    # ---- class 9: a model's config.json values of the wrong type (were exit 70 in the plan's size rule or meta model)
    Case("c9-plan-sd3-patch-size-a-string", ["plan", "recipes/sd35_grpo_ocr.yaml", "model.path={tmp}/model"], BAD, "model.path: the model's config.json files give no size rule (", prepare=config_value("sd3", "patch_size", "x")),
    Case("c9-plan-tiny-pos-embed-a-float", ["plan", "recipes/tiny_sft.yaml", "model.path={tmp}/model"], BAD, "model.path: the transformer's config.json cannot build a SD3Transformer2DModel (TypeError", prepare=config_value("tiny", "pos_embed_max_size", 1e300)),
    Case("c9-plan-tiny-patch-size-a-string", ["plan", "recipes/tiny_sft.yaml", "model.path={tmp}/model"], BAD, "model.path: the transformer's config.json cannot build a SD3Transformer2DModel (TypeError", prepare=config_value("tiny", "patch_size", "x")),
    # ---- class 4: a model's config.json declaring 10^9 layers (building it, even on the meta device, ran for good)
    Case("c4-sample-tiny-a-billion-layers", SAMPLE, BAD, f"{TRANSFORMER}: num_layers is 1000000000, more than the 10,000 layers any model has", prepare=config_value("tiny", "num_layers", 10**9)),
    Case("c4-plan-tiny-a-billion-layers", ["plan", "recipes/tiny_sft.yaml", "model.path={tmp}/model"], BAD, "cannot build a SD3Transformer2DModel (num_layers is 1000000000, more than the 10,000 layers", prepare=config_value("tiny", "num_layers", 10**9)),
    Case("c4-plan-sd3-a-billion-layers", ["plan", "recipes/sd35_grpo_ocr.yaml", "model.path={tmp}/model"], BAD, "num_layers is 1000000000, more than the 10,000 layers", prepare=config_value("sd3", "num_layers", 10**9)),
    # ---- class 9: a save_to_disk prompt set whose JSON files are nested deep or of another shape (were exit 70)
    Case("c9-hf-state-json-nested-deep", ["train", GRPO, "data.prompts={tmp}/ds"], BAD, "'{tmp}/ds' split 'train' cannot be read by datasets.load_from_disk (RecursionError", prepare=saved_dataset("state.json", DEEP)),
    Case("c9-hf-dataset-info-nested-deep", ["train", GRPO, "data.prompts={tmp}/ds"], BAD, "cannot be read by datasets.load_from_disk (RecursionError", prepare=saved_dataset("dataset_info.json", DEEP)),
    Case("c9-hf-state-json-a-list", ["train", GRPO, "data.prompts={tmp}/ds"], BAD, "cannot be read by datasets.load_from_disk (TypeError", prepare=saved_dataset("state.json", "[1]")),
    Case("c9-hf-dataset-dict-nested-deep", ["train", GRPO, "data.prompts={tmp}/ds"], BAD, "'{tmp}/ds/dataset_dict.json' is not a DatasetDict's index (RecursionError", prepare=saved_dataset("dataset_dict.json", DEEP, dict_folder=True)),
    # ---- serve-reward --params read as a recipe is (was: yaml.safe_load, refused before anything loads or binds)
    Case("c4-serve-params-nested-deep", ["serve-reward", "--reward", "ocr", "--port", "0", "--params", "{a: " + "[" * 5000 + "]" * 5000 + "}"], BAD, "is not a YAML/JSON mapping (line 1: nested more than 40 levels deep)", absent="[" * 1000),
    Case("c5-serve-params-key-twice", ["serve-reward", "--reward", "ocr", "--port", "0", "--params", "{num_workers: 1, num_workers: 2}"], BAD, "duplicate key 'num_workers' (first at line 1); YAML would keep only the last one"),
    Case("c5-serve-params-item-twice", ["serve-reward", "--reward", "ocr", "--port", "0", "--params", "num_workers=1", "num_workers=2"], BAD, "--params: 'num_workers' is given twice; give it once"),
    Case("c4-serve-params-item-nested-deep", ["serve-reward", "--reward", "ocr", "--port", "0", "--params", "num_workers=" + "[" * 5000 + "]" * 5000], BAD, "the value is not YAML (line 1: nested more than 40 levels deep)", absent="[" * 1000),
    # ---- a reward's weights folder: its config.json read bounded at validation (was RecursionError: exit 70)
    Case("c9-reward-config-nested-deep", ["train", GRPO, CLIP_REWARD], BAD, "rewards[0] (clip_score).params: model: the model's config '{tmp}/clip/config.json' is JSON nested too deeply to read; give a folder of", files={"clip/config.json": DEEP}),
    Case("c4-reward-config-a-fifo", ["train", GRPO, CLIP_REWARD], BAD, "model: the model's config '{tmp}/clip/config.json' is a FIFO (named pipe), not a regular file", files={"clip/": ""}, prepare=lambda tmp: os.mkfifo(tmp / "clip" / "config.json")),
    Case("c9-reward-config-not-utf8", ["train", GRPO, CLIP_REWARD], BAD, "model: the model's config '{tmp}/clip/config.json' is not UTF-8 text", files={"clip/config.json": b"\xff{}"}),
]
# fmt: on


def test_the_table_is_well_formed():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    assert all(i.split("-")[0] in {"c3", "c4", "c5", "c6", "c9"} for i in ids)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_hostile_input(case: Case, tmp_path, request, capsys, monkeypatch):
    run_and_check(case, tmp_path, request, capsys, monkeypatch)


# ---- a reward's folder at load: its files checked first, every library error the reward's ------


def test_clap_weights_that_are_no_safetensors_are_a_reward_error(tmp_path):
    """Was exit 70: ClapModel.from_pretrained's OSError reached the command line unnamed."""
    from diffrl.rewards.base import RewardError
    from diffrl.rewards.clap import ClapScore
    from tests.unit.rewards.tiny_clap import write_clap

    write_clap(tmp_path / "clap")
    (tmp_path / "clap" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(
        RewardError, match=r"reward 'clap': could not load LAION CLAP .* is not a safetensors file"
    ):
        ClapScore(model=str(tmp_path / "clap"))


def test_clip_reward_folder_with_a_fifo_is_refused_before_it_loads(tmp_path):
    """A FIFO among a reward folder's files (tokenizer_config.json) is named, never opened."""
    from diffrl.rewards.base import RewardError
    from diffrl.rewards.clip_score import ClipScore
    from tests.unit.rewards.tiny_clip import write_clip

    write_clip(tmp_path / "clip")
    (tmp_path / "clip" / "tokenizer_config.json").unlink()
    os.mkfifo(tmp_path / "clip" / "tokenizer_config.json")
    with pytest.raises(
        RewardError, match=r"tokenizer_config.json' is a FIFO \(named pipe\), not a regular file"
    ):
        ClipScore(model=str(tmp_path / "clip"))


def test_judge_chat_template_json_without_its_text(tmp_path):
    """Was exit 70 (KeyError 'chat_template')."""
    from diffrl.rewards.base import RewardError
    from diffrl.rewards.judge import chat_template

    (tmp_path / "chat_template.json").write_text('{"template": "x"}')
    with pytest.raises(RewardError, match='holds no "chat_template" text'):
        chat_template(tmp_path, None)


# ---- class 6: a run folder's prompt cache (model.encode_once) damaged by hand -------------------


@pytest.mark.parametrize("damage", ["garbage", "identity-nested-deep"])
def test_a_damaged_prompt_cache_is_encoded_again_with_a_warning(damage, tmp_path):
    """Was exit 70 (SafetensorError from a resumed run's start); the cache is derived, so it is
    rebuilt. The file fails before the config is looked at (None stands for it)."""
    import torch
    from safetensors.torch import save_file

    from diffrl.sampling.prompt_cache import _read

    path = tmp_path / "prompt_embeddings.safetensors"
    if damage == "garbage":
        path.write_bytes(bytes(range(256)))
    else:
        save_file({"x": torch.zeros(1)}, str(path), metadata={"identity": DEEP})
    with pytest.warns(
        UserWarning, match=r"prompt cache '.*' cannot be read \(.*\); encoding the prompts again"
    ):
        assert _read(path, None, []) is None
