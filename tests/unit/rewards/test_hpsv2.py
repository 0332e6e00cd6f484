"""hpsv2 against an independent plain-torch forward of the raw open_clip state dict (so the key
conversion is checked, not assumed), and against open_clip itself where it imports (it needs
torchvision: skipped on a CPU-torch install, run on the GPU machines)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from diffrl.rewards import clip_embed
from diffrl.rewards.base import RewardError
from diffrl.rewards.hpsv2 import HPSv2, open_clip_config
from diffrl.rewards.pretrained import pil_images
from tests.unit.rewards.tiny_clip import (
    PROMPTS,
    clip_pixels,
    preflight_problems,
    random_images,
    write_tokenizer,
)

VISION_WIDTH, TEXT_WIDTH, EMBED, PATCH, GRID, LAYERS = (
    160,
    32,
    16,
    8,
    4,
    2,
)  # 2 image heads of 80, 16 text heads of 2
LONG_PROMPT = "a very long prompt " * 8  # > 77 tokens in the tiny BPE: truncated, end token kept last


def open_clip_state(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random state dict with open_clip's ViT-H-14 key layout (``CLIP.state_dict()``), tiny."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=None):
        return torch.randn(*shape, generator=gen) * (scale if scale is not None else shape[-1] ** -0.5)

    state = {
        "visual.conv1.weight": rand(VISION_WIDTH, 3, PATCH, PATCH, scale=0.05),
        "visual.class_embedding": rand(VISION_WIDTH, scale=0.1),
        "visual.positional_embedding": rand(GRID * GRID + 1, VISION_WIDTH, scale=0.1),
        "visual.proj": rand(VISION_WIDTH, EMBED),
        "token_embedding.weight": rand(vocab, TEXT_WIDTH, scale=0.1),
        "positional_embedding": rand(77, TEXT_WIDTH, scale=0.1),
        "text_projection": rand(TEXT_WIDTH, EMBED),
        "logit_scale": torch.tensor(math.log(100.0)),
    }
    for prefix, width in (("visual.", VISION_WIDTH), ("", TEXT_WIDTH)):
        for norm in ("ln_pre", "ln_post") if prefix else ("ln_final",):
            state[f"{prefix}{norm}.weight"] = 1 + rand(width, scale=0.1)
            state[f"{prefix}{norm}.bias"] = rand(width, scale=0.1)
        for n in range(LAYERS):
            p = f"{prefix}transformer.resblocks.{n}."
            for norm in ("ln_1", "ln_2"):
                state[p + norm + ".weight"] = 1 + rand(width, scale=0.1)
                state[p + norm + ".bias"] = rand(width, scale=0.1)
            state[p + "attn.in_proj_weight"] = rand(3 * width, width)
            state[p + "attn.in_proj_bias"] = rand(3 * width, scale=0.1)
            state[p + "attn.out_proj.weight"] = rand(width, width)
            state[p + "attn.out_proj.bias"] = rand(width, scale=0.1)
            state[p + "mlp.c_fc.weight"] = rand(4 * width, width)
            state[p + "mlp.c_fc.bias"] = rand(4 * width, scale=0.1)
            state[p + "mlp.c_proj.weight"] = rand(width, 4 * width)
            state[p + "mlp.c_proj.bias"] = rand(width, scale=0.1)
    return state


# --- open_clip's forward, written out in plain torch from the state dict -------------------------


def _ln(x, s, p):
    return F.layer_norm(x, (x.shape[-1],), s[p + ".weight"], s[p + ".bias"], eps=1e-5)


def _block(x, s, p, heads, causal):
    """open_clip ResidualAttentionBlock: x + attn(ln_1(x)); x + mlp(ln_2(x)), GELU (not QuickGELU)."""
    b, length, width = x.shape
    q, k, v = (_ln(x, s, p + "ln_1") @ s[p + "attn.in_proj_weight"].T + s[p + "attn.in_proj_bias"]).chunk(
        3, -1
    )
    q, k, v = (t.reshape(b, length, heads, width // heads).transpose(1, 2) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(width // heads)
    if causal:
        logits = logits.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    attended = (logits.softmax(-1) @ v).transpose(1, 2).reshape(b, length, width)
    x = x + attended @ s[p + "attn.out_proj.weight"].T + s[p + "attn.out_proj.bias"]
    hidden = F.gelu(_ln(x, s, p + "ln_2") @ s[p + "mlp.c_fc.weight"].T + s[p + "mlp.c_fc.bias"])
    return x + hidden @ s[p + "mlp.c_proj.weight"].T + s[p + "mlp.c_proj.bias"]


def encode_image(s, pixels):
    x = F.conv2d(pixels, s["visual.conv1.weight"], stride=PATCH).flatten(2).transpose(1, 2)
    x = (
        torch.cat([s["visual.class_embedding"].expand(len(x), 1, -1), x], 1)
        + s["visual.positional_embedding"]
    )
    x = _ln(x, s, "visual.ln_pre")
    for n in range(LAYERS):
        x = _block(x, s, f"visual.transformer.resblocks.{n}.", VISION_WIDTH // 80, causal=False)
    return F.normalize(_ln(x[:, 0], s, "visual.ln_post") @ s["visual.proj"], dim=-1)


def encode_text(s, ids):
    x = s["token_embedding.weight"][ids] + s["positional_embedding"]
    for n in range(LAYERS):
        x = _block(x, s, f"transformer.resblocks.{n}.", 16, causal=True)
    x = _ln(x, s, "ln_final")
    return F.normalize(x[torch.arange(len(x)), ids.argmax(-1)] @ s["text_projection"], dim=-1)


def open_clip_tokenize(tokenizer, prompts):
    """open_clip's ``tokenize``: [sot] + BPE + [eot], cut to 77 with eot last, zero-padded."""
    sot, eot = tokenizer.convert_tokens_to_ids(["<|startoftext|>", "<|endoftext|>"])
    out = torch.zeros(len(prompts), 77, dtype=torch.long)
    for row, prompt in zip(out, prompts):
        ids = [sot, *tokenizer.encode(prompt, add_special_tokens=False), eot]
        if len(ids) > 77:
            ids = ids[:77]
            ids[-1] = eot
        row[: len(ids)] = torch.tensor(ids)
    return out


# --- tests -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hpsv2")
    tokenizer = write_tokenizer(root / "laion")
    state = open_clip_state(len(tokenizer))
    torch.save({"state_dict": state}, root / "HPS_v2.1_compressed.pt")  # the HPSv2 release's layout
    return root, state


@pytest.fixture(scope="module")
def reward(files):
    root, _ = files
    return HPSv2(str(root / "HPS_v2.1_compressed.pt"), tokenizer=str(root / "laion"))


def test_config_is_vit_h_14_with_the_checkpoints_sizes(files):
    _, state = files
    config = open_clip_config(state)
    vision, text = config.vision_config, config.text_config
    assert (vision.hidden_size, vision.num_attention_heads, vision.patch_size, vision.image_size) == (
        160,
        2,
        8,
        32,
    )
    assert (vision.num_hidden_layers, vision.intermediate_size, vision.hidden_act) == (2, 640, "gelu")
    assert (text.hidden_size, text.num_attention_heads, text.num_hidden_layers, text.hidden_act) == (
        32,
        16,
        2,
        "gelu",
    )
    assert config.projection_dim == 16


def test_score_equals_open_clips_forward_on_the_raw_state_dict(files, reward):
    _, state = files
    prompts = [*PROMPTS, LONG_PROMPT]
    images = random_images(6, 32, 32, seed=12)
    ids = open_clip_tokenize(reward.tokenizer, prompts)
    assert ids[-1, -1] == ids.max()  # the long prompt was cut with its end token kept
    expected = (encode_image(state, clip_pixels(images, 32)) * encode_text(state, ids)).sum(-1)
    # cosines in [-1, 1], float32 in both forwards (SDPA vs softmax(q k^T) v): 1e-5 covers the rounding
    torch.testing.assert_close(reward(images, prompts, [{}] * 6), expected, atol=1e-5, rtol=0)
    assert expected.std() > 1e-2


def test_non_square_larger_image_is_prepared_as_open_clips_transform(files, reward):
    _, state = files
    images = random_images(2, 64, 48, seed=13)
    reference = clip_pixels(images, 32)  # shortest side 32 bicubic, center crop, OpenAI mean / std
    torch.testing.assert_close(
        clip_embed.pixel_values(reward.image_processor, pil_images(images)), reference, atol=1e-6, rtol=0
    )
    expected = (
        encode_image(state, reference) * encode_text(state, open_clip_tokenize(reward.tokenizer, PROMPTS[:2]))
    ).sum(-1)
    torch.testing.assert_close(reward(images, PROMPTS[:2], [{}] * 2), expected, atol=1e-5, rtol=0)


def test_batch_size_does_not_change_scores(files, reward):
    root, _ = files
    images = random_images(5, 32, 32, seed=14)
    one = HPSv2(str(root / "HPS_v2.1_compressed.pt"), tokenizer=str(root / "laion"), batch_size=1)
    torch.testing.assert_close(
        one(images, PROMPTS, [{}] * 5), reward(images, PROMPTS, [{}] * 5), atol=1e-5, rtol=0
    )


def test_bare_state_dict_and_safetensors_load_the_same(files, reward, tmp_path):
    from safetensors.torch import save_file

    root, state = files
    torch.save({f"module.{k}": v for k, v in state.items()}, tmp_path / "bare.pt")  # a DDP-saved dict
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "hps.safetensors"))
    images = random_images(2, 32, 32, seed=15)
    expected = reward(images, PROMPTS[:2], [{}] * 2)
    for path in ("bare.pt", "hps.safetensors"):
        other = HPSv2(str(tmp_path / path), tokenizer=str(root / "laion"))
        assert torch.equal(other(images, PROMPTS[:2], [{}] * 2), expected), path


def test_checkpoints_that_are_not_open_clip_vit_h_14_are_clear_errors(files, tmp_path):
    root, state = files
    torch.save({"state_dict": {**state, "visual.extra_head.weight": torch.zeros(2)}}, tmp_path / "extra.pt")
    with pytest.raises(
        RewardError, match=r"reward 'hpsv2': could not load .*extra.pt.*visual.extra_head.weight"
    ):
        HPSv2(str(tmp_path / "extra.pt"), tokenizer=str(root / "laion"))
    narrow = {**state, "visual.conv1.weight": torch.zeros(96, 3, PATCH, PATCH)}
    torch.save({"state_dict": narrow}, tmp_path / "narrow.pt")
    with pytest.raises(RewardError, match="do not fit ViT-H-14's heads"):
        HPSv2(str(tmp_path / "narrow.pt"), tokenizer=str(root / "laion"))
    torch.save({"state_dict": {"weird": object()}}, tmp_path / "pickle.pt")
    with pytest.raises(RewardError, match="Unpickl"):  # weights_only: no arbitrary objects
        HPSv2(str(tmp_path / "pickle.pt"), tokenizer=str(root / "laion"))


def test_param_problems(files, tmp_path):
    root, _ = files
    checkpoint = str(root / "HPS_v2.1_compressed.pt")
    assert preflight_problems("hpsv2", {"checkpoint": checkpoint, "tokenizer": str(root / "laion")}) == []
    [missing] = preflight_problems(
        "hpsv2", {"checkpoint": str(tmp_path / "x.pt"), "tokenizer": str(root / "laion")}
    )
    assert missing.startswith(
        f"rewards[0] (hpsv2).params: checkpoint: {str(tmp_path / 'x.pt')!r} is not a file"
    )
    (tmp_path / "empty").mkdir()
    [no_tokenizer] = preflight_problems(
        "hpsv2", {"checkpoint": checkpoint, "tokenizer": str(tmp_path / "empty")}
    )
    assert (
        "tokenizer: " in no_tokenizer
        and "has no CLIP tokenizer (tokenizer.json, or vocab.json + merges.txt)" in no_tokenizer
    )
    [batch] = preflight_problems(
        "hpsv2", {"checkpoint": checkpoint, "tokenizer": str(root / "laion"), "batch_size": 2.5}
    )
    assert "(hpsv2).params.batch_size: expected an integer, got 2.5" in batch


def test_matches_open_clip_itself(tmp_path):
    """Runs where open_clip imports (it needs torchvision; skipped on CPU-torch installs): a tiny
    model of ViT-H-14's layout made by open_clip.create_model_and_transforms, its own preprocess and
    tokenizer, against the reward loading that model's state dict."""
    open_clip = pytest.importorskip("open_clip")
    from PIL import Image
    from transformers import CLIPTokenizer

    config = {
        "embed_dim": EMBED,
        "vision_cfg": {
            "image_size": 32,
            "layers": 2,
            "width": VISION_WIDTH,
            "head_width": 80,
            "patch_size": PATCH,
        },
        "text_cfg": {
            "context_length": 77,
            "vocab_size": 49408,
            "width": TEXT_WIDTH,
            "heads": 16,
            "layers": 2,
        },
    }
    (tmp_path / "tiny-vit-h-14.json").write_text(json.dumps(config))
    open_clip.add_model_config(tmp_path / "tiny-vit-h-14.json")
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms("tiny-vit-h-14", pretrained=None)
    model.eval()
    torch.save({"state_dict": model.state_dict()}, tmp_path / "hps.pt")
    oc_tokenizer = open_clip.get_tokenizer("tiny-vit-h-14")

    # the same CLIP BPE as a transformers tokenizer folder, from open_clip's own vocabulary
    simple = open_clip.tokenizer.SimpleTokenizer()
    rename = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    vocab = {rename.get(t, t): i for t, i in simple.encoder.items()}
    merges = sorted(simple.bpe_ranks, key=simple.bpe_ranks.get)
    CLIPTokenizer(vocab=vocab, merges=merges).save_pretrained(tmp_path / "tokenizer")

    reward = HPSv2(str(tmp_path / "hps.pt"), tokenizer=str(tmp_path / "tokenizer"))
    images = random_images(3, 48, 64, seed=16)  # even crop margin: torchvision and PIL crops agree
    prompts = PROMPTS[:3]
    pictures = pil_images(images)
    pixels = torch.stack([preprocess(p) for p in pictures])
    torch.testing.assert_close(
        clip_embed.pixel_values(reward.image_processor, pictures), pixels, atol=1e-5, rtol=0
    )
    ids = oc_tokenizer(prompts)
    assert torch.equal(ids, open_clip_tokenize(reward.tokenizer, prompts))
    with torch.no_grad():
        expected = (model.encode_image(pixels, normalize=True) * model.encode_text(ids, normalize=True)).sum(
            -1
        )
    torch.testing.assert_close(reward(images, prompts, [{}] * 3), expected, atol=1e-5, rtol=0)
    assert isinstance(pictures[0], Image.Image)
