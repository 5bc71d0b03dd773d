"""The client library a web app imports: Producer (blocking) and AsyncProducer (asyncio), one surface written once
(producer/client/surface.py) over one I/O-free core (core.py, and its reads in reads.py), with the coalesced waits
of the async client."""
