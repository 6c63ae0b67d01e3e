"""Servers for tests and benchmarks.

:class:`ServerProcess` starts ``genlm serve`` as a subprocess: a free loopback port,
readiness from the server's own ready line, bounded waits, and a stop that always ends
the process (SIGTERM, then SIGKILL after a grace period). :class:`InProcessServer`
serves an application (:func:`genlm_core.serve.app.build_app`) from a thread of this
process, for tests that reach into its backend (a forward pass held on an event)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from genlm_core.serve.run import READY_PREFIX

__all__ = ["InProcessServer", "ServerProcess"]


class ServerProcess:
    """``with ServerProcess("mock") as srv: load("remote", url=srv.url)``.

    ``ready_timeout`` is generous (a model load on a busy 2-core machine); the wait ends
    early, with the server's stderr in the message, if the process exits first."""

    def __init__(
        self,
        backend: str,
        *,
        model: str | None = None,
        opts: dict[str, Any] | None = None,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        env: dict[str, str] | None = None,
        ready_timeout: float = 600.0,
    ) -> None:
        import json

        cmd = [
            sys.executable,
            "-m",
            "genlm_core.tools.cli",
            "serve",
            backend,
            "--host",
            host,
            "--port",
            str(port),
        ]
        if model is not None:
            cmd += ["--model", str(model)]
        for k, v in (opts or {}).items():
            cmd += ["--opt", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
        cmd += list(args)
        self.cmd = cmd
        self.env = {**os.environ, **(env or {})}
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self._stderr: list[str] = []

    def start(self) -> "ServerProcess":
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env
        )
        lines: queue.Queue[str | None] = queue.Queue()

        def pump_out() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(None)

        def pump_err() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self._stderr.append(line)
                del self._stderr[:-200]

        threading.Thread(target=pump_out, daemon=True).start()
        threading.Thread(target=pump_err, daemon=True).start()
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            if line.startswith(READY_PREFIX):
                self.url = line[len(READY_PREFIX) :].strip()
                self._wait_healthy(deadline)
                return self
        code = self.proc.poll()
        self.stop()
        raise RuntimeError(
            f"genlm serve did not become ready ({'exited ' + str(code) if code is not None else 'timed out'}): "
            + "".join(self._stderr[-20:])
        )

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/v1/health", timeout=10) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"genlm serve at {self.url} printed its ready line but /v1/health does not answer")

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def stop(self, grace: float = 60.0) -> int | None:
        """SIGTERM (graceful shutdown), then SIGKILL after ``grace`` seconds. The exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class InProcessServer:
    """``with InProcessServer(build_app(llm)) as srv: ... srv.url``: uvicorn on a free
    loopback port in a daemon thread; every wait bounded by ``timeout``."""

    def __init__(self, app: Any, timeout: float = 120.0) -> None:
        self.app = app
        self.timeout = timeout
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "InProcessServer":
        import asyncio

        import uvicorn

        from genlm_core.serve.run import bind_socket, server_class

        sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, loop="asyncio", lifespan="on", log_level="warning")
        self._server = server = server_class()(config)

        def run() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="genlm-serve-test", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self.timeout)
