"""A redis-server of a test's own with a password, ACL users and TLS (a throwaway CA made with openssl),
and the fleet's real processes (worker, gateway) started against any Redis URL."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import redis

from embedfleet.common.redisclient import ACL_GRANT
from embedfleet.common.redisserver import find_redis_server, free_port
from tests.commands import ROOT
from tests.systemtools import missing, need

DEFAULT_PASSWORD = "d3fault-pw"
FLEET_PASSWORD = "fl33t-pw"
# What docs/security.md's "Secured Redis" grants an embedfleet user; `narrow` lacks rq's keys.
FLEET_ACL = ACL_GRANT
NARROW_ACL = "~embedfleet:* &* +@all"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate signed by it, and another CA."""
    need("openssl", untested="TLS to Redis")
    folder.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                "-days", "2", "-subj", f"/CN=embedfleet test {ca}", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=folder)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext", cwd=folder)
    return {name: folder / name for name in ("ca.crt", "other-ca.crt", "server.crt", "server.key",
                                             "client.crt", "client.key")}


class SecureRedis:
    """redis-server with `requirepass`, ACL users `fleet` (enough) and `narrow` (no rq keys), a plain port
    and a TLS port that demands a client certificate."""

    def __init__(self, folder: Path, pki: dict[str, Path]):
        self.folder, self.pki = folder, pki
        self.port, self.tls_port = free_port(), free_port()
        conf = folder / "redis.conf"
        conf.write_text("\n".join([
            f"port {self.port}", "bind 127.0.0.1", f"dir {folder}", 'save ""', "appendonly no",
            f"logfile {folder / 'redis.log'}", f"requirepass {DEFAULT_PASSWORD}",
            f"user fleet on >{FLEET_PASSWORD} {FLEET_ACL}", f"user narrow on >{FLEET_PASSWORD} {NARROW_ACL}",
            f"tls-port {self.tls_port}", f"tls-cert-file {pki['server.crt']}", f"tls-key-file {pki['server.key']}",
            f"tls-ca-cert-file {pki['ca.crt']}", "tls-auth-clients yes", ""]))
        self.process = subprocess.Popen([find_redis_server(), str(conf)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=self.port, password=DEFAULT_PASSWORD, socket_timeout=5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                log = (folder / "redis.log").read_text() if (folder / "redis.log").exists() else ""
                if self.process.poll() is not None:
                    if "TLS" in log or "tls" in log:
                        missing(f"TLS support in {find_redis_server()}", f"TLS to Redis ({log[-300:]})")
                    raise AssertionError(f"redis-server did not start: {log[-500:]}") from None
                assert time.monotonic() < deadline, "redis-server did not answer within 10 s"
                time.sleep(0.05)
        client.close()

    def url(self, user: str = "fleet", password: str = FLEET_PASSWORD, tls: bool = False) -> str:
        scheme, port = ("rediss", self.tls_port) if tls else ("redis", self.port)
        return f"{scheme}://{user}:{password}@127.0.0.1:{port}/0"

    def tls_flags(self, ca: str = "ca.crt") -> list[str]:
        return ["--redis-tls-ca", str(self.pki[ca]), "--redis-tls-cert", str(self.pki["client.crt"]),
                "--redis-tls-key", str(self.pki["client.key"])]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def embedfleet_process(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def stop(process: subprocess.Popen) -> str:
    """Stop a process this test started; returns what it printed."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
    out, _ = process.communicate()
    return out or ""


def wait_healthy(gateway_url: str, processes: list[subprocess.Popen], timeout: float = 60) -> dict:
    """Wait until the gateway's /health says ok (Redis reachable, a live worker); its body."""
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            assert process.poll() is None, f"a fleet process exited early: {stop(process)[-2000:]}"
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{gateway_url}/health", timeout=5) as answer:
                return json.loads(answer.read())
        assert time.monotonic() < deadline, "the gateway never became healthy"
        time.sleep(0.3)


def post_embeddings(gateway_url: str, model: str, text: str) -> dict:
    request = urllib.request.Request(f"{gateway_url}/v1/embeddings", method="POST",
                                     data=json.dumps({"model": model, "input": text}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())
