"""The fleet's policy numbers: how long results, jobs and adverts live, how long a job may wait and run, how often a
worker beats, recovers and retries (each one the default of the flag or setting that overrides it, where one does).
The keys they apply to are common/protocol/keys.py's. Stdlib only, like common/names.py.
"""

from __future__ import annotations

RESULT_TTL = 3600  # seconds a result blob (and its notify list) is kept
RESULT_TTL_BOUND = 7 * 24 * 3600  # a job's own result_ttl above this (or unreadable) gives way to the worker's
JOB_TTL = 24 * 3600  # seconds a job may wait in the queue before rq drops it (rq's `ttl` field)
FAILURE_TTL = 24 * 3600  # seconds a failed rq job stays in the failed registry (rq's default: forever)
JOB_TIMEOUT = 600  # seconds a job may run: past it its lease is no longer renewed, so it lapses and the job
#                    is requeued (a lapse counted toward poison); the watchdog catches a hung pass sooner
JOB_RETRIES = 2  # a job whose worker died is requeued this often (at-least-once), then failed
MAINTENANCE_INTERVAL = 60  # seconds between a worker's rq maintenance runs (the backstop behind leases)
ADVERTISE_TTL = 30  # a worker that stops refreshing stops counting as alive after this long
HEARTBEAT_INTERVAL = 10
LEASE_SECONDS = 6.0  # default --lease-seconds: a claim's life without a renewal (renewed every third)
MAX_LEASE_SECONDS = 600  # the longest --lease-seconds
RECOVER_LIMIT = 1000  # lapsed claims one recover run requeues (the rest on the next run)
MAX_DELIVERIES = 3  # default --max-deliveries: a job whose worker died this often is failed as poison
DRAIN_TIMEOUT = 30.0  # default --drain-timeout

CACHE_TTL = 24 * 3600  # default --cache-ttl: seconds a cached vector lives (the bound on the queue's Redis)
INFLIGHT_TTL = 60  # seconds an in-flight marker outlives its last renewal (a dead leader's followers wait
#                    at most this long, then run on their own)
