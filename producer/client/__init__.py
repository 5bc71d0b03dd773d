"""The client library a web app imports: Producer (blocking) and AsyncProducer (asyncio) over one
I/O-free core (producer/client/core.py, and its reads in reads.py), with the coalesced waits of the async client."""
