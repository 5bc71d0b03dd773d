"""The rq job function (common.protocol.jobdata.JOB_FUNCS names it); only BatchWorker may serve it, in bulk."""

from __future__ import annotations

from embedfleet.common.protocol.jobdata import JOB_FUNC


class WrongWorkerError(RuntimeError):
    """A plain `rq worker` picked up an embedding job."""


def embed(request: bytes) -> None:
    """Never runs in a healthy fleet: BatchWorker decodes the args itself and embeds many requests at once.

    A plain `rq worker` would load the model per job (or not at all), so it fails the job loudly instead.
    """
    raise WrongWorkerError(
        f"{JOB_FUNC} jobs are served in batches by the embedfleet worker, not by a plain `rq worker`: "
        "stop this worker and run `embedfleet worker` on this queue")
