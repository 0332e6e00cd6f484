"""image_reward against ImageReward's forward written out in plain torch from the raw checkpoint
(THUDM/ImageReward's ``ImageReward.py``, BLIP's ``vit.py`` and ``med.py`` as published in the
``image-reward`` 1.5 package), so the key conversion and the folder are checked, not assumed.

The package itself cannot run here: it imports torchvision (through its own transforms and timm
0.6.13), whose wheel does not import against a CPU torch (``operator torchvision::nms does not
exist``), and its ``med.py`` imports transformers 4 names that transformers 5 dropped.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file
from transformers import BertTokenizer

from diffrl.core.errors import EXIT_USER_ERROR
from diffrl.rewards.base import RewardError
from diffrl.rewards.image_reward import (
    HEAD_FILE,
    ImageReward,
    convert_checkpoint,
    main,
    pixel_values,
)
from diffrl.rewards.pretrained import pil_images
from diffrl.rewards.registry import REWARDS
from tests.integration.test_bad_inputs import BAD, GRPO, Case, run_and_check
from tests.unit.rewards.tiny_clip import PROMPTS, preflight_problems, random_images

VISION, TEXT, EMBED, PATCH, GRID, LAYERS, POSITIONS = 128, 128, 16, 8, 4, 2, 40  # 2 heads of 64 each
IMAGE = GRID * PATCH
HEAD_WIDTHS = (TEXT, 32, 16, 8, 4, 1)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # ImageReward.py's _transform
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
WORDS = "a the cat photo of sea red cube on table an astronaut riding horse very long prompt".split()
LONG_PROMPT = "a very long prompt " * 12  # 48 word pieces: cut at 35 with [SEP] last


def write_bert_vocab(folder: Path) -> None:
    """A word-piece vocabulary in bert-base-uncased's layout ([PAD] 0, specials, then words)."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s"]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")


def reference_tokenizer(folder: Path) -> BertTokenizer:
    """BLIP's ``init_tokenizer`` on the vocabulary folder."""
    tokenizer = BertTokenizer.from_pretrained(str(folder))
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


def image_reward_state(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random state dict with ImageReward.pt's keys (``ImageReward.state_dict()``), tiny."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=None):
        return torch.randn(*shape, generator=gen) * (scale if scale is not None else shape[-1] ** -0.5)

    def linear(prefix, out_dim, in_dim):
        state[prefix + ".weight"] = rand(out_dim, in_dim)
        state[prefix + ".bias"] = rand(out_dim, scale=0.1)

    def norm(prefix, width):
        state[prefix + ".weight"] = 1 + rand(width, scale=0.1)
        state[prefix + ".bias"] = rand(width, scale=0.1)

    v, t = "blip.visual_encoder.", "blip.text_encoder."
    state = {
        v + "cls_token": rand(1, 1, VISION, scale=0.1),
        v + "pos_embed": rand(1, GRID * GRID + 1, VISION, scale=0.1),
        v + "patch_embed.proj.weight": rand(VISION, 3, PATCH, PATCH, scale=0.05),
        v + "patch_embed.proj.bias": rand(VISION, scale=0.1),
        t + "embeddings.word_embeddings.weight": rand(vocab, TEXT, scale=0.5),
        t + "embeddings.position_embeddings.weight": rand(POSITIONS, TEXT, scale=0.5),
        t + "embeddings.position_ids": torch.arange(POSITIONS).expand(1, -1),  # med.py keeps it persistent
    }
    norm(v + "norm", VISION)
    norm(t + "embeddings.LayerNorm", TEXT)
    for n in range(LAYERS):
        b = f"{v}blocks.{n}."
        norm(b + "norm1", VISION)
        norm(b + "norm2", VISION)
        linear(b + "attn.qkv", 3 * VISION, VISION)
        linear(b + "attn.proj", VISION, VISION)
        linear(b + "mlp.fc1", 4 * VISION, VISION)
        linear(b + "mlp.fc2", VISION, 4 * VISION)
        layer = f"{t}encoder.layer.{n}."
        for attention, source in (("attention", TEXT), ("crossattention", VISION)):
            linear(layer + attention + ".self.query", TEXT, TEXT)
            linear(layer + attention + ".self.key", TEXT, source)
            linear(layer + attention + ".self.value", TEXT, source)
            linear(layer + attention + ".output.dense", TEXT, TEXT)
            norm(layer + attention + ".output.LayerNorm", TEXT)
        linear(layer + "intermediate.dense", 4 * TEXT, TEXT)
        linear(layer + "output.dense", TEXT, 4 * TEXT)
        norm(layer + "output.LayerNorm", TEXT)
    linear("blip.vision_proj", EMBED, VISION)
    linear("blip.text_proj", EMBED, TEXT)
    for i, (in_dim, out_dim) in zip((0, 2, 4, 6, 7), zip(HEAD_WIDTHS, HEAD_WIDTHS[1:])):
        linear(f"mlp.layers.{i}", out_dim, in_dim)
    return state


# --- ImageReward's forward, written out in plain torch from the raw state dict -------------------


def _linear(x, s, p):
    return x @ s[p + ".weight"].T + s[p + ".bias"]


def _ln(x, s, p, eps):
    return F.layer_norm(x, (x.shape[-1],), s[p + ".weight"], s[p + ".bias"], eps=eps)


def _heads(x, width):  # (B, L, width) -> (B, heads, L, 64)
    return x.view(*x.shape[:2], width // 64, 64).transpose(1, 2)


def vit(s, pixels):
    """BLIP's ``vit.py`` VisionTransformer.forward (eval): patches + cls + pos, pre-norm blocks
    (fused qkv as (3, heads, head_dim)), the final norm; LayerNorm eps 1e-6."""
    v = "blip.visual_encoder."
    x = F.conv2d(pixels, s[v + "patch_embed.proj.weight"], s[v + "patch_embed.proj.bias"], stride=PATCH)
    x = torch.cat([s[v + "cls_token"].expand(len(pixels), -1, -1), x.flatten(2).transpose(1, 2)], 1)
    x = x + s[v + "pos_embed"]
    b, n, c = x.shape
    for i in range(LAYERS):
        p = f"{v}blocks.{i}."
        qkv = _linear(_ln(x, s, p + "norm1", 1e-6), s, p + "attn.qkv").reshape(b, n, 3, c // 64, 64)
        q, k, val = qkv.permute(2, 0, 3, 1, 4)
        attended = ((q @ k.transpose(-2, -1)) * 64**-0.5).softmax(-1) @ val
        x = x + _linear(attended.transpose(1, 2).reshape(b, n, c), s, p + "attn.proj")
        x = x + _linear(F.gelu(_linear(_ln(x, s, p + "norm2", 1e-6), s, p + "mlp.fc1")), s, p + "mlp.fc2")
    return _ln(x, s, v + "norm", 1e-6)


def _bert_attention(x, source, mask, s, p):
    """med.py's BertAttention: scores / sqrt(64) + the extended mask, softmax, then
    LayerNorm(dense(context) + x) (eps 1e-12)."""
    q, k, v = (
        _heads(_linear(inp, s, f"{p}.self.{n}"), TEXT)
        for inp, n in ((x, "query"), (source, "key"), (source, "value"))
    )
    scores = q @ k.transpose(-1, -2) / math.sqrt(64) + mask
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
    return _ln(_linear(context, s, p + ".output.dense") + x, s, p + ".output.LayerNorm", 1e-12)


def bert_with_cross_attention(s, ids, attention_mask, image_embeds):
    """med.py's BertModel.forward(mode='multimodal', is_decoder=False): word + position
    embeddings, LayerNorm; per layer self-attention (padding masked by (1 - mask) * -10000),
    cross-attention to every image token, the feed-forward; the last hidden state."""
    t = "blip.text_encoder."
    length = ids.shape[1]
    x = (
        s[t + "embeddings.word_embeddings.weight"][ids]
        + s[t + "embeddings.position_embeddings.weight"][:length]
    )
    x = _ln(x, s, t + "embeddings.LayerNorm", 1e-12)
    self_mask = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
    cross_mask = (1.0 - torch.ones(image_embeds.shape[:2])[:, None, None, :]) * -10000.0
    for i in range(LAYERS):
        p = f"{t}encoder.layer.{i}."
        x = _bert_attention(x, x, self_mask, s, p + "attention")
        x = _bert_attention(x, image_embeds, cross_mask, s, p + "crossattention")
        hidden = F.gelu(_linear(x, s, p + "intermediate.dense"))
        x = _ln(_linear(hidden, s, p + "output.dense") + x, s, p + "output.LayerNorm", 1e-12)
    return x


def reference_scores(s, pixels, tokenizer, prompts):
    """ImageReward.score: tokens padded to 35, the text encoder's first token through the MLP,
    (r - mean) / std."""
    text = tokenizer(prompts, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    features = bert_with_cross_attention(s, text.input_ids, text.attention_mask, vit(s, pixels))[:, 0]
    for i in (0, 2, 4, 6, 7):
        features = _linear(features, s, f"mlp.layers.{i}")
    return (features.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072


def reference_pixels(picture: Image.Image, new_size: tuple[int, int], top: int, left: int) -> torch.Tensor:
    """ToTensor + Normalize of the picture resized (bicubic) to ``new_size`` and cropped at
    (``top``, ``left``): the offsets are given by each test from torchvision's rules."""
    if picture.size != new_size:
        picture = picture.resize(new_size, Image.Resampling.BICUBIC)
    array = np.asarray(picture, dtype=np.float64)[top : top + IMAGE, left : left + IMAGE] / 255
    return torch.from_numpy((array - np.array(CLIP_MEAN)) / np.array(CLIP_STD)).permute(2, 0, 1).float()


# --- tests -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("image_reward")
    write_bert_vocab(root / "bert")
    tokenizer = reference_tokenizer(root / "bert")
    state = image_reward_state(len(tokenizer))
    torch.save(state, root / "ImageReward.pt")  # the release is a bare state dict
    convert_checkpoint(str(root / "ImageReward.pt"), str(root / "bert"), str(root / "converted"))
    return root, state, tokenizer


@pytest.fixture(scope="module")
def reward(files):
    root, _, _ = files
    return ImageReward(str(root / "converted"))


def test_the_converted_folder_holds_a_blip_model_head_and_tokenizer(files, reward):
    root, _, tokenizer = files
    names = {p.name for p in (root / "converted").iterdir()}
    assert {"config.json", "model.safetensors", HEAD_FILE, "tokenizer.json"} <= names
    assert not [p for p in root.iterdir() if p.name.startswith(".converted")]  # no staging left
    config = json.loads((root / "converted" / "config.json").read_text())
    vision, text = config["vision_config"], config["text_config"]
    assert (config["model_type"], config["image_text_hidden_size"]) == ("blip", EMBED)
    assert (
        vision["hidden_size"],
        vision["num_attention_heads"],
        vision["image_size"],
        vision["patch_size"],
    ) == (
        VISION,
        2,
        IMAGE,
        PATCH,
    )
    assert (vision["num_hidden_layers"], vision["layer_norm_eps"], text["layer_norm_eps"]) == (
        LAYERS,
        1e-6,
        1e-12,
    )
    assert (text["pad_token_id"], text["bos_token_id"], text["sep_token_id"]) == (0, len(tokenizer) - 2, 4)
    assert (text["num_attention_heads"], text["encoder_hidden_size"], text["vocab_size"]) == (
        2,
        VISION,
        len(tokenizer),
    )
    assert reward.tokenizer.convert_tokens_to_ids(["[DEC]", "[ENC]"]) == [
        len(tokenizer) - 2,
        len(tokenizer) - 1,
    ]
    assert torch.equal(reward.model.itm_head.weight, torch.zeros(2, TEXT))  # ImageReward has no ITM head


def test_score_equals_image_rewards_forward_on_the_raw_checkpoint(files, reward):
    _, state, tokenizer = files
    prompts = [*PROMPTS, LONG_PROMPT, "The CATS on a zebra [ENC]"]  # cased, unknown word, a special token
    images = random_images(len(prompts), IMAGE, IMAGE, seed=21)
    ids = reward.tokenizer(prompts, padding="max_length", truncation=True, max_length=35)["input_ids"]
    assert ids == tokenizer(prompts, padding="max_length", truncation=True, max_length=35)["input_ids"]
    assert ids[5][-1] == tokenizer.sep_token_id and 2 in ids[6] and len(tokenizer) - 1 in ids[6]
    pixels = torch.stack([reference_pixels(p, (IMAGE, IMAGE), 0, 0) for p in pil_images(images)])
    expected = reference_scores(state, pixels, tokenizer, prompts)
    scores = reward(images, prompts, [{}] * len(prompts))
    # float32 in both forwards, scores of order 1 (measured: 1.4e-6 apart)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
    assert expected.std() > 0.05  # the random model tells these samples apart


def test_images_are_resized_and_cropped_as_torchvision_does():
    """Resize(32, bicubic): the long side int(32 * long / short); CenterCrop(32) at
    int(round(margin / 2)): a 47-high picture is not resized and is cut at row round(7.5) = 8
    (a floor would take 7), a 48 x 64 one becomes 42 x 32 and is cut at column 5."""
    tall, wide = (
        pil_images(random_images(1, 47, IMAGE, seed=22))[0],
        pil_images(random_images(1, 48, 64, seed=23))[0],
    )
    torch.testing.assert_close(
        pixel_values([tall], IMAGE)[0], reference_pixels(tall, (IMAGE, 47), 8, 0), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        pixel_values([wide], IMAGE)[0], reference_pixels(wide, (42, IMAGE), 0, 5), atol=1e-5, rtol=0
    )


def test_large_non_square_images_and_batch_size(files, reward):
    root, state, tokenizer = files
    images = random_images(3, 48, 64, seed=24)
    pixels = torch.stack([reference_pixels(p, (42, IMAGE), 0, 5) for p in pil_images(images)])
    expected = reference_scores(state, pixels, tokenizer, PROMPTS[:3])
    torch.testing.assert_close(reward(images, PROMPTS[:3], [{}] * 3), expected, atol=1e-5, rtol=0)
    one = ImageReward(str(root / "converted"), batch_size=1)
    torch.testing.assert_close(
        one(images, PROMPTS[:3], [{}] * 3), reward(images, PROMPTS[:3], [{}] * 3), atol=1e-5, rtol=0
    )


def test_registered_and_preflight_checks_the_folder(files, tmp_path):
    root, _, _ = files
    assert REWARDS.resolve("image_reward") is ImageReward
    assert preflight_problems("image_reward", {"model": str(root / "converted")}) == []
    [pt] = preflight_problems("image_reward", {"model": str(root / "ImageReward.pt")})
    assert (
        "is a file, not a folder; ImageReward.pt is converted once into the folder this reward loads: python -m diffrl.rewards.image_reward convert"
        in pt
    )
    (tmp_path / "blip").mkdir()
    (tmp_path / "blip" / "config.json").write_text('{"model_type": "blip"}')
    (tmp_path / "blip" / "model.safetensors").write_bytes(b"")
    head, vocab = preflight_problems("image_reward", {"model": str(tmp_path / "blip")})
    assert f"has no {HEAD_FILE} (ImageReward's MLP head)" in head and "has no BERT tokenizer" in vocab
    [clip] = preflight_problems("image_reward", {"model": str(tmp_path / "clip"), "dtype": "float32"})
    assert "is not a folder" in clip


def test_convert_command(files, tmp_path, capsys):
    root, state, _ = files
    pt, bert = str(root / "ImageReward.pt"), str(root / "bert")
    (tmp_path / "ok").mkdir()  # an empty folder is written into
    assert main(["convert", pt, str(tmp_path / "ok"), "--tokenizer", bert]) == 0
    assert f"wrote {tmp_path / 'ok'}" in capsys.readouterr().out
    images = random_images(2, IMAGE, IMAGE, seed=25)
    assert torch.equal(
        ImageReward(str(tmp_path / "ok"))(images, PROMPTS[:2], [{}] * 2),
        ImageReward(str(root / "converted"))(images, PROMPTS[:2], [{}] * 2),
    )

    def refused(argv, message):
        assert main(argv) == EXIT_USER_ERROR
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        return err

    # an existing folder with files is never written into
    refused(["convert", pt, str(tmp_path / "ok"), "--tokenizer", bert], "exists and is not an empty folder")
    assert (tmp_path / "ok" / HEAD_FILE).is_file()
    refused(
        ["convert", str(tmp_path / "none.pt"), str(tmp_path / "a"), "--tokenizer", bert],
        "none.pt' does not exist",
    )
    refused(
        ["convert", pt, str(tmp_path / "a"), "--tokenizer", str(tmp_path)],
        "is no folder with bert-base-uncased's tokenizer",
    )
    torch.save({**state, "blip.itm_head.weight": torch.zeros(2, TEXT)}, tmp_path / "extra.pt")
    refused(
        ["convert", str(tmp_path / "extra.pt"), str(tmp_path / "a"), "--tokenizer", bert],
        "blip.itm_head.weight",
    )
    torch.save({k: v for k, v in state.items() if k != "mlp.layers.7.bias"}, tmp_path / "no_head.pt")
    refused(
        ["convert", str(tmp_path / "no_head.pt"), str(tmp_path / "a"), "--tokenizer", bert],
        "is not ImageReward's MLP head",
    )
    torch.save({"weird": object()}, tmp_path / "pickle.pt")
    refused(["convert", str(tmp_path / "pickle.pt"), str(tmp_path / "a"), "--tokenizer", bert], "Unpickl")
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n")
    refused(
        ["convert", pt, str(tmp_path / "a"), "--tokenizer", str(tmp_path / "small")],
        "tokens with [DEC] and [ENC] but the checkpoint's text encoder has 26 rows",
    )
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob(".a.*"))  # nothing half-written
    assert main(["convert", pt]) == EXIT_USER_ERROR  # argparse's usage error
    assert "the following arguments are required" in capsys.readouterr().err


def test_a_damaged_folder_is_a_reward_error(files, tmp_path):
    root, _, _ = files
    folder = tmp_path / "damaged"
    assert (
        main(["convert", str(root / "ImageReward.pt"), str(folder), "--tokenizer", str(root / "bert")]) == 0
    )
    save_file({"layers.0.weight": torch.zeros(2, 2)}, str(folder / HEAD_FILE))
    with pytest.raises(
        RewardError,
        match=r"reward 'image_reward': .* is not ImageReward's MLP head.*convert ImageReward.pt again",
    ):
        ImageReward(str(folder))
    (folder / HEAD_FILE).write_bytes(b"garbage")
    with pytest.raises(
        RewardError, match=r"reward 'image_reward': could not load .*image_reward_head.safetensors"
    ):
        ImageReward(str(folder))


def test_the_module_runs_as_a_command(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffrl.rewards.image_reward",
            "convert",
            str(tmp_path / "x.pt"),
            str(tmp_path / "out"),
            "--tokenizer",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_USER_ERROR
    assert proc.stderr.startswith("error: checkpoint ") and proc.stderr.count("\n") == 1, proc.stderr


# fmt: off
IR_REWARD = "rewards=[{name: image_reward, params: {model: '{tmp}/ir'}}]"
CASES = [
    Case("ir-reward-given-the-checkpoint-file", ["train", GRPO, "rewards=[{name: image_reward, params: {model: '{tmp}/ImageReward.pt'}}]"], BAD, "(image_reward).params: model: '{tmp}/ImageReward.pt' is a file, not a folder; ImageReward.pt is converted once into the folder this reward loads: python -m diffrl.rewards.image_reward convert ImageReward.pt OUT --tokenizer BERT_FOLDER", files={"ImageReward.pt": b"x"}),
    Case("ir-folder-without-head", ["train", GRPO, IR_REWARD], BAD, f"model: '{{tmp}}/ir' has no {HEAD_FILE} (ImageReward's MLP head)", files={"ir/config.json": '{"model_type": "blip"}', "ir/model.safetensors": b"", "ir/vocab.txt": "[PAD]\n"}),
    Case("ir-folder-of-another-model", ["train", GRPO, IR_REWARD], BAD, "model: '{tmp}/ir' holds a 'clip' model; reward 'image_reward' expects an ImageReward folder", files={"ir/config.json": '{"model_type": "clip"}'}),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_bad_input(case: Case, tmp_path, request, capsys, monkeypatch):
    run_and_check(case, tmp_path, request, capsys, monkeypatch)
