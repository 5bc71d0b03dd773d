"""rq's pub/sub teardown without redis-py's wait: a worker that stops returns at once, not up to 60 s later.

rq 3.0 unsubscribes from its worker channel, then stops redis-py's PubSubWorkerThread, whose stop() joins the
thread. Should the thread read the UNSUBSCRIBE reply in between, it calls get_message again with rq's
`sleep_time` (60 s) for a subscription that never comes, and the join waits that long: rq registers the worker's
death (its hash then expires in 60 s) before it unsubscribes, so a stopped worker could hang its caller for a
minute and lose its hash meanwhile (seen in test teardowns on a busy machine). The thread's run flag is cleared
first, so the reply ends its loop. And rq's stop() joins without a bound: a thread stuck reconnecting (a Redis
Cluster master that just failed over, its socket read waiting out SOCKET_TIMEOUT) would hold the worker's exit;
the join here waits STOP_SECONDS at most (the thread is a daemon, and rq closes its pub/sub connection next).
"""

from __future__ import annotations

from rq import SimpleWorker

STOP_SECONDS = 2.0


class PromptUnsubscribe:
    """Mixed into an rq Worker class, before it: `class W(PromptUnsubscribe, SimpleWorker)`."""

    def unsubscribe(self):
        thread = getattr(self, "pubsub_thread", None)  # redis-py's PubSubWorkerThread
        running = getattr(thread, "_running", None)
        if running is not None:
            running.clear()
            stop = type(thread).stop
            thread.stop = lambda: stop(thread, timeout=STOP_SECONDS)
        super().unsubscribe()


class PromptSimpleWorker(PromptUnsubscribe, SimpleWorker):
    """rq's own SimpleWorker with this teardown: plain rq as the tests and benches run it beside ours (with
    redis-py 8.2 a plain SimpleWorker's burst sometimes ends 60 s late, in its teardown)."""
