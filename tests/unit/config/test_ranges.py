"""Every number of the schema declares its range (:class:`~diffrl.config.schema.Range`), and the
binder refuses a value outside it, naming the field and the range. Walks the dataclasses, so a
field added without a range fails here. Also the bounds on what a user can make diffrl read: YAML
(duplicate keys, alias bombs, nesting), quoted values, the divisor hint and caption wrapping."""

from __future__ import annotations

import dataclasses
import math
import re
import time
import types
import typing
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import pytest

from diffrl.config import Config, ConfigError, Range, TrainConfig, bind_config
from diffrl.config.binding import YamlProblem, load_yaml, signature_problems, with_lines
from diffrl.errors import quoted
from diffrl.preflight.schema import largest_divisor, read_config, schema_problems
from diffrl.rewards.registry import REWARDS
from diffrl.train.evaluate import caption_font, wrap


def _numeric(tp: Any) -> tuple[type, Range | None] | None:
    """``(int or float, its Range or None)`` for a numeric field type (Optional unwrapped), else None."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return _numeric(args[0]) if len(args) == 1 else None
    if get_origin(tp) is Annotated:
        base, *extras = get_args(tp)
        ranges = [e for e in extras if isinstance(e, Range)]
        return (base, ranges[0] if ranges else None) if base in (int, float) else None
    return (tp, None) if tp in (int, float) else None


def _fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    """``(path, type)`` of every field of ``cls`` and of the dataclasses under it (tuples' items as
    ``path[i]``); a list of dataclasses as ``path[0]``."""
    out = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        path, tp = f"{prefix}{f.name}", hints[f.name]
        inner = (
            [a for a in get_args(tp) if a is not type(None)] if get_origin(tp) is types.UnionType else [tp]
        )
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            out += _fields(inner[0], f"{path}.")
        elif get_origin(tp) is list and dataclasses.is_dataclass(get_args(tp)[0]):
            out += _fields(get_args(tp)[0], f"{path}[0].")
        elif get_origin(tp) is tuple:
            out += [(f"{path}[{i}]", a) for i, a in enumerate(get_args(tp))]
        else:
            out.append((path, tp))
    return out


NUMERIC = [(path, *_numeric(tp)) for path, tp in _fields(Config) if _numeric(tp) is not None]


def test_the_walk_finds_the_numbers():
    paths = {path for path, *_ in NUMERIC}
    assert {"train.lr", "train.adam_betas[1]", "model.lora.rank", "eval.rewards[0].timeout_s"} <= paths
    assert len(NUMERIC) >= 40


@pytest.mark.parametrize("path, kind, bounds", NUMERIC, ids=[p for p, *_ in NUMERIC])
def test_every_number_declares_a_finite_range(path, kind, bounds):
    assert bounds is not None, (
        f"{path} ({kind.__name__}) declares no Range: add Annotated[{kind.__name__}, Range(...)]"
    )
    assert math.isfinite(bounds.lo) and math.isfinite(bounds.hi) and bounds.lo < bounds.hi


def _data(path: str, value: Any) -> dict[str, Any]:
    """``rewards[0].weight`` = 5 -> ``{"rewards": [{"weight": 5}]}`` (a tuple item: the whole tuple)."""
    *parents, last = path.split(".")
    if last.endswith("]"):  # train.adam_betas[1]: the tuple with that item changed
        name, index = last[:-1].split("[")
        default = list(getattr(TrainConfig(), name))
        default[int(index)] = value
        parents, last, value = [*parents], name, default
    node: Any = value
    for part in [*parents, last][::-1]:
        name, _, index = part.partition("[")
        node = {name: [node] if index else node}
    return node


def _outside(bounds: Range, kind: type) -> list[Any]:
    """Values just outside ``bounds``: the open ends themselves, else one step beyond."""
    step = 1 if kind is int else max(abs(bounds.hi), 1.0) * 1e-3
    low = bounds.lo if bounds.lo_open else bounds.lo - step
    high = bounds.hi if bounds.hi_open else bounds.hi + step
    return [low, high]


@pytest.mark.parametrize("path, kind, bounds", NUMERIC, ids=[p for p, *_ in NUMERIC])
def test_a_value_out_of_range_is_refused_with_the_range(path, kind, bounds):
    for value in _outside(bounds, kind):
        _, errors, _ = bind_config(_data(path, value), [])
        assert any(e.startswith(f"{path} must be {bounds.text()}, got ") for e in errors), (value, errors)
    inside = (
        bounds.hi if not bounds.hi_open else bounds.lo if not bounds.lo_open else (bounds.lo + bounds.hi) / 2
    )
    assert bind_config(_data(path, inside), [])[1] == [], (path, inside)


FLOATS = [p for p in NUMERIC if p[1] is float]
INTS = [p for p in NUMERIC if p[1] is int]


@pytest.mark.parametrize("path, kind, bounds", FLOATS, ids=[p for p, *_ in FLOATS])
def test_a_float_field_refuses_nan_inf_and_huge_integers(path, kind, bounds):
    for value in (math.nan, math.inf, -math.inf, 10**400, "1e999"):
        errors = bind_config(_data(path, value), [])[1]
        assert len(errors) == 1 and errors[0].startswith(f"{path} must be {bounds.text()}, got "), errors


@pytest.mark.parametrize("path, kind, bounds", INTS, ids=[p for p, *_ in INTS])
def test_an_int_field_takes_only_integral_values(path, kind, bounds):
    for value in (2.5, math.nan, True, "two"):
        errors = bind_config(_data(path, value), [])[1]
        assert errors and errors[0].startswith(f"{path}: expected an integer, got "), (value, errors)


def test_integral_floats_and_exponents_are_integers():
    config = read_config({}, ["sampling.num_steps=1e2", "train.iterations=3.0", "eval.seed=-1e3"])[0]
    assert (config.sampling.num_steps, config.train.iterations, config.eval.seed) == (100, 3, -1000)
    assert all(type(v) is int for v in (config.sampling.num_steps, config.train.iterations, config.eval.seed))


def test_a_config_built_in_code_gets_the_same_checks():
    problems = schema_problems(Config(train=TrainConfig(lr=5.0, iterations=0)))
    assert "train.lr must be in (0, 1] (e.g. 1e-4), got 5.0" in problems
    assert "train.iterations must be in [1, 1_000_000_000], got 0" in problems


def num_workers_of(images, prompts, metadata, workers: Annotated[int, Range(0, 8)] = 1, name: str = "x"):
    return [0.0] * len(prompts)


def test_a_plugins_params_are_checked_by_its_annotations():
    assert signature_problems(num_workers_of, {"workers": 3, "name": "y", "other": 1}, "p") == []
    assert signature_problems(num_workers_of, {"workers": 9}, "p") == ["p.workers must be in [0, 8], got 9"]
    assert signature_problems(num_workers_of, {"workers": "two", "name": False}, "p")[0] == (
        "p.workers: expected an integer, got 'two'"
    )


# ---- YAML ------------------------------------------------------------------------------------


def test_duplicate_keys_are_refused_with_their_line():
    with pytest.raises(YamlProblem, match=r"line 4: duplicate key 'lr' \(first at line 2\)"):
        load_yaml("train:\n  lr: 1\n  iterations: 3\n  lr: 2\n")
    with pytest.raises(YamlProblem, match=r"line 3: duplicate key 'train' \(first at line 1\)"):
        load_yaml("train: {}\nrun: {}\ntrain: {}\n")


def test_anchors_and_merge_keys_still_work():
    text = "base: &b {lr: 1, iterations: 2}\ntrain:\n  <<: *b\n  lr: 3\nrewards: [&r {name: ocr}, *r]\n"
    value, lines = load_yaml(text)
    assert value["train"] == {"lr": 3, "iterations": 2} and value["rewards"] == [{"name": "ocr"}] * 2
    assert lines["train.lr"] == 4 and lines["rewards[1]"] == 5


@pytest.mark.parametrize("fan", [9, 40])
def test_an_alias_bomb_is_refused_before_anything_expands(fan):
    anchors = "abcdefghij"
    text = f"a: &a [{', '.join(['x'] * fan)}]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * fan)}]\n" for a, b in zip(anchors, anchors[1:])
    )
    start = time.process_time()
    with pytest.raises(YamlProblem, match="expands to more than 100,000 values"):
        load_yaml(text)
    assert time.process_time() - start < 10  # 40^10 values if anything expanded them


def test_deep_nesting_is_refused():
    with pytest.raises(YamlProblem, match="nested more than 40 levels deep"):
        load_yaml("a: " + "[" * 100_000 + "]" * 100_000)
    nested = load_yaml("a: " + "[" * 30 + "]" * 30)[0]["a"]  # 31 levels with the mapping: fine
    for _ in range(29):
        nested = nested[0]
    assert nested == []


def test_problems_get_the_line_of_their_recipe_value(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "run:\n  name: a\ntrain:\n  lr: 5\n  iterations: 0\nrewards:\n  - name: ocr\n    weight: .nan\n"
    )
    with pytest.raises(ConfigError) as e:
        read_config(recipe, ["train.iterations=-1"])
    assert e.value.problems == [
        "line 4: train.lr must be in (0, 1] (e.g. 1e-4), got 5.0",
        "train.iterations must be in [1, 1_000_000_000], got -1",  # from the command line: no line
        "line 8: rewards[0].weight must be in [-1e6, 1e6] (e.g. 1.0), got nan",
    ]
    assert with_lines(["train.x: bad"], {"train": 3}) == ["line 3: train.x: bad"]
    assert with_lines(["train.x: bad"], {"train": 0}) == ["train.x: bad"]


@pytest.mark.parametrize("text", ["", "# comments\n# only\n", "\n\n", "~\n"])
def test_an_empty_recipe_is_refused(tmp_path, text):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match="the recipe is empty"):
        read_config(recipe, [])


@pytest.mark.parametrize(
    "override, message",
    [
        ("run.name=no", "run.name: expected a string, got False (YAML reads the unquoted word as a boolean"),
        ("run.name=off", "got False"),
        ("run.name=12", "run.name: expected a string, got 12 (YAML reads the unquoted word as a number"),
        ("run.name=null", "run.name: null is not allowed here"),
        ("model.family=~", "model.family: null is not allowed here"),
        ("run.output_dir=yes", "run.output_dir: expected a string, got True"),
    ],
)
def test_a_string_field_refuses_what_yaml_read_as_another_type(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_config({}, [override])


def test_quoted_yaml_words_stay_strings():
    config = read_config({}, ["run.name='no'", 'run.output_dir="1e3"', "model.path=1e3"])[0]
    assert (config.run.name, config.run.output_dir, config.model.path) == ("no", "1e3", "1e3")


# ---- bounded work on user-sized input -----------------------------------------------------------


def test_quoted_cuts_huge_values():
    assert len(quoted("x" * 10**6)) < 300 and "(+999,800 characters)" in quoted("x" * 10**6)
    assert quoted(10**5000) == "an integer of about 5,001 digits"
    nested: Any = "x"
    for _ in range(9):
        nested = [nested] * 9
    assert len(quoted(nested)) < 300
    assert quoted("ab") == "'ab'" and quoted(2.5) == "2.5"


def test_the_divisor_hint_is_bounded_and_right():
    for n in range(1, 300):
        for at_most in (1, 2, 7, n - 1, n, n + 5):
            expected = max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)
            assert largest_divisor(n, at_most) == expected, (n, at_most)
    start = time.process_time()
    assert largest_divisor(10**12, 10**12 - 1) == 5 * 10**11
    assert largest_divisor(999_999_999_989, 999_999_999_988) == 1  # a prime: the worst case
    assert time.process_time() - start < 20


def test_caption_wrapping_is_bounded_by_the_lines_not_the_text():
    font = caption_font(128)
    start = time.process_time()
    lines = wrap("x" * 900_000, font, 120)
    assert time.process_time() - start < 5  # minutes before: every cut copied the rest of the word
    assert len(lines) == 2 and lines[1].endswith("…") and lines[0] == "x" * len(lines[0])
    assert wrap("a cat on a mat", font, 120) == ["a cat on a mat"]
    assert wrap("a " * 500_000, font, 120)[-1].endswith("…")


OWN_CHECKS = {"remote"}
"""Built-in rewards whose numeric params are checked by the reward itself (``remote``: its
deadlines, see :mod:`diffrl.rewards.remote`), not yet declared as ranges."""


def test_every_numeric_param_of_a_builtin_reward_declares_a_range():
    missing = []
    for name in sorted(set(REWARDS.names()) - OWN_CHECKS):
        reward = REWARDS.resolve(name)
        fn = reward.__init__ if isinstance(reward, type) else reward
        for param, tp in typing.get_type_hints(fn, include_extras=True).items():
            if (kind := _numeric(tp)) is not None and kind[1] is None:
                missing.append(f"{name}.{param}")
    assert not missing, f"numeric reward params without a Range: {missing}"


def test_the_docs_list_every_range():
    page = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    missing = [p for p, kind, r in NUMERIC if f"| `{p}` | `{kind.__name__}` | {r.text()} |" not in page]
    assert not missing, f"docs/configuration.md (Ranges and input limits) lacks or misstates: {missing}"
