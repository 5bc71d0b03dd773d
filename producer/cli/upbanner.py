"""What `embedfleet up` prints once its fleet is up: how to reach it, with commands that run as printed."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def command(name: str) -> str:
    """How to run this installation's `name` (embedfleet, rq, python) from the user's shell: the bare name
    where PATH finds this very one, else its path, relative to the current directory when inside it (a
    `make up` in a clone: `.venv/bin/embedfleet`). `up` runs as its venv's python: the commands are its
    neighbours."""
    mine = Path(sys.executable) if name == "python" else Path(sys.executable).parent / name
    found = shutil.which(name)
    if not mine.exists():  # installed some other way (pip --user, a distribution's package): PATH's, or the module
        return name if found or name != "embedfleet" else f"{sys.executable} -m embedfleet.producer.cli"
    if found and os.path.samefile(found, mine):
        return name
    relative = os.path.relpath(mine)
    return str(mine) if relative.startswith("..") else relative


def banner(url: str, name: str, gateway_url: str | None, api_key: str | None) -> str:
    """The lines `up` prints when its fleet is up (the last ones of a quiet terminal)."""
    python, embedfleet = command("python"), command("embedfleet")
    lines = [
        f"embedfleet is up: model '{name}' on {url}",
        f"  Python:  {python} -c \"from embedfleet import Producer; print(Producer().embed(['hello world']).shape)\"",
    ]
    if gateway_url:
        # The key itself is never printed: the line reads it from the caller's shell.
        keyed = api_key or os.environ.get("EMBEDFLEET_API_KEY")
        auth = " -H \"Authorization: Bearer $EMBEDFLEET_API_KEY\"" if keyed else ""
        lines += [f"  HTTP:    curl {gateway_url}/v1/embeddings -H 'Content-Type: application/json'{auth} "
                  f"-d '{{\"model\": \"{name}\", \"input\": \"hello world\"}}'"]
        if api_key:
            lines += ["           (export EMBEDFLEET_API_KEY=<the key given to --api-key> first)"]
    lines += [f"  Status:  {embedfleet} status   (this fleet's Redis and gateway, its queues and workers)",
              f"  rq:      {command('rq')} info --url {url}"
              " --serializer embedfleet.common.serializer.MsgpackSerializer",
              "From now on only problems and restarts are printed (--access-log: every HTTP request too). "
              "Ctrl-C stops everything."]
    return "\n".join(lines)
