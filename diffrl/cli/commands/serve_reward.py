"""``diffrl serve-reward --reward NAME``: its arguments (one flag per server limit), the reward's
params, the token and the limits, checked before anything loads; the server runs in
:mod:`diffrl.cli.serve_reward`."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from diffrl.cli.arguments import Command, integer, number
from diffrl.config.binding import YamlProblem, load_yaml
from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.user_files import read_text
from diffrl.serving.limits import MAX_TOKEN_FILE_BYTES, ServerLimits, flag_name, limit_fields


@dataclass(frozen=True)
class ServeInputs:
    params: dict[str, Any]
    token: str | None
    limits: ServerLimits
    """From the limit flags (``--max-request-mb``, ``--max-image-pixels``, ...); the rest defaults."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reward", required=True, help="a reward name (e.g. ocr) or a dotted path module:obj")
    p.add_argument(
        "--params", nargs="*", default=[], help="the reward's params: key=value ... or one mapping '{k: v}'"
    )
    p.add_argument("--host", help="address to bind (default 127.0.0.1; with --ray, the node's address)")
    p.add_argument(
        "--port", type=integer(0, 65535), help="default 8000 (with --ray: a free port); 0: a free port"
    )
    p.add_argument(
        "--protocol",
        default="diffrl",
        help="the wire protocol to answer: diffrl (msgpack POST /score, the default), flow_factory "
        "(Flow-Factory's JSON POST /compute), verl_omni (verl-omni's pickled HTTP scorer, POST / and "
        "/score), flow_grpo (flow_grpo's pickled reward servers, POST /) or verl_omni_json (verl-omni's "
        "fields as JSON); pickles are read by a restricted unpickler. See diffrl/transport/protocols.py",
    )
    p.add_argument("--token-file", help="a file holding the token clients must send (Bearer)")
    p.add_argument("--token-env", help="an environment variable holding the token")
    for name, limit in limit_fields().items():  # one flag per limit (diffrl/serving/limits.py)
        lo, hi = limit.bounds.lo, limit.bounds.hi
        p.add_argument(
            flag_name(name),
            type=integer(int(lo), int(hi)) if limit.kind is int else number(lo, hi, limit.bounds.lo_open),
            help=f"{limit.help} (default {limit.default:g}; {limit.bounds.text()})",
        )
    p.add_argument("--ray", action="store_true", help="serve from a Ray actor (its own CPUs/GPUs)")
    p.add_argument("--ray-address", help="with --ray: auto or HOST:PORT of a cluster (default: start one)")
    p.add_argument(
        "--num-gpus", type=number(0, 1024), default=0, help="with --ray: GPUs for the server's actor"
    )
    p.add_argument(
        "--num-cpus", type=number(0, 1024), default=1, help="with --ray: CPUs for the server's actor"
    )


def inputs(args: argparse.Namespace) -> ServeInputs:
    params, token = reward_params(args.params), server_token(args)
    given = {name: getattr(args, name) for name in limit_fields() if getattr(args, name) is not None}
    limits = ServerLimits(**given)
    if problems := limits.problems():  # the flags' types checked each; this holds them together
        raise DiffrlError("; ".join(problems))
    if not args.ray and (args.ray_address or args.num_gpus or args.num_cpus != 1):
        raise DiffrlError("--ray-address, --num-gpus and --num-cpus place the server on Ray: add --ray")
    return ServeInputs(params, token, limits)


def reward_params(items: list[str]) -> dict:
    """``--params``: one YAML/JSON mapping (``'{device: cuda, batch_size: 8}'``) or ``key=value``
    items, each value read as YAML (``8`` an int, ``true`` a bool), as config overrides are: read
    as recipes are (:func:`~diffrl.config.binding.load_yaml`: a key given twice, nesting past 40
    levels or an alias bomb refused, not the last key winning or a RecursionError)."""
    if len(items) == 1 and items[0].lstrip().startswith("{"):
        try:
            params = load_yaml(items[0])[0]
        except (yaml.YAMLError, YamlProblem) as e:
            raise DiffrlError(f"--params {quoted(items[0])} is not a YAML/JSON mapping ({e})") from e
        if not isinstance(params, dict):
            raise DiffrlError(f"--params {quoted(items[0])} must be a mapping, e.g. '{{device: cuda}}'")
        return params
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DiffrlError(
                f"--params: {quoted(item)} is not key=value; give key=value items or one mapping, e.g. '{{device: cuda}}'"
            )
        if key in params:
            raise DiffrlError(f"--params: {quoted(key)} is given twice; give it once")
        try:
            params[key] = load_yaml(value)[0]
        except (yaml.YAMLError, YamlProblem) as e:
            raise DiffrlError(f"--params {quoted(item)}: the value is not YAML ({e})") from e
    return params


def server_token(args: argparse.Namespace) -> str | None:
    """The token from ``--token-file`` or ``--token-env`` (surrounding whitespace dropped)."""
    if args.token_file and args.token_env:
        raise DiffrlError("give either --token-file or --token-env, not both")
    if args.token_file:
        # a regular file, read bounded and non-blocking: a FIFO, /dev/zero or binary junk is refused
        fix = "give a text file holding the token (make one with: openssl rand -hex 32 > FILE)"
        path = Path(args.token_file).expanduser()
        token = read_text(path, "--token-file", fix, MAX_TOKEN_FILE_BYTES).strip()
        if not token:
            raise DiffrlError(f"--token-file {args.token_file!r} is empty; write the token into it")
        return token
    if args.token_env:
        token = os.environ.get(args.token_env, "").strip()
        if not token:
            raise DiffrlError(
                f"--token-env {args.token_env}: that environment variable is not set (or empty)"
            )
        return token
    return None


COMMAND = Command(
    "serve a reward over HTTP for the 'remote' reward (wire format: diffrl/serving/server.py)",
    "diffrl.cli.serve_reward:run",
    arguments,
    inputs,
)
