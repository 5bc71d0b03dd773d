"""embedfleet: an embedding fleet behind Redis queues. `from embedfleet import Producer, AsyncProducer`.

One import package holds the three parts: `embedfleet.common` (the contract: wire models, errors, the Redis
protocol; no torch), `embedfleet.producer` (the clients, the HTTP gateway, the CLI) and `embedfleet.worker` (the
model side). A wheel installs them inside this folder; a checkout keeps them beside it (the repository's
`common/`, `producer/` and `worker/`), and this package's search path takes them from there.
"""

from __future__ import annotations

import os

# In a checkout the parts sit beside this folder, not inside it: search there too (a wheel has them inside, and
# nothing beside it is added then). pyproject.toml's package-dir maps the same folders for a build.
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(__path__[0], "common")) and os.path.isfile(
        os.path.join(_checkout, "common", "__init__.py")):
    __path__.append(_checkout)

__all__ = ["AsyncProducer", "Producer"]


def __getattr__(name: str):
    # Imported on first use: `python -m embedfleet.worker` loads this package too, and needs no client.
    if name == "Producer":
        from embedfleet.producer.client.blocking import Producer  # noqa: PLC0415 (see above)

        return Producer
    if name == "AsyncProducer":
        from embedfleet.producer.client.aio import AsyncProducer  # noqa: PLC0415 (see above)

        return AsyncProducer
    raise AttributeError(f"module 'embedfleet' has no attribute {name!r}")
