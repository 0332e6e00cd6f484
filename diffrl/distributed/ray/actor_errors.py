"""A user's error raised inside a Ray actor, raised in the driver as itself.

A plugin (a user's model family, algorithm, engine, reward, ... named by dotted path) runs inside
the engines, trainer ranks and reward workers. Whatever it raises or does there, ``sys.exit()``
and ``KeyboardInterrupt`` included, is named in the actor, where its traceback is (the driver only
gets Ray's copy of it): :func:`names_user_errors` turns it into a :class:`~diffrl.core.user_code.PluginError`
before Ray sees it (a ``SystemExit`` that reached Ray would end the actor, and the driver would
replace the engine again and again). The driver's :func:`get` raises a
:class:`~diffrl.core.errors.DiffrlError` made in an actor as itself, not wrapped in Ray's
``RayTaskError`` (whose text is the actor's traceback): the command line prints its one line and
exits 2. (A Ctrl-C never raises ``KeyboardInterrupt`` in an actor: Ray's processes block SIGINT,
and diffrl cancels no Ray task; so there one is always raised by code.)

An error that is neither diffrl's user error nor a plugin's reaches Ray as it is: a bug in diffrl,
or an actor that died (replaced, or a dead trainer rank: :mod:`.dispatch`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from diffrl.core.errors import Abandoned, DiffrlError
from diffrl.core.user_code import as_plugin_error
from diffrl.distributed.ray.cluster import import_ray

T = TypeVar("T", bound=type)

_FAILED = "_diffrl_failed_at_start"
"""The attribute holding the user error an actor's ``__init__`` raised (see :func:`names_user_errors`)."""


def names_user_errors(context: str) -> Callable[[T], T]:
    """Class decorator for an actor class: in ``__init__`` and every public method, a plugin's
    error (``BaseException`` included; :class:`~diffrl.core.errors.Abandoned` excepted) is raised as the
    :class:`~diffrl.core.user_code.PluginError` naming it, with ``context`` (``in a Ray rollout engine``)
    saying where it ran. A user error in ``__init__`` (a plugin's, or a
    :class:`~diffrl.core.errors.DiffrlError`) is kept and raised by each method call instead: Ray would
    end the actor and report only its text, so the driver could not tell a user's error from an
    actor that died."""

    def decorate(cls: T) -> T:
        for name, method in list(vars(cls).items()):
            if inspect.isfunction(method) and (name == "__init__" or not name.startswith("_")):
                setattr(cls, name, _guarded(method, context, at_start=name == "__init__"))
        return cls

    return decorate


def _guarded(method: Callable, context: str, at_start: bool) -> Callable:
    @functools.wraps(method)
    def call(self, *args: Any, **kwargs: Any) -> Any:
        failed = self.__dict__.get(_FAILED)
        if failed is not None:
            raise failed.with_traceback(None)
        try:
            return method(self, *args, **kwargs)
        except (Abandoned, DiffrlError) as e:
            if at_start and isinstance(e, DiffrlError):
                self.__dict__[_FAILED] = e
                return None
            raise
        except BaseException as e:  # noqa: BLE001 - a plugin's exit too; anything else is re-raised
            error = as_plugin_error(e, context)
            if error is None:
                raise
            if at_start:
                self.__dict__[_FAILED] = error
                return None
            raise error from e  # (Ray keeps the chained traceback's text for --debug)

    return call


def user_error(error: BaseException) -> DiffrlError | None:
    """The :class:`~diffrl.core.errors.DiffrlError` an actor raised, when ``error`` is Ray's
    ``RayTaskError`` wrapping one; else None."""
    cause = getattr(error, "cause", None)
    if isinstance(error, import_ray().exceptions.RayTaskError) and isinstance(cause, DiffrlError):
        return cause
    return None


def get(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get(refs, timeout=timeout)``; a user's error raised in the actor (see
    :func:`names_user_errors`) is raised here as itself."""
    ray = import_ray()
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.RayTaskError as e:
        error = user_error(e)
        if error is None:
            raise
        raise error from e
