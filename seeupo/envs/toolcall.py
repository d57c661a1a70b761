"""Tool-call parsers, chosen by name. A parser never raises on model output: it returns a
``ToolCall`` or a ``ParseError`` whose message becomes the error observation.

- ``json``: the first JSON object in the text, ``{"tool": NAME, ...arguments}``.
- ``hermes``: ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` (Qwen/Hermes templates).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from seeupo.core.registry import pick


@dataclass
class ToolCall:
    name: str
    args: dict = field(default_factory=dict)


@dataclass
class ParseError:
    message: str


def _first_json_object(text: str):
    dec = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = dec.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def parse_json(text: str) -> ToolCall | ParseError:
    obj = _first_json_object(text)
    if obj is None:
        return ParseError("no JSON tool call found")
    name = obj.get("tool")
    if not isinstance(name, str):
        return ParseError('the JSON object has no "tool" name')
    return ToolCall(name, {k: v for k, v in obj.items() if k != "tool"})


def parse_hermes(text: str) -> ToolCall | ParseError:
    m = re.search(r"<tool_call>(.*?)(</tool_call>|$)", text, re.S)
    if not m:
        return ParseError("no <tool_call> block found")
    obj = _first_json_object(m.group(1))
    if obj is None or not isinstance(obj.get("name"), str):
        return ParseError('the <tool_call> block needs {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ParseError("the arguments are not valid JSON")
    if not isinstance(args, dict):
        return ParseError("the arguments must be a JSON object")
    return ToolCall(obj["name"], args)


PARSERS = {"json": parse_json, "hermes": parse_hermes}


def get_parser(name: str):
    return pick(PARSERS, name, "tool-call parser")
