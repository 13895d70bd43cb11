"""Frozen entry point of `tandem-cli` (same as the `tandem-cli = engine.cli:main` console script)."""

import sys

from engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
