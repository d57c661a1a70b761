"""A plain tool-calling agent on the `openai` client that solves `lookup` tasks.

Nothing in it knows about seeupo: it talks to any OpenAI-compatible endpoint. Train it with

    seeupo train --preset tiny --agent examples/agents/lookup_agent.py:run

which points `client` at the run's own endpoint (every call recorded with its exact tokens), or run it
against a served checkpoint (docs/agents.md). The task is a `lookup` task: a table of keys, each
pointing at another key or a number; start at a key and follow the pointers to the number.

The prompt, the tool result text and the error text are the ones the built-in `lookup` environment
uses, so the format warm-up of the tiny preset (on that environment's demonstrations) carries over.
"""

from __future__ import annotations

import json


def make_tools(table: dict[str, str], keys: list[str], chain: list[str]):
    """The agent's tools as Python functions over the task's table; ``chain`` records the keys the
    agent has followed from the start (what the task rewards)."""

    def lookup(key: str) -> str:
        key = str(key).strip()
        if key not in table:
            return f"error: unknown key {json.dumps(key[:40])}. Keys: {', '.join(keys)}"
        chain.append(key)
        return f"{key} -> {table[key]}"

    return {"lookup": lookup}


TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "show what a key points to",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]


def prompt(data: dict) -> str:
    steps = "one lookup" if data["hops"] == 1 else f"{data['hops']} lookups"
    return ('Write exactly one tool call per message, as JSON: {"tool": "lookup", "key": "<key>"} shows what '
            f"the key points to.\nKeys: {', '.join(data['keys'])}.\nTask: start at the key {data['start']} and "
            f"follow what each key points to until you reach a number ({steps}).")


def followed(table: dict[str, str], start: str, hops: int, keys: list[str]) -> bool:
    """Did the lookups made follow the chain from ``start`` to its number (every hop, in order)?"""
    position, progress = start, 0
    for k in keys:
        if k == position and progress < hops:
            position, progress = table[k], progress + 1
    return progress == hops


async def run(task, client, *, model: str = "policy", max_turns: int | None = None) -> float:
    data = task.data
    table, chain = data["table"], []
    tools = make_tools(table, data["keys"], chain)
    messages = [{"role": "user", "content": prompt(data)}]
    for _ in range(max_turns or data["hops"]):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        msg = reply.choices[0].message
        messages.append({"role": "assistant", "content": msg.content,
                         **({"tool_calls": [c.model_dump() for c in msg.tool_calls]} if msg.tool_calls else {})})
        if not msg.tool_calls:
            messages.append({"role": "user", "content": "error: no JSON tool call found. Write one JSON tool call, "
                             f'e.g. {{"tool": "lookup", "key": "{data["keys"][0]}"}}'})
            continue
        call = msg.tool_calls[0]
        fn = tools.get(call.function.name)
        try:
            args = json.loads(call.function.arguments or "{}")
        except ValueError:
            args = None
        if fn is None:
            result = f"error: unknown tool {json.dumps(call.function.name[:40])}; use lookup"
        elif not isinstance(args, dict) or "key" not in args:
            result = f"error: unknown key. Keys: {', '.join(data['keys'])}"
        else:
            result = fn(args["key"])
        if followed(table, data["start"], data["hops"], chain):
            return 1.0  # the number at the end of the chain is revealed
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0
