"""The `embedfleet` command line: `up`, `embed` (bulk files), `status`, `failed`, `health`; `worker` and
`gateway` exec their own modules."""

from embedfleet.producer.cli.main import main

__all__ = ["main"]
