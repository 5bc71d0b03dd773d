"""The queue side of a worker: the pipelined BatchWorker (take, prepare, forward, finish), its leases and
heartbeat, priority levels, the vector cache, in-flight dedup, spread requests, adverts and metrics; builder.py
builds a worker from its settings, the one way (`embedfleet worker` and the tests' harness)."""
