"""How `embedfleet worker --replicas 2` ends, and its engines with it (worker/serving/supervise.py): a supervisor
killed outright takes its engines with it, each drained and withdrawn; a SIGTERMed one exits as soon as its
engines have; Ctrl-C in a terminal (SIGINT to the whole foreground process group) reaches each engine once, and
the command exits 130. Real supervisor and engine processes, a real Redis; bounded in time."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from embedfleet import Producer
from tests.commands import ROOT, running, wait_for
from tests.supervisors import MODEL, engines, supervisor


def serving(conn, parent, log, engine_pids) -> dict[str, int]:
    """Once both engines advertise: engine name -> pid (checked to be the supervisor's children)."""
    wait_for(lambda: len(engines(conn)) == 2 or parent.poll() is not None, 120)
    assert parent.poll() is None, log.read_text()[-3000:]
    named = {name: facts["pid"] for name, facts in engines(conn).items()}
    assert set(named.values()) == engine_pids(), (named, log.read_text()[-3000:])
    return named


def drain_lines(log, name: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if f"worker {name}: SIG" in line]


def test_a_supervisor_killed_outright_takes_its_engines_with_it(redis_url, redis_client, tmp_path):
    """SIGKILL cannot be forwarded: each engine learns of its parent's death from the kernel (a SIGTERM), drains,
    withdraws its advert and exits, so that a supervisor started again never serves beside orphans."""
    with supervisor(redis_url, tmp_path, "--replicas", "2") as (parent, log, engine_pids):
        named = serving(redis_client, parent, log, engine_pids)
        parent.kill()
        parent.wait()
        wait_for(lambda: not any(running(pid) for pid in named.values()), 60)
        assert engines(redis_client) == {}, log.read_text()[-3000:]
        assert Producer(redis_url).fleet()["workers"] == []  # what `embedfleet status` lists
        for name in named:
            assert [line.split(": ", 2)[-1] for line in drain_lines(log, name)] == [
                "SIGTERM: draining (a second signal exits at once)"], log.read_text()[-3000:]


def test_a_sigtermed_supervisor_exits_as_soon_as_its_engines_have(redis_url, redis_client, tmp_path, minilm_path):
    """The bundled model (torch and transformers loaded, as users run it), busy: the engines drain and withdraw,
    then exit without the seconds an interpreter spends unloading those modules (10.5 s seen, 3-8 s here before
    the fix), and the supervisor exits right after them. The bound is ten times what it takes here."""
    with supervisor(redis_url, tmp_path, "--replicas", "2", "--model", minilm_path,
                    "--max-batch-tokens", "2048", "--max-batch-size", "32") as (parent, log, engine_pids):
        named = serving(redis_client, parent, log, engine_pids)
        producer = Producer(redis_url)
        ids = producer.submit_many([[f"text {i} in a queue deep enough to keep both busy"] * 4
                                    for i in range(2000)], MODEL)
        assert producer.wait(ids[0], timeout=60) is not None
        parent.send_signal(signal.SIGTERM)
        wait_for(lambda: not engines(redis_client) or parent.poll() is not None, 60)
        withdrawn = time.monotonic()  # both have drained and withdrawn: only their exits are left
        assert parent.wait(60) == 0, log.read_text()[-3000:]
        exited = time.monotonic() - withdrawn
        assert exited < 2.0, (exited, log.read_text()[-3000:])
        assert not any(running(pid) for pid in named.values())
    text = log.read_text()
    assert len(re.findall(r"stopped \(exited with code 0\)", text)) == 2, text[-3000:]


def test_drained_engines_exit_without_waiting_for_the_interpreter_teardown(redis_url, redis_client, tmp_path):
    """What a process does at exit after its work (here an exit hook that sleeps a minute, standing in for the
    seconds torch and transformers take to unload) delays neither the engines nor their supervisor."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text("import atexit, time\natexit.register(time.sleep, 60)\n")
    with supervisor(redis_url, tmp_path, "--replicas", "2",
                    PYTHONPATH=f"{hooks}{os.pathsep}{ROOT}") as (parent, log, engine_pids):
        named = serving(redis_client, parent, log, engine_pids)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(30) == 0, log.read_text()[-3000:]
        assert not any(running(pid) for pid in named.values())
        assert engines(redis_client) == {}


def test_ctrl_c_reaches_each_engine_once_and_the_command_exits_130(redis_url, redis_client, tmp_path):
    """A terminal's Ctrl-C is SIGINT to its whole foreground process group. Each engine gets it once, from its
    supervisor (they run in sessions of their own), drains and withdraws; none takes a forward as the second
    signal that means `exit now`."""
    with supervisor(redis_url, tmp_path, "--replicas", "2") as (parent, log, engine_pids):
        named = serving(redis_client, parent, log, engine_pids)
        os.killpg(parent.pid, signal.SIGINT)  # as the terminal does: the supervisor's group
        assert parent.wait(60) == 130, log.read_text()[-3000:]
        assert not any(running(pid) for pid in named.values())
        assert engines(redis_client) == {}, log.read_text()[-3000:]
        assert Producer(redis_url).fleet()["workers"] == []  # what `embedfleet status` lists
    text = log.read_text()
    for name in named:
        assert [line.split(": ", 2)[-1] for line in drain_lines(log, name)] == [
            "SIGINT: draining (a second signal exits at once)"], text[-3000:]
    assert len(re.findall(r"stopped \(exited with code 130\)", text)) == 2, text[-3000:]  # drained, Ctrl-C'd


@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_single_engine_worker_exits_130_after_ctrl_c_and_0_after_sigterm(redis_url, redis_client, tmp_path,
                                                                            stop, code):
    """`embedfleet worker` with one engine (--replicas 1, the CPU default) is the engine itself, no supervisor:
    Ctrl-C (SIGINT to its process group, as a terminal sends it) drains it and the command exits 130, the
    shell's code for Ctrl-C (docs/cli.md), as a supervisor does; SIGTERM (docker stop, systemd) drains it to 0."""
    with supervisor(redis_url, tmp_path, "--replicas", "1") as (worker, log, engine_pids):
        wait_for(lambda: len(engines(redis_client)) == 1 or worker.poll() is not None, 120)
        assert worker.poll() is None and not engine_pids(), log.read_text()[-3000:]  # serving, in this process
        os.killpg(worker.pid, stop)
        assert worker.wait(60) == code, log.read_text()[-3000:]
        assert engines(redis_client) == {}  # drained and withdrawn either way
    assert f"{signal.Signals(stop).name}: draining" in log.read_text()
