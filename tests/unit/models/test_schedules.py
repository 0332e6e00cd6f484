import torch
from safetensors import safe_open
from safetensors.torch import load_file

from diffrl.models.schedules import flow_sigmas


def test_sigmas_match_diffusers_reference(reference_dir):
    path = reference_dir / "sde_image.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    ref = load_file(str(path))["sigmas"]
    sigmas = flow_sigmas(int(meta["num_inference_steps"]), float(meta["shift"]))
    torch.testing.assert_close(sigmas, ref.float())
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0
