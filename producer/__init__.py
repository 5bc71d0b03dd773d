"""What a web app imports: Producer and AsyncProducer (plus the gateway and the CLI)."""

from producer.client.aio import AsyncProducer
from producer.client.blocking import Producer

__all__ = ["AsyncProducer", "Producer"]
