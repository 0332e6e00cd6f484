"""Binding recipes and ``key=value`` overrides to the schema (:mod:`diffrl.config.binding`):
unknown keys with a "did you mean", wrong types and literals, overrides parsed as YAML, recipe
files that are missing or malformed. Through :func:`~diffrl.preflight.load_config`, as commands do."""

import pytest

from diffrl.config import ConfigError, bind_config, parse_overrides, recipes_dir
from diffrl.preflight import load_config


def test_unknown_key_gets_did_you_mean():
    with pytest.raises(ConfigError) as e:
        load_config({"train": {"learning_rate": 1e-4}})
    assert "unknown key 'train.learning_rate'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config({}, ["train.itterations=3"])
    assert "Did you mean 'iterations'" in str(e.value)


def test_wrong_types_and_literals():
    with pytest.raises(ConfigError) as e:
        load_config({"train": {"iterations": 2.5, "lr_schedule": "cosin"}, "model": {"dtype": "fp8"}})
    text = str(e.value)
    assert "train.iterations: expected an integer" in text
    assert "'cosin' is not one of" in text
    assert "model.dtype" in text


def test_overrides_parse_yaml_values():
    tree = parse_overrides(["train.lr=3e-4", "model.lora=null", "run.name=abc"])
    assert tree["run"]["name"] == "abc"
    assert load_config({}, ["train.lr=3e-4"]).train.lr == 3e-4  # YAML 1.1 reads 3e-4 as a string
    assert tree["model"]["lora"] is None
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["train.lr"])
    with pytest.raises(ConfigError, match="conflicts"):
        parse_overrides(["model.lora=null", "model.lora.rank=4"])


def test_override_enables_lora():
    cfg = load_config({}, ["model.lora={rank: 4}"])
    assert cfg.model.lora.rank == 4 and cfg.model.lora.alpha == 16.0


def test_missing_and_malformed_recipe(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(listy)


def test_a_shipped_recipe_by_name_from_any_folder(tmp_path, monkeypatch):
    """Outside the source tree (an installed wheel) ``tiny_demo``, ``tiny_demo.yaml`` and
    ``recipes/tiny_demo.yaml`` name the shipped recipe; a path into another folder never does."""
    monkeypatch.chdir(tmp_path)
    shipped = load_config(recipes_dir() / "tiny_demo.yaml")
    for name in ("tiny_demo", "tiny_demo.yaml", "recipes/tiny_demo.yaml"):
        assert load_config(name) == shipped
    with pytest.raises(ConfigError, match="does not exist. A shipped recipe of that name is at"):
        load_config("elsewhere/tiny_demo.yaml")
    (tmp_path / "tiny_demo.yaml").write_text("run: {name: mine}\n")  # a file of the name wins
    assert load_config("tiny_demo.yaml").run.name == "mine"
    assert load_config("tiny_demo").run.name == "mine"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("ray.sequence_parallel", "parallel.sequence"),
        ("ray.num_trainer_ranks", "parallel.trainer_ranks"),
        ("ray.num_engines", "parallel.engines"),
    ],
)
def test_a_moved_key_is_refused_with_its_new_spelling(old, new):
    for recipe, overrides in (({}, [f"{old}=2"]), ({"ray": {old.split(".")[1]: 2}}, [])):
        with pytest.raises(ConfigError) as e:
            load_config(recipe, overrides)
        assert f"unknown key '{old}': it moved to {new}" in str(e.value)
    config, errors, _ = bind_config({}, [f"{new}=2"])
    assert not errors and getattr(config.parallel, new.split(".")[1]) == 2
