"""Tool-call parsers, chosen by name. A parser never raises on model output: it returns a
``ToolCall`` or a ``ParseError`` whose message becomes the error observation.

- ``json``: the first JSON object in the text, ``{"tool": NAME, ...arguments}``.
- ``hermes``: ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` (Qwen/Hermes templates).

``count_calls(text, parser_name)`` counts the tool calls a reply holds, in the parser's syntax, so
an environment that acts on one call per turn can report the others as ``info["extra_calls"]``
(``extra_calls(text, parser_name)`` = calls beyond the first, never negative):

- ``json``: the top-level JSON objects (scanned left to right as the parser does, an object's
  nested objects are not counted separately) that have a ``"tool"`` key, whatever its value.
- ``hermes``: the ``<tool_call>`` blocks (the parser's own pattern; an unclosed block runs to the
  end of the text), whatever they hold.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Iterator

from seeupo.core.registry import pick

# what json raises on text it cannot decode: JSONDecodeError (a ValueError), ValueError for an
# integer over Python's digit limit, RecursionError for deep nesting
_JSON_ERRORS = (ValueError, RecursionError)
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)


@dataclass
class ToolCall:
    name: str
    args: dict = field(default_factory=dict)


@dataclass
class ParseError:
    message: str


def _json_objects(text: str) -> Iterator[dict]:
    """The top-level JSON objects of ``text``, left to right: from each ``{`` that starts a valid
    object, the next search starts after that object's end."""
    dec = json.JSONDecoder()
    pos = text.find("{")
    while pos >= 0:
        try:
            obj, end = dec.raw_decode(text, pos)
        except _JSON_ERRORS:
            pos = text.find("{", pos + 1)
            continue
        yield obj  # raw_decode at a "{" only ever returns a dict
        pos = text.find("{", end)


def _first_json_object(text: str):
    return next(_json_objects(text), None)


def parse_json(text: str) -> ToolCall | ParseError:
    obj = _first_json_object(text)
    if obj is None:
        return ParseError("no JSON tool call found")
    name = obj.get("tool")
    if not isinstance(name, str):
        return ParseError('the JSON object has no "tool" name')
    return ToolCall(name, {k: v for k, v in obj.items() if k != "tool"})


def parse_hermes(text: str) -> ToolCall | ParseError:
    m = _HERMES_BLOCK.search(text)
    if not m:
        return ParseError("no <tool_call> block found")
    obj = _first_json_object(m.group(1))
    if obj is None or not isinstance(obj.get("name"), str):
        return ParseError('the <tool_call> block needs {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except _JSON_ERRORS:
            return ParseError("the arguments are not valid JSON")
    if not isinstance(args, dict):
        return ParseError("the arguments must be a JSON object")
    return ToolCall(obj["name"], args)


def count_json_calls(text: str) -> int:
    return sum("tool" in obj for obj in _json_objects(text))


def count_hermes_calls(text: str) -> int:
    return sum(1 for _ in _HERMES_BLOCK.finditer(text))


PARSERS = {"json": parse_json, "hermes": parse_hermes}
CALL_COUNTERS = {"json": count_json_calls, "hermes": count_hermes_calls}


def get_parser(name: str):
    return pick(PARSERS, name, "tool-call parser")


def count_calls(text: str, parser_name: str) -> int:
    """The number of tool calls ``text`` holds in the syntax of the parser ``parser_name``."""
    return pick(CALL_COUNTERS, parser_name, "tool-call parser")(text)


def extra_calls(text: str, parser_name: str) -> int:
    """The calls in ``text`` beyond the one an environment acting on one call per turn uses."""
    return max(count_calls(text, parser_name) - 1, 0)
