"""The worker's CPU threads follow the CPU it has: its affinity, a cgroup CPU quota (read from fixture cgroup
files, not the machine's), and --threads / EMBEDFLEET_THREADS over both; OpenMP waits PASSIVE unless the user
set OMP_WAIT_POLICY, set before torch loads; the count and its source reach the advert and `status`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from embedfleet.worker.engine import cpus
from embedfleet.worker.engine.cpus import Threads, apply_wait_policy, cgroup_quota, decide


def cgroup(tmp_path: Path, own: str, files: dict[str, str]) -> tuple[str, str]:
    """A cgroup tree under tmp_path (files: relative path -> content) and a /proc/self/cgroup naming `own`."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    self_file = tmp_path / "self_cgroup"
    self_file.write_text(own)
    return str(root), str(self_file)


def test_the_count_is_the_affinity_without_a_quota():
    assert decide(None, 4, None) == Threads(4, "affinity 4", "PASSIVE")
    assert decide(0, 1, None).count == 1  # 0 is auto too


def test_the_engines_of_a_partitioned_model_share_the_cpus():
    """Each partition's engine (fed alike by round robin) gets its part of the CPUs, never none; --threads wins."""
    assert decide(None, 8, None, engines=2) == Threads(4, "affinity 8, shared by 2 engines", "PASSIVE")
    assert decide(None, 2, None, engines=3) == Threads(1, "affinity 2, shared by 3 engines", "PASSIVE")
    assert decide(None, 8, 2.0, engines=2).count == 1
    assert decide(3, 8, None, engines=2) == Threads(3, "--threads", "PASSIVE")


def test_the_count_follows_the_real_affinity_mask():
    """A process pinned to one CPU (as `taskset -c 0` does) counts one, whatever the host has."""
    from tests.commands import ROOT

    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from embedfleet.worker.engine import cpus; t = cpus.plan(None, {}, root='/nonexistent');"
            " print(t.count, t.source)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split("\n")[0] == "1 affinity 1", done.stderr


def test_a_quota_below_the_affinity_caps_the_count_rounded_up():
    assert decide(None, 8, 2.0).count == 2
    assert decide(None, 8, 1.5) == Threads(2, "cgroup quota 1.5 CPUs of affinity 8", "PASSIVE")
    assert decide(None, 8, 0.25).count == 1  # never none
    above = decide(None, 2, 6.0)  # a quota above the CPUs it may run on changes nothing
    assert above.count == 2 and "quota 6" in above.source


def test_the_flag_wins_within_the_cpus_the_process_may_use():
    assert decide(3, 8, None) == Threads(3, "--threads", "PASSIVE")
    assert decide(2, 8, 1.5) == Threads(2, "--threads", "PASSIVE")  # the quota rounded up allows 2


def test_a_flag_above_the_cpus_the_process_may_use_is_capped_with_a_warning():
    """--threads 999 on 2 CPUs ran 2,001 threads, passes 60-140x slower: it runs the CPUs it has, and says so."""
    capped = decide(999, 2, None)
    assert (capped.count, capped.source) == (2, "--threads 999 capped to affinity 2")
    assert capped.warning.startswith("--threads 999 is more than the 2 CPUs this process may use (affinity 2)")
    assert decide(3, 8, 1.0).count == 1  # a cgroup quota of one CPU: one thread, as without the flag
    assert decide(2, 2, None).warning is None and decide(None, 2, None).warning is None


def test_a_cgroup_v2_quota_is_read_from_the_process_own_cgroup_and_its_parents(tmp_path):
    root, own = cgroup(tmp_path, "0::/kubepods/pod1/worker\n", {
        "cpu.max": "max 100000\n",
        "kubepods/cpu.max": "400000 100000\n",
        "kubepods/pod1/cpu.max": "150000 100000\n",  # the pod's limit: the least one applies
        "kubepods/pod1/worker/cpu.max": "max 100000\n",
        "elsewhere/cpu.max": "10000 100000\n",  # another cgroup's: not ours
    })
    assert cgroup_quota(root, own) == 1.5
    assert decide(None, 2, cgroup_quota(root, own)).count == 2


def test_no_quota_reads_as_none(tmp_path):
    root, own = cgroup(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert cgroup_quota(root, own) is None
    assert cgroup_quota(str(tmp_path / "absent"), str(tmp_path / "absent_self")) is None


def test_a_cgroup_v1_quota_is_read_from_the_cpu_controller(tmp_path):
    root, own = cgroup(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    })
    assert cgroup_quota(root, own) == 0.5
    assert decide(None, 4, cgroup_quota(root, own)).count == 1


def test_inside_a_container_the_host_path_is_not_there_and_the_root_files_count(tmp_path):
    """A container's /proc/self/cgroup may name the host's path while its /sys/fs/cgroup is its own root."""
    root, own = cgroup(tmp_path, "0::/system.slice/docker-abc.scope\n", {"cpu.max": "200000 100000\n"})
    assert cgroup_quota(root, own) == 2.0


def test_omp_waits_passive_unless_the_user_said_otherwise():
    environ: dict[str, str] = {}
    assert apply_wait_policy(environ) == "PASSIVE" and environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert environ["GOMP_SPINCOUNT"] == "1000"  # a brief spin before each sleep
    assert apply_wait_policy({"OMP_WAIT_POLICY": ""}) == "PASSIVE"  # compose passes unset variables as ""
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert apply_wait_policy(mine) == "ACTIVE" and mine == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert cpus.plan(None, mine).spinning and not cpus.plan(None, {}).spinning
    passive = {"OMP_WAIT_POLICY": "PASSIVE"}  # the user's own PASSIVE: libgomp's spin count for it, none added
    assert apply_wait_policy(passive) == "PASSIVE" and passive == {"OMP_WAIT_POLICY": "PASSIVE"}
    own_spin = {"GOMP_SPINCOUNT": "0", "OMP_WAIT_POLICY": ""}  # GOMP_SPINCOUNT=0: PASSIVE alone
    assert apply_wait_policy(own_spin) == "PASSIVE" and own_spin["GOMP_SPINCOUNT"] == "0"
    assert cpus.plan(None, {}).spin_count == "1000" and cpus.plan(None, {"GOMP_SPINCOUNT": "0"}).spin_count == "0"
    assert cpus.plan(None, mine).spin_count == ""


def test_the_entry_point_sets_the_policy_before_torch_loads():
    """libgomp reads OMP_WAIT_POLICY once, when torch is imported: the worker's module must not import it."""
    from tests.commands import ROOT

    code = "import sys, embedfleet.worker.__main__; assert 'torch' not in sys.modules, 'torch loaded before the flags'"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr


def test_a_worker_advertises_its_threads_and_status_shows_them(tmp_path, redis_url, redis_client):
    """EMBEDFLEET_THREADS=1 (the settings' env twin of --threads) on a real worker process."""
    from tests.commands import ROOT, advertised, clean_env, embedfleet
    from tests.tinymodels import save_tiny_bert, wrap_sentence_transformers

    folder = str(tmp_path / "tiny")
    save_tiny_bert(folder)
    wrap_sentence_transformers(folder, "mean")
    env = {**clean_env(tmp_path / "xdg"), "PYTHONPATH": str(ROOT)}
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    env["EMBEDFLEET_THREADS"] = "1"
    worker = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model", folder,
                               "--served-model-name", "tiny", "--poll-timeout", "1", "--probe-seconds", "0.2",
                               "--no-cache"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        from embedfleet import Producer

        with Producer(redis_url) as producer:
            info = advertised(producer, "tiny", worker)
        assert info["threads"] == 1 and info["threads_source"] == "--threads"
        assert info["omp_wait_policy"] == "PASSIVE" and info["omp_spin_count"] == "1000"
        assert info["max_batch_tokens"] >= 2048 and info["max_batch_size"] >= 16  # the CPU floor (probe.py)
        shown = embedfleet("status", "--wide", "--redis-url", redis_url, env=clean_env(tmp_path / "xdg"))
        assert shown.returncode == 0 and "cpu, 1 thread (--threads)" in shown.stdout, shown.stdout
    finally:
        worker.terminate()
        _, log = worker.communicate(timeout=60)
    assert "1 CPU thread (--threads; OMP_WAIT_POLICY PASSIVE, GOMP_SPINCOUNT 1000)" in log, log[-2000:]


def test_a_real_worker_given_999_threads_runs_the_cpus_it_has_and_warns_once(tmp_path, redis_url):
    from tests.commands import ROOT, advertised, clean_env
    from tests.tinymodels import save_tiny_bert, wrap_sentence_transformers

    folder = wrap_sentence_transformers(save_tiny_bert(str(tmp_path / "tiny")), "mean")
    worker = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, "--model", folder,
                               "--served-model-name", "tiny", "--threads", "999", "--poll-timeout", "1",
                               "--probe-seconds", "0.2", "--no-cache"],
                              env={**clean_env(tmp_path / "xdg"), "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE,
                              text=True)
    try:
        from embedfleet import Producer

        with Producer(redis_url) as producer:
            info = advertised(producer, "tiny", worker)
    finally:
        worker.terminate()
        _, log = worker.communicate(timeout=60)
    allowed = decide(None, cpus.affinity(), cpus.cgroup_quota())
    assert info["threads"] == allowed.count and info["threads_source"] == f"--threads 999 capped to {allowed.source}"
    assert log.count("--threads 999 is more than") == 1 and " WARNING " in log, log[-2000:]
