"""A reward server on a Ray cluster: the same app as ``diffrl serve-reward``
(:class:`~diffrl.serving.server.RewardServer`), run in-process by an actor that holds its own CPUs
and GPUs, so a reward model can live on GPUs of its own, anywhere on the cluster; trainers score
through the ``remote`` reward at the URL it reports.

Ray Serve would need the ``ray[serve]`` extra; one actor running uvicorn needs nothing beyond
``ray``, and speaks exactly the wire format of :mod:`diffrl.serving.server`.

From the command line (prints the URL, serves until Ctrl-C, then ends the actor)::

    REWARD_TOKEN=... diffrl serve-reward --reward my_pkg.rewards:Aesthetic --ray --ray-address auto \\
        --num-gpus 1 --token-env REWARD_TOKEN

From Python::

    server = start_reward_server("my_pkg.rewards:Aesthetic", {"device": "cuda"}, token=..., num_gpus=1)
    server.url   # http://<node ip>:<port>; trainers: {name: remote, params: {url: ..., token_env: ...}}
    server.stop()

The server binds the actor's node address (``host=None``), which is not loopback, so it needs a
token; ``host="127.0.0.1"`` serves only processes on that node (a single-machine cluster, tests).
The token reaches the actor as a constructor argument (through Ray's object store, readable by
whoever can run code on the cluster).
"""

from __future__ import annotations

import time
from typing import Any

from diffrl.core.errors import DiffrlError
from diffrl.distributed.ray.actor_errors import names_user_errors
from diffrl.distributed.ray.cluster import import_ray
from diffrl.serving.limits import ServerLimits
from diffrl.serving.server import RewardServer, bind_problem, build_served_reward

POLL_S = 10.0
"""How often :meth:`RayRewardServer.wait` checks that the actor lives."""
START_TIMEOUT_S = 600.0
"""How long :func:`start_reward_server` waits for the actor to be placed and its reward to load."""


@names_user_errors("in a Ray reward server")
class RewardServerActor:
    """Builds the reward and serves it on a thread of this actor's process (so the actor's own
    thread stays free for :meth:`url` and :meth:`stop`). The work is in :meth:`start`, not in
    ``__init__``: an error raised by a method reaches the caller as itself (``.cause``), one raised
    in ``__init__`` only as the text of a traceback."""

    def __init__(self) -> None:
        self.server: RewardServer | None = None

    def start(
        self,
        name: str,
        params: dict[str, Any],
        host: str | None,
        port: int,
        token: str | None,
        limits: ServerLimits,
    ) -> str:
        if host is None:
            host = import_ray().util.get_node_ip_address()
        reward = build_served_reward(name, params)
        self.server = RewardServer(reward, name, host, port, token, limits=limits).start()
        return self.server.url

    def url(self) -> str | None:
        return None if self.server is None else self.server.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class RayRewardServer:
    """A started :class:`RewardServerActor`: its ``url``; :meth:`stop` ends it."""

    def __init__(self, actor: Any, url: str):
        self.actor, self.url = actor, url

    def wait(self, poll_s: float = POLL_S) -> None:
        """Block while the actor lives; :class:`DiffrlError` once it has died (its node lost,
        out of memory): a URL that no longer answers must not look served."""
        ray = import_ray()
        while True:
            try:
                ray.get(self.actor.url.remote(), timeout=max(60.0, poll_s))
            except ray.exceptions.RayActorError as e:
                raise DiffrlError(f"the reward server actor at {self.url} died: {e}") from e
            except ray.exceptions.GetTimeoutError:
                pass  # busy or a slow node: not dead
            time.sleep(poll_s)

    def stop(self) -> None:
        ray = import_ray()
        try:
            ray.get(self.actor.stop.remote(), timeout=30)
        except Exception:  # already dead or stuck: the kill below ends it either way
            pass
        ray.kill(self.actor)


def start_reward_server(
    name: str,
    params: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    host: str | None = None,
    port: int = 0,
    num_cpus: float = 1,
    num_gpus: float = 0,
    limits: ServerLimits | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> RayRewardServer:
    """Start the reward ``name`` (a registry name or dotted path) with ``params`` in an actor of
    ``num_cpus`` / ``num_gpus`` on the Ray cluster this process has joined (``ray.init`` first);
    returns once it serves. ``host=None``: the node's address (needs a token); ``port=0``: a free
    port. Raises :class:`DiffrlError` when the actor cannot be placed or its reward fails to load."""
    ray = import_ray()
    problem = bind_problem(host, token)
    if problem:
        raise DiffrlError(problem)
    actor = ray.remote(RewardServerActor).options(num_cpus=num_cpus, num_gpus=num_gpus).remote()
    try:
        url = ray.get(
            actor.start.remote(name, dict(params or {}), host, port, token, limits or ServerLimits()),
            timeout=timeout_s,
        )
    except ray.exceptions.GetTimeoutError as e:
        ray.kill(actor)
        raise DiffrlError(
            f"the reward server actor ({num_cpus} CPU, {num_gpus} GPU) did not start within {timeout_s:g} s "
            f"(cluster: {ray.cluster_resources()}); ask for fewer --num-gpus/--num-cpus, or add nodes"
        ) from e
    except ray.exceptions.RayActorError as e:  # the process ended while the reward was built
        raise DiffrlError(
            f"the reward server actor died while building the reward {name!r} ({str(e).splitlines()[0][:300]}); "
            "run `diffrl serve-reward` with the same reward without --ray to see its error"
        ) from e
    except ray.exceptions.RayTaskError as e:
        ray.kill(actor)
        cause = e.cause
        if isinstance(cause, DiffrlError):
            raise DiffrlError(str(cause)) from cause
        raise DiffrlError(
            f"the reward server actor failed to start: {type(cause).__name__}: {cause}"
        ) from cause
    return RayRewardServer(actor, url)
