"""`seeupo serve` over real HTTP with the `openai` package's own client, and the exactness guards of
agent programs as the rollout source (issue 35): the ids trained on are the ids sampled, a chat
template that is not append-only trains on what the model saw, log-probs are finite and equal a
re-score, and episodes with no call, a refused call, an error or a timeout are counted and excluded."""

import asyncio
import copy
import json
import math

import openai
import pytest
import torch

from seeupo.data.episode import derive_seed, turn_rows
from seeupo.envs import make_family
from seeupo.rollout.agent import AgentSource, episode_from_calls, outcome
from seeupo.rollout.runner import Chat
from seeupo.rollout.sampler import HFSampler, ScriptedPolicy
from seeupo.serve.app import BackgroundServer
from seeupo.serve.engine import ChatEngine
from seeupo.train.learner import score

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}}}}]


def sampler(tiny, chat, temperature=1.0):
    return HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=temperature)


@pytest.fixture
def served(tiny, chat):
    eng = ChatEngine(sampler(tiny, chat), chat, model_name="tiny", max_new_tokens=12, max_context=512)
    with BackgroundServer(eng) as srv:
        yield eng, srv


def test_openai_client_chat_n_and_logprobs(served):
    eng, srv = served
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], n=3,
                                       logprobs=True, max_tokens=6, seed=7)
    assert len(r.choices) == 3 and [c.index for c in r.choices] == [0, 1, 2]
    texts = {c.message.content for c in r.choices}
    assert len(texts) > 1  # three draws of a random model, not one copied
    for c in r.choices:
        lp = [t.logprob for t in c.logprobs.content]
        assert 1 <= len(lp) <= 6 and all(math.isfinite(x) and x <= 0 for x in lp)
        assert c.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    again = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], n=3,
                                           logprobs=True, max_tokens=6, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]  # seeded
    with pytest.raises(openai.BadRequestError, match="non-empty"):
        client.chat.completions.create(model="tiny", messages=[])
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 600}])


def test_tool_call_round_trip(chat):
    """The model's own syntax parsed into OpenAI tool_calls; the client's tool_calls and tool message
    rendered back in the model's syntax and the user role (serve.tool_role=user)."""
    reply = json.dumps({"tool": "lookup", "key": "red"})
    policy = ScriptedPolicy(lambda env, rng: reply, chat.encode, chat.eos_id)
    policy.temperature = 1.0
    eng = ChatEngine(policy, chat, model_name="s", max_new_tokens=64)
    with BackgroundServer(eng) as srv:
        eng.recorder.open("a", 1)
        client = openai.OpenAI(base_url=srv.episode_url("a"), api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "find red"}]
        r = client.chat.completions.create(model="s", messages=msgs, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"key": "red"}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "red -> 42"}]
        client.chat.completions.create(model="s", messages=msgs, tools=TOOLS)
        r = client.chat.completions.create(model="s", messages=msgs, tool_choice="none", tools=TOOLS)
        assert r.choices[0].message.tool_calls is None  # tool_choice=none: text only
        log = eng.recorder.close("a")
    second = chat.decode(log.calls[1].prompt_ids)
    expected = chat.render([{"role": "user", "content": "find red"}, {"role": "assistant", "content": reply},
                            {"role": "user", "content": "red -> 42"}], generation_prompt=True)
    assert second == expected
    assert log.calls[1].observation == [{"role": "user", "content": "red -> 42"}]


async def _echo_agent(task, client):
    """Two calls; the second sends back a *changed* copy of the first reply (stripped, upper case)."""
    msgs = [{"role": "user", "content": f"task {task.id}"}]
    r = await client.chat.completions.create(model="p", messages=msgs)
    msgs += [{"role": "assistant", "content": r.choices[0].message.content.strip().upper()},
             {"role": "user", "content": "go on"}]
    await client.chat.completions.create(model="p", messages=msgs)
    return {"reward": 1.0, "turn_rewards": [0.25, 0.75]}


def _jobs(n=4, seed=0):
    tasks = make_family("lookup", {}).tasks("train")[:n]
    return [(t, i, 0, derive_seed(seed, "agent", t.id)) for i, t in enumerate(tasks)]


@pytest.mark.parametrize("transport", ["local", "http"])
def test_ids_trained_on_are_the_ids_sampled(tiny, chat, one_thread, transport):
    eng = ChatEngine(sampler(tiny, chat), chat, model_name="p", max_new_tokens=10, temperature=1.0)
    src = AgentSource(_echo_agent, eng, transport=transport)
    try:
        logs = {}
        close = eng.recorder.close

        def keep(key):
            logs[key] = close(key)
            return logs[key]
        eng.recorder.close = keep
        eps = src.run(_jobs())
    finally:
        src.close()
    assert len(logs) == 4
    for ep, log in zip(eps, logs.values()):
        assert ep.end_reason == "done", ep.error
        assert ep.n_turns == 2 and ep.step_rewards == [0.25, 0.75]
        for k, c in enumerate(log.calls):
            gen = [i for i, (m, t) in enumerate(zip(ep.gen_mask, ep.turn_of)) if m and t == k]
            assert [ep.ids[i] for i in gen] == c.ids  # exactly the sampled ids, none re-tokenised
            assert [ep.logp[i] for i in gen] == c.logp
            assert ep.ids[ep.turn_starts[k]:gen[0]] == c.prompt_ids
        # the second prompt holds the agent's changed text, not the sampled ids: a re-tokenised
        # transcript would train turn 0 on ids the model never sampled
        assert log.calls[1].prompt_ids[:len(log.calls[0].prompt_ids)] == log.calls[0].prompt_ids


async def _faithful_agent(task, client):
    """Two calls; the second sends the first reply back as it came. Odd tasks start 0.3 s late and even
    ones wait 0.6 s before their second call, so a batch of the odd tasks' first calls comes between
    the even tasks' two calls."""
    odd = int(task.id.rsplit("-", 1)[1]) % 2
    await asyncio.sleep(0.3 * odd)
    msgs = [{"role": "user", "content": f"task {task.id}"}]
    r = await client.chat.completions.create(model="p", messages=msgs)
    await asyncio.sleep(0.6 * (1 - odd))
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "go on"}]
    await client.chat.completions.create(model="p", messages=msgs)
    return 1.0


def test_a_reply_sent_back_unchanged_continues_the_sampled_ids(tiny, chat, one_thread):
    """An append-only template and the reply sent back as it came: the next prompt is the previous
    prompt, the sampled ids (closed with the end-of-turn token where cut) and the new text's ids, never
    a re-tokenisation of the reply (which differs from the sampled ids where those are not the
    tokenizer's own split), and the sampler pre-fills only the new tokens, whichever batches the calls
    came in (an open episode's cached prefix outlives sampler calls it is not in)."""
    smp = sampler(tiny, chat)
    eng = ChatEngine(smp, chat, model_name="p", max_new_tokens=10, temperature=1.0)
    src = AgentSource(_faithful_agent, eng)
    logs, close = {}, eng.recorder.close

    def keep(key):
        logs[key] = close(key)
        return logs[key]
    eng.recorder.close = keep
    try:
        src.run(_jobs(8))
    finally:
        src.close()
    retokenised = 0
    for log in logs.values():
        first, second = log.calls
        closed = first.ids if first.finished else [*first.ids, chat.eos_id]
        assert second.prompt_ids[:len(first.prompt_ids) + len(closed)] == first.prompt_ids + closed
        msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": first.text},
                {"role": "user", "content": "go on"}]
        assert chat.decode(second.prompt_ids).endswith(chat.render(msgs, generation_prompt=True)[
            len(chat.render(msgs[:1], generation_prompt=True)):])  # the same text as the template's
        retokenised += chat.encode(chat.decode(first.ids)) != first.ids
    assert retokenised > 0  # some replies are not the tokenizer's own split: the case this guards
    assert eng.continued == 8
    assert eng.batches >= 3  # the calls did come in several batches
    new_tokens = sum(len(c.prompt_ids) - len(logs[k].calls[0].prompt_ids) - len(logs[k].calls[0].ids)
                     for k in logs for c in logs[k].calls[1:])
    first_prompts = sum(len(log.calls[0].prompt_ids) for log in logs.values())
    # the second calls pre-filled their new tokens and each reply's last sampled token (whose keys and
    # values the sampler had not computed), nothing of the history
    assert smp.prefilled_tokens == first_prompts + new_tokens + len(logs)


NOT_APPEND_ONLY = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
    "<|im_start|>assistant\n[earlier reply]<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_template_not_append_only_trains_on_what_the_model_saw(tiny, one_thread):
    """A template that replaces earlier replies: each call is its own row, and re-scoring the rows
    gives the sampling log-probs (ratio 1 before any update), within the sampler's float gap."""
    tok = copy.deepcopy(tiny.tokenizer)
    tok.chat_template = NOT_APPEND_ONLY
    chat = Chat(tok)
    eng = ChatEngine(sampler(tiny, chat), chat, model_name="p", max_new_tokens=10, temperature=1.0)
    src = AgentSource(_echo_agent, eng)
    try:
        eps = src.run(_jobs(3))
    finally:
        src.close()
    for ep in eps:
        first_row = ep.ids[ep.turn_starts[0]:ep.turn_ends[0]]
        second_prompt = ep.ids[ep.turn_starts[1]:ep.turn_ends[1]]
        assert second_prompt[:len(first_row)] != first_row  # the template did drop the first reply
    rows = turn_rows(eps, tok.pad_token_id)
    logp, _ = score(tiny.model, rows, temperature=1.0, budget_tokens=4096)
    m = rows.loss_mask.bool()
    gap = (logp[m] - rows.old_logp[m]).abs().max().item()
    assert torch.isfinite(rows.old_logp[m]).all() and gap < 1e-4, gap


def test_faulty_agents_are_counted_and_excluded(tiny, chat, one_thread):
    async def agent(task, client):
        kind = task.data["start"]  # which failure, by task (stable across runs)
        i = int(task.id.rsplit("-", 1)[1])
        if i == 0:
            return 1.0  # no model call
        if i == 1:
            raise RuntimeError("tool crashed")
        if i == 2:
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x " * 900}])
        if i == 3:
            await asyncio.sleep(30)
        if i == 4:
            return "yes"  # not a reward
        r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": kind}])
        return float(len(r.choices[0].message.content) >= 0)

    eng = ChatEngine(sampler(tiny, chat), chat, model_name="p", max_new_tokens=4, max_context=256, temperature=1.0)
    src = AgentSource(agent, eng, timeout_s=3.0)
    try:
        eps = src.run(_jobs(6))
    finally:
        src.close()
    reasons = [e.end_reason for e in eps]
    assert reasons == ["no_call", "error", "refused", "timeout", "error", "done"], reasons
    assert [e.faulted for e in eps] == [True] * 5 + [False]
    assert eps[2].counts == {"refused_context_length_exceeded": 1}
    assert "tool crashed" in eps[1].error and "str" in eps[4].error
    assert eps[5].step_rewards == [1.0] and eps[5].score == 1.0


def test_a_policy_past_its_turn_limit_is_kept_as_max_turns(tiny, chat, one_thread):
    """As the built-in runner's episodes at rollout.max_turns: kept (trained on) with reward 0, not excluded."""
    async def agent(task, client):
        msgs = [{"role": "user", "content": "go"}]
        for _ in range(3):  # one call more than the server allows
            r = await client.chat.completions.create(model="p", messages=msgs)
            msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "again"}]
        return 1.0

    eng = ChatEngine(sampler(tiny, chat), chat, model_name="p", max_new_tokens=4, temperature=1.0, max_calls=2)
    src = AgentSource(agent, eng)
    try:
        eps = src.run(_jobs(2))
    finally:
        src.close()
    for e in eps:
        assert e.end_reason == "max_turns" and not e.faulted and e.n_turns == 2
        assert e.step_rewards == [0.0, 0.0] and e.counts == {"refused_max_turns": 1}


def test_outcome_values():
    assert outcome(0.5) == (0.5, None, None)
    assert outcome({"reward": 1, "turn_rewards": [0, 1], "score": 1}) == (1.0, [0.0, 1.0], 1.0)
    for bad in (True, "1", None, float("nan"), {"reward": "1"}, {"reward": 1, "turn_rewards": [float("inf")]}):
        with pytest.raises(ValueError):
            outcome(bad)


def test_episode_from_no_calls_is_empty(chat):
    from seeupo.data.episode import Episode
    from seeupo.serve.engine import EpisodeLog

    ep = episode_from_calls(Episode(0, "t", 0, 0, 0), EpisodeLog(0, torch.Generator()))
    assert ep.n_turns == 0 and ep.ids == []


SMALL = ["warmup.episodes=16", "warmup.epochs=1", "eval.tasks=2", "eval.k=2", "rollout.tasks_per_iteration=2",
         "rollout.group_size=2", "run.loggers=[jsonl]"]
EXAMPLE = "examples/agents/lookup_agent.py:run"


@pytest.mark.parametrize("algo", ["seeupo", "grpo"])
def test_cli_train_with_the_example_agent(tmp_path, algo):
    from pathlib import Path

    from typer.testing import CliRunner

    from seeupo.cli import app

    example = str(Path(__file__).parents[2] / EXAMPLE)
    res = CliRunner().invoke(app, ["train", "--preset", "tiny", "--agent", example, "--algo", algo, "--out",
                                   str(tmp_path), "--steps", "2", *SMALL, *(["algo.rows=turn"] if algo == "grpo" else [])])
    assert res.exit_code == 0, res.output
    train = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "reward_mean" in r]
    assert [r["iteration"] for r in train] == [0, 1]
    assert all(r["optimizer_steps"] >= 1 and r["episodes_excluded"] == 0 for r in train)
    assert any(r["episode/turns"] > 1 for r in train)
    bad = CliRunner().invoke(app, ["train", "--preset", "tiny", "--agent", "nowhere.py:run", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "no file nowhere.py" in bad.output
    bad = CliRunner().invoke(app, ["train", "--preset", "tiny", "--agent", example, "--algo", "grpo",
                                   "--out", str(tmp_path / "c")])
    assert bad.exit_code == 2 and "algo.rows=turn" in bad.output


def test_jsonl_tasks_for_an_agent(tmp_path):
    """env jsonl: tasks from a file (here the tiny preset's lookup tasks), trained with the example agent;
    refused without an agent or with a warm-up; bad lines named by file and line."""
    from pathlib import Path

    from typer.testing import CliRunner

    from seeupo.cli import app
    from seeupo.envs.jsonl import read_tasks
    from seeupo.train.config import load_config

    fam = make_family("lookup", load_config("tiny").env.options)
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps({"id": t.id, "split": t.split, **t.data})
                              for sp in ("train", "test") for t in fam.tasks(sp)[:6]) + "\n")
    tasks = read_tasks(str(path))
    assert len(tasks) == 12 and tasks[0].data == fam.tasks("train")[0].data
    example = str(Path(__file__).parents[2] / EXAMPLE)
    args = ["train", "--preset", "tiny", "--agent", example, "--env", "jsonl", f"env.options.path={path}",
            "warmup.enabled=off", "--steps", "1", *SMALL]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["iterations"] == 1 and s["eval_after"]["tasks"] == 2
    no_agent = [a for a in args if a not in ("--agent", example)]
    res = CliRunner().invoke(app, [*no_agent, "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "--agent" in res.output
    res = CliRunner().invoke(app, [*[a for a in args if a != "warmup.enabled=off"], "warmup.enabled=on",
                                   "--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and "warmup.enabled=off" in res.output
    for bad, msg in (("[1]\n", "JSON object"), ('{"id": "a"}\n{"id": "a"}\n', "repeated"), ("{x\n", "not JSON"),
                     ("\n", "no tasks")):
        p = tmp_path / "bad.jsonl"
        p.write_text(bad)
        with pytest.raises(ValueError, match=msg):
            read_tasks(str(p))
