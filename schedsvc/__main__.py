"""``python -m schedsvc``: the ``schedsvc`` command without its console script."""

import sys

from .cli import main

sys.exit(main())
