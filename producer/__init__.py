"""What a web app imports: Producer and AsyncProducer (plus the gateway and the CLI)."""

from producer.aio import AsyncProducer
from producer.client import Producer

__all__ = ["AsyncProducer", "Producer"]
