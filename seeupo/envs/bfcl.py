"""``bfcl``: BFCL v4 multi-turn (the paper's benchmark), on BFCL's own backends and checker.

The data, the eight executable tool backends and the multi-turn checker ship in the PyPI package
``bfcl-eval`` (install it with ``seeupo setup bfcl``: without its declared dependencies, which pin
numpy 1.26 and pull about 1.9 GB of API clients the backends never use).

One episode is one BFCL entry. The system prompt is BFCL's default prompting-mode prompt (python
call syntax ``[f(a=1), g(b=2)]``) with the docs of the entry's functions, in BFCL's full JSON format
or a compact one-line-per-function format (``doc_format``). The user questions come one after
another, as in BFCL's own inference loop: a reply holding calls is executed and answered with one
``tool`` message per call; a reply without calls ends the current question and the next one is
served; more than ``max_steps_per_question`` call steps on one question fail the entry (BFCL's
force-quit). The reward is BFCL's ``multi_turn_checker`` (state and response checks): 1 or 0.

Safety and isolation:

- Replies are parsed by our own ``ast``-based decoder: only calls of listed functions with literal
  arguments (checked against the function's signature and documented types) ever reach BFCL's
  executor, which runs ``eval`` on call strings. Anything else becomes an error observation,
  counted in ``info["tool_error"]``.
- BFCL's executor prefixes every ``name(`` in a call string whose name is a method of the entry's
  backends with the backend instance, string literals included (``mkdir(dir_name='ls(')`` would
  make a folder named ``..._instance.ls(``). A call with an argument whose text holds such a
  ``name(`` (BFCL's own pattern: the name, optional spaces, ``(``), in a string at any depth of
  the argument, is malformed and never executed.

Step info (every step): ``tool_error`` 0 or 1 (1 when the reply is malformed or any of its calls
failed in the backend), ``exec_errors`` (how many of its calls failed in the backend), ``calls``
(calls executed), ``extra_calls`` 0 (several calls in one reply are BFCL's parallel calls, all
executed), ``error: "malformed"`` on a malformed reply, ``force_quit: 1`` when the step limit ends
the entry. ``BfclEnv.counts`` sums them over the episode: ``calls``, ``malformed``, ``exec_errors``.
- BFCL caches backend instances in module globals under a model-name key; every episode uses its
  own key, so parallel episodes of one entry never share state, and removes its instances when
  it is scored.

Split (the paper's): entries 0-99 of a category are ``train``, 100-199 ``test``.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import itertools
import json
import os
import random
import re
from pathlib import Path
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from seeupo.envs.base import Env, EnvFamily, EnvUnavailable, Message, StepResult, Task, register

BFCL_VERSION = "2026.3.23"
SETUP_HINT = "the bfcl environment needs the package bfcl-eval: run `seeupo setup bfcl`"
CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


def require_bfcl():
    """The ``bfcl_eval`` modules we use, or a clear error naming the setup command."""
    try:
        from bfcl_eval.constants import default_prompts, eval_config, executable_backend_config
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils
    except ImportError as e:
        raise EnvUnavailable(f"{SETUP_HINT} (import failed: {e})") from None
    return {"prompts": default_prompts, "paths": eval_config, "backends": executable_backend_config,
            "checker": multi_turn_checker, "utils": multi_turn_utils}


# ----------------------------------------------------------------------------- decoding model replies
class Call:
    __slots__ = ("name", "args", "kwargs")

    def __init__(self, name: str, args: list, kwargs: dict):
        self.name, self.args, self.kwargs = name, args, kwargs

    def __repr__(self):
        return f"Call({self.name!r}, {self.args!r}, {self.kwargs!r})"


class Malformed(Exception):
    """A reply that tries to call functions but is not a valid list of calls."""


_CALL_START = re.compile(r"^\s*\[?\s*[A-Za-z_][\w.]*\s*\(")


def decode_calls(text: str) -> list[Call]:
    """Decode a reply in BFCL's python syntax. ``[]`` means no call (plain text: the question is
    done); :class:`Malformed` means an attempted call that is not valid. Arguments must be literals."""
    body = text.strip().strip("`").strip()
    if body.startswith("python\n"):
        body = body[len("python\n"):].strip()
    if not body:
        return []
    src = body if body.startswith("[") else f"[{body}]"
    try:
        node = ast.parse(src, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        # ValueError: e.g. a lone surrogate (not encodable); RecursionError/MemoryError: too deep
        if _CALL_START.match(body):
            raise Malformed(f"invalid call syntax ({getattr(e, 'msg', None) or type(e).__name__})") from None
        return []
    elems = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    if not any(isinstance(e, ast.Call) for e in elems):
        return []  # e.g. a bare word: text, not a call
    calls = []
    for e in elems:
        if not isinstance(e, ast.Call) or not isinstance(e.func, ast.Name):
            raise Malformed("expected a list of calls like [func(arg=value)]")
        try:
            args = [ast.literal_eval(a) for a in e.args]
            kwargs = {}
            for kw in e.keywords:
                if kw.arg is None:
                    raise Malformed(f"{e.func.id}: **kwargs are not allowed")
                kwargs[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise Malformed(f"{e.func.id}: arguments must be literal values (strings, numbers, lists, ...)") from None
        calls.append(Call(e.func.id, args, kwargs))
    return calls


# BFCL's executor (multi_turn_utils._process_method_calls) rewrites every match of this pattern
# whose name is a backend method into ``<instance>.name``, inside string literals too
_REWRITTEN = re.compile(r"\b([a-zA-Z_]\w*)\s*(?=\()")

_TYPES = {"string": (str,), "integer": (int,), "float": (int, float), "number": (int, float),
          "boolean": (bool,), "array": (list, tuple), "tuple": (list, tuple), "dict": (dict,)}


def check_call(call: Call, docs: dict[str, dict], signatures: dict[str, inspect.Signature]) -> str:
    """The canonical call string (keyword arguments, ``repr`` values) or raise ``Malformed``.
    ``signatures``: each backend method's signature without ``self``; a call is known when the
    backend has the method (as in BFCL's executor, even if its doc is not shown yet: one reference
    answer in ``multi_turn_miss_func`` calls a withheld function). ``docs``: types to check."""
    if call.name not in signatures:
        raise Malformed(f"unknown function {call.name!r}; available: {', '.join(sorted(docs))}")
    sig = signatures[call.name]
    try:
        bound = sig.bind(*call.args, **call.kwargs)
    except TypeError as e:
        raise Malformed(f"{call.name}: {e}") from None
    props = docs.get(call.name, {}).get("parameters", {}).get("properties", {})
    for name, value in bound.arguments.items():
        want = _TYPES.get(props.get(name, {}).get("type", "any"))
        if value is None or want is None or isinstance(value, str) and int in want:
            continue  # BFCL's own reference calls pass strings for some documented integers
        if isinstance(value, bool) and bool not in want or not isinstance(value, want):
            raise Malformed(f"{call.name}: argument {name!r} must be {props[name]['type']}, "
                            f"got {type(value).__name__}")
    shown = {k: repr(v) for k, v in bound.arguments.items()}
    for name, text in shown.items():
        for m in _REWRITTEN.finditer(text):
            if m.group(1) in signatures:  # the executor would turn it into a method call
                raise Malformed(f"{call.name}: argument {name!r} contains the text {m.group(1)!r} followed by '(', "
                                f"which BFCL's executor treats as a call of the function {m.group(1)}; "
                                "write the value without '(' right after a function name")
    return f"{call.name}({', '.join(f'{k}={v}' for k, v in shown.items())})"


# ----------------------------------------------------------------------------- prompts
def _short_description(doc: dict) -> str:
    d = doc.get("description", "")
    return d.split("Tool description:", 1)[-1].strip()


def compact_doc(doc: dict) -> str:
    """``name(a: string, b: integer = 3) -- what it does``: one line per function."""
    params = doc.get("parameters", {})
    req = set(params.get("required", []))
    parts = []
    for name, p in params.get("properties", {}).items():
        t = p.get("type", "any")
        if name in req:
            parts.append(f"{name}: {t}")
        else:
            parts.append(f"{name}: {t} = {json.dumps(p.get('default'))}")
    return f"{doc['name']}({', '.join(parts)}) -- {_short_description(doc)}"


def format_docs(docs: list[dict], doc_format: str) -> str:
    if doc_format == "json":
        return json.dumps(docs, indent=4)  # BFCL's own default
    return "\n".join(compact_doc(d) for d in docs)


def system_prompt(docs: list[dict], doc_format: str) -> str:
    """BFCL's default system prompt (classic style, plaintext, python calls, no tag)."""
    P = require_bfcl()["prompts"]
    style = P.PROMPT_STYLE_TEMPLATES["classic"]
    return P.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"], task=style["task"],
        tool_call_format=style["tool_call_no_tag"].format(output_format=P.OUTPUT_FORMAT_MAPPING["python"],
                                                          param_types=P.PARAM_TYPE_MAPPING["python"]),
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(
            format="JSON" if doc_format == "json" else "compact (one line per function)",
            functions=format_docs(docs, doc_format)))


# ----------------------------------------------------------------------------- the environment
class BfclOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)
    category: Union[str, list[str]] = Field("multi_turn_base", description="a category, a list, or 'all' (the four)")
    doc_format: Literal["compact", "json"] = Field(
        "compact", description="function docs: one line per function (1.5-3.2k-token prompts) or BFCL's JSON (4.2-9.3k)")
    max_steps_per_question: int = Field(20, ge=1, description="call steps per question before the entry fails (BFCL: 20)")
    train_ids: tuple[int, int] = Field((0, 100), description="entry index range of the train split")
    test_ids: tuple[int, int] = Field((100, 200), description="entry index range of the test split")
    max_tasks: int | None = Field(None, ge=1, description="use only the first N tasks of each split")

    @field_validator("category")
    @classmethod
    def _known(cls, v):
        names = list(CATEGORIES) if v == "all" else [v] if isinstance(v, str) else v
        bad = [c for c in names if c not in CATEGORIES]
        if bad:
            raise ValueError(f"unknown BFCL categories {bad}; valid: {', '.join(CATEGORIES)} or 'all'")
        return names


_keys = itertools.count()
_NO_CALLS = {"tool_error": 0, "exec_errors": 0, "calls": 0, "extra_calls": 0}  # the info of a step without calls


class BfclEnv(Env):
    max_turns = 10_000  # the runner's rollout.max_turns and the per-question step limit bound an episode

    def __init__(self, task: Task, opts: BfclOptions, seed: int):
        self.B = require_bfcl()
        self.task, self.opts = task, opts
        self.entry, self.gt = task.data["entry"], task.data["ground_truth"]
        # distinct per episode (and process): BFCL keys its cached backend instances by this name
        self.key = f"seeupo_{os.getpid()}_{next(_keys)}_{seed % 10**8}"
        self.long_context = "long_context" in task.data["category"]
        self.questions = copy.deepcopy(self.entry["question"])
        self.all_docs = {d["name"]: d for d in task.data["docs"]}
        self.docs = dict(self.all_docs)  # the docs shown so far
        self.held_out = {int(k): v for k, v in task.data["held_out"].items()}
        self.signatures = backend_signatures(self.entry["involved_classes"])
        self.q = 0  # the question being answered
        self.steps = 0  # call steps on this question
        self.decoded: list[list[list[str]]] = [[]]  # per question, per step: executed call strings
        self.force_quit = False
        self.finished = False
        self.counts = {"calls": 0, "malformed": 0, "exec_errors": 0}
        self._oracle_sent = -1  # the last question whose reference calls the oracle sent

    # -- protocol
    def reset(self) -> list[Message]:
        docs = [d for d in self.task.data["docs"] if d["name"] not in self._withheld()]
        self.docs = {d["name"]: d for d in docs}
        self._execute([])  # create this episode's backend instances from the entry's initial state
        return [{"role": "system", "content": system_prompt(docs, self.opts.doc_format)}, *self._question(0)]

    def _withheld(self) -> set[str]:
        return {d["name"] for q, ds in self.held_out.items() for d in ds}

    def _question(self, i: int) -> list[Message]:
        if i in self.held_out:  # miss_func: the withheld functions arrive with an empty question
            P = self.B["prompts"]
            return [{"role": "user", "content": P.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
                functions=format_docs(self.held_out[i], self.opts.doc_format))}]
        return list(self.questions[i])

    def _execute(self, calls: list[str]) -> list[str]:
        results, _ = self.B["utils"].execute_multi_turn_func_call(
            calls, self.entry["initial_config"], self.entry["involved_classes"], self.key, self.entry["id"],
            long_context=self.long_context, is_evaL_run=False)
        return results

    def step(self, assistant_text: str) -> StepResult:
        try:
            calls = decode_calls(assistant_text)
            strings = [check_call(c, self.all_docs, self.signatures) for c in calls]
        except Malformed as e:
            self.counts["malformed"] += 1
            return self._after_step([{"role": "tool", "content": f"Error: {e}. Write the calls as "
                                      "[func_name(param=value, ...), ...], or reply in plain text when done."}],
                                    {**_NO_CALLS, "tool_error": 1, "error": "malformed"})
        if not strings:  # no call: the question is done, serve the next one
            self.q += 1
            if self.q >= len(self.questions):
                self.finished = True
                return StepResult([], 0.0, True, dict(_NO_CALLS))
            self.steps = 0
            self.decoded.append([])
            for d in self.held_out.get(self.q, []):  # now shown to the model
                self.docs[d["name"]] = d
            return StepResult(self._question(self.q), 0.0, False, dict(_NO_CALLS))
        results = self._execute(strings)
        self.decoded[self.q].append(strings)
        self.counts["calls"] += len(strings)
        errors = sum(r.startswith("Error during execution") for r in results)
        self.counts["exec_errors"] += errors
        return self._after_step([{"role": "tool", "content": r} for r in results],
                                {"tool_error": int(errors > 0), "exec_errors": errors, "calls": len(strings),
                                 "extra_calls": 0})

    def _after_step(self, observation: list[Message], info: dict) -> StepResult:
        self.steps += 1
        if self.steps > self.opts.max_steps_per_question:
            self.force_quit = True  # BFCL: the whole entry fails
            return StepResult([], 0.0, True, {**info, "force_quit": 1})
        return StepResult(observation, 0.0, False, info)

    def score(self) -> float:
        """BFCL's multi-turn checker on the executed calls: 1.0 or 0.0 (0 when questions were left
        unserved or the step limit was hit, as BFCL scores a force-terminated entry)."""
        try:
            served = min(self.q + 1, len(self.questions))
            if self.force_quit or served < len(self.questions):
                return 0.0
            entry = {"id": self.entry["id"], "initial_config": self.entry["initial_config"],
                     "involved_classes": self.entry["involved_classes"]}
            res = self.B["checker"].multi_turn_checker(self.decoded, self.gt, entry, self.task.data["category"],
                                                       self.key + "_chk")
            return float(bool(res.get("valid")))
        finally:
            self.release()

    def release(self) -> None:
        """Drop this episode's backend instances from BFCL's module globals."""
        g = vars(self.B["utils"])
        for name in [k for k in g if k.startswith(self.key + "_")]:
            del g[name]

    # -- scripted policies
    def oracle_action(self) -> str:
        """The reference calls of the current question in one step, then a plain-text reply."""
        calls = self.gt[self.q] if self.q < len(self.gt) else []
        if calls and self._oracle_sent != self.q:
            self._oracle_sent = self.q
            return "[" + ", ".join(calls) + "]"
        return "Done."

    def demo_action(self, rng: random.Random) -> str:
        """Format-correct and answer-blind: a random listed function with arguments filled from words
        of the question, or a plain-text reply that ends the question."""
        if self.steps >= 2 or rng.random() < 0.4:
            return "Done."
        name = rng.choice(sorted(self.docs))
        params = self.docs[name].get("parameters", {})
        text = " ".join(m["content"] for m in self._question(self.q))
        words = re.findall(r"'([^']+)'", text) or re.findall(r"[A-Za-z_]{3,}", text) or ["x"]
        args = []
        for p in params.get("required", []):
            t = params.get("properties", {}).get(p, {}).get("type", "string")
            v = {"integer": rng.randint(1, 10), "float": float(rng.randint(1, 100)), "boolean": rng.random() < 0.5,
                 "array": [], "dict": {}}.get(t, rng.choice(words))
            args.append(f"{p}={v!r}")
        return f"[{name}({', '.join(args)})]"


def backend_signatures(classes) -> dict[str, inspect.Signature]:
    """The public methods of BFCL's backend classes, by name, with signatures without ``self``
    (computed once per set of classes, not per episode)."""
    return _signatures(tuple(classes))


@functools.lru_cache(maxsize=None)
def _signatures(classes: tuple[str, ...]) -> dict[str, inspect.Signature]:
    paths = require_bfcl()["backends"].CLASS_FILE_PATH_MAPPING
    out = {}
    for cls_name in classes:
        cls = getattr(importlib.import_module(paths[cls_name]), cls_name)
        for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction):
            if not name.startswith("_"):
                sig = inspect.signature(fn)
                out[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return out


@register("bfcl")
class BfclFamily(EnvFamily):
    name = "bfcl"

    def __init__(self, **options):
        self.opts = BfclOptions(**options)
        self.B = require_bfcl()
        self._tasks: dict[str, list[Task]] = {}

    def _load(self, category: str) -> list[tuple[dict, list]]:
        paths = self.B["paths"]
        prefix = getattr(paths, "VERSION_PREFIX", "BFCL_v4")
        entries = _jsonl(Path(paths.PROMPT_PATH) / f"{prefix}_{category}.json")
        answers = {a["id"]: a["ground_truth"] for a in _jsonl(Path(paths.POSSIBLE_ANSWER_PATH) / f"{prefix}_{category}.json")}
        return [(e, answers[e["id"]]) for e in entries]

    def _docs(self, classes: list[str]) -> list[dict]:
        files = self.B["backends"].MULTI_TURN_FUNC_DOC_FILE_MAPPING
        docs = []
        for c in classes:
            docs.extend(_jsonl(Path(self.B["paths"].MULTI_TURN_FUNC_DOC_PATH) / files[c]))
        return docs

    def tasks(self, split: str) -> list[Task]:
        ranges = {"train": self.opts.train_ids, "test": self.opts.test_ids}
        if split not in ranges:
            raise ValueError(f"unknown split {split!r}; valid: train, test")
        if split not in self._tasks:
            lo, hi = ranges[split]
            out = []
            for cat in self.opts.category:
                for entry, gt in self._load(cat)[lo:hi][: self.opts.max_tasks]:
                    docs = self._docs(entry["involved_classes"])
                    by_name = {d["name"]: d for d in docs}
                    held = {k: [by_name[n] for n in names] for k, names in entry.get("missed_function", {}).items()}
                    out.append(Task(id=entry["id"], split=split, data={
                        "category": cat, "entry": entry, "ground_truth": gt, "docs": docs, "held_out": held}))
            self._tasks[split] = out
        return self._tasks[split]

    def make(self, task: Task, *, seed: int) -> BfclEnv:
        return BfclEnv(task, self.opts, seed)


def _jsonl(path: Path) -> list[dict]:
    text = path.read_text()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]
