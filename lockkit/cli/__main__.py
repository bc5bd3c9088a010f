"""``python -m lockkit.cli``: the ``lockkit`` command."""

import sys

from .commands import main

sys.exit(main())
