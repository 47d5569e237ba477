"""memtop: a Textual TUI showing the peak memory offenders among watched processes."""

from importlib.metadata import PackageNotFoundError, version

try:
    #: memtop ships in the memagent distribution, with its version.
    __version__ = version("memagent")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
