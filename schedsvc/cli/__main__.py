"""``python -m schedsvc.cli``: the ``schedsvc`` command without its console script."""

import sys

from . import main

sys.exit(main())
