"""`embedfleet worker --gpus all|0,1,... --replicas N`: N engine processes per GPU, each seeing only its own GPU.

A multi-GPU host runs one container (or one command) and every GPU serves: the parent starts N
`python -m embedfleet.worker` children per GPU with CUDA_VISIBLE_DEVICES set to that GPU (so each child's `cuda` is
its own device and it advertises under a name of its own); without --gpus, N children on the flags' device.
Several engines per GPU keep it busy while each one's CPU side (take, tokenise, finish) runs.
worker/serving/supervise.py keeps them running: a dead child is started again and its jobs come back by their
leases.
"""

from __future__ import annotations

import logging

from embedfleet.common.errors import StartupError

log = logging.getLogger("embedfleet.worker")


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
    """The worker's own flags minus --gpus and --replicas (each child is one engine), a fixed --name and
    --metrics-port (each child gets its own)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _PER_CHILD:
            skip = True
            continue
        if arg.startswith(tuple(f"{flag}=" for flag in _PER_CHILD)):
            continue
        out.append(arg)
    return out


_PER_CHILD = ("--gpus", "--replicas", "--name", "--metrics-port")


def default_replicas(gpu_count: int, cores: int) -> int:
    """Engines per GPU when --replicas is not given: one per 4 CPU cores a GPU has (each engine's take,
    tokenise, forward and finish threads keep about that many busy; on an H200 with 16 cores, 2 and 4 engines
    served 2.3x and 3.1x one), at most 8; 1 on a CPU, where one engine already uses every core."""
    if gpu_count <= 0:
        return 1
    return max(1, min(8, cores // gpu_count // 4))


def run(gpus: list[str | None], argv: list[str], name: str | None, environ: dict[str, str],
        metrics_port: int | None = None, replicas: int = 1, max_restarts: int = 5, partitions: int = 1) -> int:
    """Start `replicas` workers per GPU (None: no GPU of its own, the flags' device) and per partition of the model
    (common/shards.py: each child takes from one partition's Redis, so none waits behind another's) and supervise
    them until they stop (worker/serving/supervise.py); returns the exit code. With `metrics_port`, child k serves
    its metrics on metrics_port + k."""
    from embedfleet.worker.serving.supervise import Child, run as supervise  # noqa: PLC0415 - the supervisor's own module

    base = {k: v for k, v in environ.items() if k not in ("EMBEDFLEET_GPUS", "EMBEDFLEET_NAME", "EMBEDFLEET_REPLICAS",
                                                          "EMBEDFLEET_METRICS_PORT", "EMBEDFLEET_REPLICA",
                                                          "EMBEDFLEET_PARTITION")}
    children = []
    for gpu in gpus:
        for replica in range(replicas):
            for partition in range(1, partitions + 1) if partitions > 1 else [None]:
                index = len(children)
                where = ([] if gpu is None else [f"gpu{gpu}"]) + ([f"r{replica + 1}"] if replicas > 1 else [])
                label = "-".join(where + ([f"p{partition}"] if partition else [])) or "worker"
                extra = [] if metrics_port is None else ["--metrics-port", str(metrics_port + index)]
                env = {**base, "EMBEDFLEET_REPLICAS": "1", "EMBEDFLEET_REPLICA": f"{replica + 1}/{replicas}",
                       **({} if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu}),
                       **({} if partition is None else {"EMBEDFLEET_PARTITION": str(partition)})}
                children.append(Child(label, [*child_argv(argv), *extra], env, f"{name}-{label}" if name else None))
    return supervise(children, max_restarts)
