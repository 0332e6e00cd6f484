"""The whole-system checks before anything loads (:mod:`diffrl.preflight`): the shipped recipes,
every problem at once, files, names and the plugins' own settings (algorithm, model family, runner)."""

from pathlib import Path

import pytest

from diffrl.config import ConfigError, recipes_dir
from diffrl.preflight import load_config

SHIPPED = sorted(recipes_dir().glob("*.yaml"))


def test_there_are_shipped_recipes():
    assert SHIPPED, "no recipes found"


@pytest.mark.parametrize("recipe", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_recipe_validates_and_opens_with_its_command(recipe: Path):
    import yaml

    # real-scale recipes name a model folder a user has and this machine does not
    local = yaml.safe_load(recipe.read_text()).get("model", {}).get("path", "base") in ("base", "random")
    load_config(recipe, check_files=local)
    first = recipe.read_text().splitlines()[0]
    assert first == f"# diffrl train recipes/{recipe.name}"


def test_defaults_validate():
    cfg = load_config({})
    assert cfg.model.family == "tiny"


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(
            {
                "train": {"batch_size": 10, "micro_batch_size": 4, "lr": "fast"},
                "model": {"famliy": "tiny"},
                "sampling": {"num_steps": 0},
            }
        )
    problems = e.value.problems
    text = str(e.value)
    assert len(problems) >= 3, problems
    assert "train.lr: expected a number" in text
    assert "famliy" in text and "family" in text
    assert "multiple of train.micro_batch_size" in text and "micro_batch_size=2" in text
    assert "sampling.num_steps must be in [1, 1000], got 0" in text


def test_missing_files_unknown_names_and_incompatible_choices(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(
            {
                "eval": {"prompts": str(tmp_path / "missing.txt")},
                "algorithm": {"name": "sftt"},
                "model": {"family": "tiny", "path": str(tmp_path / "nowhere")},
                "rewards": [{"name": "no_such_pkg.mod:fn"}],
            }
        )
    text = str(e.value)
    assert "missing.txt" in text and "does not exist" in text
    assert "unknown algorithm 'sftt'" in text and "Did you mean 'sft'" in text
    assert "nowhere" in text and "is not a directory" in text
    assert "cannot import module 'no_such_pkg.mod'" in text


def test_sft_without_dataset_is_refused():
    with pytest.raises(ConfigError, match="set data.dataset"):
        load_config({"algorithm": {"name": "sft"}, "data": {"dataset": None}})


def test_algorithm_params_are_validated():
    with pytest.raises(ConfigError) as e:
        load_config(
            {
                "data": {"dataset": "synthetic_text"},
                "algorithm": {"name": "sft", "params": {"cond_drop": 0.1}},
            }
        )
    assert "algorithm.params.cond_drop" in str(e.value) and "cond_dropout" in str(e.value)
    with pytest.raises(ConfigError, match="cond_dropout must be in"):
        load_config({"data": {"dataset": "synthetic_text"}, "algorithm": {"params": {"cond_dropout": 1.5}}})


def test_guidance_defaults_to_the_familys_and_an_explicit_value_wins():
    from diffrl.models.tiny import TinyFamily

    assert load_config({}).sampling.guidance_scale == TinyFamily.description.default_guidance
    assert load_config({}, ["sampling.guidance_scale=1"]).sampling.guidance_scale == 1.0


def test_sequence_parallel_settings_are_checked_before_anything_starts():
    recipe = "recipes/tiny_grpo_ocr_small.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(recipe, ["runner=ray", "parallel.trainer_ranks=3", "parallel.sequence=2"])
    msg = str(e.value)
    assert "parallel.sequence=2 ranks per sample do not divide parallel.trainer_ranks=3" in msg
    # the tiny family (SD3's transformer class) has no context-parallel plan: the error names who can
    assert "the tiny family's transformer cannot split a sample over ranks" in msg
    assert "families that can: " in msg and "ltx2" in msg and "wan" in msg
    with pytest.raises(ConfigError, match=r"over 2 data-parallel group\(s\) \(parallel.trainer_ranks=4 / "):
        load_config(
            recipe,
            ["runner=ray", "parallel.trainer_ranks=4", "parallel.sequence=2", "train.batch_size=3"],
            check_files=False,
        )
    with pytest.raises(ConfigError, match="runner=local is one process: set runner: ray"):
        load_config(recipe, ["parallel.sequence=2"])
    with pytest.raises(ConfigError, match=r"parallel.sequence must be in \[1, 1024\], got 0"):
        load_config(recipe, ["runner=ray", "parallel.sequence=0"])


def scores_on(images, prompts, metadata, device="cpu"):
    return [0.0] * len(prompts)


def test_ray_settings_are_checked_before_anything_starts():
    with pytest.raises(ConfigError) as e:
        load_config(
            "recipes/tiny_grpo_ocr_small.yaml",
            ["runner=ray", "parallel.trainer_ranks=3", "parallel.engines=0", "ray.backend=mpi"],
        )
    msg = str(e.value)
    assert "do not split evenly over parallel.trainer_ranks=3" in msg
    assert (
        "parallel.engines must be in [1, 4096], got 0" in msg
        and "ray.backend must be gloo, nccl or null" in msg
    )
    with pytest.raises(ConfigError, match="model.compile=true with parallel.trainer_ranks=2"):
        load_config(
            "recipes/tiny_grpo_ocr_small.yaml",
            ["runner=ray", "parallel.trainer_ranks=2", "model.compile=true"],
        )
    here = "tests.unit.test_preflight:scores_on"
    gpu_reward = ["runner=ray", f"rewards=[{{name: ocr}}, {{name: {here}, params: {{device: cuda}}}}]"]
    with pytest.raises(ConfigError, match=r"rewards\[1\] \(.*scores_on\).params.device=cuda, but under"):
        load_config("recipes/tiny_grpo_ocr_small.yaml", gpu_reward, check_files=False)
    load_config(
        "recipes/tiny_grpo_ocr_small.yaml", [*gpu_reward, "ray.rewards_on_gpu=true"], check_files=False
    )
    with pytest.raises(ConfigError, match="unknown key 'ray.num_engine'"):
        load_config("recipes/tiny_grpo_ocr_small.yaml", ["runner=ray", "ray.num_engine=2"])
    with pytest.raises(ConfigError, match="runner"):
        load_config("recipes/tiny_grpo_ocr_small.yaml", ["runner=slurm"])


def test_an_edit_prompt_set_for_a_family_that_does_not_edit_is_refused(tmp_path):
    from diffrl.data.synthetic_text import write_edit_set

    edits = write_edit_set(tmp_path / "set", ['the number "12"'], seed=0, height=16, width=16)
    with pytest.raises(ConfigError) as e:
        load_config(
            {
                "algorithm": {"name": "flow_grpo"},
                "data": {"prompts": str(edits)},
                "eval": {"prompts": str(edits), "num_prompts": None},
            }
        )
    text = str(e.value)
    for where in ("data.prompts", "eval.prompts"):
        assert f"{where}: {str(edits)!r} gives source images" in text
    assert "model family 'tiny' does not edit images" in text
    with pytest.raises(ConfigError, match="synthetic_edit holds edit pairs"):
        load_config({"algorithm": {"name": "sft"}, "data": {"dataset": "synthetic_edit"}, "rewards": []})


def test_a_malformed_edit_line_is_reported_with_its_file_and_line_before_loading(tmp_path):
    import json

    (tmp_path / "edits.jsonl").write_text(json.dumps({"prompt": "write 42 on the sign", "image": "gone.png"}))
    with pytest.raises(ConfigError) as e:
        load_config({"algorithm": {"name": "flow_grpo"}, "data": {"prompts": str(tmp_path / "edits.jsonl")}})
    assert str(tmp_path / "edits.jsonl") in str(
        e.value
    ) and "line 1: \"image\" 'gone.png': no such file" in str(e.value)


def test_off_policy_steps_are_checked_before_anything_starts():
    """``train.off_policy_steps: 1`` needs a runner that can draw while it trains and an
    algorithm that can learn from samples one update old; each refusal says why and what to set."""
    with pytest.raises(ConfigError) as e:
        load_config("recipes/tiny_nft_ocr.yaml", ["train.off_policy_steps=1"])
    assert "runner=local samples and trains with one module" in str(e.value)
    assert "Set runner: ray" in str(e.value)
    with pytest.raises(
        ConfigError,
        match=r"train.off_policy_steps must be in \[0, 1\] \(0: synchronous, 1: rollout one iteration ahead",
    ):
        load_config("recipes/tiny_nft_ocr.yaml", ["runner=ray", "train.off_policy_steps=2"])
    # Flow-GRPO's ratio is against the recorded log-probs: off-policy it needs the correction
    grpo = ["runner=ray", "train.off_policy_steps=1"]
    with pytest.raises(ConfigError, match="set algorithm.params.rollout_correction: tis"):
        load_config("recipes/tiny_grpo_ocr_small.yaml", grpo)
    load_config("recipes/tiny_grpo_ocr_small.yaml", [*grpo, "algorithm.params.rollout_correction=tis"])
    # forward-process and pair losses take older samples as they are; SFT has no rollout to draw ahead
    for recipe in ("tiny_nft_ocr", "tiny_awm_ocr", "tiny_dpo_ocr"):
        assert load_config(f"recipes/{recipe}.yaml", grpo).train.off_policy_steps == 1
    with pytest.raises(ConfigError, match="trains on a fixed dataset .no rollout to draw ahead."):
        load_config("recipes/tiny_sft.yaml", grpo)
    # a user's runner without end_rollout cannot pipeline
    with pytest.raises(ConfigError, match="cannot draw a rollout while it trains .it has no end_rollout"):
        load_config(
            "recipes/tiny_nft_ocr.yaml",
            ["runner=tests.unit.test_preflight:PlainRunner", "train.off_policy_steps=1"],
        )


class PlainRunner:
    """A user's runner that does not pipeline (no ``end_rollout``)."""

    def __init__(self, config, algorithm, spec):
        pass
