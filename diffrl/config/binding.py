"""Binding plain data (YAML recipes, ``key=value`` overrides) to the schema's dataclasses,
collecting every error: unknown keys (with a "did you mean"), wrong types, numbers outside their
field's :class:`~diffrl.config.schema.Range`. What the values mean together is checked above, by
:mod:`diffrl.preflight`.

YAML is read by :func:`load_yaml`, which refuses what a plain ``yaml.safe_load`` accepts
silently or cannot bound: duplicate keys (the last would win), aliases that expand past
:data:`MAX_YAML_VALUES` values (an alias bomb), nesting deeper than :data:`MAX_YAML_DEPTH`, and
recipes over :data:`MAX_RECIPE_BYTES`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml

from diffrl.config.schema import MOVED, Config, FolderName, Range
from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.registry import did_you_mean
from diffrl.core.user_files import file_problem

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
    origin = get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    return str(tp).replace("typing.", "")


MAX_TEXT = 100_000
"""Characters of a string field at most (a path, a prompt, a name): a longer value is a mistake."""
YAML_WORDS = {"yes", "no", "on", "off", "true", "false", "y", "n", "null", "~"}


def _bind_value(tp: Any, value: Any, where: str, errors: list[str]) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Annotated:
        base, *extras = get_args(tp)
        before = len(errors)
        bound = _bind_value(base, value, where, errors)
        for extra in extras:
            if isinstance(extra, FolderName) and isinstance(bound, str) and len(errors) == before:
                if (problem := extra.problem(where, bound)) is not None:
                    errors.append(problem)
                continue
            if not isinstance(extra, Range) or bound is None:
                continue
            if (
                base is float
                and isinstance(bound, float)
                and not math.isfinite(bound)
                and len(errors) == before + 1
            ):
                shown = value if isinstance(value, int) else bound  # 10**400 by its digits; NaN, inf
                errors[-1] = f"{where} must be {extra.text()}, got {quoted(shown)}"
            elif len(errors) == before and bound not in extra:
                errors.append(f"{where} must be {extra.text()}, got {quoted(bound)}")
        return bound
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
        errors.append(f"{where}: {quoted(value)} is not a {_type_name(tp)}")
        return None
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, dict | list) or value not in allowed:
            errors.append(f"{where}: {quoted(value)} is not one of {list(allowed)}")
        return value
    if dataclasses.is_dataclass(tp):
        return bind_dataclass(tp, value, where, errors)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            errors.append(f"{where}: expected a list, got {quoted(value)}")
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
            errors.append(f"{where}: expected a mapping, got {quoted(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(f"{where}: expected true/false, got {quoted(value)}")
        return value
    if tp is int:
        return _bind_int(value, where, errors)
    if tp is float:
        return _bind_float(value, where, errors)
    if tp is str:
        return _bind_str(value, where, errors)
    return value


# YAML 1.1 reads 1e-4 and 1e3 (an exponent, no dot) as strings: they are numbers all the same
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _bind_int(value: Any, where: str, errors: list[str]) -> Any:
    """An integer: an int, or a float / exponent string with an integral value (``1e3``, ``2.0``);
    ``2.5``, ``nan`` and booleans are errors."""
    if isinstance(value, str) and len(value) < 400 and _EXPONENT.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(f"{where}: expected an integer, got {quoted(value)}")
    return value


def _bind_float(value: Any, where: str, errors: list[str]) -> Any:
    """A finite number (an int is taken as a float); NaN, inf and an int too large for a float are
    errors (a field's :class:`Range` says which values it takes)."""
    if isinstance(value, str):
        try:
            value = float(value) if len(value) < 400 else value
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors.append(f"{where}: expected a number, got {quoted(value)}")
        return value
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        errors.append(f"{where} must be a finite number, got {quoted(value)}")
    return number


def _bind_str(value: Any, where: str, errors: list[str]) -> Any:
    """A string; a value YAML read as something else (``no`` as false, ``1.5`` as a number) is an
    error that says to quote it; NUL bytes and strings over :data:`MAX_TEXT` are errors."""
    if value is None:
        errors.append(
            f"{where}: null is not allowed here; give a string (a literal 'null' needs quotes: {where}: 'null')"
        )
    elif isinstance(value, bool | int | float):
        word = "a boolean" if isinstance(value, bool) else "a number"
        errors.append(
            f"{where}: expected a string, got {quoted(value)} (YAML reads the unquoted word as {word}: "
            "yes/no/on/off/true/false and numbers need quotes to stay text); quote it: "
            f"{where}: '...' in a recipe, {where}=\"'...'\" on the command line"
        )
    elif not isinstance(value, str):
        errors.append(f"{where}: expected a string, got {quoted(value)}")
    elif "\x00" in value:
        errors.append(f"{where}: holds a NUL byte (character {value.index(chr(0))}): {quoted(value)}")
    elif len(value) > MAX_TEXT:
        errors.append(f"{where}: {len(value):,} characters; at most {MAX_TEXT:,}: {quoted(value)}")
    return value


def bind_dataclass(cls: type, data: Any, where: str, errors: list[str]) -> Any:
    """Build ``cls`` from a mapping; unknown keys and wrong types are appended to ``errors``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        names = [f.name for f in dataclasses.fields(cls)]
        hint = f"; e.g. {{name: {data}}}" if isinstance(data, str) and "name" in names else ""
        errors.append(f"{where or 'config'}: expected a mapping, got {quoted(data)}{hint}")
        return cls()
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names and path in MOVED:
            errors.append(
                f"unknown key {quoted(path)}: it moved to {MOVED[path]} (how many ranks and engines a run "
                "has is the parallel: section's, apart from ray:'s address and resources); write "
                f"{MOVED[path]} instead"
            )
            continue
        if key not in names:
            head, colon, _ = str(key).partition(":")
            hint = (  # YAML reads {rank:4} as the key "rank:4"; a mapping needs "key: value"
                f" YAML needs a space after the colon: write {{{head}: ...}}."
                if colon and head in names
                else did_you_mean(str(key), names)
            )
            errors.append(f"unknown key {quoted(path)}.{hint} Valid keys here: {', '.join(names)}")
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


MAX_OVERRIDE_CHARS = 100_000
"""Characters of one ``key=value`` override at most."""


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["train.lr=1e-4", "model.lora=null"]`` -> nested dict. Values are parsed as YAML (by
    :func:`load_yaml`: no duplicate keys, no alias bombs)."""
    tree: dict[str, Any] = {}
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            problems.append(f"override {quoted(item)} is not of the form key=value (e.g. train.lr=1e-4)")
            continue
        if len(item) > MAX_OVERRIDE_CHARS:
            problems.append(
                f"override {quoted(item)} is {len(item):,} characters long; an override is at most "
                f"{MAX_OVERRIDE_CHARS:,} (put long values in a recipe file)"
            )
            continue
        if "\x00" in item:
            problems.append(f"override {quoted(item)} holds a NUL byte; remove it")
            continue
        if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key.strip()):
            problems.append(
                f"override {quoted(item)}: {quoted(key)} is not a dotted key (e.g. train.lr, "
                "model.lora.rank); a list item is set by giving the whole list (rewards=[...])"
            )
            continue
        try:  # blank stays text: YAML reads "run.name= " as null, which no one means
            value = load_yaml(raw)[0] if raw.strip() else raw
        except YamlProblem as e:
            problems.append(f"override {quoted(item)}: {e}")
            continue
        except (yaml.YAMLError, ValueError):
            value = raw  # not YAML (e.g. an unbalanced bracket): the text as it is
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                problems.append(f"override {quoted(item)} conflicts with another override of {part!r}")
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


MAX_RECIPE_BYTES = 1_048_576
"""A recipe file's size at most (the shipped ones are a few KB)."""
MAX_YAML_DEPTH = 40
"""Nesting of mappings and lists at most (a recipe nests four or five deep)."""
MAX_YAML_VALUES = 100_000
"""Values (scalars, lists, mappings) a YAML document holds once its aliases (``*name``) are
expanded, at most: a 400-byte document of nested aliases can stand for billions."""


class YamlProblem(ValueError):
    """YAML that parses but that diffrl refuses: a duplicate key, too deep, too many values."""


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and bounds nesting (see :func:`load_yaml`)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 - PyYAML's signature
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise YamlProblem(f"line {line}: nested more than {MAX_YAML_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN201 - PyYAML's signature
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:  # the mapping's own keys (a merge ``<<`` may be overridden)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise YamlProblem(
                    f"line {line}: duplicate key {quoted(key)} (first at line {seen[key]}); YAML would "
                    "keep only the last one: keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):  # noqa: ANN001, ANN201 - PyYAML's signature
        """YAML 1.1's integers, but those that read as another number than they look: ``010``
        (octal, 8) and ``1:30`` (base 60, 90), refused with their line."""
        _refuse_surprising_number(node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):  # noqa: ANN001, ANN201 - PyYAML's signature
        _refuse_surprising_number(node)
        return super().construct_yaml_float(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)


def _refuse_surprising_number(node: yaml.ScalarNode) -> None:
    """A plain scalar YAML 1.1 reads as a number other than the digits say: a leading 0 (octal)
    or a colon (base 60, ``1:30`` is 90). Other YAML readers (1.2) read them otherwise."""
    text = str(node.value).replace("_", "").lstrip("+-")
    line = node.start_mark.line + 1
    if ":" in text:
        raise YamlProblem(
            f"line {line}: {quoted(node.value)} is a base-60 number to YAML 1.1 (1:30 is 90); write the "
            "number itself, or quote it for text"
        )
    if len(text) > 1 and text[0] == "0" and text[1].isdigit() and "." not in text and "e" not in text.lower():
        raise YamlProblem(
            f"line {line}: {quoted(node.value)} is an octal number to YAML 1.1 ({node.value} reads as "
            f"{int(text, 8)}); write it without the leading 0, "
            "or quote it for text"
        )


def load_yaml(text: str) -> tuple[Any, dict[str, int]]:
    """``text`` -> (its value, the line of each config path in it: ``{"train.lr": 3,
    "rewards[0]": 7}``). Raises :class:`YamlProblem` for a duplicate key (with its line), nesting
    past :data:`MAX_YAML_DEPTH` or aliases expanding past :data:`MAX_YAML_VALUES` values, and
    ``yaml.YAMLError`` for text that is not YAML. Bounded: nothing is expanded before it is
    counted."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _count_values(node)
        try:
            value = loader.construct_document(node)
        except ValueError as e:  # Python refuses int("9" * 5000): no setting takes such a number
            if isinstance(e, YamlProblem):
                raise
            what = "a number of more than 4,300 digits" if "digits" in str(e) else quoted(str(e))
            raise YamlProblem(f"a value YAML cannot read: {what}") from e
        return value, _lines(node)
    except RecursionError as e:  # a guard: the depth bound stops nesting well before Python's limit
        raise YamlProblem(f"nested more than {MAX_YAML_DEPTH} levels deep") from e
    finally:
        loader.dispose()


def _count_values(node: yaml.Node) -> None:
    """Refuse a document whose aliases expand past :data:`MAX_YAML_VALUES` values (each node's
    expanded size counted once: linear in the document, not in its expansion)."""
    sizes: dict[int, int] = {}

    def size(n: yaml.Node) -> int:
        if id(n) not in sizes:
            if isinstance(n, yaml.SequenceNode):
                total = 1 + sum(size(item) for item in n.value)
            elif isinstance(n, yaml.MappingNode):
                total = 1 + sum(size(k) + size(v) for k, v in n.value)
            else:
                total = 1
            sizes[id(n)] = total
            if total > MAX_YAML_VALUES:
                raise YamlProblem(
                    f"line {n.start_mark.line + 1}: this value expands to more than {MAX_YAML_VALUES:,} "
                    "values (aliases *name repeat their anchor's value, aliases of aliases multiply); "
                    "a recipe holds a few hundred: write the values out"
                )
        return sizes[id(n)]

    size(node)


def _lines(node: yaml.Node, prefix: str = "", out: dict[str, int] | None = None) -> dict[str, int]:
    """The line of each path (mapping keys ``a.b``, list items ``a[0]``) in a document already
    bounded by :func:`_count_values`."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                continue
            if k.tag == "tag:yaml.org,2002:merge":
                _lines(v, prefix, out)  # merged keys: the anchor's lines (the node's own keys win)
                continue
            path = f"{prefix}.{k.value}" if prefix else k.value
            out[path] = k.start_mark.line + 1
            _lines(v, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = f"{prefix}[{i}]"
            out[path] = item.start_mark.line + 1
            _lines(item, path, out)
    return out


def read_recipe(path: str | Path) -> dict[str, Any]:
    return _read_recipe(path)[0]


def _read_recipe(path: str | Path) -> tuple[dict[str, Any], dict[str, int]]:
    """A recipe file -> (its sections, the line of each config path in it)."""
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
    if path.exists() and (problem := file_problem(path)) is not None:  # a FIFO (reading it waits), a device
        raise ConfigError([f"recipe file {str(path)!r} {problem}; give a recipe .yaml file"], str(path))
    if not path.is_file():
        hint = ""
        shipped = recipes_dir() / path.name
        if shipped.is_file() and shipped != path:
            hint = f" A shipped recipe of that name is at {shipped}."
        raise ConfigError(
            [f"recipe file {str(path)!r} does not exist.{hint} List them with 'diffrl recipes'."], str(path)
        )
    try:
        size = path.stat().st_size
        if size > MAX_RECIPE_BYTES:
            raise ConfigError(
                [
                    f"the recipe is {size:,} bytes; a recipe is at most {MAX_RECIPE_BYTES:,} (is it the right file?)"
                ],
                str(path),
            )
        data, lines = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(
            [f"not a text file (byte {e.start} is not UTF-8); a recipe is a YAML file of sections"], str(path)
        ) from e
    except OSError as e:
        raise ConfigError([f"cannot read the recipe: {e.strerror}"], str(path)) from e
    except YamlProblem as e:
        raise ConfigError([str(e)], str(path)) from e
    except yaml.YAMLError as e:
        raise ConfigError([f"not valid YAML: {_cut(str(e))}"], str(path)) from e
    if data is None:
        raise ConfigError(
            [
                "the recipe is empty (no sections; comments only, or nothing): it would train every "
                "default. Start from a shipped recipe ('diffrl recipes' lists them)"
            ],
            str(path),
        )
    if not isinstance(data, dict):
        raise ConfigError(
            [f"the top level must be a mapping of sections, got {type(data).__name__}"], str(path)
        )
    return data, lines


def _cut(text: str, limit: int = 600) -> str:
    """A message (PyYAML's quotes the offending line) cut to ``limit`` characters."""
    return text if len(text) <= limit else f"{text[:limit]}... (+{len(text) - limit:,} characters)"


def recipe_lines(recipe: str | Path | dict[str, Any] | None, overrides: list[str] | None) -> dict[str, int]:
    """The line in the recipe file of each config path whose value comes from the file (a path
    the ``overrides`` set maps to 0); ``{}`` for a dict recipe or an unreadable file."""
    if not isinstance(recipe, str | Path):
        return {}
    try:
        lines = _read_recipe(recipe)[1]
        tree = parse_overrides(overrides or [])
    except ConfigError:
        return {}
    for key in _paths(tree):  # 0: the value comes from the command line (no line to point at)
        lines = {p: n for p, n in lines.items() if not (p == key or p.startswith((f"{key}.", f"{key}[")))}
        lines[key] = 0
    return lines


def _paths(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else k
        out += _paths(v, path) if isinstance(v, dict) and not isinstance(v, _Replace) else [path]
    return out


_PATH = re.compile(r"(?:unknown key ')?([A-Za-z_][\w-]*(?:\.[\w-]+|\[\d+\])*)")


def with_lines(problems: list[str], lines: Mapping[str, int]) -> list[str]:
    """``problems`` (each naming its config path first, ``train.lr must be ...``), each led by
    ``line N:`` where ``lines`` (:func:`recipe_lines`) knows the path or a section above it."""
    if not lines:
        return problems
    out = []
    for problem in problems:
        match = _PATH.match(problem)
        path = match.group(1) if match else ""
        while path and path not in lines:
            path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(r"[.\[]", path) else ""
        out.append(f"line {lines[path]}: {problem}" if path and lines[path] else problem)
    return out


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


def value_problems(obj: Any, where: str) -> list[str]:
    """The type and range problems of a dataclass instance's values (every nested one too), as
    the binder finds them in data: for a config built in code rather than bound. A list is
    checked item by item."""
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in value_problems(v, f"{where}[{i}]")]
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        return []
    hints = typing.get_type_hints(type(obj), include_extras=True)
    errors: list[str] = []
    for f in dataclasses.fields(obj):
        value, path = getattr(obj, f.name), f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(value) or (
            isinstance(value, list) and value and dataclasses.is_dataclass(value[0])
        ):
            errors += value_problems(value, path)
        else:
            _bind_value(hints[f.name], value, path, errors)
    return errors


def signature_problems(fn: Callable[..., Any], params: Mapping[str, Any], where: str) -> list[str]:
    """The type and range problems of ``params`` for ``fn``'s parameters of the same names, by
    their annotations (``num_workers: Annotated[int, Range(0, 256)] | None``), as the binder
    checks a config's fields; parameters without an annotation it can read are left alone."""
    return bind_signature(fn, params, where)[1]


def bind_signature(
    fn: Callable[..., Any], params: Mapping[str, Any], where: str
) -> tuple[dict[str, Any], list[str]]:
    """``params`` bound to ``fn``'s annotations as the binder binds a config's fields (``2.0``
    for an int parameter is 2), and the problems (:func:`signature_problems`)."""
    bound, errors = dict(params), []
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
        names = inspect.signature(fn).parameters
    except Exception:  # noqa: BLE001 - a plugin's annotations may not resolve here: nothing to check
        return bound, []
    for name, value in params.items():
        if name in names and name in hints:
            bound[name] = _bind_value(hints[name], value, f"{where}.{name}", errors)
    return bound, errors


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
