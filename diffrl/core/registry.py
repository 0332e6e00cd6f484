"""Registries map short names to classes or functions and also accept a dotted path.

``"sft"`` resolves through the registry; ``"my_pkg.my_mod:MyThing"`` (or ``my_pkg.my_mod.MyThing``)
imports the user's own object. An unknown name is an error that lists the known ones.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
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
