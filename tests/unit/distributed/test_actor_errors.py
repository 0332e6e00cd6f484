"""The actor side of a plugin's error under ``runner: ray`` (:mod:`diffrl.distributed.ray.actor_errors`),
without a cluster: an actor class's methods called in this process, and Ray's wrapping of what
they raise made by hand as Ray makes it. (tests/distributed/test_ray_plugin_errors.py runs two
cases through real actors.)"""

from __future__ import annotations

import sys

import pytest

from diffrl.core.errors import Abandoned, DiffrlError
from diffrl.core.registry import import_object
from diffrl.core.user_code import PluginError
from diffrl.distributed.ray.actor_errors import get, names_user_errors, user_error

ray = pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")

PLUGIN = """
import sys


def exits():
    sys.exit(0)


def interrupts():
    raise KeyboardInterrupt


def raises():
    raise ValueError("bad value")


def abandons():
    from diffrl.core.errors import Abandoned

    raise Abandoned
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``actorplug``'s functions, imported as the registry imports a plugin."""
    (tmp_path / "actorplug.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda name: import_object(f"actorplug:{name}")
    sys.modules.pop("actorplug", None)


def actor_class():
    @names_user_errors("in a test actor")
    class Actor:
        def __init__(self, call=None):
            if call is not None:
                call()

        def run(self, call):
            return call()

        def diffrl_bug(self):
            raise KeyError("diffrl's own")

        def user_error(self):
            raise DiffrlError("the user's input")

    return Actor


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "exits",
            "plugin 'actorplug:exits' called sys.exit(0) (at actorplug.py:6 in exits, in a test actor)",
        ),
        ("interrupts", "plugin 'actorplug:interrupts' raised KeyboardInterrupt (no Ctrl-C was pressed)"),
        ("raises", "plugin 'actorplug:raises' raised ValueError: bad value (at actorplug.py:14 in raises"),
    ],
)
def test_a_plugins_error_in_an_actor_method_or_init_is_named_there(plugin, name, message):
    actor = actor_class()()
    with pytest.raises(PluginError) as raised:
        actor.run(plugin(name))
    assert str(raised.value).startswith(message)
    # in __init__: kept (Ray would end the actor and keep only its text), raised by every call
    failed = actor_class()(plugin(name))
    for _ in range(2):
        with pytest.raises(PluginError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
            failed.diffrl_bug()


def test_what_is_not_a_plugins_passes_as_it_is(plugin):
    actor = actor_class()()
    with pytest.raises(Abandoned):  # a stop signal's: never a plugin's error
        actor.run(plugin("abandons"))
    with pytest.raises(KeyError, match="diffrl's own"):  # a bug in diffrl stays one
        actor.diffrl_bug()
    with pytest.raises(DiffrlError, match="the user's input"):
        actor.user_error()
    with pytest.raises(KeyError):  # __init__'s bug reaches Ray (the actor dies, as before)
        actor_class()(actor_class()().diffrl_bug)
    failed = actor_class()(actor_class()().user_error)  # __init__'s user error: kept, as a plugin's
    with pytest.raises(DiffrlError, match="the user's input"):
        failed.run(print)


def test_the_driver_raises_an_actors_user_error_as_itself():
    error = PluginError("plugin 'p:f' raised ValueError")
    wrapped = ray.exceptions.RayTaskError("Actor.run", "Traceback (most recent call last): ...", error)
    wrapped = wrapped.as_instanceof_cause()  # what ray.get raises
    assert user_error(wrapped) is error
    assert user_error(ray.exceptions.RayTaskError("f", "tb", KeyError("x")).as_instanceof_cause()) is None
    assert user_error(error) is None


def test_get_unwraps_a_user_error_from_a_real_ref(monkeypatch):
    error = PluginError("plugin 'p:f' called sys.exit(0)")

    def fake_get(refs, timeout=None):
        raise ray.exceptions.RayTaskError("Actor.run", "Traceback ...", error).as_instanceof_cause()

    monkeypatch.setattr(ray, "get", fake_get)
    with pytest.raises(PluginError) as raised:
        get("ref")
    assert raised.value is error and "Traceback" not in str(raised.value)
