"""Agent programs as the rollout source: ``seeupo train --agent FILE.py:FUNCTION`` (or ``module:function``).

The agent is the user's own code, written against a chat API::

    async def run(task, client) -> float | dict:
        ...  # calls await client.chat.completions.create(model=..., messages=..., tools=...)

``task`` is the environment family's ``Task`` (``task.id``, ``task.split``, ``task.data``);
``client`` an ``openai.AsyncOpenAI`` pointed at the run's endpoint (``seeupo.serve``) under this
episode's path, so every call it makes is recorded with its exact prompt ids, sampled ids and
log-probs. The endpoint is reached one of two ways (``serve.transport``): ``local`` (the default) calls
the endpoint's ASGI app inside the run's process and event loop through ``httpx.ASGITransport``: the
same app, routes and JSON, no socket (the client's ``base_url`` is ``http://seeupo.local/ep/<id>/v1``
and only that client object reaches it); ``http`` starts the server on a free ``127.0.0.1`` port in a
thread, for agents that pass the URL on to other clients or processes. It returns the episode's reward (a float), or ``{"reward": r}`` with optionally
``"turn_rewards": [...]`` (one per call: then these are the per-turn rewards, and their sum the
episode's reward) and ``"score"`` (the success measure in [0, 1] of evaluations; default: the
reward, or the sum of ``turn_rewards``).

Call ``k`` of an episode is its turn ``k``: a row of its own (the prompt as the server built it,
then the sampled ids), so the episode is segmented like ``rollout.history=last:K``'s and its rows
need not be prefixes of one another. ``AgentSource.run(jobs)`` runs every job's agent concurrently
(the G copies of each task too) in one event loop, and the server batches the calls that wait
together (as soon as every running agent has one waiting, else after ``max_wait_s``).

An episode is left out of training, counted by its end reason, when its agent raised or returned
something that is not a reward (``error``), ran past ``serve.agent_timeout_s`` (``timeout``), made
no call (``no_call``) or had a call refused by the server for a malformed request (``refused``).
Evaluations count such an episode as failed. An episode whose policy ran into a limit, a call past
``rollout.max_turns`` or a prompt with no room left in ``rollout.max_context``, is kept with the end
reason ``max_turns`` or ``context`` (as the built-in runner's), its reward 0 unless the agent still
returned one. A failure of the sampler itself stops the run (``RuntimeError``).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import sys
from pathlib import Path

from seeupo.data.episode import Episode, anchor_key
from seeupo.serve.engine import ChatEngine, EpisodeLog


# server refusals that are the policy's doing, as the built-in runner's end reasons: the episode is kept
POLICY_LIMITS = {"max_turns": "max_turns", "context_length_exceeded": "context"}


class AgentError(ValueError):
    """The agent spec cannot be loaded (a clear message for ``seeupo train --agent``)."""


def load_agent(spec: str):
    """``path/to/file.py:function`` or ``package.module:function`` -> the async function."""
    if ":" not in spec:
        raise AgentError(f"--agent {spec!r}: write FILE.py:FUNCTION or module:function")
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise AgentError(f"--agent {spec!r}: no file {where}")
        mod_name = f"seeupo_agent_{path.stem}"
        module = sys.modules.get(mod_name)
        if module is None or getattr(module, "__file__", None) != str(path.resolve()):
            spec_ = importlib.util.spec_from_file_location(mod_name, path.resolve())
            module = importlib.util.module_from_spec(spec_)
            sys.modules[mod_name] = module
            try:
                spec_.loader.exec_module(module)
            except Exception as e:
                del sys.modules[mod_name]
                raise AgentError(f"--agent {spec!r}: importing {where} failed: {e!r}") from e
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise AgentError(f"--agent {spec!r}: cannot import {where}: {e}") from e
    fn = getattr(module, name, None)
    if fn is None:
        raise AgentError(f"--agent {spec!r}: {where} has no {name}")
    if not inspect.iscoroutinefunction(fn):
        raise AgentError(f"--agent {spec!r}: {name} must be an async function (async def {name}(task, client))")
    return fn


def outcome(value) -> tuple[float, list[float] | None, float | None]:
    """An agent's return value as (reward, turn rewards or None, score or None); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise ValueError(f"the agent returned {type(value).__name__}; return a float or {{'reward': r, ...}}")
    if not isinstance(value, dict):
        value = {"reward": value}
    reward, turns, score = value.get("reward"), value.get("turn_rewards"), value.get("score")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ValueError(f"the agent's reward must be a finite number, not {reward!r}")
    if turns is not None:
        if not isinstance(turns, list) or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in turns):
            raise ValueError("turn_rewards must be a list of finite numbers")
        turns = [float(x) for x in turns]
    if score is not None and (not isinstance(score, (int, float)) or not math.isfinite(score)):
        raise ValueError(f"the agent's score must be a finite number, not {score!r}")
    return float(reward), turns, None if score is None else float(score)


def episode_from_calls(ep: Episode, log: EpisodeLog) -> Episode:
    """Fill ``ep`` with the recorded calls: call k is turn k, its own segment (prompt, then the sampled ids)."""
    for k, c in enumerate(log.calls):
        start = len(ep.ids)
        ep.anchors.append(anchor_key(c.observation))
        ep.append(c.prompt_ids)
        ep.append(c.ids, turn=k, logp=c.logp)
        ep.turn_starts.append(start)
        ep.turn_ends.append(len(ep.ids))
        ep.texts.append(c.text)
        if not c.finished:
            ep.truncated_turns += 1
    return ep


def _asgi_transport(openai, app):
    """An ASGI transport of the httpx that this openai release builds its clients on (httpx, or its fork
    httpx2: another one's transport fails its checks). A failure inside the app is a 500 reply, as over a
    socket (``raise_app_exceptions=False``)."""
    base = next(c for c in openai.DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient")
    return sys.modules[base.__module__.split(".")[0]].ASGITransport(app=app, raise_app_exceptions=False)


class AgentSource:
    """Runs an agent program's episodes through a ``ChatEngine``: in the run's process or on a local port."""

    def __init__(self, agent, engine: ChatEngine, *, timeout_s: float | None = None, concurrency: int = 64,
                 api_key: str = "seeupo", transport: str = "local"):
        if transport not in ("local", "http"):
            raise ValueError(f"transport={transport!r}: local or http")
        self.agent, self.engine, self.timeout_s, self.api_key = agent, engine, timeout_s, api_key
        self.transport = transport
        self._app = None  # the endpoint's ASGI app (transport local)
        self.concurrency = concurrency  # agents running at once (rollout.batch_size)
        self.server = None
        self.unfinished = 0  # agents of the current run not yet finished
        # a batch is flushed as soon as every agent that runs (or is about to run: admitted as others finish)
        # has a call waiting. Counting only the agents already started flushed the first turn early, before
        # the last agents had sent their first call (3 sampler calls for 128 calls instead of 2)
        self.engine.expected = lambda: min(self.unfinished, self.concurrency)
        self._n = 0  # episodes run so far (unique path ids)

    def start(self):
        if self.transport == "http" and self.server is None:
            from seeupo.serve.app import BackgroundServer

            self.server = BackgroundServer(self.engine).start()
        elif self.transport == "local" and self._app is None:
            from seeupo.serve.app import build_app

            self._app = build_app(self.engine)
            # the batch is sampled in the run's own loop: every running agent waits on it anyway
            self.engine.inline = True
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()  # (closes the engine)
            self.server = None
        elif self._app is not None:
            self.engine.close()
            self._app = None

    def run(self, jobs, *, first_episode_id: int = 0, on_progress=None) -> list[Episode]:
        """One episode per job ``(task, group, sample, seed)``, in job order."""
        self.start()
        return asyncio.run(self._run(jobs, first_episode_id, on_progress))

    async def _run(self, jobs, first_episode_id, on_progress):
        import openai

        episodes = [Episode(first_episode_id + k, task.id, group, sample, seed)
                    for k, (task, group, sample, seed) in enumerate(jobs)]
        keys = []
        for ep in episodes:
            self._n += 1
            keys.append(f"e{self._n}")
            self.engine.recorder.open(keys[-1], ep.seed)
        done = 0
        self.unfinished = len(jobs)
        gate = asyncio.Semaphore(self.concurrency)
        client_timeout = self.timeout_s or 3600.0  # a request never waits forever
        # one connection pool for every episode's client (a client of its own costs 44 ms to build: its SSL
        # context; that was most of the agent path's overhead on the tiny preset)
        batching = None
        if self.transport == "local":
            # the app's batching loop in this loop (a server's lifespan starts it in the server's own)
            batching = asyncio.get_running_loop().create_task(self.engine.run_batches())
            await asyncio.sleep(0)
            http = openai.DefaultAsyncHttpxClient(timeout=client_timeout, transport=_asgi_transport(openai, self._app))
            url = lambda key: f"http://seeupo.local/ep/{key}/v1"  # noqa: E731
        else:  # plain HTTP to this machine: no certificate store loaded (a further 12 ms per run)
            http = openai.DefaultAsyncHttpxClient(timeout=client_timeout, verify=False)
            url = self.server.episode_url

        async def one(ep: Episode, task, key: str):
            nonlocal done
            async with gate:
                client = openai.AsyncOpenAI(base_url=url(key), api_key=self.api_key,
                                            max_retries=0, timeout=client_timeout, http_client=http)
                run = asyncio.ensure_future(self.agent(task, client))
                try:
                    finished, _ = await asyncio.wait({run}, timeout=self.timeout_s)
                    if not finished:  # ours: the agent's own TimeoutErrors are errors like any other
                        run.cancel()
                        return None, ("timeout", f"the agent ran past serve.agent_timeout_s={self.timeout_s:g} s")
                    return outcome(run.result()), None
                except Exception as e:  # noqa: BLE001 (the user's program: counted, never a crash of the run)
                    return None, ("error", f"agent: {e!r}")
                finally:
                    self.unfinished -= 1
                    self.engine.wake_threadsafe()
                    done += 1
                    if on_progress:
                        on_progress(done, len(jobs))

        try:
            results = await asyncio.gather(*(one(ep, job[0], key) for ep, job, key in zip(episodes, jobs, keys)))
        finally:
            await http.aclose()
            logs = [self.engine.recorder.close(key) for key in keys]  # calls still waiting are dropped, then
            if batching is not None:  # none runs on
                try:
                    await asyncio.wait_for(self.engine.idle(), 600)
                finally:
                    batching.cancel()
                    await asyncio.gather(batching, return_exceptions=True)
        if batching is None:
            asyncio.run_coroutine_threadsafe(self.engine.idle(), self.engine._loop).result(timeout=600)
        if self.engine.fatal is not None:  # the sampler failed: stop the run rather than train on nothing
            raise RuntimeError(f"the endpoint's sampler failed: {self.engine.fatal!r}") from self.engine.fatal
        for ep, log, (got, fault) in zip(episodes, logs, results):
            episode_from_calls(ep, log)
            ep.counts.update({f"refused_{k}": v for k, v in log.refused.items()})
            if log.overridden:
                ep.counts["temperature_overridden"] = log.overridden
            limit = next((POLICY_LIMITS[k] for k in log.refused if k in POLICY_LIMITS), None)
            other = [k for k in log.refused if k not in POLICY_LIMITS or not log.calls]  # (a too-long first prompt too)
            if other and (fault is None or fault[0] == "error"):  # the refusal is why the agent raised
                fault = ("refused", "the server refused a call: " + ", ".join(f"{k} x{log.refused[k]}" for k in other))
            elif limit and log.calls and (fault is None or fault[0] == "error"):
                # the policy ran into rollout.max_turns or max_context, as the built-in runner's episodes
                # do: kept and trained on, a failure unless the agent still returned a reward
                got, fault = (got if fault is None else (0.0, None, None)), None
                ep.end_reason = limit
            if fault is None and not log.calls:
                fault = ("no_call", "the agent made no model call")
            if fault is not None:
                ep.end_reason, ep.error = fault
                ep.step_rewards = [0.0] * ep.n_turns
                ep.score = 0.0
                continue
            reward, turns, score = got
            if turns is not None and len(turns) != ep.n_turns:
                ep.end_reason = "error"
                ep.error = f"agent: {len(turns)} turn_rewards for {ep.n_turns} calls"
                ep.step_rewards, ep.score = [0.0] * ep.n_turns, 0.0
                continue
            ep.step_rewards = turns if turns is not None else [0.0] * (ep.n_turns - 1) + [reward]
            ep.score = score if score is not None else sum(ep.step_rewards)
            ep.end_reason = ep.end_reason or "done"
        return episodes
