"""What a web app imports: Producer and AsyncProducer (plus the gateway and the CLI)."""

from embedfleet.producer.client.aio import AsyncProducer
from embedfleet.producer.client.blocking import Producer

__all__ = ["AsyncProducer", "Producer"]
