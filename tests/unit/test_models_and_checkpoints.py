import pytest
import torch

from diffrl.models.base import FamilyMismatchError, write_family_file
from diffrl.models.registry import load_family
from diffrl.models.schedules import flow_sigmas
from diffrl.models.tiny import TinyFamily
from diffrl.preflight import load_config
from diffrl.rollout import Conditioning
from diffrl.sampling.sampler import initial_noise, sample_ode
from diffrl.train.actor import Actor, apply_lora
from diffrl.train.checkpoint import load_optimizer_state, load_weights_into, save_checkpoint


class OtherFamily(TinyFamily):
    """A second family (same code, another name) to check cross-family refusals."""

    name = "other"


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


def test_prompt_cache_returns_the_same_encoding():
    family = _family()
    a = family.encode_prompts(["x", "y"])
    b = family.encode_prompts(["y", "x", "y"])
    torch.testing.assert_close(a.tensors["pooled_projections"][1], b.tensors["pooled_projections"][0])
    assert len(family._prompt_cache) == 2


def test_save_load_roundtrip_in_diffusers_layout(tmp_path):
    family = _family()
    family.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "transformer" / "config.json").is_file()
    loaded = _family(str(tmp_path / "m"))
    torch.testing.assert_close(_velocity(loaded), _velocity(family))


def test_model_dir_of_another_family_is_refused(tmp_path):
    write_family_file(tmp_path, "sd3")
    (tmp_path / "transformer").mkdir()
    with pytest.raises(Exception, match="holds a 'sd3' model but model.family is 'tiny'"):
        load_config({"model": {"path": str(tmp_path)}})


def test_cfg_with_scale_one_is_the_conditional_velocity():
    family = _family()
    x = torch.randn(2, 3, 32, 64)
    s = torch.tensor([0.5, 0.5])
    cond, neg = family.encode_prompts(["a", "b"]), family.encode_prompts(["", ""])
    with torch.no_grad():
        plain = family.velocity(x, s, cond)
        one = family.velocity(x, s, cond, 1.0, neg)
        cfg = family.velocity(x, s, cond, 3.0, neg)
        uncond = family.velocity(x, s, neg)
    torch.testing.assert_close(one, plain)
    torch.testing.assert_close(cfg, uncond + 3.0 * (plain - uncond), atol=1e-5, rtol=1e-5)


def test_sampling_does_not_depend_on_batch_layout():
    family = _family()
    prompts = ['the text "A"', 'the text "B"', 'the text "C"']
    keys = [(5, "eval", i, 0) for i in range(3)]
    noise = initial_noise(family, keys, 32, 64)
    full = sample_ode(family, noise, family.encode_prompts(prompts), flow_sigmas(3, 1.0))
    one = sample_ode(
        family,
        initial_noise(family, keys[1:2], 32, 64),
        family.encode_prompts(prompts[1:2]),
        flow_sigmas(3, 1.0),
    )
    torch.testing.assert_close(one, full[1:2], atol=1e-5, rtol=1e-5)


def test_lora_checkpoint_roundtrip_and_family_check(tmp_path):
    cfg = load_config({"model": {"path": "random", "lora": {"rank": 4}}, "train": {"ema_decay": 0.9}})
    family = load_family(cfg)
    actor = Actor(family, cfg)
    names = [n for n, p in family.transformer.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    with torch.no_grad():  # make the adapter do something, and give the optimizer a state
        for p in actor.params:
            p.add_(0.01 * torch.randn_like(p))
    actor.params[0].grad = torch.ones_like(actor.params[0])
    actor.optimizer.step()
    want = _velocity(family)
    ckpt = save_checkpoint(tmp_path / "ckpt", actor, cfg, iteration=1)

    fresh = load_family(cfg)
    apply_lora(fresh, cfg.model.lora)
    load_weights_into(fresh, ckpt, use_ema=False)
    torch.testing.assert_close(_velocity(fresh), want)

    actor2 = Actor(load_family(cfg), cfg)
    load_optimizer_state(actor2, ckpt)
    s1, s2 = actor.optimizer.state_dict()["state"][0], actor2.optimizer.state_dict()["state"][0]
    torch.testing.assert_close(s1["exp_avg"], s2["exp_avg"])

    other = OtherFamily.load("random", torch.device("cpu"), torch.float32, OtherFamily.Options())
    with pytest.raises(FamilyMismatchError, match="trained on the 'tiny' family, not 'other'"):
        load_weights_into(other, ckpt)


def test_conditioning_select_and_cat():
    c = Conditioning({"a": torch.arange(6).view(3, 2)})
    assert Conditioning.cat([c.select([2]), c.select([0])]).tensors["a"].tolist() == [[4, 5], [0, 1]]


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
