"""The held-jobs ledger (worker/serving/ledger.py) without Redis: what a worker holds by claim, what the heartbeat
renews, and the in-flight markers let go once their jobs are no longer held."""

from __future__ import annotations

import threading

from embedfleet.common.protocol.records import Kind, Taken
from embedfleet.worker.serving.ledger import Ledger


def taken(job_id: str, execution: str = "e1", kind: Kind = Kind.STARTED, timeout: float = 60.0) -> Taken:
    return Taken(job_id, kind, execution=execution, timeout=timeout)


def test_only_claimed_jobs_are_held_and_each_claim_apart():
    ledger = Ledger()
    ledger.hold([taken("a"), taken("b", kind=Kind.BAD), taken("c", kind=Kind.CANCELED), taken("d", kind=Kind.STALE)],
                since=1.0)
    ledger.hold([taken("a", execution="e2")], since=2.0)  # taken again (its lease lapsed): a claim of its own
    assert len(ledger) == 3
    ledger.release(answered=[taken("a")])
    assert sorted(job.execution for job in ledger.renewable(3.0) if job.id == "a") == ["e2"]


def test_the_heartbeat_renews_a_job_only_within_its_timeout():
    ledger = Ledger()
    ledger.hold([taken("short", timeout=5.0), taken("long", timeout=100.0), taken("none", timeout=0)], since=10.0)
    assert {job.id for job in ledger.renewable(14.0)} == {"short", "long", "none"}
    assert {job.id for job in ledger.renewable(16.0)} == {"long", "none"}  # past 5 s: its lease may lapse
    assert len(ledger) == 3  # still held: only no longer renewed


def test_released_jobs_let_go_of_the_markers_of_what_they_computed():
    let_go: list[list[str]] = []
    ledger = Ledger(let_go.append)
    ledger.hold([taken("ran"), taken("cancelled"), taken("given-back")], since=0.0)
    ledger.release(answered=[taken("cancelled")], computed=[taken("ran")])
    ledger.release(computed=[taken("given-back")])
    assert let_go == [["ran"], ["given-back"]] and len(ledger) == 0
    ledger.release(computed=[taken("never-held")])  # already released (a late answer): nothing breaks
    assert let_go[-1] == ["never-held"] and len(ledger) == 0


def test_holding_and_releasing_from_several_threads_at_once():
    """The take, finish and heartbeat threads use it together: no claim lost or left behind."""
    ledger, jobs = Ledger(), [[taken(f"{t}-{n}") for n in range(500)] for t in range(4)]
    seen: list[int] = []

    def churn(mine: list[Taken]) -> None:
        for job in mine:
            ledger.hold([job], since=0.0)
            seen.append(len(ledger.renewable(1.0)))
            ledger.release(computed=[job])

    threads = [threading.Thread(target=churn, args=(mine,)) for mine in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(ledger) == 0 and len(seen) == 2000 and 1 <= min(seen) and max(seen) <= 4
