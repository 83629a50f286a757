"""Run the gRPC server on its own event loop in a background thread.

For tests and the in-process demo, where the caller is synchronous: the server is the real
one, on a real port, reached over a real channel; only the process is shared.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ringfence_server.control.api.server import ApiServer, create_server

__all__ = ["BackgroundServer"]


class BackgroundServer:
    """`with BackgroundServer(orchestrator, config) as s: Client(s.address, token)`."""

    def __init__(self, orchestrator: Any, config: Any, *, host: str = "127.0.0.1", **server_kwargs: Any) -> None:
        self._orchestrator = orchestrator
        self._config = config
        self._host = host
        self._kwargs = server_kwargs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.server: ApiServer | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    def start(self) -> BackgroundServer:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="rf-api-loop", daemon=True)
        self._thread.start()

        async def build() -> tuple[ApiServer, int]:
            server, port = await create_server(f"{self._host}:0", self._orchestrator, self._config, **self._kwargs)
            await server.start()
            return server, port

        try:
            self.server, self.port = asyncio.run_coroutine_threadsafe(build(), loop).result(timeout=30)
        except BaseException:
            self._shutdown_loop()
            raise
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        if self._loop is None:
            return
        try:
            if self.server is not None:
                asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop).result(timeout=30)
        finally:
            self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)
        loop.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
