"""Where the shared test helpers used to be: they are in ``tests/helpers.py`` now.

Kept only for ``tests/cli/test_demo.py``, which imports ``within`` from here and is another change's to edit.
"""

from __future__ import annotations

from ..helpers import within

__all__ = ["within"]
