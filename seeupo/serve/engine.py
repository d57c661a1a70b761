"""Chat requests in, exact tokens out: the part of ``seeupo serve`` that knows no HTTP.

``ChatEngine.complete(body, episode=None)`` takes an OpenAI chat-completions request body, renders
its messages with the model's chat template (``tools`` passed to the template), samples with the
policy's sampler and returns the OpenAI response body. Requests that arrive together are batched
into one sampler call (``max_wait_s`` after the first, or as soon as ``expected()`` requests wait).

Exact tokens: a request for an episode (``episode`` set) is recorded in the ``Recorder`` as a
``Call``: the prompt ids exactly as the server built them, the sampled ids (the end-of-turn token
included where it was sampled) and their sampling log-probs. A trainer trains on those ids, never
on a re-tokenisation of the transcript, so each call is its own row and a chat template that is not
append-only (one that drops earlier turns' reasoning, say) costs nothing. Where a call's rendered text
goes on from the episode's previous prompt and reply (an append-only template, the reply sent back
as it came), its prompt ids are the previous prompt's, the sampled ids and the new text's: the row
the built-in runner builds, and the sampler's cached keys and values of the episode still apply (it
keeps them for open episodes until their next call, whatever batch that comes in).

Messages: ``content`` as a string or a list of text parts; an assistant message with ``tool_calls``
and no content is rendered in the parser's syntax (``json``: ``{"tool": NAME, ...arguments}``,
``hermes``: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``); a ``tool`` message is
rendered with the role ``tool_role`` (``user`` by default: small instruct models' templates have no
tool role, and the built-in environments send observations as user messages). Tool calls in a
reply are parsed with the same parser into OpenAI ``tool_calls`` (one call per reply, the parser's
first) when the request has ``tools`` and ``tool_choice`` is not ``none``.

Bad requests raise ``RequestError`` (HTTP 400 with OpenAI's error body), never a crash: malformed
messages, a prompt that leaves no room in ``max_context`` (``context_length_exceeded``), a call
beyond ``max_calls`` of a recorded episode. A recorded episode counts such refusals by reason.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from seeupo.envs.toolcall import ToolCall, get_parser
from seeupo.rollout.sampler import Request

ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(ValueError):
    """A request the server refuses: HTTP 400 with ``{"error": {"message", "type", "code"}}``."""

    def __init__(self, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.code = code


@dataclass
class Call:
    """One model call of a recorded episode: what the trainer trains on."""

    prompt_ids: list[int]
    ids: list[int]  # sampled ids; the end-of-turn token is the last one when ``finished``
    logp: list[float]  # sampling log-prob of each sampled id (at ``temperature``)
    finished: bool
    observation: list[dict]  # the request's messages after its last assistant message (the anchor state)
    text: str  # the reply's text (end-of-turn token removed)
    temperature: float


@dataclass
class EpisodeLog:
    seed: int
    generator: torch.Generator
    calls: list[Call] = field(default_factory=list)
    refused: dict = field(default_factory=dict)  # reason -> count of refused requests
    overridden: int = 0  # requests whose temperature differed from the run's (sampled at the run's)
    # the text and ids of the latest call's prompt and reply: a next prompt whose text goes on from it
    # continues these ids (the sampled ones, not a re-tokenisation of the reply's text)
    stream: tuple[str, list[int]] | None = None


class Recorder:
    """The calls of each open episode, keyed by its id (the ``/ep/<id>/v1`` path of the base URL)."""

    def __init__(self):
        self._logs: dict[str, EpisodeLog] = {}
        self._generators: set[torch.Generator] = set()
        self._lock = threading.Lock()

    def open(self, episode: str, seed: int) -> EpisodeLog:
        with self._lock:
            log = self._logs[episode] = EpisodeLog(seed, torch.Generator().manual_seed(seed))
            self._generators.add(log.generator)
            return log

    def is_open(self, generator: torch.Generator) -> bool:
        """Whether ``generator`` is an open episode's (the sampler keeps its cached prefix until it closes)."""
        return generator in self._generators

    def get(self, episode: str) -> EpisodeLog | None:
        with self._lock:
            return self._logs.get(episode)

    def close(self, episode: str) -> EpisodeLog | None:
        with self._lock:
            log = self._logs.pop(episode, None)
            if log is not None:
                self._generators.discard(log.generator)
            return log


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise RequestError("message content parts must be {\"type\": \"text\", \"text\": ...} (no images here)")
            parts.append(p["text"])
        return "".join(parts)
    raise RequestError(f"message content must be a string or a list of text parts, not {type(content).__name__}")


def render_call(name: str, arguments, parser: str) -> str:
    """A tool call in the model's own syntax (what the parser ``parser`` reads back)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise RequestError(f"tool call {name!r}: arguments are not valid JSON") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"tool call {name!r}: arguments must be a JSON object")
    if parser == "json":
        return json.dumps({"tool": name, **arguments})
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def normalise(messages, *, parser: str, tool_role: str) -> list[dict]:
    """OpenAI messages as the chat template takes them (role and text content only)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}] needs a role, one of {', '.join(ROLES)}")
        role, text = m["role"], _text(m.get("content"))
        if role == "assistant" and not text and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise RequestError(f"messages[{i}].tool_calls must be a list")
            text = "\n".join(render_call(c.get("function", {}).get("name", ""), c.get("function", {}).get("arguments", "{}"),
                                         parser) for c in calls if isinstance(c, dict))
        if role == "tool":
            role = tool_role
        if role == "developer":
            role = "system"
        out.append({"role": role, "content": text})
    return out


def observation(messages: list[dict]) -> list[dict]:
    """The messages after the last assistant message (all of them before the first reply)."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    return messages[last + 1:]


@dataclass
class _Item:
    prompt: list[int]
    generator: torch.Generator
    max_new: int
    temperature: float
    future: asyncio.Future
    episode: str | None = None  # a recorded episode's key: dropped once that episode is closed


class ChatEngine:
    """Renders, batches and samples. ``sampler``: anything with ``act(list[Request]) -> list[Sample]``
    and a ``temperature`` attribute (``HFSampler``, the vLLM backend). ``temperature``: the run's
    sampling temperature, or None to honour each request's (standalone serving). ``max_new_tokens``:
    the most tokens a reply may have (a request's ``max_tokens`` may ask for fewer)."""

    @classmethod
    def from_config(cls, sampler, chat, cfg, **kw) -> "ChatEngine":
        """The engine a run's config describes (model name, tool-call parser, tool role, context, batching
        wait); ``kw`` sets the rest (``max_new_tokens``, ``temperature``, ``max_calls``)."""
        return cls(sampler, chat, model_name=cfg.model.name, parser=cfg.serve.parser, tool_role=cfg.serve.tool_role,
                   max_context=cfg.rollout.max_context, max_wait_s=cfg.serve.max_wait_ms / 1000, **kw)

    def __init__(self, sampler, chat, *, model_name: str, parser: str = "json", tool_role: str = "user",
                 max_context: int = 2048, max_new_tokens: int = 256, temperature: float | None = None,
                 max_calls: int | None = None, max_wait_s: float = 0.01, recorder: Recorder | None = None):
        get_parser(parser)  # an unknown name fails here, not at the first request
        if tool_role not in ("user", "tool"):
            raise ValueError(f"tool_role={tool_role!r}: user or tool")
        self.sampler, self.chat, self.model_name = sampler, chat, model_name
        self.parser, self.tool_role = parser, tool_role
        self.max_context, self.max_new_tokens, self.temperature = max_context, max_new_tokens, temperature
        self.max_calls, self.max_wait_s = max_calls, max_wait_s
        self.recorder = recorder or Recorder()
        if hasattr(sampler, "retain"):  # an episode's cached prefix waits for its next call, in whatever batch
            sampler.retain = self.recorder.is_open
        self.expected = None  # () -> int: flush a batch as soon as this many requests wait
        self._pending: list[_Item] = []
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="seeupo-sample")  # one batch at a time
        self.batches = 0  # sampler calls made (diagnostic: requests per batch)
        self.requests = 0
        self.sample_seconds = 0.0  # time in the sampler (diagnostic: the rest is the endpoint's own)
        self.continued = 0  # prompts that continued their episode's sampled ids (diagnostic)
        self.fatal: BaseException | None = None  # the sampler failed: the run must stop, not count it per episode
        self._busy = False
        # sample in the batching loop's own thread, the loop waiting meanwhile (a run's in-process agents:
        # they wait on the batch anyway; a second thread's sampling ran ~25% slower here, its OpenMP
        # team beside the main thread's). False: in a worker thread, the server answering meanwhile
        self.inline = False

    # ------------------------------------------------------------------ batching
    async def run_batches(self) -> None:
        """The batching loop: started with the server (its event loop), runs until cancelled."""
        loop = self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while True:
            await self._wake.wait()
            # wait for the others while they keep arriving: up to max_wait_s after the latest arrival
            # (clients parse a batch's replies one after another, so the next turn's calls trickle in),
            # never longer than 10 x max_wait_s in all
            start = loop.time()
            seen, deadline = len(self._pending), start + self.max_wait_s
            while self._pending and len(self._pending) < self._target() and loop.time() < deadline:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), max(deadline - loop.time(), 0))
                except asyncio.TimeoutError:
                    break
                if len(self._pending) > seen:
                    seen, deadline = len(self._pending), min(loop.time() + self.max_wait_s, start + 10 * self.max_wait_s)
            batch, self._pending = self._pending, []
            self._wake.clear()
            # a request whose client gave up, or whose episode is closed (its agent timed out), is not sampled
            for it in batch:
                if not it.future.done() and it.episode is not None and self.recorder.get(it.episode) is None:
                    it.future.set_exception(RequestError("the episode is closed", "episode_closed"))
            batch = [it for it in batch if not it.future.done()]
            if not batch:
                continue
            self._busy = True
            try:
                if self.inline:
                    samples = self._sample(batch)
                else:
                    samples = await loop.run_in_executor(self._pool, self._sample, batch)
                if len(samples) != len(batch):
                    raise RuntimeError(f"the sampler returned {len(samples)} samples for {len(batch)} requests")
            except Exception as e:  # noqa: BLE001 (each waiting request gets the error; a run stops on it)
                self.fatal = e
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(e)
                continue
            finally:
                self._busy = False
            for it, s in zip(batch, samples):
                if not it.future.done():
                    it.future.set_result(s)

    async def idle(self) -> None:
        """Wait until no request waits and no batch is being sampled (a run's update may then use the model)."""
        while self._pending or self._busy:
            self._wake.set()
            await asyncio.sleep(0.002)

    def wake_threadsafe(self) -> None:
        """From another thread: ``expected()`` changed, look at the waiting requests again."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def _target(self) -> float:
        n = self.expected() if self.expected else None
        return n if n else math.inf

    def _sample(self, batch: list[_Item]):
        t0 = time.perf_counter()
        try:
            return self._sample_batch(batch)
        finally:
            self.sample_seconds += time.perf_counter() - t0

    def _sample_batch(self, batch: list[_Item]):
        self.batches += 1
        out = [None] * len(batch)
        old = self.sampler.temperature
        try:
            for t in sorted({it.temperature for it in batch}):
                idx = [i for i, it in enumerate(batch) if it.temperature == t]
                self.sampler.temperature = t
                with torch.no_grad():
                    got = self.sampler.act([Request(batch[i].prompt, batch[i].generator, batch[i].max_new, None)
                                            for i in idx])
                for i, s in zip(idx, got):
                    out[i] = s
        finally:
            self.sampler.temperature = old
        return out

    async def _submit(self, prompt, generator, max_new, temperature, episode=None):
        if self._wake is None:
            raise RuntimeError("ChatEngine.run_batches is not running (start the server)")
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(_Item(prompt, generator, max_new, temperature, fut, episode))
        self._wake.set()
        return await fut

    # ------------------------------------------------------------------ requests
    def render_text(self, messages: list[dict], tools=None) -> str:
        kw = {"tools": tools} if tools else {}
        try:
            return self.chat.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
        except Exception as e:  # noqa: BLE001 (a template's own check, e.g. roles that must alternate)
            raise RequestError(f"the model's chat template refused these messages: {e}", "template_error") from None

    def prompt_ids(self, text: str, log: EpisodeLog | None) -> list[int]:
        """The prompt's ids: where ``text`` goes on from the episode's latest prompt and reply (an
        append-only template, the reply sent back as it came), those ids (the sampled ones) and the new
        text's; otherwise the whole text tokenised. Both stand for the same text; the first keeps the
        sampler's cached keys and values of the episode usable and is the row the built-in runner builds."""
        if log is not None and log.stream is not None:
            seen, ids = log.stream
            if len(text) > len(seen) and text.startswith(seen):
                self.continued += 1
                return ids + self.chat.encode(text[len(seen):])
        return self.chat.encode(text)

    async def complete(self, body: dict, episode: str | None = None) -> dict:
        self.requests += 1
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        log = None
        if episode is not None:
            log = self.recorder.get(episode)
            if log is None:
                raise RequestError(f"no open episode {episode!r} on this server", "unknown_episode")
        try:
            return await self._complete(body, log, episode)
        except RequestError as e:
            if log is not None:
                log.refused[e.code] = log.refused.get(e.code, 0) + 1
            raise

    async def _complete(self, body: dict, log: EpisodeLog | None, episode: str | None = None) -> dict:
        n = body.get("n", 1)
        n = 1 if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > 16:
            raise RequestError("n must be an integer from 1 to 16")
        if log is not None and n > 1:
            raise RequestError("n > 1 in a recorded episode: the trainer cannot know which choice the agent went on "
                               "with; ask for one choice per call", "n_unsupported")
        for key, ok in (("stop", lambda v: not v), ("top_p", lambda v: v == 1), ("response_format", lambda v: not v),
                        ("stream", lambda v: not v), ("tool_choice", lambda v: v in ("auto", "none"))):
            if body.get(key) is not None and not ok(body[key]):
                raise RequestError(f"{key}={body[key]!r} is not supported by this server (docs/agents.md)", "unsupported")
        if log is not None and self.max_calls is not None and len(log.calls) >= self.max_calls:
            raise RequestError(f"this episode has made its {self.max_calls} calls (rollout.max_turns)", "max_turns")
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise RequestError("tools must be a list")
        messages = normalise(body.get("messages"), parser=self.parser, tool_role=self.tool_role)
        prompt_text = self.render_text(messages, tools)
        prompt = self.prompt_ids(prompt_text, log)
        room = self.max_context - len(prompt) - 1  # one token stays free for a closing end-of-turn
        if room < 1:
            raise RequestError(f"the prompt has {len(prompt)} tokens; the context holds {self.max_context}",
                               "context_length_exceeded")
        asked = body.get("max_tokens", body.get("max_completion_tokens"))
        if asked is not None and (not isinstance(asked, int) or asked < 1):
            raise RequestError("max_tokens must be a positive integer")
        max_new = min(room, self.max_new_tokens, asked or self.max_new_tokens)
        t_req = body.get("temperature")
        if t_req is not None and (not isinstance(t_req, (int, float)) or t_req < 0):
            raise RequestError("temperature must be a number >= 0")
        if self.temperature is not None:
            temperature = self.temperature
            if log is not None and t_req is not None and float(t_req) != self.temperature:
                log.overridden += 1  # the trainer's ratios need the run's temperature
        else:
            temperature = float(1.0 if t_req is None else t_req)
        if log is not None:
            gens = [log.generator] + [_child(log.generator) for _ in range(n - 1)]
        else:
            seed = body.get("seed")
            root = torch.Generator().manual_seed(int(seed) if isinstance(seed, int) else int(time.time_ns() % 2**62))
            gens = [root] + [_child(root) for _ in range(n - 1)]
        samples = await asyncio.gather(*(self._submit(prompt, g, max_new, temperature, episode) for g in gens))
        if log is not None and self.recorder.get(episode) is not log:
            raise RequestError("the episode is closed", "episode_closed")
        eos = self.chat.eos_id
        choices, completion = [], 0
        parse = get_parser(self.parser) if tools and body.get("tool_choice") != "none" else None
        want_logprobs = bool(body.get("logprobs"))
        for j, s in enumerate(samples):
            body_ids = s.ids[:-1] if s.finished and s.ids and s.ids[-1] == eos else s.ids
            text = self.chat.decode(body_ids)
            completion += len(s.ids)
            msg: dict = {"role": "assistant", "content": text}
            finish = "stop" if s.finished else "length"
            if parse is not None:
                call = parse(text)
                if isinstance(call, ToolCall):
                    msg["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                          "function": {"name": call.name, "arguments": json.dumps(call.args)}}]
                    finish = "tool_calls" if s.finished else finish
            choice = {"index": j, "message": msg, "finish_reason": finish, "logprobs": None}
            if want_logprobs:  # the tokens of ``content`` (the end-of-turn token, left out of it, too)
                choice["logprobs"] = {"content": [
                    {"token": self.chat.decode([i]), "logprob": lp, "bytes": list(self.chat.decode([i]).encode()),
                     "top_logprobs": []} for i, lp in zip(body_ids, s.logp)]}
            choices.append(choice)
            if log is not None:
                log.calls.append(Call(list(prompt), list(s.ids), list(s.logp), bool(s.finished),
                                      observation(messages), text, temperature))
                closed = list(s.ids) if s.finished else [*s.ids, eos]  # a cut reply is closed, as the runner does
                log.stream = (prompt_text + self.chat.decode(closed), list(prompt) + closed)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt) * n, "completion_tokens": completion,
                          "total_tokens": len(prompt) * n + completion}}

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _child(g: torch.Generator) -> torch.Generator:
    """A generator seeded from ``g``'s next draw (the extra choices of an ``n > 1`` request)."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (), generator=g)))
