"""The working directory leaves sys.path: imported first by `python -m embedfleet.worker` (worker/__main__.py).

`python -m` puts the directory the command runs in first on sys.path, so a module lying there (a data or
shared directory) would shadow what the worker imports, or be importable by a name read from Redis. Nothing
the worker needs lives there, unless that directory is the source tree the worker runs from: then it stays.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the directory holding `worker`


def drop_working_directory(path: list[str]) -> None:
    """Remove the entry `python -m` prepended (the working directory) from `path`, unless it is the code's."""
    cwd = os.path.realpath(os.getcwd())
    if path and path[0] and os.path.realpath(path[0]) == cwd and cwd != _ROOT:
        del path[0]


drop_working_directory(sys.path)
