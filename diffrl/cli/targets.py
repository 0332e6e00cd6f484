"""The model a command loads, told before its world loads (torch-free): ``base``, a recipe, a
checkpoint (verified, its code refused unless named again) or a model folder -> a :class:`Target`
whose config passed the schema stage (:mod:`diffrl.preflight.schema`) for the command's sections.
Shared by the commands' modules (:mod:`diffrl.cli.commands`) and their runs."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffrl.config import Config, ConfigError
from diffrl.core.errors import DiffrlError
from diffrl.core.user_files import file_problem
from diffrl.preflight.schema import read_config, schema_problems
from diffrl.train.manifest import CheckpointError, base_problem, run_folder_hint, verify_checkpoint

# What a command checks of a config (``train`` checks every section, ``load_config``'s default).
EVAL_SECTIONS = ("run", "model", "sampling", "eval")
"""``eval`` samples with ``sampling``, scores with ``eval.rewards``; the training sections are not its
business (a checkpoint of a run whose training reward is not installed here still evaluates)."""
SAMPLE_SECTIONS = ("run", "model", "sampling")

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
        """The folders this target reads, by role (for :func:`diffrl.cli.outputs.check_out_dir`)."""
        return {
            f"{role} checkpoint": self.checkpoint,
            f"{role} model folder (model.path)": self.config.model.path,
        }


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


def is_run_folder(path: Path) -> bool:
    """A folder ``diffrl train`` wrote (as ``diffrl report`` tells one)."""
    return path.is_dir() and any(
        os.path.lexists(path / n) for n in ("metrics.jsonl", "config.yaml", "run.json")
    )


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


def paired_target(target: Target, baseline: Target, given: str) -> Target:
    """The ``--baseline`` model (``given`` on the command line, ``baseline`` its own config) in
    ``target``'s config: sampled and scored exactly as the target (same config, prompts, seeds).
    Refused for another model family (not the same noise), or where the config does not hold."""
    family, base_family = target.config.model.family, baseline.config.model.family
    if base_family != family:
        raise DiffrlError(
            f"--baseline {given!r} is a {base_family!r} model, the target a "
            f"{family!r} one; a paired comparison needs the same family (same noise)"
        )
    source = f"--baseline {given}"
    config = dataclasses.replace(target.config, model=baseline.config.model)
    if problems := schema_problems(config, EVAL_SECTIONS):
        raise ConfigError(problems, source)
    return Target(config, baseline.checkpoint, source, EVAL_SECTIONS)


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
