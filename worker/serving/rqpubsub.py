"""rq's pub/sub teardown without redis-py's wait: a worker that stops returns at once, not up to 60 s later.

rq 3.0 unsubscribes from its worker channel, then stops redis-py's PubSubWorkerThread, whose stop() joins the
thread. Should the thread read the UNSUBSCRIBE reply in between, it calls get_message again with rq's
`sleep_time` (60 s) for a subscription that never comes, and the join waits that long: rq registers the worker's
death (its hash then expires in 60 s) before it unsubscribes, so a stopped worker could hang its caller for a
minute and lose its hash meanwhile (seen in test teardowns on a busy machine). The thread's run flag is cleared
first, so the reply ends its loop.
"""

from __future__ import annotations


class PromptUnsubscribe:
    """Mixed into an rq Worker class, before it: `class W(PromptUnsubscribe, SimpleWorker)`."""

    def unsubscribe(self):
        running = getattr(getattr(self, "pubsub_thread", None), "_running", None)  # redis-py's PubSubWorkerThread
        if running is not None:
            running.clear()
        super().unsubscribe()
