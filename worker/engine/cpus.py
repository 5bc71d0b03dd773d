"""How many CPU threads the forward pass uses, and how they wait: sized to the CPU this process has.

A container or a pinned process sees the host's cores but may run on fewer (affinity) or spend less CPU time
than it sees (the cgroup's CPU quota: Kubernetes' CPU limit, `docker run --cpus`). OpenMP threads that spin
while they wait for each other then wait for a time slice in every parallel region of every layer: a
one-row MiniLM pass on a 2-core machine with two busy neighbours ran 2.7-6.8 passes/s with torch's default
(2 threads, spinning), 46/s with one thread, 32/s with two PASSIVE ones (issue 30; bench/history.md §14).

So: threads = the CPUs of the affinity mask, capped by the quota rounded up (`--threads` may ask for fewer;
more is capped to them, with one warning), and OpenMP told to sleep rather than spin while it waits
(OMP_WAIT_POLICY=PASSIVE; the ONNX Runtime twin is `session.intra_op.allow_spinning`) after a brief spin
(GOMP_SPINCOUNT=1000, libgomp's; ~10-30 us): a thread that finishes its share of a parallel region catches the
next one without the kernel's sleep and wake, which on 2 cores cost a one-text pass 1.5-2 ms (PASSIVE alone:
the idle fleet +6.3 ms over the bare pass, +4.45 with the brief spin, 4 runs alternating; beside two busy
loops its large passes lost 3-5%, bench/shaping.py and bench/threads.py; BENCHMARKS.md, Latency). Small passes on a
busy machine run on one thread (passthreads.py), where no thread waits. Both only where the user set neither
variable (a user's OMP_WAIT_POLICY keeps libgomp's spin count for it; GOMP_SPINCOUNT=0 is PASSIVE alone). libgomp
reads them when it is loaded, i.e. at `import torch`: `apply_wait_policy` must run before that, at the worker's
entry point.

Torch-free: the decision is pure and reads files whose paths the caller may point at a fixture.
"""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, replace

CGROUP_ROOT = "/sys/fs/cgroup"
SELF_CGROUP = "/proc/self/cgroup"
WAIT_POLICY = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"
SPIN_COUNT = "GOMP_SPINCOUNT"
BRIEF_SPIN = "1000"  # spins before a PASSIVE thread sleeps (libgomp: ~100,000 a millisecond, CPU-dependent)


@dataclass(frozen=True)
class Threads:
    """The forward pass's thread count, why, and OpenMP's wait policy."""

    count: int
    source: str  # "--threads", "affinity 2", "cgroup quota 1.5 CPUs of affinity 2"
    wait_policy: str = PASSIVE  # OMP_WAIT_POLICY as the worker runs with it (ours, or the user's own value)
    spin_count: str = ""  # GOMP_SPINCOUNT as it runs with it ('': libgomp's own for the policy)
    warning: str | None = None  # what the worker logs once: a --threads above the CPUs it may use, capped

    @property
    def spinning(self) -> bool:
        """Whether waiting threads may spin (the user asked for ACTIVE): also ONNX Runtime's allow_spinning."""
        return self.wait_policy.upper() == "ACTIVE"

    def describe(self) -> str:
        spin = f", GOMP_SPINCOUNT {self.spin_count}" if self.spin_count else ""
        waits = f"OMP_WAIT_POLICY {self.wait_policy}{spin}"
        return f"{self.count} CPU thread{'s' * (self.count != 1)} ({self.source}; {waits})"

    def facts(self) -> dict:
        """For the worker's advert (`embedfleet status`)."""
        return {"threads": self.count, "threads_source": self.source, "omp_wait_policy": self.wait_policy,
                "omp_spin_count": self.spin_count}


def affinity() -> int:
    """CPUs this process may run on (its affinity mask; the CPU count where the OS has no such call)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def cgroup_quota(root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> float | None:
    """The CPU quota (CPUs' worth of time per period) of this process's cgroup and its ancestors, the least
    of them; None: no quota (or no cgroup files). Reads cgroup v2's `cpu.max` ("QUOTA PERIOD", "max" for
    none) and v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1 for none) under `root`."""
    paths = _own_paths(self_cgroup) or {"": "/", "cpu": "/"}  # no /proc/self/cgroup: the root's own files
    quotas = []
    v2 = paths.get("")  # the unified hierarchy's line is "0::/path"
    if v2 is not None:
        for folder in _ancestors(root, v2):
            quotas.append(_v2_quota(os.path.join(folder, "cpu.max")))
    for controllers, path in paths.items():
        if "cpu" not in controllers.split(","):
            continue
        mounts = [os.path.join(root, name) for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu")]
        for mount in dict.fromkeys(mount for mount in mounts if os.path.isdir(mount)):
            for folder in _ancestors(mount, path):
                quotas.append(_v1_quota(folder))
            break
    found = [quota for quota in quotas if quota is not None]
    return min(found) if found else None


def decide(flag: int | None, cpus: int, quota: float | None, wait_policy: str = PASSIVE,
           engines: int = 1) -> Threads:
    """The thread count: the affinity's CPUs capped by the quota rounded up (1.5 CPUs of time on 2 CPUs: 2
    threads; PASSIVE threads cost nothing while they wait), or `flag` (--threads) when set above 0 and within
    that. A flag above it is capped, with a warning: threads past the CPUs the process may use only wait for
    time slices in every parallel region (--threads 999 on 2 CPUs: 2,001 threads, passes 60-140x slower).
    `engines`: processes of one worker that share these CPUs, each as busy as the others (the engines of a model's
    partitions, fed alike by round robin): each gets its share, at least one."""
    allowed = _allowed(cpus, quota, wait_policy)
    if not flag and engines > 1:
        return Threads(max(1, allowed.count // engines), f"{allowed.source}, shared by {engines} engines",
                       wait_policy)
    if not flag:
        return allowed
    if flag <= allowed.count:
        return Threads(flag, "--threads", wait_policy)
    return Threads(allowed.count, f"--threads {flag} capped to {allowed.source}", wait_policy,
                   warning=f"--threads {flag} is more than the {allowed.count} CPU{'s' * (allowed.count != 1)} this "
                           f"process may use ({allowed.source}): using {allowed.count} (more threads than CPUs "
                           "only wait for each other's time slices)")


def _allowed(cpus: int, quota: float | None, wait_policy: str) -> Threads:
    """The threads the CPUs this process may use run: its affinity, capped by its cgroup quota rounded up."""
    if quota is not None and math.ceil(quota) < cpus:
        return Threads(max(1, math.ceil(quota)), f"cgroup quota {quota:g} CPUs of affinity {cpus}", wait_policy)
    return Threads(cpus, f"affinity {cpus}" + (f", cgroup quota {quota:g} CPUs" if quota is not None else ""),
                   wait_policy)


def apply_wait_policy(environ: MutableMapping[str, str]) -> str:
    """OMP_WAIT_POLICY=PASSIVE in `environ` unless the user set it, with GOMP_SPINCOUNT=BRIEF_SPIN unless the user
    set that (either: a user's policy keeps libgomp's spin count for it); returns the policy in force. Call before
    `import torch` (libgomp reads both when it loads); children started from `environ` inherit them. An empty
    value counts as unset (compose passes unset variables as "")."""
    if not environ.get(WAIT_POLICY):
        environ[WAIT_POLICY] = PASSIVE
        if not environ.get(SPIN_COUNT):
            environ[SPIN_COUNT] = BRIEF_SPIN
    return environ[WAIT_POLICY]


def plan(flag: int | None, environ: MutableMapping[str, str], root: str = CGROUP_ROOT,
         self_cgroup: str = SELF_CGROUP, engines: int = 1) -> Threads:
    """What the worker's entry point runs: the wait policy set in `environ`, the count decided."""
    policy = apply_wait_policy(environ)
    return replace(decide(flag, affinity(), cgroup_quota(root, self_cgroup), policy, engines),
                   spin_count=environ.get(SPIN_COUNT) or "")


# -- cgroup files ---------------------------------------------------------------------------------------


def _own_paths(self_cgroup: str) -> dict[str, str]:
    """{controllers: path} from /proc/self/cgroup ("ID:CONTROLLERS:PATH" lines; v2's controllers are "")."""
    try:
        with open(self_cgroup) as lines:
            rows = [line.rstrip("\n").split(":", 2) for line in lines if line.strip()]
    except OSError:
        return {}
    return {row[1]: row[2] for row in rows if len(row) == 3}


def _ancestors(mount: str, path: str) -> list[str]:
    """The cgroup folder of `path` under `mount` and each parent up to the mount (a limit anywhere above
    applies too). Inside a container the path may name the host's hierarchy: only folders that exist count."""
    parts = [part for part in path.strip("/").split("/") if part and part != ".."]
    folders = [os.path.join(mount, *parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [folder for folder in folders if os.path.isdir(folder)]


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return None


def _v2_quota(path: str) -> float | None:
    text = _read(path)
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max":
        return None
    try:
        quota_us, period_us = int(quota), int(period or 100000)
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def _v1_quota(folder: str) -> float | None:
    quota, period = _read(os.path.join(folder, "cpu.cfs_quota_us")), _read(os.path.join(folder, "cpu.cfs_period_us"))
    try:
        quota_us, period_us = int(quota or -1), int(period or 100000)
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None
