"""``diffrl serve-reward --reward NAME``: serve a reward over HTTP (the ``remote`` reward's
server), in this process or from a Ray actor (``--ray``)."""

from __future__ import annotations

import argparse
import signal

from diffrl.cli.commands.serve_reward import ServeInputs
from diffrl.core.errors import DiffrlError
from diffrl.distributed.ray.cluster import import_ray, ray_address_problem
from diffrl.distributed.ray.reward_server import start_reward_server
from diffrl.serving.server import bind_problem, check_served_reward, serve, served_protocol


def _print_serving(name: str, url: str, token: str | None, protocol: str = "diffrl") -> None:
    auth = "token required" if token else "no token: this machine only"
    speaks = "" if protocol == "diffrl" else f", protocol {protocol}"
    print(f"serving reward {name!r} at {url} ({auth}{speaks}); Ctrl-C stops it", flush=True)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def run(args: argparse.Namespace, inputs: ServeInputs) -> int:
    params, token = inputs.params, inputs.token
    if not args.ray:
        host = args.host or "127.0.0.1"
        port = 8000 if args.port is None else args.port
        serve(
            args.reward,
            params,
            host,
            port,
            token,
            limits=inputs.limits,
            on_ready=lambda s: _print_serving(args.reward, s.url, token, args.protocol),
            protocol=args.protocol,
        )
        return 0
    if served_protocol(args.protocol).name != "diffrl":
        raise DiffrlError(
            f"--protocol {args.protocol} with --ray: the Ray actor serves protocol diffrl only; serve a "
            "peer's protocol without --ray"
        )
    problem = bind_problem(args.host, token)  # before Ray starts: that takes seconds
    if problem:
        raise DiffrlError(problem)
    check_served_reward(args.reward, params)  # here, not only in the actor: before Ray starts
    ray = import_ray()
    if args.ray_address and (problem := ray_address_problem(args.ray_address)):
        raise DiffrlError(problem.replace("ray.address", "--ray-address"))
    ray.init(address=args.ray_address, include_dashboard=False)
    # after ray.init, which installs a SIGTERM handler that aborts: a service manager's stop must
    # end the actor and shut down the cluster this process started or joined
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server = start_reward_server(
            args.reward,
            params,
            token=token,
            host=args.host,
            port=args.port or 0,
            num_cpus=args.num_cpus,
            num_gpus=args.num_gpus,
            limits=inputs.limits,
        )
        _print_serving(args.reward, server.url, token)
        try:
            server.wait()
        finally:
            server.stop()
    finally:
        ray.shutdown()
    return 0
