"""What each command checks before its world loads: its arguments, its output folder and the
schema stage of its config (:mod:`diffrl.preflight.schema`). Nothing here imports torch, so every
argument or config error answers at once; a command's module (``diffrl/cli/<command>.py``) is
imported only after its inputs passed, and gets them as one of the dataclasses below.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from diffrl.bench.report import BENCH_JSON
from diffrl.bench.suites import SUITES, BenchPrompts, load_suite, suite_name
from diffrl.cli.outputs import (
    check_inputs_outside,
    check_links_inside,
    check_out_folder,
    check_page_out,
    check_run_pictures,
)
from diffrl.config import SECTIONS, Config, ConfigError
from diffrl.config.binding import YamlProblem, load_yaml
from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.user_files import file_problem, read_text
from diffrl.data.lines import prompt_problem
from diffrl.preflight.schema import read_config, schema_problems
from diffrl.serving.limits import MAX_TOKEN_FILE_BYTES, ServerLimits, limit_fields
from diffrl.train.manifest import (
    CheckpointError,
    base_problem,
    checkpoint_around,
    overlap,
    run_folder_hint,
    verify_checkpoint,
)

# What each command checks of a config (``train`` checks every section, ``load_config``'s default).
EVAL_SECTIONS = ("run", "model", "sampling", "eval")
"""``eval`` samples with ``sampling``, scores with ``eval.rewards``; the training sections are not its
business (a checkpoint of a run whose training reward is not installed here still evaluates)."""
SAMPLE_SECTIONS = ("run", "model", "sampling")
EXPORT_SECTIONS = ("run", "model")

CHECKPOINT_INFO = "checkpoint.json"
"""The file that makes a folder a checkpoint (as ``diffrl.train.checkpoint.is_checkpoint`` says;
told apart here without importing the checkpoint code, which needs torch)."""


@dataclass(frozen=True)
class Target:
    """A model a command loads: its config (the schema stage passed; the command's module runs the
    plugin stage on it), the checkpoint whose weights go in (None: the config's model as is), the
    source's name for messages and the config sections the command checks."""

    config: Config
    checkpoint: Path | None
    source: str
    sections: tuple[str, ...]
    untrusted: dict[str, str] = field(default_factory=dict)
    """The dotted paths a checkpoint's config names that the user did not name again -> why each is
    refused: the command runs under :func:`diffrl.core.registry.refusing` of them (importing one would
    run code that came with the checkpoint). Empty with ``--trust-checkpoint-code``."""

    def inputs(self, role: str) -> dict[str, Path | str | None]:
        """The folders this target reads, by role (for :func:`check_out_dir`)."""
        return {
            f"{role} checkpoint": self.checkpoint,
            f"{role} model folder (model.path)": self.config.model.path,
        }


@dataclass(frozen=True)
class EvalInputs:
    target: Target
    baseline: Target | None
    """The ``--baseline`` model as its own config names it (its ``model`` section checked)."""
    paired: Target | None
    """The target's config with the baseline's model: sampled and scored exactly as the target."""
    out: Path

    def untrusted(self) -> dict[str, str]:
        return {**self.target.untrusted, **(self.baseline.untrusted if self.baseline else {})}


@dataclass(frozen=True)
class SampleInputs:
    target: Target
    out: Path


@dataclass(frozen=True)
class ExportInputs:
    target: Target
    out: Path


@dataclass(frozen=True)
class ServeInputs:
    params: dict[str, Any]
    token: str | None
    limits: ServerLimits
    """From the limit flags (``--max-request-mb``, ``--max-image-pixels``, ...); the rest defaults."""


RUN_ALIASES = ("best", "final")
"""``RUN_DIR/best`` and ``RUN_DIR/final`` name a run folder's ``checkpoints/best`` (kept by
``train.keep_best``) and ``checkpoints/final``, wherever a checkpoint is expected."""


def run_checkpoint(target: str) -> str:
    """``RUN_DIR/best`` (or ``RUN_DIR/final``), where no such file exists and ``RUN_DIR`` is a run
    folder -> ``RUN_DIR/checkpoints/best``; any other target as given. A run with no best
    checkpoint yet is said: none of its evals beat its first by more than the paired SE."""
    path = Path(target).expanduser()
    if path.name not in RUN_ALIASES or os.path.lexists(path) or not is_run_folder(path.parent):
        return target
    checkpoint = path.parent / "checkpoints" / path.name
    if path.name == "best" and not os.path.lexists(checkpoint / CHECKPOINT_INFO):
        raise DiffrlError(
            f"{target!r}: run folder {str(path.parent)!r} has no best checkpoint ({str(checkpoint)!r}): "
            "it keeps one with train.keep_best, once an eval beats the run's first eval by more than "
            f"its paired standard error; give one of its checkpoints instead{run_folder_hint(path.parent)}"
        )
    return str(checkpoint)


def resolve_target(
    target: str, overrides: list[str], sections: Sequence[str] = SAMPLE_SECTIONS, trust: bool = False
) -> Target:
    """``base`` | a recipe YAML | a checkpoint dir | a model dir -> its :class:`Target`, the
    config's schema stage checked for the ``sections`` the command uses.

    A checkpoint is checked before its ``config.yaml`` is read: its sealed ``checkpoint.json`` and
    ``config.yaml``'s sha256 (the weights are verified when they load), and its base model against
    the config's ``model.path`` (its weights fit no other). Its config's dotted paths go into
    ``untrusted`` unless the user names them again in ``overrides`` or ``trust`` is set."""
    path = Path(target).expanduser()
    sections = tuple(sections)
    if target == "base":
        return Target(read_config({}, overrides, sections)[0], None, "config", sections)
    if path.suffix in (".yaml", ".yml"):
        config, source = read_config(path, overrides, sections)
        return Target(config, None, source, sections)
    if os.path.lexists(path / CHECKPOINT_INFO):  # a FIFO or a symlink loop too: verified, described
        if not os.path.lexists(path / "config.yaml"):
            raise DiffrlError(
                f"checkpoint {target!r} has no config.yaml (the run's config is saved beside its weights); "
                "the folder is incomplete: copy it again"
            )
        info = verify_checkpoint(path, only={"config.yaml"})  # nothing of it is read unverified
        config, source = read_config(path / "config.yaml", overrides, sections)
        problem = base_problem(info, config.model.family, config.model.path, path)
        if problem is not None:
            raise CheckpointError(problem)
        untrusted = {} if trust else untrusted_paths(config, overrides, path)
        return Target(config, path, source, sections, untrusted)
    if hint := run_folder_hint(path):  # a run folder is no model folder: name its checkpoint
        raise DiffrlError(f"{target!r} is not a checkpoint nor a model folder{hint}")
    if path.is_dir():  # as given ('./base' is a folder; str(Path('./base')) would be the built-in 'base')
        folder = os.path.expanduser(target)
        return Target(
            read_config({"model": {"path": folder}}, overrides, sections)[0], None, "config", sections
        )
    problem = file_problem(path)  # what it is (a FIFO, a symlink loop) rather than "no such"
    what = (
        "a file" if problem is None else "no such file or folder" if problem == "does not exist" else problem
    )
    raise DiffrlError(
        f"{target!r} ({what}) is not 'base', a recipe .yaml, a checkpoint (a folder with checkpoint.json, "
        "e.g. runs/NAME/checkpoints/final) or a model folder"
    )


DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?")
"""What :func:`diffrl.core.registry.import_object` can import: ``pkg.mod:attr`` or ``pkg.mod.attr``."""


def _strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a config's nested dicts and lists, with its key (``eval.rewards[0].name``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")
    elif isinstance(value, str):
        yield key, value


def untrusted_paths(config: Config, overrides: list[str], checkpoint: Path) -> dict[str, str]:
    """The dotted paths the checkpoint's config names (any string an import could take: a reward,
    family, algorithm, runner, engine, kernel or tracker of the user's own; diffrl's own modules
    aside) that ``overrides`` do not name again -> the message that refuses each."""
    given = " ".join(overrides)
    refused = {}
    for key, value in _strings(config.to_dict()):
        if ("." not in value and ":" not in value) or not DOTTED.fullmatch(value):
            continue
        module = value.partition(":")[0]
        if module == "diffrl" or module.startswith("diffrl."):
            continue
        if re.search(rf"(?<![\w.:]){re.escape(value)}(?![\w.:])", given):
            continue  # the user named it on this command line: theirs
        root = key.split("[")[0]
        refused[value] = (
            f"{value!r} comes from the checkpoint's config ({str(checkpoint / 'config.yaml')!r}), and "
            "importing it would run code that came with the checkpoint; diffrl imports no code a checkpoint "
            f"names unless you name it too: if you trust it, name it again on the command line (an override "
            f"of {root} naming {value}), or pass --trust-checkpoint-code"
        )
    return refused


def check_out_dir(
    path: Path, flag: str, empty: bool = False, inputs: dict[str, Path | str | None] | None = None
) -> None:
    """Refuse an output folder that cannot be one (it, or a parent, is a file) before anything
    loads; one that is or lies inside an input (``inputs``: role -> folder) or any checkpoint,
    whose files the output would replace or join; with ``empty``, also one that holds files."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "it" if p == path else f"its parent {str(p)!r}"
                raise DiffrlError(
                    f"{flag} {str(path)!r} cannot be a folder: {where} is a file; give a folder path"
                )
            break
    why = overlap(path, inputs or {})
    if why is not None:
        raise DiffrlError(
            f"{flag} {why}: writing there would damage what this command reads; give another folder"
        )
    if empty and path.is_dir() and any(path.iterdir()):
        n = sum(1 for _ in path.iterdir())
        raise DiffrlError(
            f"{flag} {str(path)!r} is not empty ({n} {'entry' if n == 1 else 'entries'}); give a new or empty folder, or pass --force "
            "to write into it (files of the same name are replaced)"
        )


def _outside_inputs(
    out: Path,
    flag: str,
    command: str,
    folders: dict[str, Path | str | None],
    files: list[tuple[str, Path | str | None]],
) -> None:
    """:func:`check_out_dir` against the input ``folders``, then no input (``folders``, ``files``)
    inside ``out``, no symlink in ``out`` into one, and ``out`` new, empty or ``command``'s
    earlier output (:mod:`diffrl.cli.outputs`)."""
    check_out_dir(out, flag, inputs=folders)
    check_inputs_outside(out, flag, command, [*folders.items(), *files])
    check_links_inside(out, flag, folders)
    check_out_folder(out, flag, command)


# ---- one function per command: argparse's namespace -> the command's inputs ---------------------


def train_inputs(args: argparse.Namespace) -> Target:
    config, source = read_config(args.recipe, args.overrides, SECTIONS)
    return Target(config, None, source, SECTIONS)


PLAN_GPUS = ("H200", "H100", "A100", "L40S", "L4", "A10", "RTX 4090")
"""``diffrl plan --gpu``: the GPUs whose datasheet figures :mod:`diffrl.models.numerics` holds."""


def plan_inputs(args: argparse.Namespace) -> Target:
    if args.gpu not in PLAN_GPUS:
        raise DiffrlError(f"--gpu {args.gpu!r} is not one of {', '.join(PLAN_GPUS)}")
    if not 0 < args.mfu <= 1:
        raise DiffrlError(f"--mfu {args.mfu:g} must be in (0, 1], e.g. 0.4")
    return train_inputs(args)


def eval_inputs(args: argparse.Namespace) -> EvalInputs:
    out = Path(args.out).expanduser()
    check_out_dir(out, "--out")
    # the eval command evaluates whatever the run's eval.enabled said about evals during training
    overrides = [*args.overrides, "eval.enabled=true"]
    if args.num_prompts is not None:
        overrides.append(f"eval.num_prompts={args.num_prompts}")
    elif args.prompts:  # a prompt file named on the command line is scored whole
        overrides.append("eval.num_prompts=null")
    if args.samples_per_prompt is not None:
        overrides.append(f"eval.samples_per_prompt={args.samples_per_prompt}")
    if args.prompts:
        overrides.append(f"eval.prompts={json.dumps(args.prompts)}")  # quoted: any path is a string
    trust = getattr(args, "trust_checkpoint_code", False)
    args.target, args.baseline = run_checkpoint(args.target), args.baseline and run_checkpoint(args.baseline)
    target = resolve_target(args.target, overrides, EVAL_SECTIONS, trust)
    read = [("the target", args.target), ("eval.prompts", target.config.eval.prompts)]
    if not args.baseline:
        _outside_inputs(out, "--out", "eval", target.inputs("the target's"), read)
        return EvalInputs(target, None, None, out)
    # the baseline's model, sampled and scored exactly as the target: same config, prompts, seeds
    baseline = resolve_target(args.baseline, [], ("model",), trust)
    inputs = {**target.inputs("the target's"), **baseline.inputs("the baseline's")}
    _outside_inputs(out, "--out", "eval", inputs, [*read, ("--baseline", args.baseline)])
    family, base_family = target.config.model.family, baseline.config.model.family
    if base_family != family:
        raise DiffrlError(
            f"--baseline {args.baseline!r} is a {base_family!r} model, the target a "
            f"{family!r} one; a paired comparison needs the same family (same noise)"
        )
    source = f"--baseline {args.baseline}"
    config = dataclasses.replace(target.config, model=baseline.config.model)
    problems = schema_problems(config, EVAL_SECTIONS)
    if problems:
        raise ConfigError(problems, source)
    return EvalInputs(target, baseline, Target(config, baseline.checkpoint, source, EVAL_SECTIONS), out)


def sample_inputs(args: argparse.Namespace) -> SampleInputs:
    if args.prompt and args.prompts:
        raise DiffrlError("give either --prompt TEXT (repeatable) or --prompts FILE, not both")
    if not args.prompt and not args.prompts:
        raise DiffrlError("give --prompt TEXT (repeatable) or --prompts FILE")
    problems = [
        f"--prompt {n} ({quoted(p, 60)}): {why}"
        for n, p in enumerate(args.prompt or [], 1)
        if (why := prompt_problem(p))
    ]
    if problems:  # checked again where the prompts are read (given_prompts); here before anything loads
        raise DiffrlError("; ".join(problems))
    if args.num_prompts is not None and not args.prompts:
        raise DiffrlError(
            "--num-prompts takes the first N prompts of --prompts FILE; with --prompt, give just those"
        )
    if args.samples_per_prompt < 1:
        raise DiffrlError(f"--samples-per-prompt must be >= 1, got {args.samples_per_prompt}")
    out = Path(args.out).expanduser()
    check_out_dir(out, "--out")
    target = resolve_target(
        args.target, args.overrides, SAMPLE_SECTIONS, getattr(args, "trust_checkpoint_code", False)
    )
    read = [
        ("the target", args.target),
        ("--prompts", args.prompts),
        *(("--image", i) for i in args.image or []),
    ]
    _outside_inputs(out, "--out", "sample", target.inputs("the target's"), read)
    if target.config.eval.batch_size < 1:  # sample draws eval.batch_size images per forward
        raise DiffrlError(
            f"eval.batch_size (images per sampling forward) must be >= 1, got {target.config.eval.batch_size}"
        )
    if args.image and not args.prompt:
        raise DiffrlError("--image goes with --prompt (one each); a prompt file names its images itself")
    return SampleInputs(target, out)


def export_inputs(args: argparse.Namespace) -> ExportInputs:
    args.checkpoint = run_checkpoint(args.checkpoint)
    checkpoint = Path(args.checkpoint).expanduser()
    if not os.path.lexists(checkpoint / CHECKPOINT_INFO):  # one that is no file: described when read
        what = "no such folder" if not checkpoint.exists() else "no checkpoint.json inside"
        raise DiffrlError(
            f"{args.checkpoint!r} is not a diffrl checkpoint ({what}); give a run's checkpoint folder, "
            f"e.g. runs/NAME/checkpoints/final{run_folder_hint(checkpoint)}"
        )
    out = Path(args.out_dir).expanduser()
    check_out_dir(out, "OUT_DIR")
    # export reads the model and its weights: the run's training settings (rewards, data) need not resolve
    target = resolve_target(
        args.checkpoint, args.overrides, EXPORT_SECTIONS, getattr(args, "trust_checkpoint_code", False)
    )
    check_out_dir(out, "OUT_DIR", empty=not args.force, inputs=target.inputs("the checkpoint's"))
    check_links_inside(out, "OUT_DIR", target.inputs("the checkpoint's"))
    return ExportInputs(target, out)


def report_inputs(args: argparse.Namespace) -> None:
    run_dir = Path(args.run_dir).expanduser()
    around = checkpoint_around(run_dir)
    if around is not None:  # the report's pictures and page would join the checkpoint's files
        raise DiffrlError(
            f"RUN_DIR {str(run_dir)!r} is a checkpoint (or inside one: {str(around)!r}); give the run's "
            "output folder, e.g. runs/NAME"
        )
    out = Path(args.out).expanduser() if args.out else None
    if out is not None:
        if out.is_dir():
            raise DiffrlError(
                f"--out {str(out)!r} is a folder; give the HTML file to write, e.g. {out / 'report.html'}"
            )
        check_out_dir(out.parent, "--out's folder")  # not into a checkpoint
        check_page_out(out, "--out", "give a new .html file (or an earlier report), e.g. --out report.html")
    else:
        check_page_out(
            run_dir / "report.html", "RUN_DIR's report.html", "move it away, or give --out FILE.html"
        )
    check_run_pictures(run_dir)


def serve_inputs(args: argparse.Namespace) -> ServeInputs:
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


BENCH_WRITES = (BENCH_JSON,)
"""What ``diffrl bench`` writes into a run folder given as ``--out`` (and ``bench_SUITE.png``)."""


@dataclass(frozen=True)
class BenchInputs:
    eval: EvalInputs
    """The target (and baseline) as ``diffrl eval`` takes them: sampled with ``sampling`` and
    ``eval.seed``; ``eval.rewards`` is what DrawBench scores."""
    prompts: BenchPrompts
    samples_per_prompt: int
    run_folder: bool
    """``--out`` is a training run's folder: bench adds its files there (``diffrl report`` shows
    them) instead of making ``--out`` its own output folder."""


def is_run_folder(path: Path) -> bool:
    """A folder ``diffrl train`` wrote (as ``diffrl report`` tells one)."""
    return path.is_dir() and any(
        os.path.lexists(path / n) for n in ("metrics.jsonl", "config.yaml", "run.json")
    )


def bench_inputs(args: argparse.Namespace) -> BenchInputs:
    suite = SUITES[suite_name(args.suite)]
    for flag, given, used in (
        ("--detector", args.detector, suite.models),
        ("--clip", args.clip, suite.models),
        ("--rewards", args.rewards, suite.rewards),
    ):
        if given is not None and not used:
            users = [s.name for s in SUITES.values() if (s.rewards if flag == "--rewards" else s.models)]
            raise DiffrlError(
                f"{flag}: --suite {suite.name} does not use it (only {', '.join(users)} does); leave it out"
            )
    prompts = load_suite(suite.name, args.prompts).head(args.num_prompts)
    samples = args.samples_per_prompt or suite.samples_per_prompt
    overrides = [*args.overrides, "eval.enabled=true"]
    if args.rewards is not None:
        names = [n.strip() for n in args.rewards.split(",") if n.strip()]
        if not names:
            raise DiffrlError(
                f"--rewards {quoted(args.rewards, 60)} names no reward; give names, e.g. pickscore,clip_score"
            )
        overrides.append("eval.rewards=" + json.dumps([{"name": n} for n in names]))
    trust = getattr(args, "trust_checkpoint_code", False)
    out = Path(args.out).expanduser()
    check_out_dir(out, "--out")
    target = resolve_target(args.target, overrides, EVAL_SECTIONS, trust)
    baseline = paired = None
    folders = target.inputs("the target's")
    if args.baseline:
        baseline = resolve_target(args.baseline, [], ("model",), trust)
        folders = {**folders, **baseline.inputs("the baseline's")}
        family, base_family = target.config.model.family, baseline.config.model.family
        if base_family != family:
            raise DiffrlError(
                f"--baseline {args.baseline!r} is a {base_family!r} model, the target a "
                f"{family!r} one; a paired comparison needs the same family (same noise)"
            )
        config = dataclasses.replace(target.config, model=baseline.config.model)
        if problems := schema_problems(config, EVAL_SECTIONS):
            raise ConfigError(problems, f"--baseline {args.baseline}")
        paired = Target(config, baseline.checkpoint, f"--baseline {args.baseline}", EVAL_SECTIONS)
    if suite.rewards and not target.config.eval.rewards:
        raise DiffrlError(
            f"--suite {suite.name} scores with eval.rewards, which is empty; give --rewards NAMES"
        )
    if target.config.eval.batch_size < 1:
        raise DiffrlError(
            f"eval.batch_size (images per sampling forward) must be >= 1, got {target.config.eval.batch_size}"
        )
    run_folder = is_run_folder(out)
    if run_folder:  # only bench's own files are written there, each a file of its own (no link out)
        check_out_dir(out, "--out", inputs=folders)
        for name in (*BENCH_WRITES, f"bench_{suite.name}.png"):
            path = out / name
            if path.is_symlink() or (os.path.lexists(path) and not path.is_file()):
                raise DiffrlError(
                    f"--out {quoted(str(out))}: {name} there is {'a symlink' if path.is_symlink() else 'not a file'}; "
                    "bench writes that file: remove it, or give another --out"
                )
    else:
        read = [("the target", args.target), ("--prompts", args.prompts)]
        if args.baseline:
            read.append(("--baseline", args.baseline))
        _outside_inputs(out, "--out", "bench", folders, read)
    return BenchInputs(EvalInputs(target, baseline, paired, out), prompts, samples, run_folder)
