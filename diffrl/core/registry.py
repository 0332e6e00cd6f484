"""Registries map short names to classes or functions and also accept a dotted path.

``"sft"`` resolves through the registry; ``"my_pkg.my_mod:MyThing"`` (or ``my_pkg.my_mod.MyThing``)
imports the user's own object. An unknown name is an error that lists the known ones.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from diffrl.core.errors import DiffrlError
from diffrl.core.interrupts import is_real_interrupt
from diffrl.core.user_code import describe, note_plugin


class RegistryError(DiffrlError, ValueError):
    """A name that is neither registered nor an importable dotted path."""


_REFUSED: dict[str, str] = {}
"""Dotted paths :func:`import_object` refuses while :func:`refusing` is active -> why."""


@contextlib.contextmanager
def refusing(paths: Mapping[str, str]) -> Iterator[None]:
    """While inside, :func:`import_object` refuses each path of ``paths`` with its message (the
    dotted paths a downloaded checkpoint's config names: importing one runs its code)."""
    saved = dict(_REFUSED)
    _REFUSED.update(paths)
    try:
        yield
    finally:
        _REFUSED.clear()
        _REFUSED.update(saved)


def import_object(path: str) -> Any:
    """Import ``pkg.mod:attr`` or ``pkg.mod.attr``; raise ``RegistryError`` naming what failed,
    whatever the module's import raised or did (``sys.exit()`` at its top, as a script's argparse
    does, included; a real Ctrl-C goes through). A module outside diffrl is recorded as a plugin
    (:mod:`diffrl.core.user_code`): its later errors are named by ``path``."""
    if path in _REFUSED:
        raise RegistryError(_REFUSED[path])
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise RegistryError(f"{path!r} is not a dotted path; write it as 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RegistryError(
            f"cannot import module {module_name!r} for {path!r}: {e}; install it or put its folder on PYTHONPATH"
        ) from e
    except BaseException as e:  # the user's module raised or exited while importing: say where
        if is_real_interrupt(e):
            raise
        raise RegistryError(
            f"importing module {module_name!r} for {path!r} {describe(e)}; fix that module (code "
            "that runs when it is imported, e.g. argparse, belongs under if __name__ == '__main__':)"
        ) from e
    note_plugin(module_name, path)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RegistryError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})")
        obj = getattr(obj, part)
    return obj


def did_you_mean(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


class Registry:
    """Short name -> "module:attr" string, imported lazily so optional parts stay optional.

    ``check``: what is wrong with a resolved object, as ``is not a Reward subclass ...`` (None:
    nothing), so that a dotted path naming the wrong kind of thing is refused where it is
    resolved (the config's checks), not found when it is first called."""

    def __init__(self, kind: str, entries: dict[str, str], check: Callable[[Any], str | None] | None = None):
        self.kind = kind
        self._entries = dict(entries)
        self.check = check

    def names(self) -> list[str]:
        return sorted(self._entries)

    def resolve(self, name: str) -> Any:
        if name in self._entries:
            return import_object(self._entries[name])
        if "." in name or ":" in name:
            obj = import_object(name)
            if self.check is not None and (problem := self.check(obj)):
                raise RegistryError(f"{name!r} {problem}")
            return obj
        raise RegistryError(
            f"unknown {self.kind} {name!r}.{did_you_mean(name, self.names())} "
            f"Known: {', '.join(self.names())}; or give a dotted path 'package.module:Name'."
        )


# ---- a plugin's call signatures, checked where it is resolved --------------------------------------


def _signature(obj: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read, nothing refused
        return None


def call_problem(
    fn: Callable[..., Any], call: str, args: tuple[str, ...], kwargs: tuple[str, ...] = ()
) -> str | None:
    """Why ``fn`` cannot be called as diffrl calls it, ``call`` (shown), with the positional
    arguments ``args`` and the keywords ``kwargs`` (names only); None when it can. A class: its
    constructor."""
    sig = _signature(fn)
    if sig is None:
        return None
    try:
        sig.bind(*args, **dict.fromkeys(kwargs))
    except TypeError as e:
        name = getattr(fn, "__qualname__", repr(fn))
        return f"cannot be called as diffrl calls it, {call}: its signature is {name}{sig} ({e})"
    return None


def override_problems(cls: type, base: type, names: tuple[str, ...] | None = None) -> list[str]:
    """The methods of ``base`` (``names``; None: every public method and ``__call__`` it defines; a
    constructor diffrl calls is checked by :func:`call_problem`) that ``cls`` defines anew with a signature diffrl's call cannot bind: diffrl calls
    each with at least the parameters ``base`` requires (its positional ones by position, its
    keyword-only ones by keyword), so an override must accept that call; the parameters ``base``
    gives defaults diffrl may leave out (an override need not take them)."""
    if names is None:
        names = tuple(
            n
            for n, v in vars(base).items()
            if callable(v) and (not n.startswith("_") or n == "__call__")
        )
    problems = []
    for name in names:
        mine, theirs = inspect.getattr_static(cls, name, None), inspect.getattr_static(base, name, None)
        if mine is None or theirs is None or mine is theirs:
            continue
        if isinstance(mine, staticmethod | classmethod) != isinstance(theirs, staticmethod | classmethod):
            continue  # a different kind of method: nothing to compare by parameters
        mine_fn, base_fn = getattr(mine, "__func__", mine), getattr(theirs, "__func__", theirs)
        if not (callable(mine_fn) and callable(base_fn)):
            continue
        base_sig, sig = _signature(base_fn), _signature(mine_fn)
        if base_sig is None or sig is None:
            continue
        args, kwargs = [], []
        for p in base_sig.parameters.values():  # the required ones: diffrl may leave out the others
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
                args.append(p.name)
            elif p.kind == p.KEYWORD_ONLY and p.default is p.empty:
                kwargs.append(p.name)
        try:
            sig.bind(*args, **dict.fromkeys(kwargs))
        except TypeError as e:
            shown = ", ".join([*args[1:], *(f"{k}=..." for k in kwargs)]) if args else ", ".join(kwargs)
            problems.append(
                f"its {name}{sig} cannot take diffrl's call {name}({shown}) ({e}); "
                f"give it {base.__name__}.{name}'s parameters {base_sig}"
            )
    return problems
