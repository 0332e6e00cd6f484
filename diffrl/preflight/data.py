"""Plugin stage: the files a run reads: the prompt files (``data.prompts``, ``eval.prompts``)
and the offline dataset an algorithm's collection spec asks for."""

from __future__ import annotations

import functools

from diffrl.config import Config, EvalConfig
from diffrl.core.rollout import CollectionSpec
from diffrl.data.hf import EVAL_SPLITS, TRAIN_SPLITS
from diffrl.data.offline import SYNTHETIC, DatasetError, scan_image_data, scan_pair_folder
from diffrl.data.prompts import PromptFileError, PromptSet, load_prompts


def data_problems(config: Config, spec: CollectionSpec | None, check_files: bool) -> list[str]:
    """``spec``: the algorithm's collection spec (None when its config did not build)."""
    d, errors = config.data, []
    if not check_files:
        return errors
    online = spec is not None and spec.online
    # online rollouts sample data.prompts; the synthetic datasets render them
    if online or d.dataset in SYNTHETIC:
        _, problem = prompt_count(d.prompts)
        if problem:
            errors.append(f"data.prompts: {problem}")
    if d.dataset and d.dataset not in SYNTHETIC and not online:
        try:
            pairs = spec is not None and spec.offline_items == "pairs"
            (scan_pair_folder if pairs else scan_image_data)(d.dataset)
        except DatasetError as e:
            errors.append(f"data.dataset: {e}")
    return errors


def eval_prompt_problems(e: EvalConfig, check_files: bool) -> list[str]:
    """``eval.prompts`` readable, and holding ``eval.num_prompts`` prompts."""
    if not check_files:
        return []
    count, problem = prompt_count(e.prompts, EVAL_SPLITS)
    if problem:
        return [f"eval.prompts: {problem}"]
    if e.num_prompts is not None and e.num_prompts > count:
        return [
            f"eval.num_prompts is {e.num_prompts}, but eval.prompts {e.prompts!r} holds {count} "
            f"prompts; ask for at most {count} (null: all of them)"
        ]
    return []


def prompt_count(path: str, splits: tuple[str, ...] = TRAIN_SPLITS) -> tuple[int, str | None]:
    """The number of prompts in a prompt file (``splits``: the split a ``datasets`` folder
    without one named reads), or the problem that makes it unreadable."""
    prompts, problem = prompt_set(path, splits)
    return (0, problem) if prompts is None else (len(prompts), None)


@functools.lru_cache(maxsize=8)  # cleared by each validation: files may change between two
def prompt_set(path: str, splits: tuple[str, ...] = TRAIN_SPLITS) -> tuple[PromptSet | None, str | None]:
    """A prompt file's prompts (each source image checked), or the problem that makes it
    unreadable; read once per validation (several checks ask for it, and each of an edit set's
    images is opened to be checked)."""
    try:
        return load_prompts(path, splits), None
    except PromptFileError as e:
        return None, str(e)
