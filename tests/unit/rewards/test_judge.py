"""The judge reward on tiny random Qwen2.5-VL / Qwen3-VL models built here (no download).

Each score is checked against an independent computation: the real processor class builds the
inputs (``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor``), the model runs a full forward pass, and
the probability is read from the softmax of the last position's logits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from diffrl.config import Config, RewardConfig
from diffrl.preflight import validate
from diffrl.rewards.base import RewardError, RewardSet
from diffrl.rewards.judge import VQASCORE_QUESTION, WHAT, JudgeReward

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
SPECIAL += ["<|image_pad|>", "<|video_pad|>"]
WORDS = ["[UNK]", "user", "assistant", "Yes", "No", "yes", "no", "please", "Does", "this", "figure"]
WORDS += [
    "show",
    "Please",
    "answer",
    "or",
    '"',
    "?",
    ".",
    "a",
    "cat",
    "dog",
    "red",
    "on",
    "the",
    "blue",
    "big",
]
VOCAB = {w: i for i, w in enumerate(WORDS + SPECIAL)}

# Qwen's chat template, reduced to what a one-image user turn uses (no default system turn)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PATCH = 4  # x merge 2: image sides are rounded to multiples of 8
PROMPTS = ["a cat", "a big red dog on the blue cat", "the dog", "a blue cat on a red dog", "cat"]


@dataclass
class Judge:
    folder: str
    model: torch.nn.Module
    processor: object  # the real processor class, for the reference inputs


def tokenizer():
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", pad_token="<|endoftext|>", eos_token="<|im_end|>"
    )


def token_ids() -> dict:
    return {
        "image_token_id": VOCAB["<|image_pad|>"],
        "video_token_id": VOCAB["<|video_pad|>"],
        "vision_start_token_id": VOCAB["<|vision_start|>"],
        "vision_end_token_id": VOCAB["<|vision_end|>"],
    }


def text_config(**extra) -> dict:
    return dict(
        vocab_size=len(VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=VOCAB["<|endoftext|>"],
        bos_token_id=VOCAB["<|endoftext|>"],
        eos_token_id=VOCAB["<|im_end|>"],
        **extra,
    )


def build(family: str, folder: Path) -> Judge:
    """A tiny random model of the real class, saved as Qwen's folders are laid out (config.json +
    safetensors, preprocessor_config.json, tokenizer files, chat_template.json)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.processing_utils import ProcessorMixin

    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}  # head_dim 16
    vision = dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=PATCH, out_hidden_size=32
    )
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig as Cfg
        from transformers import Qwen2_5_VLForConditionalGeneration as Model
        from transformers import Qwen2_5_VLProcessor as Processor

        vision.update(window_size=16, fullatt_block_indexes=[0])
        config = Cfg(text_config=text_config(rope_parameters=rope), vision_config=vision, **token_ids())
    else:
        from transformers import Qwen3VLConfig as Cfg
        from transformers import Qwen3VLForConditionalGeneration as Model
        from transformers import Qwen3VLProcessor as Processor

        vision.update(num_position_embeddings=64, deepstack_visual_indexes=[0])
        rope["mrope_interleaved"] = True
        config = Cfg(
            text_config=text_config(head_dim=16, rope_parameters=rope), vision_config=vision, **token_ids()
        )
    torch.manual_seed(0)
    model = Model(config).eval()
    model.save_pretrained(folder)
    tok = tokenizer()
    images = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=2, min_pixels=8 * 8, max_pixels=48 * 48)
    tok.save_pretrained(folder)
    images.save_pretrained(folder)
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    # transformers 5.24 checks every processor part's class, and the video processor's base class
    # only exists with torchvision; images never use it, so the reference goes without one
    check = ProcessorMixin.check_argument_for_proper_class
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            ProcessorMixin,
            "check_argument_for_proper_class",
            lambda self, name, arg: None if name == "video_processor" else check(self, name, arg),
        )
        processor = Processor(
            image_processor=images, tokenizer=tok, video_processor=None, chat_template=CHAT_TEMPLATE
        )
    return Judge(str(folder), model, processor)


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory) -> Judge:
    return build("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"))


def pictures(n: int, height: int = 32, width: int = 40) -> torch.Tensor:
    """``(n, 3, H, W)`` uint8 noise (what rollouts keep)."""
    gen = torch.Generator().manual_seed(height * 1000 + width)
    return torch.randint(0, 256, (n, 3, height, width), generator=gen, dtype=torch.uint8)


def reference(judge: Judge, image: torch.Tensor, prompt: str, **images_kwargs) -> torch.Tensor:
    """Next-token probabilities ``(V,)`` after the assistant prefix, from the processor's inputs and
    a full forward pass of one image."""
    question = VQASCORE_QUESTION.format(prompt=prompt)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = judge.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    picture = Image.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).numpy()))
    inputs = judge.processor(text=[text], images=[picture], return_tensors="pt", **images_kwargs)
    with torch.no_grad():
        logits = judge.model(**inputs).logits  # (1, L, V)
    return torch.softmax(logits[0, -1].double(), dim=-1)


def scores(reward: JudgeReward, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    return reward(images.float() / 255, prompts, [{}] * len(prompts))


# float32 end to end; reward and reference differ only in how the sums run (lm_head on one row vs
# all, padded vs unpadded attention): measured <= 1.6e-7 relative (about one float32 ulp) on
# probabilities near 1/35. Leaving out mm_token_type_ids (1-D positions) moves them by ~1e-4.
CLOSE = {"rtol": 3e-6, "atol": 1e-9}


def test_score_is_the_next_token_probability_of_yes(qwen25):
    """Through the registry and the reward set (uint8 in, scoring on the call thread)."""
    images = pictures(2)
    rewards = RewardSet([RewardConfig("judge", params={"model": qwen25.folder})])
    try:
        got = rewards(images, PROMPTS[:2], [{}, {}]).per_reward["judge"]
    finally:
        rewards.close()
    want = torch.stack([reference(qwen25, images[i], PROMPTS[i])[VOCAB["Yes"]] for i in range(2)])
    torch.testing.assert_close(got, want.float(), **CLOSE)
    assert not torch.equal(got[0], got[1])  # the image and prompt matter


def test_a_batch_of_five_scores_as_five_batches_of_one(qwen25):
    images = pictures(5)
    batched, single = JudgeReward(qwen25.folder, batch_size=5), JudgeReward(qwen25.folder, batch_size=1)
    mask = batched.inputs(
        [Image.fromarray(np.ascontiguousarray(i.permute(1, 2, 0).numpy())) for i in images], PROMPTS
    )["attention_mask"]
    assert not mask[:, 0].all() and mask[:, -1].all()  # prompts of other lengths: left padding
    torch.testing.assert_close(scores(batched, images, PROMPTS), scores(single, images, PROMPTS), **CLOSE)


def test_normalize_is_yes_over_yes_plus_no(qwen25):
    images = pictures(2)
    got = scores(JudgeReward(qwen25.folder, normalize=True), images, PROMPTS[:2])
    probs = [reference(qwen25, images[i], PROMPTS[i]) for i in range(2)]
    want = torch.stack([p[VOCAB["Yes"]] / (p[VOCAB["Yes"]] + p[VOCAB["No"]]) for p in probs])
    torch.testing.assert_close(got, want.float(), **CLOSE)


def test_an_image_of_any_size_is_resized_as_the_processor_does(qwen25):
    """30 x 45 is no multiple of 8 (patch 4 x merge 2): smart_resize rounds it to 32 x 48, a grid of
    8 x 12 patches; with max_pixels 256 it shrinks it to 8 x 16 pixels (floor(side / 2.30 / 8) * 8,
    2.30 = sqrt(30 * 45 / 256)), 2 x 4 patches."""
    image = pictures(1, 30, 45)
    for max_pixels, grid in ((None, [1, 8, 12]), (256, [1, 2, 4])):
        reward = JudgeReward(qwen25.folder, max_pixels=max_pixels)
        picture = Image.fromarray(np.ascontiguousarray(image[0].permute(1, 2, 0).numpy()))
        assert reward.inputs([picture], ["q"])["image_grid_thw"].tolist() == [grid]
        size = {} if max_pixels is None else {"size": {"shortest_edge": 64, "longest_edge": max_pixels}}
        want = reference(qwen25, image[0], "cat", **size)[VOCAB["Yes"]]
        torch.testing.assert_close(scores(reward, image, ["cat"]), want.float().view(1), **CLOSE)


@pytest.mark.parametrize("answer", ["Maybe", "Yes please"])
def test_an_answer_that_is_not_one_token_is_an_error(qwen25, answer):
    with pytest.raises(RewardError, match=f"answer '{answer}' is not one token"):
        JudgeReward(qwen25.folder, answer=answer)


def test_preflight_checks_the_folders_and_params(qwen25, tmp_path):
    clip = tmp_path / "clip"
    clip.mkdir()
    (clip / "config.json").write_text(json.dumps({"model_type": "clip"}))
    missing = str(tmp_path / "nowhere")
    params = [
        {"model": missing},
        {"model": str(clip)},
        {"model": qwen25.folder, "processor": str(clip)},
        {
            "model": qwen25.folder,
            "question": "Is it {prompt} and {other}?",
            "min_pixels": 512,
            "max_pixels": 256,
        },
        {"model": qwen25.folder, "normalize": True, "negative": "Yes", "batch_size": 0},
    ]
    errors = validate(Config(rewards=[RewardConfig("judge", params=p) for p in params]), sections=["rewards"])
    where = [f"rewards[{i}] (judge).params: " for i in range(len(params))]
    assert errors == [
        where[0] + f"model: reward 'judge' needs {WHAT} in a local folder; {missing!r} is not a folder",
        where[1] + f"model: {str(clip)!r} holds a 'clip' model; reward 'judge' expects {WHAT} "
        "(model_type 'qwen2_5_vl' or 'qwen3_vl')",
        where[2]
        + f"processor: {str(clip)!r} has no preprocessor_config.json or tokenizer_config.json, so it "
        "holds no processor; download the model's processor files with it, or point processor at a folder "
        "that has them",
        where[3] + "question must be a template holding {prompt} (other braces doubled: {{ }}), got "
        f"'Is it {{prompt}} and {{other}}?'; e.g. {VQASCORE_QUESTION!r}",
        where[3] + "min_pixels (512) is above max_pixels (256)",
        where[4] + "answer and negative are the same token; normalize would always give 0.5",
        "rewards[4] (judge).params.batch_size must be in [1, 4096] (images per forward pass), got 0",
    ]
    assert (
        validate(
            Config(rewards=[RewardConfig("judge", params={"model": qwen25.folder})]), sections=["rewards"]
        )
        == []
    )


def test_qwen3_vl_score_is_the_next_token_probability_of_yes(tmp_path):
    judge = build("qwen3_vl", tmp_path)
    images = pictures(3)
    got = scores(JudgeReward(judge.folder, batch_size=3), images, PROMPTS[:3])
    want = torch.stack([reference(judge, images[i], PROMPTS[i])[VOCAB["Yes"]] for i in range(3)])
    torch.testing.assert_close(got, want.float(), **CLOSE)
