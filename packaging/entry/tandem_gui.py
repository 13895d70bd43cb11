"""Frozen entry point of `tandem` (same as the `tandem = app.main:main` console script)."""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
