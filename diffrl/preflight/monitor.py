"""Plugin stage: the CLIP diversity monitor's folders and device (``monitor.clip*``), checked before
anything loads, and its default (the CLIP of a reward of ``rewards`` with ``clip_folders``)."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

from diffrl.config import Config
from diffrl.core.errors import quoted
from diffrl.core.registry import RegistryError
from diffrl.core.user_files import UserFileError, read_json_object
from diffrl.launch import RUNNERS
from diffrl.rewards.base import Reward
from diffrl.rewards.clip_embed import image_processor_problems
from diffrl.rewards.registry import REWARDS

FIX = (
    "give the path of a local CLIPModel folder (as CLIPModel.save_pretrained writes), or monitor.clip_every=0"
)


def monitor_problems(config: Config, check_files: bool) -> list[str]:
    """``monitor.clip`` and ``monitor.clip_processor`` (when given and the monitor is on) hold a
    ``CLIPModel`` and its image processor config; ``monitor.clip_device`` names a device."""
    m = config.monitor
    errors = []
    if m.clip_device is not None and m.clip_device not in ("auto", "cpu"):
        if not re.fullmatch(r"cuda(:\d+)?", m.clip_device):
            errors.append(
                f"monitor.clip_device must be auto, cpu, cuda or cuda:N, got {quoted(m.clip_device)}"
            )
    if not m.clip_interval():
        return errors
    if m.clip is None and default_clip(config) is None:
        errors.append(
            f"monitor.clip_every is {m.clip_every} but there is no CLIP to embed with: give monitor.clip "
            "(a local CLIPModel folder) or train with a pickscore, clip_score or aesthetic reward"
        )
    for param, folder in (("monitor.clip", m.clip), ("monitor.clip_processor", m.clip_processor)):
        if folder is not None and not folder.strip():
            errors.append(f"{param} must be the path of a local folder or null, got {quoted(folder)}")
    if errors or not check_files:
        return errors
    if m.clip is not None:
        errors += clip_folder_problems(m.clip)
    processor = m.clip_processor or m.clip
    if processor is not None and not errors:
        param = "monitor.clip_processor" if m.clip_processor else "monitor.clip"
        path = Path(processor).expanduser()
        if not path.is_dir():
            errors.append(
                f"{param}: {quoted(processor)} is not a folder; give the folder of a CLIP image processor"
            )
        else:
            errors += image_processor_problems("monitor.clip", param, processor, path)
    return errors


def clip_folder_problems(folder: str) -> list[str]:
    """What keeps ``folder`` from loading as a ``CLIPModel``: not a folder, no readable
    ``config.json`` of ``model_type`` clip, no weights."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        return [f"monitor.clip: {quoted(folder)} is not a folder; {FIX}"]
    config = path / "config.json"
    if not config.exists() and not config.is_symlink():
        return [
            f"monitor.clip: {quoted(folder)} has no config.json, so it is no transformers model folder; {FIX}"
        ]
    try:  # bounded: a FIFO would wait forever, JSON nested 100,000 deep raise RecursionError
        model_type = read_json_object(config, "monitor.clip: the model's config", FIX).get("model_type")
    except UserFileError as e:
        return [str(e)]
    if model_type != "clip":
        return [
            f"monitor.clip: {quoted(folder)} holds a {quoted(model_type)} model, not a CLIPModel (model_type 'clip'); {FIX}"
        ]
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        return [
            f"monitor.clip: {quoted(folder)} has a config.json but no weights (*.safetensors or *.bin); {FIX}"
        ]
    return []


def resolve_monitor(config: Config, sections: Collection[str]) -> None:
    """Fill the CLIP monitor's defaults once the config passed the checks: a null ``monitor.clip``
    becomes the CLIP folder (and processor folder) of the first CLIP-family reward in
    ``rewards`` when ``clip_every`` asks for the monitor, a null ``clip_every`` 1 when ``clip``
    is given (else 0: the monitor is opt-in), a null ``monitor.clip_device`` ``run.device``. Only for a command that trains (its
    rewards were checked)."""
    if not {"train", "rewards", "monitor"} <= set(sections):
        return
    m = config.monitor
    m.clip_every = m.clip_interval()
    found = default_clip(config) if m.clip is None and m.clip_every > 0 else None
    if found is not None:
        m.clip = found[0]
        m.clip_processor = m.clip_processor or found[1]
    if m.clip is not None and m.clip_device is None:
        m.clip_device = driver_device(config)


def driver_device(config: Config) -> str:
    """Where the monitor runs: the driver process, whose device the runner says (``run.device``
    in one process; under a cluster runner ``run.device`` names the actors' devices, which the
    driver's machine may not have, or shares with rank 0: the CPU, also for a runner that does
    not say)."""
    try:
        runner = RUNNERS.resolve(config.runner)
    except RegistryError:
        return "cpu"  # reported by the runner checks
    said = getattr(runner, "driver_device", None)
    return str(said(config)) if said is not None else "cpu"


def default_clip(config: Config) -> tuple[str, str | None] | None:
    """``(model folder, processor folder)`` of the first CLIP-family reward of ``rewards``."""
    for r in config.rewards:
        try:
            cls = REWARDS.resolve(r.name)
        except RegistryError:
            continue
        folders = cls.clip_folders if isinstance(cls, type) and issubclass(cls, Reward) else None
        if folders is None or not isinstance(r.params, dict):  # (a function reward has none)
            continue
        model_param, processor_param = folders
        model = r.params.get(model_param)
        if isinstance(model, str) and model:
            processor = r.params.get(processor_param) if processor_param else None
            return model, processor if isinstance(processor, str) and processor else None
    return None
