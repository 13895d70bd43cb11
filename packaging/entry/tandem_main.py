"""Frozen entry point of both `tandem` and `tandem-cli`.

The bundle ships one executable; `tandem-cli` is a link to it (a second copy on Windows), and the
name it was started under picks the program: `app.main:main` or `engine.cli.main:main`, the same
functions as the console scripts of a source install.
"""

import os
import sys


def started_as_cli(argv0: str) -> bool:
    name = os.path.basename(argv0).lower()
    return name.startswith("tandem-cli")


if __name__ == "__main__":
    if started_as_cli(sys.argv[0]):
        from engine.cli.main import main
    else:
        from app.main import main
    sys.exit(main())
