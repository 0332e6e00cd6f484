"""Whose error is it: diffrl's, or a plugin's (the user's code named by a dotted path)?

Plugins are the user's rewards, algorithms, model families, engines, trackers and kernels,
imported by :func:`diffrl.core.registry.import_object` (which records them here). Whatever a plugin
raises or does is the plugin's error, named by its dotted path: an ``Exception``, and also a
``sys.exit()`` (an argparse tool wrapped as a reward), a ``KeyboardInterrupt`` that no Ctrl-C
sent, a ``GeneratorExit`` or any other ``BaseException``. Where diffrl calls a plugin it can name
(a reward's calls, a module's import) it says so itself; anything else that reaches the command
line is judged by its traceback (:func:`plugin_origin`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

from diffrl.core.errors import DiffrlError


class PluginError(DiffrlError):
    """A plugin raised or did what a plugin must not (exit the process, close ``sys.stdout``)."""


class GlobalStateChanged(PluginError):
    """A plugin changed torch's process-wide settings (:mod:`diffrl.core.torch_state`): the run's
    numbers are no longer what its config says, so the run stops (a reward's, too)."""


def is_diffrl_module(module: str) -> bool:
    return module == "diffrl" or module.startswith("diffrl.")


def path_of(obj: object) -> str:
    """``pkg.mod:Name``: the dotted path of a class (of an instance's class) or a function."""
    target = obj if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(target).__name__)}"


def plugin_named(obj: object) -> str:
    """``plugin 'pkg.mod:Name'`` for a plugin (an instance, a class or a function), and ``diffrl's
    own 'diffrl.mod:Name' (a bug in diffrl)`` for one of diffrl's."""
    path = path_of(obj)
    if is_diffrl_module(path.partition(":")[0]):
        return f"diffrl's own {path!r} (a bug in diffrl)"
    return f"plugin {path!r}"


def returned_wrong(owner: object, call: str, got: str, want: str) -> Exception:
    """What to raise when ``owner`` (an algorithm, family or tracker instance or class)'s
    ``call`` returned ``got`` instead of ``want``: a :class:`PluginError` naming the plugin by its
    dotted path, or, for diffrl's own, a ``RuntimeError`` (a bug)."""
    path = path_of(owner)
    text = f"{call} returned {got}; it must return {want}"
    if is_diffrl_module(path.partition(":")[0]):
        return RuntimeError(f"{path}: {text}")
    return PluginError(f"plugin {path!r}: {text}; fix the plugin")


def checked_problems(owner: object, call: str, problems: object) -> list[str]:
    """What a plugin's check (an algorithm's ``validate()``, a family's ``validate_config()``, a
    reward's ``param_problems()``) returned: a list of messages, ``[]`` for none. A str (which
    would be listed character by character), None or anything else is refused naming ``owner``."""
    want = "a list of str, one message per problem ([] when there is none)"
    if not isinstance(problems, list | tuple):
        raise returned_wrong(owner, call, kind(problems), want)
    for p in problems:
        if not isinstance(p, str):
            raise returned_wrong(owner, call, f"a list holding {kind(p)}", want)
    return list(problems)


def kind(value: object) -> str:
    """A returned value in words, for an error message: ``a float32 tensor of shape (3,)``,
    ``None``, ``a str ('abc')``, ``a generator``; at most about a hundred characters of it."""
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"a {str(dtype).removeprefix('torch.')} tensor of shape {tuple(shape)}"
    name = type(value).__name__
    if isinstance(value, tuple | list) and 0 < len(value) <= 4 and any(hasattr(v, "shape") for v in value):
        return _cut(f"a {name} of {len(value)} ({'; '.join(kind(v) for v in value)})", 300)
    if name == "generator":
        return "a generator (is there a yield in it?)"
    article = "an" if name[:1].lower() in "aeiou" else "a"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a plugin's __repr__ may raise: the type says enough
        return f"{article} {name}"
    return f"{article} {name} ({_cut(text, 100)})"


_MODULES: dict[str, list[str]] = {}
"""A plugin's module -> the dotted paths imported from it."""


def note_plugin(module: str, path: str) -> None:
    """Record that ``path`` (``pkg.mod:Name``) was imported from the user's module ``module``."""
    if module == "diffrl" or module.startswith("diffrl."):
        return
    paths = _MODULES.setdefault(module, [])
    if path not in paths:
        paths.append(path)


def plugin_paths() -> list[str]:
    """Every dotted path imported as a plugin so far, in import order."""
    return [path for paths in _MODULES.values() for path in paths]


@dataclass(frozen=True)
class Origin:
    """Where an exception came from: the plugin (``path``, its dotted path) and the line."""

    path: str
    where: str
    """``file:line in function``: the plugin's innermost line in the traceback."""


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _owner(frame: FrameType) -> str:
    """``diffrl``, ``plugin`` or ``library`` (the standard library, torch, argparse, ... and a
    plugin's helper modules: their frames are passed over, down to the plugin's that called them)."""
    module = _module(frame)
    if module == "diffrl" or module.startswith("diffrl."):
        return "diffrl"
    if module in _MODULES:
        return "plugin"
    return "library"


def _frames(tb: TracebackType | None) -> list[tuple[FrameType, int]]:
    return list(traceback.walk_tb(tb))


def _dotted_path(frame: FrameType) -> str:
    """The recorded dotted path that ``frame`` runs (``pkg.mod:Reward`` for ``Reward.__call__``),
    else the first recorded one of its module."""
    module, qualname = _module(frame), frame.f_code.co_qualname
    for path in _MODULES.get(module, []):
        attr = path.partition(":")[2] if ":" in path else path.rpartition(".")[2]
        if qualname == attr or qualname.startswith(attr + "."):
            return path
    return _MODULES[module][0]


def _line(frame: FrameType, line: int) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{line} in {frame.f_code.co_qualname}"


def plugin_origin(error: BaseException) -> Origin | None:
    """The plugin ``error`` came from, or None when it is not a plugin's. It is a plugin's when
    the innermost frame of its traceback that is diffrl's or a plugin's is a plugin's (library
    frames, as argparse's ``exit``, are passed over: a plugin that called them did it)."""
    return _origin(_frames(error.__traceback__))


def calling_plugin() -> Origin | None:
    """The plugin whose code called this function's caller (through library code or not), or
    None when it is diffrl's code."""
    stack = list(traceback.walk_stack(sys._getframe(2)))  # innermost first
    return _origin(stack[::-1])


def _origin(frames: list[tuple[FrameType, int]]) -> Origin | None:
    """``frames``, outermost first: the plugin, named by the dotted path it was imported as,
    from its outermost frame in the run of plugin frames at the inner end (the function diffrl
    called), and its innermost line."""
    owned = [(f, n) for f, n in frames if _owner(f) != "library"]
    if not owned or _owner(owned[-1][0]) != "plugin":
        return None
    run = [owned[-1]]
    for item in reversed(owned[:-1]):  # the plugin frames since diffrl last called into the plugin
        if _owner(item[0]) != "plugin":
            break
        run.append(item)
    entry, _ = run[-1]
    inner, line = run[0]
    return Origin(_dotted_path(entry), _line(inner, line))


def raised_in_diffrl(error: BaseException) -> bool:
    """Whether ``error`` was raised by diffrl's own code (its innermost frame is diffrl's)."""
    frames = _frames(error.__traceback__)
    return bool(frames) and _owner(frames[-1][0]) == "diffrl"


def describe(error: BaseException) -> str:
    """What ``error`` is, in words: ``called sys.exit(3)``, ``raised KeyboardInterrupt (no Ctrl-C
    sent it)``, ``raised ValueError: bad``; at most a few hundred characters of its message."""
    if isinstance(error, SystemExit):
        code = error.code
        text = "" if code is None else repr(code) if isinstance(code, str) else str(code)
        return f"called sys.exit({_cut(text)})"
    if isinstance(error, KeyboardInterrupt):
        return "raised KeyboardInterrupt (no Ctrl-C was pressed)"
    message = str(error)
    return f"raised {type(error).__name__}" + (f": {_cut(message)}" if message else "")


def _cut(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def plugin_error(error: BaseException, origin: Origin, context: str | None = None) -> PluginError:
    """The :class:`PluginError` for ``error`` raised by the plugin at ``origin``; ``context``
    says where that code ran when it was not in this process (``in a Ray rollout engine``)."""
    fix = (
        "fix the plugin"
        if isinstance(error, Exception)
        else "a plugin must return or raise an Exception, never end the process: fix it"
    )
    where = f"{origin.where}, {context}" if context else origin.where
    return PluginError(
        f"plugin {origin.path!r} {describe(error)} (at {where}); {fix} (rerun with --debug for the traceback)"
    )


def as_plugin_error(error: BaseException, context: str | None = None) -> PluginError | None:
    """``error`` as the :class:`PluginError` that names its plugin (see :func:`plugin_error`), or
    None when it is not a plugin's."""
    origin = plugin_origin(error)
    return None if origin is None else plugin_error(error, origin, context)


_EXIT = os._exit
"""Python's ``os._exit``: :func:`guarding_os_exit` puts it back."""


def _exit_unless_a_plugin(status: int) -> None:
    """``os._exit`` while a diffrl command runs: a plugin's call is its error (a PluginError
    raised in its own call, which diffrl reports as that plugin's); anyone else's, a real exit.
    In a process forked from the command (multiprocessing's children end with ``os._exit``),
    always a real exit."""
    origin = calling_plugin() if os.getpid() == _GUARDED_PID[0] else None
    if origin is None:
        _EXIT(status)
    raise PluginError(
        f"plugin {origin.path!r} (at {origin.where}) called os._exit({status!r}), which ends the "
        "process at once, saving nothing; a plugin must return or raise"
    )


_GUARDED_PID = [0]
"""The process that installed the guard (0: none)."""


@contextmanager
def guarding_os_exit() -> Iterator[None]:
    """Inside the block, a plugin's ``os._exit()`` in this process raises :class:`PluginError`
    instead of ending it (code that took ``os._exit`` before the block, ``from os import
    _exit``, still ends it: nothing in Python can stop that). And what a plugin raises where
    Python cannot raise it (its ``__del__``, a weakref or ``atexit`` callback: Python prints
    "Exception ignored in" and a traceback) prints one warning line naming the plugin
    (:func:`_unraisable`)."""
    previous = os._exit, _GUARDED_PID[0], sys.unraisablehook
    os._exit, _GUARDED_PID[0] = _exit_unless_a_plugin, os.getpid()
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    try:
        yield
    finally:
        os._exit, _GUARDED_PID[0], sys.unraisablehook = previous


def _unraisable(python_hook):
    """``sys.unraisablehook`` for an exception nobody can catch: a plugin's is one ``warning:``
    line naming it and its line (a plugin's ``__del__`` calling ``sys.exit()``); anyone else's goes
    to ``python_hook``."""

    def hook(unraisable) -> None:
        error = unraisable.exc_value
        origin = plugin_origin(error) if error is not None else None
        if origin is None:
            python_hook(unraisable)
            return
        print(
            f"warning: plugin {origin.path!r} {describe(error)} (at {origin.where}) where Python "
            "cannot raise it (it was ignored); fix the plugin",
            file=sys.stderr,
        )

    return hook


LINGER_S = 5.0
"""How long a finished command waits for threads that would keep its process alive."""


def _thread_owner(thread: threading.Thread) -> str:
    """``thread 'name' (plugin 'pkg.mod:f' at file:line)``: a non-daemon thread still running,
    named by the plugin whose code it runs, where its stack or its target tells."""
    frame = sys._current_frames().get(thread.ident or -1)
    origin = _origin(list(traceback.walk_stack(frame))[::-1]) if frame is not None else None
    if origin is not None:
        return f"thread {thread.name!r} (plugin {origin.path!r}, at {origin.where})"
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None)
    if module in _MODULES:
        return f"thread {thread.name!r} (started by plugin {_MODULES[module][0]!r}: {path_of(target)})"
    return f"thread {thread.name!r}" + (f" (running {path_of(target)})" if target is not None else "")


def _keeping_alive() -> list[threading.Thread]:
    """The threads Python would wait for at exit (not daemon, not this one), less an executor's
    idle workers (Python tells those to end at exit)."""
    return [
        t
        for t in threading.enumerate()
        if t is not threading.current_thread()
        and not t.daemon
        and getattr(getattr(t, "_target", None), "__module__", None) != "concurrent.futures.thread"
    ]


def end_process(code: int) -> int:
    """What a command's process ends with, once the command returned ``code``: a thread a plugin
    started and left running (not a daemon) would keep the process alive after the command
    finished, for ever if it never ends. Such threads get :data:`LINGER_S` seconds to end; then a
    warning names them (and the plugin whose code they run) and the process ends here with
    ``code``, its output flushed (``os._exit``: Python would wait for them). Returns ``code`` when
    no thread lingers."""
    deadline = time.monotonic() + LINGER_S
    for thread in _keeping_alive():
        thread.join(max(0.0, deadline - time.monotonic()))
    lingering = [t for t in _keeping_alive() if t.is_alive()]
    if not lingering:
        return code
    names = "; ".join(_thread_owner(t) for t in lingering[:5])
    more = f" and {len(lingering) - 5} more" if len(lingering) > 5 else ""
    print(
        f"warning: {len(lingering)} thread(s) still running {LINGER_S:g} s after the command finished "
        f"would keep this process alive: {names}{more}. A plugin must end the threads it starts (in "
        "its close()) or make them daemon threads; the process ends now",
        file=sys.stderr,
    )
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or gone: nothing left to write
            pass
    _EXIT(code)
    return code  # not reached
