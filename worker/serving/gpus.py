"""`embedfleet worker --gpus all|0,1,...`: one engine process per GPU, each seeing only its own GPU.

A multi-GPU host runs one container (or one command) and every GPU serves: the parent starts one
`python -m worker` child per GPU with CUDA_VISIBLE_DEVICES set to that GPU (so each child's `cuda` is its
own device and it advertises under a name of its own), forwards SIGTERM/SIGINT to all of them (each drains
what it holds), and exits when they have: with the first failing child's exit code, after stopping the
others, so that a container restarts whole rather than serving on fewer GPUs unnoticed.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

from common.errors import StartupError

log = logging.getLogger("embedfleet.worker")
CHILD_POLL = 0.5  # seconds between looks at the children


def visible_gpus(spec: str, environ: dict[str, str]) -> list[str]:
    """The GPU ids `spec` names: `all` = those CUDA_VISIBLE_DEVICES lists, else every device torch sees."""
    if spec != "all":
        ids = [g.strip() for g in spec.split(",") if g.strip()]
        if not ids:
            raise StartupError(f"--gpus {spec!r} names no GPU; pass `all` or GPU indices like 0,1")
        return ids
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    else:
        import torch  # noqa: PLC0415 - only `--gpus all` without CUDA_VISIBLE_DEVICES needs to count devices

        ids = [str(i) for i in range(torch.cuda.device_count())]
    if not ids:
        raise StartupError("--gpus all: no GPU is visible (no CUDA device, or CUDA_VISIBLE_DEVICES is empty); "
                           "drop --gpus to serve on the CPU, or give the container its GPUs")
    return ids


def child_argv(argv: list[str]) -> list[str]:
    """The worker's own flags minus --gpus (children serve one GPU each), a fixed --name and --metrics-port
    (each child gets its own)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--gpus", "--name", "--metrics-port"):
            skip = True
            continue
        if arg.startswith(("--gpus=", "--name=", "--metrics-port=")):
            continue
        out.append(arg)
    return out


def run(gpus: list[str], argv: list[str], name: str | None, environ: dict[str, str],
        metrics_port: int | None = None) -> int:
    """Start one worker per GPU and supervise them until they stop; returns the exit code. With
    `metrics_port`, GPU i's worker serves its metrics on metrics_port + i."""
    base = {k: v for k, v in environ.items() if k not in ("EMBEDFLEET_GPUS", "EMBEDFLEET_NAME",
                                                          "EMBEDFLEET_METRICS_PORT")}
    children = []
    for index, gpu in enumerate(gpus):
        extra = ["--name", f"{name}-gpu{gpu}"] if name else []
        if metrics_port is not None:
            extra += ["--metrics-port", str(metrics_port + index)]
        env = {**base, "CUDA_VISIBLE_DEVICES": gpu}
        children.append(subprocess.Popen([sys.executable, "-m", "worker", *child_argv(argv), *extra], env=env))
        log.info("GPU %s: worker pid %d", gpu, children[-1].pid)
    stopping = []

    def forward(signum, _frame):
        stopping.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    failed = 0
    while any(child.poll() is None for child in children):
        for child, gpu in zip(children, gpus):
            code = child.poll()
            if code not in (None, 0) and not failed and not stopping:
                failed = code
                log.error("GPU %s: worker pid %d exited with %d; stopping the others", gpu, child.pid, code)
                forward(signal.SIGTERM, None)
        time.sleep(CHILD_POLL)
    codes = [child.returncode for child in children]
    return failed or next((c for c in codes if c not in (0, -signal.SIGTERM, -signal.SIGINT)), 0)
