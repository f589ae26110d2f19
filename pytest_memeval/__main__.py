"""``python -m pytest_memeval ...``: the ``memeval`` command (:mod:`pytest_memeval.tools.cli`)."""

from __future__ import annotations

import sys

from pytest_memeval.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
