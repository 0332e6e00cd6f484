"""Model families by short name (or a dotted path to a user's ``ModelFamily`` subclass)."""

from __future__ import annotations

import torch

from diffrl.config import Config
from diffrl.core import torch_state
from diffrl.core.registry import Registry, override_problems
from diffrl.core.user_code import kind, plugin_named, returned_wrong
from diffrl.logging.quiet import quiet_libraries
from diffrl.models.base import DTYPES, ModelFamily
from diffrl.models.numerics import resolve_numerics

FAMILIES = Registry(
    "model family",
    {
        "tiny": "diffrl.models.tiny:TinyFamily",
        "sd3": "diffrl.models.sd3:SD3Family",
        "flux": "diffrl.models.flux:FluxFamily",
        "flux_kontext": "diffrl.models.flux_kontext:FluxKontextFamily",
        "flux2": "diffrl.models.flux2:Flux2Family",
        "qwen_image": "diffrl.models.qwen_image:QwenImageFamily",
        "qwen_image_edit": "diffrl.models.qwen_image_edit:QwenImageEditFamily",
        "wan": "diffrl.models.wan:WanFamily",
        "cosmos3": "diffrl.models.cosmos3:Cosmos3Family",
        "ltx2": "diffrl.models.ltx2:LTX2Family",
        "z_image": "diffrl.models.z_image:ZImageFamily",
    },
    check=lambda obj: (
        "; ".join(override_problems(obj, ModelFamily)) or None
        if isinstance(obj, type) and issubclass(obj, ModelFamily)
        else None  # not a subclass at all: the model checks say so
    ),
)
# DTYPES lives in base (the families import it from there); it is imported here for load_family


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_family(config: Config) -> ModelFamily:
    cls = FAMILIES.resolve(config.model.family)
    quiet_libraries()  # the family's libraries are imported now: no loading bars of theirs in the log
    options = cls.description.parse_options(config.model.options)
    device = resolve_device(config.run.device)
    with torch_state.guarding(lambda: plugin_named(cls)):
        family = cls.load(config.model.path, device, DTYPES[config.model.dtype], options)
    if not isinstance(family, ModelFamily):  # a variant may load as its own class (Qwen-Image-Edit)
        raise returned_wrong(
            cls,
            "load()",
            kind(family),
            f"an instance of {cls.__name__} (e.g. cls(transformer, device, options))",
        )
    if not isinstance(getattr(family, "transformer", None), torch.nn.Module):
        raise returned_wrong(
            cls,
            "load()",
            f"a family whose transformer is {kind(getattr(family, 'transformer', None))}",
            "a family holding its transformer (a torch.nn.Module): call ModelFamily.__init__",
        )
    family.numerics = resolve_numerics(config.model.autocast, config.model.compile, device)
    return family
