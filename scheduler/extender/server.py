"""Serving the app with gunicorn: one worker (the cluster state lives in it), gthread workers'
threads for concurrency, keep-alive long enough for kube-scheduler's connection reuse."""

from __future__ import annotations

from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from scheduler.extender.config import ServerConfig
from scheduler.extender.runtime import Runtime

KEEPALIVE_S = 75


class _Gunicorn(BaseApplication):  # type: ignore[misc]  # gunicorn has no type hints
    def __init__(self, runtime: Runtime, options: dict[str, Any]) -> None:
        self.runtime = runtime
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        # Runs in the worker after the fork: the watch and maintenance threads start here.
        self.runtime.start()
        return self.runtime.app


def gunicorn_options(server: ServerConfig) -> dict[str, Any]:
    return {
        "bind": f"{server.host}:{server.port}",
        "workers": 1,
        "worker_class": "gthread",
        "threads": server.threads,
        "timeout": max(1, int(server.timeout_s)),
        "graceful_timeout": 10,
        "keepalive": KEEPALIVE_S,
        "accesslog": None,  # the app logs every request itself, as JSON
        "errorlog": "-",
        "loglevel": "warning",
        "proc_name": "gpufrag-extender",
    }


def serve(runtime: Runtime, server: ServerConfig) -> None:
    """Serve until SIGTERM/SIGINT."""
    _Gunicorn(runtime, gunicorn_options(server)).run()
