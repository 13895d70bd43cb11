"""Tandem's engine: models, speculative decoding, storage and the CLI. Never imports Qt."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tandem")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"
