"""The installed fastrun version (recorded in every cache entry)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fastrun")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
