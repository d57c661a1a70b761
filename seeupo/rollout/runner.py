"""The multi-turn episode runner.

All live episodes generate their turn ``t`` in one batch. Token in, token out: the ids the model
sampled (and their sampling log-probs) are what the learner trains on; an observation is appended
as the ids of the chat template's rendering *after* the tokens already in the stream, and the
runner checks that the stream's text is a prefix of the template's rendering of the new history
(a mismatch is counted in ``prefix_mismatches``, never re-tokenised away).

Turn contexts: ``history=None`` (``rollout.history=full``) keeps one growing stream, every turn's
prompt the whole transcript so far; ``history=K`` (``last:K``) renders each turn's prompt afresh
from the environment's first messages (system prompt, task), the last K exchanges (a reply and the
observation after it; K=0: the current observation alone), as agent trainers for ALFWorld and
WebShop do, so a long game costs short rows. Each turn's prompt then starts a new segment of the
episode's ids (``Episode.turn_starts``); earlier replies appear in it as the template renders their
text (context, never trained on), the turn's own sampled ids are kept as sampled.

Limits: ``max_turns`` (and the environment's own), ``max_new_tokens`` per turn, ``max_context``
for a turn's whole context (the stream, or with ``history=K`` the turn's segment; a turn cut at the
limit still fits its closing end-of-turn token), and
``env_timeout_s`` for every environment call (make + reset, step, score). Each episode records why
it ended: ``done`` (the environment ended it), ``max_turns``, ``context`` (no room for another turn),
``error`` (the environment raised) or ``timeout`` (an environment call ran past ``env_timeout_s``;
the call is abandoned in its daemon thread and the episode's environment is never used again).
Errors and timeouts end only their episode; the trainer leaves such episodes out of the loss.

A family with ``reward_at_end`` (TextWorld's ``reward: outcome``) has each episode's rewards moved
to its last turn once it ends (the same total; ended by the game, the turn limit or the context).

Per turn, ``info["tool_error"]`` counts at most one error (rates are per turn, at most 1) and
``info["extra_calls"]`` (calls beyond the one the environment acted on) is summed per episode.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch

from seeupo.data.episode import Episode, anchor_key, derive_seed
from seeupo.envs.base import EnvFamily, Task
from seeupo.rollout.sampler import Request


@dataclass
class RolloutLimits:
    max_turns: int = 4
    max_new_tokens: int = 48
    max_context: int = 2048
    env_timeout_s: float | None = None  # per environment call; None: no limit
    history: int | None = None  # None: the whole transcript; K: the last K exchanges (rollout.history=last:K)


class EnvTimeout(TimeoutError):
    """An environment call ran past ``RolloutLimits.env_timeout_s``."""


_env_thread = threading.local()  # per calling thread: the queue of its environment-call thread


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        fn, box, done = jobs.get()
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
            box["error"] = e
        done.set()


def call_with_timeout(fn, timeout: float | None, what: str):
    """``fn()``, or ``EnvTimeout`` when it takes longer than ``timeout`` seconds. The call runs in a
    daemon thread that serves every call of the calling thread in turn; on a timeout it is
    abandoned with the call still running (Python cannot kill a thread; a daemon thread does not keep
    the process alive) and the next call starts a fresh one. Exceptions of ``fn`` propagate.
    (A new thread per call made the tiny preset's 512 warm-up demonstrations take 8.9-9.5 s on 2
    cores busy with a sweep; one long-lived thread, 2.2-2.4 s.)"""
    if not timeout:
        return fn()
    jobs = getattr(_env_thread, "jobs", None)
    if jobs is None:
        jobs = _env_thread.jobs = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(jobs,), daemon=True, name="seeupo-env").start()
    box: dict = {}
    done = threading.Event()
    jobs.put((fn, box, done))
    if not done.wait(timeout):
        _env_thread.jobs = None  # its thread is busy with this call for good, as far as we know
        raise EnvTimeout(f"{what} took longer than {timeout:g} s (env.timeout_s)")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Chat:
    """Chat-template rendering and tokenisation for one tokenizer."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def render(self, messages, *, generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@dataclass
class _Live:
    ep: Episode
    env: object
    messages: list
    text: str  # the text of ep.ids
    gen: torch.Generator
    start: int = 0  # where the current turn's prompt starts in ep.ids
    initial: list | None = None  # history=K: the environment's first messages
    exchanges: list | None = None  # history=K: per finished turn, its reply and the observation after it
    obs: list | None = None  # the environment's latest messages: the next turn's anchor state


def run_episodes(policy, chat: Chat, family: EnvFamily, jobs: list[tuple[Task, int, int, int]],
                 limits: RolloutLimits, *, first_episode_id: int = 0, on_progress=None) -> list[Episode]:
    """Run one episode per job ``(task, group, sample, seed)``; returns them in job order.
    ``on_progress(finished, total)`` is called after every turn."""
    live: list[_Live] = []
    episodes: list[Episode] = []
    envs = []
    for k, (task, group, sample, seed) in enumerate(jobs):
        ep = Episode(first_episode_id + k, task.id, group, sample, seed)
        episodes.append(ep)
        env = None
        try:
            env = call_with_timeout(lambda: family.make(task, seed=derive_seed(seed, "env")), limits.env_timeout_s, "make")
            messages = call_with_timeout(env.reset, limits.env_timeout_s, "reset")
        except Exception as e:  # an environment failure ends this episode, not the run
            _fault(ep, e, "reset")
            envs.append(None)
            continue
        envs.append(env)
        text = chat.render(messages, generation_prompt=True)
        ep.append(chat.encode(text))
        live.append(_Live(ep, env, messages, text, torch.Generator().manual_seed(seed), initial=list(messages),
                          exchanges=[], obs=list(messages)))
    for turn in range(limits.max_turns):
        batch = []
        for lv in live:
            if turn >= getattr(lv.env, "max_turns", limits.max_turns):
                lv.ep.end_reason = "max_turns"
            elif len(lv.ep.ids) - lv.start + 1 >= limits.max_context:
                lv.ep.end_reason = "context"
            else:
                batch.append(lv)
        if not batch:
            live = []
            break
        for lv in batch:
            own = lv.env.anchor_state() if hasattr(lv.env, "anchor_state") else None
            lv.ep.anchors.append(anchor_key(lv.obs) if own is None else own)
        if hasattr(policy, "begin_turn"):  # a policy with turn-specific parameters (models.turns)
            policy.begin_turn(turn)
        samples = policy.act([
            # one token of the context stays free: a reply cut at its limit gets a closing end-of-turn
            Request(lv.ep.ids[lv.start:] if lv.start else lv.ep.ids, lv.gen,
                    min(limits.max_new_tokens, limits.max_context - (len(lv.ep.ids) - lv.start) - 1), lv.env)
            for lv in batch])
        live = []
        for lv, smp in zip(batch, samples):
            ep = lv.ep
            ep.append(smp.ids, turn=turn, logp=smp.logp)
            ep.turn_ends.append(len(ep.ids))
            if limits.history is not None:
                ep.turn_starts.append(lv.start)
            body = smp.ids[:-1] if smp.finished else smp.ids
            reply = chat.decode(body)
            ep.texts.append(reply)
            if not smp.finished:
                ep.truncated_turns += 1
            try:
                res = call_with_timeout(lambda: lv.env.step(reply), limits.env_timeout_s, "step")
            except Exception as e:
                _fault(ep, e, "step")
                if ep.end_reason == "timeout":  # still busy in its thread: never touched again
                    envs[ep.episode_id - first_episode_id] = None
                continue
            ep.step_rewards.append(float(res.reward))
            ep.tool_errors += min(1, int(res.info.get("tool_error", 0)))  # per turn: at most one
            ep.extra_calls += max(0, int(res.info.get("extra_calls", 0)))
            for k, v in res.info.items():  # an environment's own counters ("count/NAME")
                if k.startswith("count/"):
                    ep.counts[k[6:]] = ep.counts.get(k[6:], 0) + v
            if res.done:
                ep.end_reason = "done"
                continue
            lv.obs = list(res.observation)
            if limits.history is not None:  # the next turn's prompt, rendered afresh: a new segment
                lv.exchanges.append([{"role": "assistant", "content": reply}] + res.observation)
                recent = [m for ex in lv.exchanges[-limits.history:] for m in ex] if limits.history else res.observation
                prompt = chat.encode(chat.render(lv.initial + recent, generation_prompt=True))
                if len(prompt) + 1 >= limits.max_context:
                    ep.end_reason = "context"  # the next prompt and a turn do not fit
                    continue
                lv.start = len(ep.ids)
                ep.append(prompt)
                live.append(lv)
                continue
            stream = lv.text + chat.decode(smp.ids)
            if not smp.finished:  # close the turn so the template can go on (not trained on)
                ep.append([chat.eos_id])
                stream += chat.decode([chat.eos_id])
            lv.messages = lv.messages + [{"role": "assistant", "content": reply}] + res.observation
            nxt = chat.render(lv.messages, generation_prompt=True)
            if nxt.startswith(stream):
                delta = nxt[len(stream):]
            else:
                ep.prefix_mismatches += 1
                before = chat.render(lv.messages[:len(lv.messages) - len(res.observation)], generation_prompt=False)
                delta = nxt[len(before):] if nxt.startswith(before) else nxt[len(_common_prefix(nxt, stream)):]
            delta_ids = chat.encode(delta)
            if len(ep.ids) + len(delta_ids) + 1 >= limits.max_context:
                ep.end_reason = "context"  # the observation and another turn do not fit
                continue
            ep.append(delta_ids)
            lv.text = stream + delta
            live.append(lv)
        if on_progress:
            on_progress(len(episodes) - len(live), len(episodes))
    if on_progress and live:  # episodes still running at the turn limit are finished too
        on_progress(len(episodes), len(episodes))
    if hasattr(policy, "reset"):  # these episodes are over: a policy's per-episode state goes
        policy.reset()
    for ep, env in zip(episodes, envs):
        ep.end_reason = ep.end_reason or "max_turns"
        if env is not None:
            try:  # also after a crash in step: scoring releases the environment's resources (BFCL)
                score = float(call_with_timeout(env.score, limits.env_timeout_s, "score"))
                ep.score = 0.0 if ep.faulted else score  # an evaluation counts a faulted episode as failed
                if getattr(family, "reward_at_end", False) and ep.step_rewards:  # outcome-only rewards: the
                    ep.step_rewards = [0.0] * (len(ep.step_rewards) - 1) + [ep.reward]  # total on the last turn
            except Exception as e:
                if not ep.faulted:
                    _fault(ep, e, "score")
                ep.score = 0.0
    return episodes


def _fault(ep: Episode, e: Exception, call: str) -> None:
    """Mark ``ep`` as ended by its environment (a crash or a timeout in ``call``)."""
    ep.end_reason = "timeout" if isinstance(e, TimeoutError) else "error"  # ours, or a worker's read
    ep.error = f"{call}: {e!r}"


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]
