"""``python -m diffrl.cli``: the ``diffrl`` command."""

import sys

from diffrl.cli import main

sys.exit(main())
