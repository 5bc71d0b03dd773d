"""`embedfleet up`'s settings: its flags and EMBEDFLEET_* variables (common.config.Settings), in a module of their
own so that the pieces of `up` (upstart, upwatch, upstop) name them without importing `up` itself."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

from embedfleet.common.config import Settings


class UpSettings(Settings):
    discovers_redis: ClassVar[bool] = False  # no --redis-url means: start our own

    redis_url: str | None = Field(None, description="use this running Redis instead of starting one")
    redis_port: int = Field(6390, description="port of the Redis `up` starts (0: any free port); if it is "
                                              "taken, `up` stops with an error")
    redis_config: Path | None = Field(None, description="a redis.conf for the Redis `up` starts (e.g. maxmemory); "
                                                        "`up` still sets its port, bind address, dir and AOF")
    data_dir: Path = Field(Path(".embedfleet"), description="where the started Redis keeps its AOF (relative: "
                                                             "to the current directory, i.e. per checkout)")
    model: str | None = Field(None, description="model folder or hub id; default: the bundled all-MiniLM-L6-v2")
    served_model_name: str | None = Field(None, description="name clients use for the model")
    workers: int = Field(1, ge=1, description="worker processes to start")
    replicas: int | None = Field(None, ge=1, le=64, description="engines per device in each worker (`embedfleet "
                                 "worker --replicas`); default: the worker's (one per 4 cores a GPU has, 1 on a CPU)")
    gpus: str | None = Field(None, description="`all` or GPU indices: each worker runs its engines on every GPU named "
                                               "(`embedfleet worker --gpus`)")
    host: str = Field("127.0.0.1", description="gateway bind address")
    port: int = Field(8000, description="gateway port")
    gateway: bool = Field(True, description="start the HTTP gateway (--no-gateway: workers only)")
    api_key: str | None = Field(None, repr=False, description="the gateway then needs `Authorization: Bearer "
                                                               "KEY` on every route but /health")
    access_log: bool = Field(False, description="log every HTTP request (uvicorn's access log) and worker round; "
                                                "default: off, so that the terminal shows what needs a look")
    ready_timeout: float = Field(300.0, gt=0, description="seconds to wait for the fleet to come up (and, "
                                                          "before that, for its Redis to load its data)")
    max_restarts: int = Field(5, ge=0, description="restarts in a row of a child that keeps dying within a "
                                                   "minute of its start before `up` stops the fleet and exits 1; "
                                                   "0: any death stops the fleet")

    @field_validator("data_dir", "redis_config")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        """Resolved once, here: the children (and redis-server, which changes into its dir) get absolute paths."""
        return path.expanduser().resolve() if path is not None else None
