"""``python -m diffrl.cli``: the ``diffrl`` command."""

import os
import sys

# `-m` puts the working directory first on sys.path: a torch.py or safetensors.py lying there would
# shadow diffrl's own imports. The `diffrl` console script does not put it there; neither does this
# (PYTHONPATH still adds folders on purpose). diffrl.cli's own light imports came before this line.
if sys.path and not sys.flags.safe_path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from diffrl.core import pins  # noqa: E402 - after the path is made safe

pins.pin_environment()  # before torch loads, as the diffrl command does (run.deterministic)

from diffrl.cli import main  # noqa: E402
from diffrl.core.user_code import end_process  # noqa: E402

sys.exit(end_process(main()))  # no thread a plugin left running keeps the process alive
