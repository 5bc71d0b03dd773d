"""The Redis protocol between producers and workers; nothing else writes these keys. Every write is one Lua script
(scripts/*.lua, loaded one way by scripts.py), and everything a script reads from Redis is judged before its
first write (tests/faults/test_protocol_hostile.py). By Redis concept:

    keys.py         every key on one page (the fleet's; rq's own in rqkeys.py, the Batch API's in batchkeys.py)
    enqueueing.py   requests onto a model's queues (rq's job hash: rqjobs.py, its data: jobdata.py)
    claims.py       a worker's claims and their leases: take, finish, refresh, recover, give back
    answering.py    answers outside a claim: publish, cancel, join, a gateway job's answer options
    adverts.py      the models served and their workers: withdraw
    dedup.py        in-flight dedup's markers: attach, release

records.py holds what the operations take and return; slotmoves.py sends again while a Redis Cluster slot moves;
taggedjob.py is rq's Job for a cluster's tagged ids.
"""
