"""SafeJob: the rq Job class of the worker. What a job's hash names is data: never a module to import, a URL to
call or a rate-limit key to act on, and its data is inflated with the worker's cap.

Anyone with producer rights may write a job's hash (`HSET rq:job:<id> failure_callback_name this.s`), and rq
acts on such fields on the paths the worker's rq maintenance takes for jobs it did not run itself:

- StartedJobRegistry.cleanup (an abandoned job: its worker died) runs the failure callback, imported by name
  (`Job.failure_callback` -> `import_attribute`), sends the job's webhooks and frees its rate-limit slot;
- IntermediateQueue.cleanup -> Worker.handle_job_failure (a job stuck between queue and started registry)
  sends webhooks and frees the slot; Queue.enqueue_dependents fetches dependents with the same class;
- `Job.func` imports whatever the data names; `Job.restore` zlib-decompresses `data` and `exc_info` whole.

The BatchWorker hands this class to rq (`job_class=`), so its queues, their registries, the intermediate-queue
cleanup and handle_job_failure all read jobs through it. embedfleet's jobs use no callback, webhook or rate
limit, so dropping them loses nothing.
"""

from __future__ import annotations

from rq.utils import decode_redis_hash

from embedfleet.common.errors import DecodeError
from embedfleet.common.protocol.jobdata import inflate
from embedfleet.common.protocol.taggedjob import TaggedJob

# What rq would import, call or act on when it handles a job; never set by embedfleet.
DROPPED_FIELDS = ("success_callback_name", "failure_callback_name", "stopped_callback_name", "webhooks",
                  "rate_limit_key", "rate_limit_concurrency")
MAX_EXC_INFO = 64 << 10  # bytes of a failure record read back (embedfleet's own are clipped to ~2 KB)


class SafeJob(TaggedJob):
    """An rq Job that never imports, calls or acts on what its hash names (see the module docstring), and that
    takes a Redis Cluster's ids (TaggedJob), which rq's own refuses: rq's maintenance reads a lapsed claim's
    job through this class."""

    def restore(self, raw_data):
        fields = decode_redis_hash(raw_data)
        for name in DROPPED_FIELDS:
            fields.pop(name, None)
        data, exc_info = fields.get("data"), fields.pop("exc_info", None)
        if data is not None:
            fields["data"] = b""  # rq would decompress it whole; it is inflated below, capped
        super().restore(fields)
        if data is not None:
            try:
                self.data = inflate(data)
            except DecodeError:  # larger than any request: kept as it is, it reads as no job data (args raise)
                self.data = data
        if exc_info:
            try:
                self._exc_info = inflate(exc_info, MAX_EXC_INFO).decode("utf-8", "replace")
            except DecodeError:
                self._exc_info = f"(a failure record of more than {MAX_EXC_INFO} bytes, not read)"

    @property
    def func(self):
        """Never imported: the BatchWorker runs a job by reading its data, not by calling what it names."""
        return None

    @property
    def success_callback(self):
        return None

    @property
    def failure_callback(self):
        return None

    @property
    def stopped_callback(self):
        return None
