"""Pre-flight: the whole-system checks of a config, before anything loads, every problem at once.

It sits at the top of the layers (it may import everything), in two stages:

- :mod:`~diffrl.preflight.schema`: what the config's values say on their own (binding, ranges,
  arithmetic). No torch, no plugin: the command line runs it before it loads anything.
- the plugin stage, one module per concern: :mod:`~diffrl.preflight.run` (loggers, runner,
  devices, output folder), :mod:`~diffrl.preflight.model` (family, sizes, guidance),
  :mod:`~diffrl.preflight.algorithm` (the algorithm and its collection spec),
  :mod:`~diffrl.preflight.rewards`, :mod:`~diffrl.preflight.data` (prompt files, datasets),
  :mod:`~diffrl.preflight.editing`; :mod:`~diffrl.preflight.plugins` runs them.

:func:`load_config` (bind, then both stages) is what the library and the tests call. It lives in
:mod:`~diffrl.preflight.plugins` and is looked up from there when first asked for, so importing
this package (as the schema stage does) stays free of torch.
"""

from __future__ import annotations

import importlib
from typing import Any

LAZY = {name: "diffrl.preflight.plugins" for name in ("load_config", "validate", "check_plugins")}
"""Names of this package that live in the plugin stage's module, imported on first use."""


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY])
