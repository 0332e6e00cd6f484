import pytest
import torch
from safetensors.torch import load_file

from diffrl.algorithms.advantages import group_advantages


@pytest.mark.parametrize("global_std", [True, False])
def test_matches_reference(reference_dir, global_std):
    ref = load_file(str(reference_dir / f"advantages_global_std_{global_std}.safetensors"))
    out = group_advantages(ref["rewards"], ref["group_id"], global_std=global_std)
    torch.testing.assert_close(out.advantages, ref["advantages"])
    # the reference has one group whose samples all scored the same
    assert out.zero_std.any() and (out.advantages[out.zero_std] == 0).all()


def test_layout_does_not_matter_and_dr_grpo_and_clip():
    r = torch.tensor([1.0, 0.0, 3.0, 5.0, 2.0, 2.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    a = group_advantages(r, g).advantages
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    torch.testing.assert_close(group_advantages(r[perm], g[perm]).advantages, a[perm])
    torch.testing.assert_close(
        group_advantages(r, g, scale_by_std=False).advantages,
        torch.tensor([0.5, -0.5, -1, 1, 0, 0], dtype=torch.float64),
    )
    assert group_advantages(r * 100, g, scale_by_std=False, clip=5.0).advantages.abs().max() == 5.0
