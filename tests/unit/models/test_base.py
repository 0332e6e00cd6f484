"""What every family inherits from :class:`~diffrl.models.base.ModelFamily` (the prompt cache,
classifier-free guidance) and the family file that marks a model folder, shown on ``tiny``; and
the static half every family declares beside it (:class:`~diffrl.models.base.FamilyDescription`)."""

import inspect

import pytest
import torch

from diffrl.models.base import FamilyDescription, write_family_file
from diffrl.models.registry import FAMILIES, load_family
from diffrl.preflight import load_config


def _family(path="random"):
    return load_family(load_config({"model": {"path": path}}))


def test_prompt_cache_returns_the_same_encoding():
    family = _family()
    a = family.encode_prompts(["x", "y"])
    b = family.encode_prompts(["y", "x", "y"])
    torch.testing.assert_close(a.tensors["pooled_projections"][1], b.tensors["pooled_projections"][0])
    assert len(family._prompt_cache) == 2


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


def test_every_family_declares_itself_in_a_static_description_in_its_own_file():
    """The registry resolves a family to its runtime class, whose ``description`` is a
    :class:`FamilyDescription` defined in the same file, named as the registry names it, with
    class attributes and classmethods only (nothing that needs an instance)."""
    for name in FAMILIES.names():
        family = FAMILIES.resolve(name)
        description = family.description
        assert issubclass(description, FamilyDescription), name
        assert description.__module__ == family.__module__, name
        assert description.name == name
        methods = [
            k for k, v in vars(description).items() if inspect.isfunction(v) or isinstance(v, property)
        ]
        assert methods == [], (name, methods)
