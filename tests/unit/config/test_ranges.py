"""Every number of the schema declares its range (:class:`~diffrl.config.schema.Range`), and the
binder refuses a value outside it, naming the field and the range. Walks the dataclasses (the
schema's, and the params of every built-in plugin of every registry), so a field added without a
range fails here. Also the bounds on what a user can make diffrl read: YAML
(duplicate keys, alias bombs, nesting), quoted values, the divisor hint and caption wrapping."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import re
import time
import types
import typing
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import pytest
import yaml

import diffrl.launch
from diffrl import cli
from diffrl.algorithms.registry import ALGORITHMS
from diffrl.config import Config, ConfigError, Range, TrainConfig, bind_config
from diffrl.config.binding import YamlProblem, load_yaml, signature_problems, with_lines
from diffrl.core.errors import EXIT_USER_ERROR, quoted
from diffrl.core.registry import Registry
from diffrl.evaluation.evaluate import caption_font, wrap
from diffrl.launch import RUNNERS
from diffrl.logging.trackers import PACKAGES, TRACKERS
from diffrl.models.registry import FAMILIES
from diffrl.preflight import load_config
from diffrl.preflight.schema import largest_divisor, read_config, schema_problems
from diffrl.rewards.registry import REWARDS
from diffrl.sampling.engine import ENGINES
from diffrl.sampling.kernels import KERNELS
from diffrl.sampling.step_strategies import STEP_STRATEGIES


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


# ---- the built-in plugins' params ----------------------------------------------------------------


def _dataclass_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _reward_hints(obj: Any) -> dict[str, Any]:
    """A reward's params: the annotated parameters of its ``__init__`` (a class) or after
    ``images, prompts, metadata`` (a function), as :func:`~diffrl.config.binding.signature_problems`
    checks them."""
    fn = obj.__init__ if isinstance(obj, type) else obj
    hints = typing.get_type_hints(fn, include_extras=True)
    return {n: hints[n] for n in inspect.signature(fn).parameters if n in hints}


@dataclasses.dataclass(frozen=True)
class Kind:
    """A plugin kind: its registry, where its built-ins declare their params, and how a config
    reaches them (the keys' prefix in a message, the recipe and the override that set one)."""

    registry: Registry
    hints: typing.Callable[[Any], dict[str, Any]] | None
    """A built-in -> its params' annotations; None: this kind takes no params."""
    prefix: str = ""
    """Of a param's key in a message; ``{name}``: the plugin's name."""
    sections: tuple[str, ...] = ()
    """The config sections whose checks bind the params (``load_config(sections=...)``)."""

    def recipe(self, name: str) -> dict[str, Any]:
        online = {"algorithm": {"name": "flow_grpo"}, "rewards": [{"name": "ocr"}]}
        return {
            "algorithm": {"algorithm": {"name": name}, "rewards": [{"name": "ocr"}]},
            "model family": {"model": {"family": name}},
            "rollout engine": {**online, "rollout": {"engine": name}},
            "step strategy": {
                **online,
                "algorithm": {"name": "flow_grpo", "params": {"step_strategy": {"name": name}}},
            },
        }.get(self.registry.kind, {})

    def override(self, name: str, param: str, value: Any) -> str:
        """``key=value`` setting ``param`` of plugin ``name`` to ``value``, as on the command line."""
        if self.registry.kind == "reward":  # a list item is set by giving the whole list
            return "rewards=" + _flow([{"name": name, "params": {param: value}}])
        return f"{self.prefix.format(name=name)}{param}={_flow(value)}"


KINDS = {
    "algorithm": Kind(ALGORITHMS, lambda c: _dataclass_hints(c.Params), "algorithm.params.", ("algorithm",)),
    "model family": Kind(
        FAMILIES, lambda c: _dataclass_hints(c.description.Options), "model.options.", ("model",)
    ),
    "rollout engine": Kind(
        ENGINES,
        lambda c: _dataclass_hints(c.Options) if hasattr(c, "Options") else {},
        "rollout.engine_options.",
        ("algorithm",),  # the algorithm's collection spec decides the engine's checks
    ),
    "step strategy": Kind(
        STEP_STRATEGIES, _dataclass_hints, "algorithm.params.step_strategy.", ("algorithm",)
    ),
    "reward": Kind(REWARDS, _reward_hints, "rewards[0] ({name}).params.", ("rewards",)),
    "sampler kernel": Kind(KERNELS, None),
    "logger": Kind(TRACKERS, None),
    "runner": Kind(RUNNERS, None),
}
"""Every registry of diffrl (checked against the source below)."""


def _flow(value: Any) -> str:
    """``value`` as YAML flow text (what an override's value is read as)."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1]


def _param_numbers(hints: dict[str, Any]) -> list[tuple[str, type, Range | None]]:
    """``(key, int or float, Range or None)`` of each numeric param, a list's items as ``key[0]``."""
    out = []
    for name, tp in hints.items():
        inner = (
            [a for a in get_args(tp) if a is not type(None)] if get_origin(tp) is types.UnionType else [tp]
        )
        if len(inner) == 1 and get_origin(inner[0]) is list:
            if (found := _numeric(get_args(inner[0])[0])) is not None:
                out.append((f"{name}[0]", *found))
        elif (found := _numeric(tp)) is not None:
            out.append((name, *found))
    return out


PLUGIN_NUMBERS = [
    (kind, name, *number)
    for kind, k in KINDS.items()
    if k.hints is not None
    for name in k.registry.names()
    for number in _param_numbers(k.hints(k.registry.resolve(name)))
]
"""``(kind, plugin, key, int or float, Range or None)`` of every numeric param of every built-in."""
PLUGIN_IDS = [f"{name}.{key}" for _, name, key, *_ in PLUGIN_NUMBERS]


def test_every_registry_is_walked():
    source = Path(__file__).resolve().parents[3] / "diffrl"
    found = {
        m.group(1)
        for f in source.rglob("*.py")
        for m in re.finditer(r'= Registry\(\s*"([^"]+)"', f.read_text(encoding="utf-8"))
    }
    assert found == set(KINDS), (
        f"a registry of diffrl is not in KINDS (add how its params bind): {found ^ set(KINDS)}"
    )
    assert all(KINDS[k].registry.kind == k for k in KINDS)


def test_the_plugin_walk_finds_the_numbers():
    ids = set(PLUGIN_IDS)
    assert {
        "flow_grpo.clip_range",
        "mix_grpo.shift_interval",
        "ltx2.stg_blocks[0]",
        "sglang.concurrency",
    } <= ids
    assert {"ocr.num_workers", "remote.retries", "judge.max_pixels", "dpo.beta", "wan.num_frames"} <= ids
    assert len(PLUGIN_NUMBERS) >= 85


@pytest.mark.parametrize("kind", [k for k in KINDS if KINDS[k].hints is None])
def test_kinds_without_params_have_no_params(kind):
    """A kernel, a logger or a runner is built without settings of its own (a runner reads the
    schema's ``parallel`` and ``ray`` sections): a built-in that grows ``Params`` / ``Options`` needs a binder."""
    for name in KINDS[kind].registry.names():
        if name in PACKAGES and importlib.util.find_spec(PACKAGES[name][0]) is None:
            continue  # an optional logger whose package is not installed here
        obj = KINDS[kind].registry.resolve(name)
        assert not hasattr(obj, "Params") and not hasattr(obj, "Options"), (kind, name)


@pytest.mark.parametrize("kind, name, key, number, bounds", PLUGIN_NUMBERS, ids=PLUGIN_IDS)
def test_every_plugin_param_declares_a_finite_range(kind, name, key, number, bounds):
    assert bounds is not None, (
        f"{kind} {name!r}: param {key} ({number.__name__}) declares no Range: add "
        f"Annotated[{number.__name__}, Range(...)]"
    )
    assert math.isfinite(bounds.lo) and math.isfinite(bounds.hi) and bounds.lo < bounds.hi


def _plugin_problems(kind: str, name: str, key: str, value: Any) -> list[str]:
    """The problems of a config setting ``key`` of plugin ``name`` to ``value`` by an override,
    from the checks the command line runs (schema and plugin stages, the kind's sections)."""
    k = KINDS[kind]
    param, _, item = key.partition("[")
    override = k.override(name, param, [value] if item else value)
    try:
        load_config(k.recipe(name), [override], check_files=False, sections=k.sections)
    except ConfigError as e:
        return e.problems
    return []


@pytest.mark.parametrize("kind, name, key, number, bounds", PLUGIN_NUMBERS, ids=PLUGIN_IDS)
def test_a_plugin_param_out_of_range_is_refused_with_its_key_and_range(kind, name, key, number, bounds):
    where = f"{KINDS[kind].prefix.format(name=name)}{key}"
    beyond = [math.nan, math.inf, -math.inf, 1e300] if number is float else [10**30, -(10**30)]
    for value in [*_outside(bounds, number), *beyond]:
        problems = _plugin_problems(kind, name, key, value)
        assert any(p.startswith(f"{where} must be {bounds.text()}, got ") for p in problems), (
            value,
            problems,
        )
    for inside in (bounds.lo if not bounds.lo_open else None, bounds.hi if not bounds.hi_open else None):
        if inside is not None:
            problems = _plugin_problems(kind, name, key, inside)
            assert not [p for p in problems if p.startswith(f"{where} must be")], (inside, problems)


CLI_ROWS = [
    ("algorithm", ["algorithm.params.clip_range=1e300"], "algorithm.params.clip_range must be in (0, 10]"),
    (
        "model family",
        ["model.family=sd3", "model.options={max_sequence_length: 1e9}"],
        "max_sequence_length must be in [1, 512]",
    ),
    (
        "rollout engine",
        ["rollout.engine=sglang", "rollout.engine_options={concurrency: 0}"],
        "rollout.engine_options.concurrency must be in [1, 4096]",
    ),
    (
        "step strategy",
        ["algorithm.params.step_strategy={name: mix_grpo, shift_interval: 1e30}"],
        "algorithm.params.step_strategy.shift_interval must be in [1, 1_000_000_000] (iterations, e.g. 25), got ",
    ),
    (
        "reward",
        ["rewards=[{name: ocr, params: {num_workers: -4}}]"],
        "rewards[0] (ocr).params.num_workers must be in [0, 256]",
    ),
]


@pytest.mark.parametrize("kind, overrides, message", CLI_ROWS, ids=[r[0] for r in CLI_ROWS])
def test_the_command_line_refuses_a_plugin_param_out_of_range(
    kind, overrides, message, tmp_path, monkeypatch, capsys
):
    def refuse(config):  # a row that got past validation must not start the recipe's training
        raise AssertionError(f"{overrides} reached training")

    monkeypatch.setattr(diffrl.launch, "train", refuse)
    recipe = Path(__file__).resolve().parents[3] / "recipes" / "tiny_grpo_ocr_small.yaml"
    code = cli.main(["train", str(recipe), f"run.output_dir={tmp_path / 'run'}", *overrides])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and err.startswith("error: ") and message in err, err
    assert "Traceback" not in err


def test_the_docs_list_every_range():
    page = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    missing = [p for p, kind, r in NUMERIC if f"| `{p}` | `{kind.__name__}` | {r.text()} |" not in page]
    for kind, name, key, number, bounds in PLUGIN_NUMBERS:
        prefix = "rewards[].params." if kind == "reward" else KINDS[kind].prefix
        row = f"| `{name}` | `{prefix}{key.replace('[0]', '[i]')}` | `{number.__name__}` | {bounds.text()} |"
        missing += [] if row in page else [f"{name}.{key}"]
    assert not missing, f"docs/configuration.md (Ranges and input limits) lacks or misstates: {missing}"
