import pytest
import torch
from safetensors.torch import save_file

from diffrl.rewards import clip_embed
from diffrl.rewards.aesthetic import LINEAR_LAYERS, Aesthetic
from diffrl.rewards.base import RewardError
from diffrl.rewards.pretrained import pil_images
from tests.unit.rewards.tiny_clip import clip_pixels, preflight_problems, random_images, write_clip

WIDTHS = [16, 24, 12, 8, 4, 1]  # the real predictor: 768, 1024, 128, 64, 16, 1


def predictor_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict with the keys and layout of sac+logos+ava1-l14-linearMSE.pth, tiny widths."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for i, (d_in, d_out) in zip(LINEAR_LAYERS, zip(WIDTHS, WIDTHS[1:])):
        state[f"layers.{i}.weight"] = torch.randn(d_out, d_in, generator=gen) / d_in**0.5
        state[f"layers.{i}.bias"] = torch.randn(d_out, generator=gen)
    return state


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("aesthetic")
    model = write_clip(root / "clip-vit-large-patch14", seed=7)
    torch.save(predictor_state(), root / "sac+logos+ava1-l14-linearMSE.pth")
    save_file(predictor_state(), str(root / "predictor.safetensors"))
    return root, model


@pytest.fixture(scope="module")
def reward(files):
    root, _ = files
    return Aesthetic(str(root / "clip-vit-large-patch14"), str(root / "sac+logos+ava1-l14-linearMSE.pth"))


def reference_scores(model, pixels):
    """flow_grpo's AestheticScorer: CLIP image features, L2-normalised, then the Linear layers."""
    embed = model.get_image_features(pixel_values=pixels).pooler_output
    x = embed / torch.linalg.vector_norm(embed, dim=-1, keepdim=True)
    state = predictor_state()
    for i in LINEAR_LAYERS:
        x = x @ state[f"layers.{i}.weight"].T + state[f"layers.{i}.bias"]
    return x.squeeze(1)


def test_score_is_the_predictor_on_normalised_clip_embeddings(files, reward):
    _, model = files
    images = random_images(5, 32, 32, seed=8)
    expected = reference_scores(model, clip_pixels(images, 32))
    # float32 throughout; the outputs are of order 1-10: 1e-5 relative covers reordered sums
    torch.testing.assert_close(reward(images, [""] * 5, [{}] * 5), expected, atol=1e-5, rtol=1e-5)
    assert expected.std() > 1e-3


def test_safetensors_predictor_scores_the_same(files, reward):
    root, _ = files
    other = Aesthetic(str(root / "clip-vit-large-patch14"), str(root / "predictor.safetensors"))
    images = random_images(3, 32, 32, seed=9)
    assert torch.equal(other(images, [""] * 3, [{}] * 3), reward(images, [""] * 3, [{}] * 3))


def test_non_square_larger_image_is_prepared_as_the_processor_config_says(files, reward):
    _, model = files
    images = random_images(2, 50, 96, seed=10)
    reference = clip_pixels(images, 32)
    torch.testing.assert_close(
        clip_embed.pixel_values(reward.image_processor, pil_images(images)), reference, atol=1e-6, rtol=0
    )
    expected = reference_scores(model, reference)
    torch.testing.assert_close(reward(images, ["", ""], [{}] * 2), expected, atol=1e-5, rtol=1e-5)


def test_batch_size_does_not_change_scores(files, reward):
    root, _ = files
    images = random_images(5, 32, 32, seed=11)
    one = Aesthetic(str(root / "clip-vit-large-patch14"), str(root / "predictor.safetensors"), batch_size=1)
    # float32 rounding of differently shaped GEMMs, on outputs of order 1-10
    torch.testing.assert_close(
        one(images, [""] * 5, [{}] * 5), reward(images, [""] * 5, [{}] * 5), atol=1e-5, rtol=1e-6
    )


class NotATensor:
    pass


def test_predictor_file_is_never_unpickled_freely(files, tmp_path):
    root, _ = files
    torch.save({"layers.0.weight": NotATensor()}, tmp_path / "evil.pth")
    with pytest.raises(
        RewardError, match=r"could not load the aesthetic predictor's state dict from '.*evil.pth'.*Unpickl"
    ):
        Aesthetic(str(root / "clip-vit-large-patch14"), str(tmp_path / "evil.pth"))


def test_predictor_of_another_layout_or_width_is_a_clear_error(files, tmp_path):
    root, _ = files
    torch.save({"fc.weight": torch.zeros(1, 16)}, tmp_path / "other.pth")
    with pytest.raises(RewardError, match="is not the LAION aesthetic predictor's state dict"):
        Aesthetic(str(root / "clip-vit-large-patch14"), str(tmp_path / "other.pth"))
    state = predictor_state()
    state["layers.0.weight"] = torch.zeros(24, 20)  # a predictor for 20-d embeddings
    torch.save(state, tmp_path / "wide.pth")
    with pytest.raises(RewardError, match="takes 20-d embeddings but the CLIP model in .* makes 16-d ones"):
        Aesthetic(str(root / "clip-vit-large-patch14"), str(tmp_path / "wide.pth"))


def test_param_problems(files, tmp_path):
    root, _ = files
    clip = str(root / "clip-vit-large-patch14")
    [missing] = preflight_problems("aesthetic", {"clip": clip, "predictor": str(tmp_path / "nope.pth")})
    assert missing == (
        f"rewards[0] (aesthetic).params: predictor: {str(tmp_path / 'nope.pth')!r} is not a file (the LAION "
        "aesthetic predictor state dict (sac+logos+ava1-l14-linearMSE.pth))"
    )
    [suffix] = preflight_problems("aesthetic", {"clip": clip, "predictor": "weights.npz"})
    assert "predictor: 'weights.npz' should be the LAION aesthetic predictor state dict" in suffix
    [no_clip] = preflight_problems("aesthetic", {"predictor": str(root / "predictor.safetensors")})
    assert "clip must be the path of a local folder holding CLIP ViT-L/14 (a CLIPModel), got None" in no_clip
    [dtype] = preflight_problems(
        "aesthetic", {"clip": clip, "predictor": str(root / "predictor.safetensors"), "dtype": "half"}
    )
    assert "dtype must be one of float32, bfloat16, float16, got 'half'" in dtype
