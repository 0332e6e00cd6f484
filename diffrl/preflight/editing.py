"""Plugin stage: editing families (``FamilyDescription.edits``) against the prompt files and datasets:
source images where the family edits, none where it does not, and one size for all sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffrl.config import Config
from diffrl.core.registry import RegistryError
from diffrl.core.rollout import CollectionSpec
from diffrl.data.hf import EVAL_SPLITS, TRAIN_SPLITS
from diffrl.data.prompts import crop_box, edit_mismatch, image_size
from diffrl.models.base import SourceError
from diffrl.models.registry import FAMILIES
from diffrl.preflight.data import prompt_set


def editing_problems(
    config: Config, spec: CollectionSpec | None, check_files: bool, data: bool, evals: bool
) -> list[str]:
    """An editing family needs source images on every prompt it samples (``data.prompts``
    online, ``eval.prompts``) and edit pairs offline (``synthetic_edit``); any other family takes
    none."""
    try:
        description = getattr(FAMILIES.resolve(config.model.family), "description", None)
    except RegistryError:
        return []  # reported by the model checks
    edits, errors = bool(getattr(description, "edits", False)), []
    name, d = config.model.family, config.data
    online = spec is not None and spec.online
    files = [("data.prompts", d.prompts, TRAIN_SPLITS)] * (data and online)
    files += [("eval.prompts", config.eval.prompts, EVAL_SPLITS)] * (evals and config.eval.enabled)
    images: list[Path] = []
    for where, path, splits in files if check_files else []:
        prompts, _ = prompt_set(path, splits)  # unreadable files are reported by the data / eval checks
        if prompts is not None and prompts.edits != edits:
            errors.append(f"{where}: {edit_mismatch(name, edits, repr(path))}")
        elif prompts is not None and edits:
            images += [image for image in prompts.images if image is not None]
    errors += _source_size_problems(config, description, list(dict.fromkeys(images)))
    if data and spec is not None and not online and spec.offline_items == "images":
        if edits and d.dataset != "synthetic_edit":
            errors.append(
                f"data.dataset: model family {name!r} edits images, so it trains offline on edit pairs "
                f"(a source, an instruction, the edited image): data.dataset=synthetic_edit, got {d.dataset!r}"
            )
        elif not edits and d.dataset == "synthetic_edit":
            errors.append(
                f"data.dataset=synthetic_edit holds edit pairs, but model family {name!r} does not "
                "edit images; use synthetic_text or an image folder"
            )
    if data and edits and spec is not None and not online and spec.offline_items == "pairs":
        errors.append(
            f"model family {name!r} edits images, but a folder of preference pairs has no source "
            "images; train it on online pairs (algorithm.params.pairs: online)"
        )
    return errors


def _source_size_problems(config: Config, description: type, images: list[Path]) -> list[str]:
    """Every source image of a run must resize to one size (``FamilyDescription.source_size``: the rows
    are batched): the first two sizes found, with a file of each, when they do not."""
    s = config.sampling
    if not images or not (
        isinstance(s.height, int) and isinstance(s.width, int) and s.height > 0 and s.width > 0
    ):
        return []  # the family's default size is known only once it loads; it checks then
    found: dict[Any, Path] = {}
    for image in images:
        _, _, w, h = crop_box(*image_size(image), s.height, s.width)
        try:
            size = description.source_size(config, w, h)
        except SourceError as e:
            return [f"source image {str(image)!r}: {e}"]
        if size is None:
            return []
        found.setdefault(size, image)
        if len(found) > 1:
            (a, first), (b, second) = found.items()
            return [
                f"the source images resize to different sizes for model family {config.model.family!r}: "
                f"{str(first)!r} to {a}, {str(second)!r} to {b}; the rows of a run are batched, so "
                "every source needs one size: give images of one aspect ratio and size (they are "
                f"centre-cropped to sampling.height : sampling.width = {s.height} : {s.width} first)"
            ]
    return []
