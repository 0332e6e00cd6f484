import torch

from diffrl.models.registry import load_family
from diffrl.models.schedules import flow_sigmas
from diffrl.preflight import load_config
from diffrl.sampling.sampler import initial_noise, sample_ode


def _family(path="random"):
    return load_family(load_config({"model": {"path": path}}))


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
