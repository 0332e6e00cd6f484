"""The CLIP diversity monitor (diffrl.trust.monitors.clip_*): the distance math on hand-made
embeddings, its schedule, the tiny CLIP's embeddings, and the default CLIP a config resolves to
(diffrl.preflight.monitor)."""

import pytest
import torch

from diffrl.config import Config, RewardConfig
from diffrl.config.schema import MonitorConfig
from diffrl.preflight.monitor import monitor_problems, resolve_monitor
from diffrl.rewards import clip_embed
from diffrl.trust.monitors import clip_diversity, clip_embedder, clip_metrics, mean_pairwise_cosine_distance
from tests.unit.rewards.tiny_clip import write_clip

TRAIN = ("train", "rewards", "monitor")


def test_identical_samples_are_at_distance_0_and_orthogonal_ones_at_1():
    same = torch.tensor([[3.0, 4.0], [0.6, 0.8], [6.0, 8.0]])  # one direction, any length
    assert mean_pairwise_cosine_distance(torch.nn.functional.normalize(same, dim=-1)) == pytest.approx(
        0,
        abs=1e-6,  # normalised in float32
    )
    assert clip_diversity(same, torch.zeros(3))["monitor/clip_within_group_dist"] == pytest.approx(
        0, abs=1e-12
    )
    assert mean_pairwise_cosine_distance(torch.eye(3)) == pytest.approx(1.0)
    assert mean_pairwise_cosine_distance(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(2.0)


def test_within_group_and_across_prompt_golden_values():
    # group 0: two identical samples (distance 0); group 1: e1 and e2 (distance 1)
    e = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    m = clip_diversity(e, torch.tensor([0, 0, 1, 1]))
    assert m["monitor/clip_within_group_dist"] == pytest.approx(0.5)  # (0 + 1) / 2
    # group means: e1 and (e2 + e3) / 2, re-normalised: cosine 0, distance 1
    assert m["monitor/clip_across_prompt_dist"] == pytest.approx(1.0)
    # every prompt drawing the same picture: across-prompt distance 0
    alike = clip_diversity(torch.tensor([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]]), torch.tensor([0, 1, 2]))
    assert alike == {"monitor/clip_across_prompt_dist": pytest.approx(0, abs=1e-12)}


def test_a_group_mean_is_the_mean_of_unit_embeddings():
    # group 0: e1 (length 1) and 10 * e2; normalised first, so its mean points at 45 degrees
    e = torch.tensor([[1.0, 0.0], [0.0, 10.0], [1.0, 0.0], [1.0, 0.0]])
    m = clip_diversity(e, torch.tensor([0, 0, 1, 1]))
    assert m["monitor/clip_across_prompt_dist"] == pytest.approx(1 - 2**-0.5)
    assert m["monitor/clip_within_group_dist"] == pytest.approx(0.5)  # (1 + 0) / 2


def test_single_sample_groups_and_one_group_leave_their_metric_out():
    e = torch.eye(2)
    assert clip_diversity(e, torch.tensor([0, 1])) == {"monitor/clip_across_prompt_dist": pytest.approx(1.0)}
    assert clip_diversity(e, torch.tensor([0, 0])) == {"monitor/clip_within_group_dist": pytest.approx(1.0)}


def test_off_or_between_its_iterations_nothing_is_loaded(tmp_path):
    images = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    group = torch.tensor([0, 0])
    missing = str(tmp_path / "nothing_here")  # would fail to load if it were tried
    assert clip_metrics(images, group, 0, MonitorConfig()) == {}
    assert clip_metrics(images, group, 0, MonitorConfig(clip=missing, clip_every=0)) == {}
    assert clip_metrics(images, group, 3, MonitorConfig(clip=missing, clip_every=2)) == {}


def test_the_tiny_clip_embeds_as_the_rewards_do(tmp_path):
    model = write_clip(tmp_path / "clip")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 3, 12, 12), generator=g, dtype=torch.uint8)
    images[1] = images[0]  # a duplicate within group 0
    group = torch.tensor([0, 0, 1, 1, 1])
    monitor = MonitorConfig(clip=str(tmp_path / "clip"), clip_device="cpu")
    m = clip_metrics(images, group, 4, monitor)
    embedder = clip_embedder(str(tmp_path / "clip"), None, "cpu")
    processor = clip_embed.load_image_processor("test", str(tmp_path / "clip"))
    pictures = clip_embed.pil_images(images.float() / 255)
    with torch.no_grad():
        expected = clip_embed.image_embeddings(model, clip_embed.pixel_values(processor, pictures))
    torch.testing.assert_close(embedder.embed(images), expected)
    assert m == pytest.approx(clip_diversity(expected, group))
    # a video is embedded by its middle frame
    video = torch.stack([torch.zeros_like(images), images, torch.zeros_like(images)], dim=2)
    torch.testing.assert_close(embedder.embed(video), expected)
    clip_embedder.cache_clear()


def test_the_default_clip_is_the_first_clip_rewards_folder():
    rewards = [
        RewardConfig("ocr"),
        RewardConfig("tests.rewards:brightness"),  # a function reward: no clip_folders, skipped
        RewardConfig("pickscore", params={"model": "/m/pickscore", "processor": "/m/laion"}),
        RewardConfig("clip_score", params={"model": "/m/clip"}),
    ]
    config = Config(rewards=rewards)
    config.run.device = "cpu"
    resolve_monitor(config, TRAIN)  # opt-in: no clip_every, no clip -> no CLIP monitor
    assert (config.monitor.clip, config.monitor.clip_every) == (None, 0)
    config.monitor.clip_every = 3
    resolve_monitor(config, TRAIN)
    m = config.monitor
    assert (m.clip, m.clip_processor, m.clip_device, m.clip_every) == ("/m/pickscore", "/m/laion", "cpu", 3)
    aesthetic = Config(rewards=[RewardConfig("aesthetic", params={"clip": "/m/vit-l", "predictor": "/p.pt"})])
    aesthetic.monitor.clip_every = 1
    resolve_monitor(aesthetic, TRAIN)
    assert (aesthetic.monitor.clip, aesthetic.monitor.clip_processor) == ("/m/vit-l", None)
    assert aesthetic.monitor.clip_device == "auto"  # run.device's default
    on_ray = Config(rewards=[RewardConfig("clip_score", params={"model": "/m/clip"})], runner="ray")
    on_ray.run.device, on_ray.monitor.clip_every = "cuda", 1
    resolve_monitor(on_ray, TRAIN)
    assert on_ray.monitor.clip_device == "cpu"  # the driver's, not the actors' device


def test_no_default_without_a_clip_reward_off_or_for_other_commands():
    ocr = Config(rewards=[RewardConfig("ocr")])
    resolve_monitor(ocr, TRAIN)
    assert ocr.monitor.clip is None and ocr.monitor.clip_device is None
    off = Config(rewards=[RewardConfig("clip_score", params={"model": "/m/clip"})])
    off.monitor.clip_every = 0
    resolve_monitor(off, TRAIN)
    assert off.monitor.clip is None
    evaluating = Config(rewards=[RewardConfig("clip_score", params={"model": "/m/clip"})])
    resolve_monitor(evaluating, ("run", "model", "sampling", "eval"))
    assert evaluating.monitor.clip is None
    own = Config(rewards=[RewardConfig("clip_score", params={"model": "/m/clip"})])
    own.monitor.clip, own.monitor.clip_device = "/mine", "cuda:1"
    resolve_monitor(own, TRAIN)
    assert (own.monitor.clip, own.monitor.clip_device, own.monitor.clip_every) == ("/mine", "cuda:1", 1)


def test_clip_every_without_a_clip_to_embed_with_is_refused():
    config = Config(rewards=[RewardConfig("ocr")])
    config.monitor.clip_every = 2
    (problem,) = monitor_problems(config, check_files=False)
    assert problem.startswith("monitor.clip_every is 2 but there is no CLIP to embed with: give monitor.clip")


def test_a_tiny_clip_folder_passes_the_checks(tmp_path):
    write_clip(tmp_path / "clip")
    config = Config()
    config.monitor.clip = str(tmp_path / "clip")
    assert monitor_problems(config, check_files=True) == []
    write_clip(tmp_path / "pickscore", with_processor=False)
    config.monitor.clip = str(tmp_path / "pickscore")
    assert "has no preprocessor_config.json" in " ".join(monitor_problems(config, check_files=True))
    config.monitor.clip_processor = str(tmp_path / "clip")
    assert monitor_problems(config, check_files=True) == []
