"""``model.encode_once`` (:mod:`diffrl.sampling.prompt_cache`): every prompt of the run encoded
once, shared through the run folder, and the text encoders released."""

import pytest
import torch

from diffrl.config import ConfigError
from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.sampling.prompt_cache import CACHE_FILE, encode_once, run_prompts


def _config(tmp_path, *extra: str):
    train = tmp_path / "train.txt"
    train.write_text('the text "A"\nthe text "B"\nthe text "A"\n')
    test = tmp_path / "test.txt"
    test.write_text('the text "C"\nthe text "B"\n')
    return load_config(
        "recipes/tiny_nft_ocr.yaml",
        [
            "model.path=random",
            "model.encode_once=true",
            f"data.prompts={train}",
            f"eval.prompts={test}",
            "eval.num_prompts=2",
            f"run.output_dir={tmp_path / 'run'}",
            *extra,
        ],
    )


def test_the_run_is_encoded_once_shared_through_its_folder_and_the_encoders_released(tmp_path):
    config = _config(tmp_path)
    prompts = run_prompts(config)  # train, eval and the negative prompt, once each
    assert prompts == ['the text "A"', 'the text "B"', 'the text "C"', ""]
    fresh = load_family(config).encode_prompts(prompts).tensors

    first = load_family(config)
    done = encode_once(first, config)
    assert done.encoded and done.prompts == 4 and done.released_bytes > 0
    assert first.text_encoder is None and first.tokenizer is None
    got = first.encode_prompts(prompts).tensors  # from the cache: what the encoder gave
    assert got.keys() == fresh.keys() and all(torch.allclose(got[k], fresh[k], atol=1e-6) for k in got)
    with pytest.raises(RuntimeError, match="text encoders were released .* 'the text \"Z\"' is not one"):
        first.encode_prompts(['the text "Z"'])

    # another process of the run (an engine, a rank, the resumed run) reads the very same tensors
    second = load_family(config)
    assert not encode_once(second, config).encoded
    again = second.encode_prompts(prompts).tensors
    assert all(torch.equal(again[k], got[k]) for k in got)

    # a file of another model (or another prompt set) is not read: it is encoded anew
    other = _config(tmp_path, "model.path=base")
    assert encode_once(load_family(other), other).encoded
    assert (tmp_path / "run" / CACHE_FILE).is_file()


def test_encode_once_is_refused_where_the_prompts_are_not_a_fixed_text_set(tmp_path):
    with pytest.raises(ConfigError, match="trains on a dataset's captions"):
        load_config("recipes/tiny_sft.yaml", ["model.encode_once=true"])
    with pytest.raises(ConfigError, match="the text encoder trains"):
        load_config(
            "recipes/tiny_nft_ocr.yaml",
            ["model.encode_once=true", "model.lora=null", "model.options={train_text_encoder: true}"],
        )
