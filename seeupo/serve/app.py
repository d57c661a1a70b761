"""``seeupo serve``: an OpenAI-compatible HTTP endpoint over a ``ChatEngine`` (Starlette + uvicorn).

Routes (each also under ``/ep/<episode>/v1/...``, which records the calls of that episode, so an
unmodified client works with ``base_url="http://HOST:PORT/ep/<episode>/v1"``):

- ``POST /v1/chat/completions``: messages, ``tools``, ``tool_choice``, ``temperature``,
  ``max_tokens``, ``n``, ``logprobs``, ``seed`` (no streaming);
- ``GET /v1/models``: the one model served.

``BackgroundServer`` runs it in a daemon thread on a free local port (``seeupo train --agent``
starts one for the run); ``serve_forever`` is the command's foreground server.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

from seeupo.serve.engine import ChatEngine, RequestError


def build_app(engine: ChatEngine):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def error(message: str, code: str, status: int = 400) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": code}},
                            status_code=status)

    async def completions(request: Request):
        episode = request.path_params.get("episode")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return error("the request body is not valid JSON", "invalid_json")
        if isinstance(body, dict) and body.get("stream"):
            return error("streaming is not supported; call without stream=true", "unsupported")
        try:
            return JSONResponse(await engine.complete(body, episode))
        except RequestError as e:
            return error(str(e), e.code)

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": engine.model_name, "object": "model", "created": 0, "owned_by": "seeupo"}]})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.get_running_loop().create_task(engine.run_batches())
        try:
            yield
        finally:
            task.cancel()

    routes = []
    for prefix in ("", "/ep/{episode:str}"):
        routes += [Route(prefix + "/v1/chat/completions", completions, methods=["POST"]),
                   Route(prefix + "/v1/models", models, methods=["GET"])]
    return Starlette(routes=routes, lifespan=lifespan)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """The endpoint in a daemon thread: ``with BackgroundServer(engine) as srv: srv.base_url``."""

    def __init__(self, engine: ChatEngine, host: str = "127.0.0.1", port: int | None = None):
        import uvicorn

        self.engine, self.host = engine, host
        self.port = port or free_port(host)
        config = uvicorn.Config(build_app(engine), host=host, port=self.port, log_level="warning",
                                access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="seeupo-serve")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def episode_url(self, episode: str) -> str:
        return f"http://{self.host}:{self.port}/ep/{episode}/v1"

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def serve_forever(engine: ChatEngine, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(build_app(engine), host=host, port=port, log_level="info")
