"""Binding plain data (YAML recipes, ``key=value`` overrides) to the schema's dataclasses,
collecting every error: unknown keys (with a "did you mean"), wrong types. What the values mean
together is checked above, by :mod:`diffrl.preflight`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from diffrl.config.schema import Config
from diffrl.errors import DiffrlError
from diffrl.registry import did_you_mean

PACKAGE_DIR = Path(__file__).resolve().parent.parent
"""The ``diffrl`` package folder (its ``data/`` holds the ``builtin:`` files)."""


class ConfigError(DiffrlError, ValueError):
    """All problems found in a config, one per line."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source} is not well-formed, found the following errors:\n{lines}")


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _bind_value(tp: Any, value: Any, where: str, errors: list[str]) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            errors.append(f"{where}: null is not allowed (expected {_type_name(tp)})")
            return None
        non_null = [o for o in options if o is not type(None)]
        if len(non_null) == 1:
            return _bind_value(non_null[0], value, where, errors)
        for option in non_null:
            trial: list[str] = []
            bound = _bind_value(option, value, where, trial)
            if not trial:
                return bound
        errors.append(f"{where}: {value!r} is not a {_type_name(tp)}")
        return None
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            errors.append(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if dataclasses.is_dataclass(tp):
        return bind_dataclass(tp, value, where, errors)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            errors.append(f"{where}: expected a list, got {value!r}")
            return value
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                errors.append(f"{where}: expected {len(args)} values, got {len(value)}")
                return tuple(value)
            return tuple(
                _bind_value(a, v, f"{where}[{i}]", errors) for i, (a, v) in enumerate(zip(args, value))
            )
        item = args[0] if args else Any
        out = [_bind_value(item, v, f"{where}[{i}]", errors) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a mapping, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(f"{where}: expected a number, got {value!r}")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            errors.append(f"{where}: expected a string, got {value!r}")
        return value
    return value


def bind_dataclass(cls: type, data: Any, where: str, errors: list[str]) -> Any:
    """Build ``cls`` from a mapping; unknown keys and wrong types are appended to ``errors``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        names = [f.name for f in dataclasses.fields(cls)]
        hint = f"; e.g. {{name: {data}}}" if isinstance(data, str) and "name" in names else ""
        errors.append(f"{where or 'config'}: expected a mapping, got {data!r}{hint}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            head, colon, _ = str(key).partition(":")
            hint = (  # YAML reads {rank:4} as the key "rank:4"; a mapping needs "key: value"
                f" YAML needs a space after the colon: write {{{head}: ...}}."
                if colon and head in names
                else did_you_mean(str(key), names)
            )
            errors.append(f"unknown key {path!r}.{hint} Valid keys here: {', '.join(names)}")
            continue
        before = len(errors)
        bound = _bind_value(hints[key], value, path, errors)
        # a bad value keeps the default so later checks still run; a section keeps its good keys
        if len(errors) == before or dataclasses.is_dataclass(bound):
            kwargs[key] = bound
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:  # a dataclass's own __post_init__ check
        errors.append(f"{where or 'config'}: {e}")
        return cls()


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["train.lr=1e-4", "model.lora=null"]`` -> nested dict. Values are parsed as YAML."""
    tree: dict[str, Any] = {}
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            problems.append(f"override {item!r} is not of the form key=value (e.g. train.lr=1e-4)")
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                problems.append(f"override {item!r} conflicts with another override of {part!r}")
                break
        else:
            node[parts[-1]] = _Replace(value) if isinstance(value, dict) else value
    if problems:
        raise ConfigError(problems, "command line")
    return tree


class _Replace(dict):
    """A mapping given whole on the command line: it replaces the recipe's, it is not merged."""


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, _Replace):
            out[k] = dict(v)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def read_recipe(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists() and (shipped := shipped_recipe(path)) is not None:
        path = shipped
    if path.is_dir():
        raise ConfigError(
            [
                f"{str(path)!r} is a folder; give a recipe .yaml file (list the shipped ones with 'diffrl recipes')"
            ],
            str(path),
        )
    if not path.is_file():
        hint = ""
        shipped = recipes_dir() / path.name
        if shipped.is_file() and shipped != path:
            hint = f" A shipped recipe of that name is at {shipped}."
        raise ConfigError(
            [f"recipe file {str(path)!r} does not exist.{hint} List them with 'diffrl recipes'."], str(path)
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(
            [f"not a text file (byte {e.start} is not UTF-8); a recipe is a YAML file of sections"], str(path)
        ) from e
    except OSError as e:
        raise ConfigError([f"cannot read the recipe: {e.strerror}"], str(path)) from e
    except yaml.YAMLError as e:
        raise ConfigError([f"not valid YAML: {e}"], str(path)) from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"the top level must be a mapping of sections, got {type(data).__name__}"], str(path)
        )
    return data


def recipes_dir() -> Path:
    """The shipped recipes (inside the package, so an installed wheel has them; the source tree's
    ``recipes/`` is a link to this folder)."""
    return PACKAGE_DIR / "recipes"


def shipped_recipe(path: Path) -> Path | None:
    """The recipe a missing ``path`` names, if any: a bare name (``tiny_demo`` or
    ``tiny_demo.yaml``) or ``recipes/NAME.yaml`` given outside the source tree names the shipped
    one, unless the folder holds ``NAME.yaml`` (then that file); None otherwise (a path into another
    folder names that file, never a shipped one)."""
    if path.is_absolute() or path.parent not in (Path("."), Path("recipes")):
        return None
    name = path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml"
    if (path.parent / name).is_file():  # ``tiny_demo`` with a tiny_demo.yaml here: that file
        return path.parent / name
    shipped = recipes_dir() / name
    return shipped if shipped.is_file() else None


SECTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config))
"""The top-level sections of :class:`Config`; ``load_config(sections=...)`` checks those given."""


def bind_config(
    recipe: str | Path | dict[str, Any] | None, overrides: list[str] | None
) -> tuple[Config, list[str], str]:
    """Recipe (path or dict) + ``key=value`` overrides -> (bound :class:`Config`, type errors, the
    source's name for messages). Unknown keys and wrong types anywhere are errors; a bad value
    keeps its default so the semantic checks can still run."""
    source = str(recipe) if isinstance(recipe, str | Path) else "config"
    data = read_recipe(recipe) if isinstance(recipe, str | Path) else dict(recipe or {})
    data = deep_merge(data, parse_overrides(overrides or []))
    errors: list[str] = []
    config = bind_dataclass(Config, data, "", errors)
    return config, errors, source


def resolve_data_path(path: str) -> Path:
    """``builtin:tiny_text/test.txt`` -> the file shipped in diffrl; anything else as given."""
    if path.startswith("builtin:"):
        return PACKAGE_DIR / "data" / path.removeprefix("builtin:")
    return Path(path).expanduser()


def number_problem(where: str, value: float | None, ok: bool, expected: str) -> list[str]:
    """``[f"{where} must be {expected}, got {value}"]`` unless ``value`` is finite and ``ok``
    (``None`` is left to the caller: pass ``ok=True`` for a field where null is allowed)."""
    if value is None:
        return []
    if not math.isfinite(value) or not ok:
        return [f"{where} must be {expected}, got {value}"]
    return []


def dump_config(config: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
