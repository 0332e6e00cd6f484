"""The ``tiny`` family: a real (small) SD3 transformer, saved and loaded in the diffusers layout,
and its option to train the text encoder with the transformer."""

import pytest
import torch

from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.sampling.sampler import initial_noise
from diffrl.train.actor import Actor
from diffrl.train.checkpoint import load_weights_into, save_checkpoint


def _family(path="random"):
    return load_family(load_config({"model": {"path": path}}))


def _velocity(family, prompts=('the text "AB3"', 'the number "42"')):
    x = initial_noise(family, [(0, "t", i) for i in range(len(prompts))], 32, 64)
    with torch.no_grad():
        return family.velocity(x, torch.tensor([0.7, 0.3]), family.encode_prompts(list(prompts)))


def test_tiny_is_a_real_sd3_transformer_and_shapes_hold():
    from diffusers import SD3Transformer2DModel

    family = _family()
    assert isinstance(family.transformer, SD3Transformer2DModel)
    cond = family.encode_prompts(['the text "AB3"', ""])
    assert cond.tensors["encoder_hidden_states"].shape == (2, 40, 64)
    assert cond.tensors["pooled_projections"].shape == (2, 64)
    assert _velocity(family).shape == (2, 3, 32, 64)
    assert family.latent_shape(32, 64) == (3, 32, 64)
    with pytest.raises(ValueError, match="multiples of 4"):
        family.latent_shape(30, 64)


def test_save_load_roundtrip_in_diffusers_layout(tmp_path):
    family = _family()
    family.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "transformer" / "config.json").is_file()
    loaded = _family(str(tmp_path / "m"))
    torch.testing.assert_close(_velocity(loaded), _velocity(family))


def test_training_the_text_encoder_with_the_transformer(tmp_path):
    cfg = load_config({"model": {"path": "random", "options": {"train_text_encoder": True}}})
    family = load_family(cfg)
    actor = Actor(family, cfg)
    names = {n.split(".")[0] for n, p in actor.module.named_parameters() if p.requires_grad}
    assert names == {"transformer", "text_encoder"}
    cond = family.encode_prompts(['the text "AB"'])
    assert cond.tensors["pooled_projections"].requires_grad and not family._prompt_cache
    ckpt = save_checkpoint(tmp_path / "c", actor, cfg, iteration=0)
    fresh = load_family(cfg)
    with torch.no_grad():
        for p in family.text_encoder.parameters():
            p.add_(0.1)
    load_weights_into(fresh, ckpt)  # text encoder weights travel with the checkpoint...
    family.save_pretrained(tmp_path / "m")  # ...and with an exported model
    reloaded = load_family(load_config({"model": {"path": str(tmp_path / "m")}}))
    torch.testing.assert_close(
        reloaded.encode_prompts(["x"]).tensors["pooled_projections"],
        family.encode_prompts(["x"]).tensors["pooled_projections"].detach(),
    )
    with pytest.raises(Exception, match="train_text_encoder needs a full fine-tune"):
        load_config(
            {"model": {"path": "random", "lora": {"rank": 4}, "options": {"train_text_encoder": True}}}
        )
