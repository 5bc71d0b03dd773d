"""Every Redis fault a client can meet answers as our own error (issue 49, item 2), on real servers: a Redis Cluster
master killed without a replica (CLUSTERDOWN), a Redis loading its RDB (LOADING), a script past its time limit
(BUSY), the script cache flushed (NOSCRIPT), an ACL user without a command (NOPERM). Producer.submit and .embed,
AsyncProducer.submit and the gateway's POST /v1/embeddings each get UnavailableError (redis_unavailable) / 503 with
Retry-After and a message that quotes Redis: never a bare redis-py exception, never a 500 (producer/client/
redisfaults.py; the table is docs/reliability.md#redis-faults).

No worker runs: the model is advertised by hand (a worker's advert, worker/serving/advertise.py), so a submit that
Redis takes is queued, and one that fails, fails on Redis."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from embedfleet import AsyncProducer, Producer
from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import ResultTimeoutError, UnavailableError
from embedfleet.common.names import slot_tag
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import ACL_GRANT, connect
from embedfleet.common.redisserver import RedisServer
from embedfleet.worker.serving.advertise import Advertiser
from tests import gatewayserver
from tests.rediscluster import LocalCluster

MODEL = "faulty"
CAPS = ModelCapabilities(name=MODEL, max_model_len=64, embedding_size=8, vocab_size=1000)
ADVERT_SECONDS = 600  # the hand-made advert outlives the test (a worker would renew it)
RETRY_AFTER = 1  # the gateway's --retry-after
DEADLINE = 60.0  # seconds any fault may take to show, or a probe to end


def advertise(connection) -> None:
    Advertiser(connection, CAPS, "faults-worker", ttl=ADVERT_SECONDS).advertise()


class Clients:
    """Every kind of client on one Redis URL: a Producer, an AsyncProducer (on an event loop of its own) and a real
    gateway (uvicorn, in a thread) with an HTTP client."""

    def __init__(self, url: str):
        self.producer = Producer(url)
        self.loop = asyncio.new_event_loop()
        self.aproducer = self.loop.run_until_complete(_async_producer(url))
        self.gateway = gatewayserver.Server(gatewayserver.settings(url, request_timeout=0.5, batch_max_running=0,
                                                                   retry_after=RETRY_AFTER))
        self.http = httpx.Client(base_url=self.gateway.url, timeout=30)

    def ask(self) -> dict[str, object]:
        """One call of each kind: what it raised (None: it returned), or the HTTP response."""
        return {"Producer.submit": _raised(lambda: self.producer.submit("a text", MODEL)),
                "Producer.embed": _raised(lambda: self.producer.embed("a text", MODEL, timeout=0.5)),
                "AsyncProducer.submit": _raised(lambda: self.loop.run_until_complete(self.aproducer.submit(
                    "a text", MODEL))),
                "POST /v1/embeddings": self.http.post("/v1/embeddings", json={"model": MODEL, "input": "a text"})}

    def close(self) -> None:
        self.http.close()
        self.gateway.stop()
        self.loop.run_until_complete(self.aproducer.close())
        self.loop.close()
        self.producer.close()

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _async_producer(url: str) -> AsyncProducer:
    return AsyncProducer(url)


def _raised(call) -> BaseException | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - what each client raises is the finding
        return exc
    return None


def unavailable_message(kind: str, answer) -> str:
    """The message of `answer` after checking that it is UnavailableError / 503 redis_unavailable with Retry-After."""
    if isinstance(answer, httpx.Response):
        error = answer.json().get("error", {})
        assert (answer.status_code, error.get("code")) == (503, "redis_unavailable"), f"{kind}: {answer.text}"
        assert answer.headers.get("retry-after") == str(RETRY_AFTER), f"{kind}: {answer.headers}"
        return error["message"]
    assert isinstance(answer, UnavailableError), f"{kind}: {answer!r}"
    assert answer.code == "redis_unavailable"
    return answer.message


def assert_unavailable(answers: dict[str, object], says: str) -> None:
    for kind, answer in answers.items():
        message = unavailable_message(kind, answer)
        assert says in message, f"{kind}: {message}"


def no_tracebacks(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.exc_info]


def raw_client(port: int) -> redis.Redis:
    """A client that tries once: it sees Redis's own answer (LOADING, BUSY) as it comes."""
    return redis.Redis(port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0))


# -- (a) a Redis Cluster master killed, without a replica to take over ----------------------------------------------
def _cluster_state(cluster: LocalCluster) -> str:
    with raw_client(cluster.live()[0].port) as client:
        return client.cluster("INFO")["cluster_state"]


def _bystander(cluster: LocalCluster, connection) -> int:
    """The port of a master that holds none of the model's keys: killed, it takes the whole cluster down
    (cluster-require-full-coverage), and the model's own masters answer CLUSTERDOWN."""
    used = {connection.get_node_from_key(key).port for key in (
        slot_tag(MODEL), keys.MODELS_KEY, keys.model_key(MODEL), keys.model_workers_key(MODEL))}
    return next(port for port in cluster.master_ports() if port not in used)


def accepted(kind: str, answer) -> bool:
    """Whether Redis took the call (before the cluster knew a master had died): a submit returns, an embed or a
    POST waits for a worker that is not there; else the answer must be UnavailableError / 503."""
    if isinstance(answer, httpx.Response) and answer.status_code == 504 or answer is None or \
            isinstance(answer, ResultTimeoutError):
        return True
    unavailable_message(kind, answer)
    return False


def test_a_cluster_master_killed_without_a_replica_answers_unavailable(tmp_path, caplog):
    """The issue's probe, bounded: from a master's death on, each call of each kind is taken (until the cluster
    knows) or answered UnavailableError / 503 with Retry-After; once the cluster reports cluster_state:fail, all
    quote CLUSTERDOWN; three rounds after that end it."""
    with LocalCluster(tmp_path / "cluster", masters=3) as cluster:
        connection = connect(cluster.url)
        advertise(connection)
        victim = _bystander(cluster, connection)
        connection.close()
        with Clients(cluster.url) as clients:
            assert all(accepted(kind, answer) for kind, answer in clients.ask().items()), "served before the fault"
            queued = clients.producer.submit("a text", MODEL)  # (on its notify list)
            streamed = clients.loop.run_until_complete(clients.aproducer.submit("a text", MODEL))  # (a reply stream)
            killed = next(s for s in cluster.servers if s.port == victim).process
            killed.kill()
            killed.wait()
            caplog.clear()
            deadline, refused, failed = time.monotonic() + DEADLINE, 0, 0
            while failed < 3:
                assert time.monotonic() < deadline, f"the cluster did not report fail within {DEADLINE:g} s"
                down = _cluster_state(cluster) == "fail"
                answers = clients.ask()
                refused += sum(not accepted(kind, answer) for kind, answer in answers.items())
                if down and failed:  # (the first round after: the news may still be spreading to the other nodes)
                    assert_unavailable(answers, "CLUSTERDOWN")
                failed += down
            # waits on requests queued before: their readers and listeners ride the outage out; the status read
            # that a timeout's message makes says it
            waits = {"Producer.wait": _raised(lambda: clients.producer.wait(queued, timeout=1)),
                     **{f"AsyncProducer.wait ({i})": _raised(lambda i=i: clients.loop.run_until_complete(
                         clients.aproducer.wait(i, timeout=1))) for i in (streamed, queued)}}
            assert_unavailable(waits, "CLUSTERDOWN")
    assert refused >= 2 * len(answers)
    assert not no_tracebacks(caplog), "a Redis fault is no unexpected error"


# -- (b) a Redis loading its dataset -----------------------------------------------------------------------------
LOADED_KEYS = 40_000  # with key-load-delay below: a load of several seconds here (~0.17 ms a key)
KEY_LOAD_DELAY_US = 50


def _loading(port: int) -> bool:
    with raw_client(port) as client:
        try:
            return bool(client.info("persistence")["loading"])
        except redis.ConnectionError:  # not listening yet
            return False


def test_a_redis_loading_its_data_answers_unavailable_then_serves(tmp_path, caplog):
    """A real RDB load: DEBUG POPULATE, SAVE, restart; key-load-delay stretches the load (Redis's own knob for its
    tests) so that every kind of call meets `loading:1`. Once loaded, the same clients submit again."""
    folder = tmp_path / "redis"
    folder.mkdir()
    (folder / "redis.conf").write_text(f"enable-debug-command local\nkey-load-delay {KEY_LOAD_DELAY_US}\n"
                                       "loading-process-events-interval-bytes 1024\n")
    server = RedisServer(folder / "data", config_file=folder / "redis.conf").start()
    try:
        with raw_client(server.port) as client:
            client.execute_command("DEBUG", "POPULATE", LOADED_KEYS, "filler", 10)
            advertise(client)
            client.save()
        with Clients(server.url) as clients:
            server.stop()
            starting = threading.Thread(target=server.start, kwargs={"load_timeout": DEADLINE}, daemon=True)
            starting.start()
            deadline = time.monotonic() + DEADLINE
            while not _loading(server.port):
                assert time.monotonic() < deadline and starting.is_alive(), "Redis did not start loading"
                time.sleep(0.01)
            answers = clients.ask()
            assert _loading(server.port), "the load ended before every call was answered: load more keys"
            assert_unavailable(answers, "LOADING")
            starting.join(DEADLINE)
            assert not starting.is_alive() and not _loading(server.port)
            assert clients.producer.submit("a text", MODEL)
            assert clients.loop.run_until_complete(clients.aproducer.submit("a text", MODEL))
    finally:
        server.stop()
    assert not no_tracebacks(caplog)


# -- (c) a script running past busy-reply-threshold ---------------------------------------------------------------
BUSY_SCRIPT = """local start = tonumber(redis.call('TIME')[1])
while tonumber(redis.call('TIME')[1]) - start < tonumber(ARGV[1]) do end
return 1"""


def test_a_script_past_its_time_limit_answers_unavailable_naming_busy(configured_redis, caplog):
    server = configured_redis("lua-time-limit 100")  # busy-reply-threshold, in ms
    with raw_client(server.port) as client:
        advertise(client)
    with Clients(server.url) as clients:
        assert clients.producer.submit("a text", MODEL), "the model is served before the fault"
        outcome: list = []

        def run_script() -> None:  # it ends by itself after DEADLINE at the latest
            with redis.Redis(port=server.port) as client:
                outcome.append(_raised(lambda: client.eval(BUSY_SCRIPT, 0, int(DEADLINE))))

        busy = threading.Thread(target=run_script, daemon=True)
        busy.start()
        deadline = time.monotonic() + DEADLINE
        while True:
            with raw_client(server.port) as client:
                if isinstance(_raised(client.ping), redis.ResponseError):
                    break
            assert time.monotonic() < deadline, "Redis did not get busy"
            time.sleep(0.01)
        try:
            answers = clients.ask()
        finally:
            with raw_client(server.port) as client:
                client.script_kill()
            busy.join(DEADLINE)
        assert_unavailable(answers, "BUSY")
        assert "Script killed" in str(outcome[0])
        assert clients.producer.submit("a text", MODEL), "served again once the script ended"
    assert not no_tracebacks(caplog)


# -- (d) the script cache flushed between two submits -----------------------------------------------------------
def _noscript_errors(client: redis.Redis) -> int:
    return int(client.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0))


def test_a_flushed_script_cache_is_loaded_again_by_every_client(redis_url, redis_client):
    """SCRIPT FLUSH between two submits of each client: the second is refused NOSCRIPT (Redis counts it), runs
    the script by source (common/protocol/scripts.py) and is queued."""
    advertise(redis_client)
    producer = Producer(redis_url)
    loop = asyncio.new_event_loop()
    aproducer = loop.run_until_complete(_async_producer(redis_url))
    try:
        for kind, submit in (("Producer.submit", lambda: producer.submit("a text", MODEL)),
                             ("AsyncProducer.submit", lambda: loop.run_until_complete(aproducer.submit("a text",
                                                                                                       MODEL))),
                             ("Producer.embed", lambda: producer.embed("a text", MODEL, timeout=0.2))):
            for flushed in (False, True):
                if flushed:
                    redis_client.script_flush()
                refused, depth = _noscript_errors(redis_client), producer.queue_depth(MODEL)
                outcome = _raised(submit)
                # (embed: queued, and no worker answers it)
                assert outcome is None or isinstance(outcome, ResultTimeoutError), f"{kind}: {outcome!r}"
                assert producer.queue_depth(MODEL) == depth + 1, kind
            assert _noscript_errors(redis_client) > refused, f"{kind}: the script was run by SHA first"
    finally:
        loop.run_until_complete(aproducer.close())
        loop.close()
        producer.close()


# -- (e) an ACL user without a command a submit needs ------------------------------------------------------------
def test_an_acl_user_without_evalsha_gets_the_access_error(configured_redis, caplog):
    """The start-up probe (EVAL) passes; the submit's EVALSHA is refused NOPERM: docs/security.md's one line, as
    UnavailableError / 503, naming the command and the grant."""
    server = configured_redis(f"user narrow on >narrow-pw {ACL_GRANT} -evalsha")
    with raw_client(server.port) as client:
        advertise(client)
    url = f"redis://narrow:narrow-pw@127.0.0.1:{server.port}/0"
    with Producer(url) as producer:
        producer.check()  # the start-up probe does not see it
    with Clients(url) as clients:
        answers = clients.ask()
    assert_unavailable(answers, "may not do what embedfleet needs")
    assert_unavailable(answers, "evalsha")
    assert not no_tracebacks(caplog)
