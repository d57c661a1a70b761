"""Fuzzing (hypothesis): random model text into every tool-call parser and every environment's step.

Properties: nothing raises; ``info["tool_error"]`` is 0 or 1; ``info["extra_calls"]`` is a count
>= 0, exact on replies built with a known number of calls; the environments' own counters equal the
sums of their step infos; BFCL never executes a call string its executor would rewrite inside an
argument; TextWorld never lets a command write files. BFCL and TextWorld skip without their packages,
AppWorld's step without its configured environment.
"""

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seeupo.envs import toolcall
from seeupo.envs.appworld import extract_code
from seeupo.envs.base import EnvUnavailable, make_family
from seeupo.envs.lookup import WORDS


def fuzz(max_examples: int):
    return settings(max_examples=max_examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- strategies
BFCL_NAMES = ["ls", "cd", "mkdir", "pwd", "echo", "cat", "touch", "mv", "rm", "sort", "grep", "post_tweet",
              "authenticate_twitter", "open", "exit", "__import__", "os.system"]
BFCL_PARAMS = ["folder", "dir_name", "file_name", "content", "a", "pattern", "source", "destination", "username",
               "password", "x", "_"]
TW_COMMANDS = ["go north", "go south", "go east", "go west", "look", "inventory", "examine cabinet", "open cabinet",
               "take key", "close type 2 chest", "save", "script", "transcripts", "restart", "quit", "restore",
               "undo", "y", "yes", "look. save", "look then script on", "\\s", "\\R", "look \\P", "\\x"]
FRAGMENTS = ["{", "}", '"tool"', '"lookup"', '"answer"', '"key"', '"value"', '"name"', '"arguments"', ":", ",",
             "<tool_call>", "</tool_call>", "[", "]", "](", "(", ")", "=", '"', "'", "\\", "\n", " ", "```",
             "```python\n", "null", "1e999", "-", "*", "**", "lambda", ">", ".", *BFCL_NAMES, *TW_COMMANDS,
             *WORDS[:6], "\x00", "\x1b", "\u202e", "\u00a0", "é", "İ", "🙂", "\ud800", "1" * 5000, "[" * 1200,
             '{"a":' * 600, "(" * 300, "x" * 3000]
# the opening of a call, then something hostile where its value goes
PREFIXES = ['{"tool": "answer", "value": ', '{"tool": "lookup", "key": ', '{"a": ',
            '<tool_call>{"name": "lookup", "arguments": ', '<tool_call>{"name": "x", "arguments": "',
            "[mkdir(dir_name=", "[ls(a=", "pwd(", "> "]
HAZARDS = ["1" * 5000, "-" + "9" * 4400, "[" * 1200, '{"a": ' * 1200, "(" * 300, "-" * 5000 + "1", '"\\ud800"',
           "\ud800", "\x00", "'\x00'", '"' + "x" * 5000, '{\\"a\\": ' + "1" * 5000 + "}", "1e999", "NaN", "'ls('",
           "'cd ('"]
model_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=25).map("".join),
    st.lists(st.sampled_from(PREFIXES + HAZARDS), min_size=1, max_size=4).map("".join))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.sampled_from(WORDS),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
tool_names = st.sampled_from(["lookup", "answer"]) | st.text(max_size=6) | json_values
tool_objects = st.builds(lambda tool, extra: {**extra, "tool": tool}, tool_names,
                         st.dictionaries(st.sampled_from(["key", "value", "x"]) | st.text(max_size=5), json_values,
                                         max_size=3))
# a call with a call-shaped object inside: one call, not two
nested_tool_objects = st.builds(lambda tool, inner: {"tool": tool, "arguments": inner}, tool_names, tool_objects)
plain_objects = st.dictionaries(st.text(max_size=6).filter(lambda k: k != "tool"), json_values, max_size=3)
no_brace_text = st.text(max_size=20).filter(lambda s: "{" not in s)
no_tag_text = st.text(max_size=20).filter(lambda s: "<" not in s)
hermes_bodies = st.one_of(
    st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}), tool_names, json_values),
    no_tag_text).filter(lambda s: "tool_call>" not in s)


def lookup_replies():
    tools = st.sampled_from(["lookup", "answer"]) | tool_names
    calls = st.builds(lambda t, k, v: json.dumps({"tool": t, "key": k, "value": v}), tools,
                      st.sampled_from(WORDS) | json_values, st.integers(10, 99) | json_values)
    hermes = st.builds(lambda n, a: f'<tool_call>{{"name": {json.dumps(n)}, "arguments": {json.dumps(a)}}}</tool_call>',
                       tools, st.fixed_dictionaries({"key": st.sampled_from(WORDS)}) | json_values)
    several = st.lists(calls | hermes, min_size=2, max_size=3).map(" then ".join)
    return st.lists(st.one_of(model_text, calls, hermes, several), min_size=1, max_size=5)


py_literals = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(["ls(", "cd (", "see mkdir(x", "pwd()", "document", "a.txt", "ls"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=6)
BFCL_STRINGS = ["document", "archive", "a.txt", "ls(", "final_report.pdf", "cd (", "see mkdir(x", "pwd()", "ls", None]
bfcl_any_call = st.builds(lambda name, kw: f"{name}({', '.join(f'{k}={v!r}' for k, v in kw.items())})",
                          st.sampled_from(BFCL_NAMES), st.dictionaries(st.sampled_from(BFCL_PARAMS), py_literals,
                                                                        max_size=3))
_TYPED = {"string": st.sampled_from(BFCL_STRINGS) | st.text(max_size=12), "integer": st.integers(-3, 20),
          "boolean": st.booleans(), "float": st.floats(-5, 5), "array": st.lists(st.sampled_from(BFCL_STRINGS), max_size=2),
          "dict": st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(BFCL_STRINGS), max_size=2)}


def bfcl_calls(docs: list[dict]):
    """Calls of the task's functions with (mostly) type-correct arguments, to reach the executor."""
    def call(doc):
        params = doc.get("parameters", {})
        props, required = params.get("properties", {}), set(params.get("required", []))
        value = {p: st.one_of(*[_TYPED.get(v.get("type"), py_literals)] * 4, py_literals) for p, v in props.items()}
        args = st.fixed_dictionaries({p: value[p] for p in props if p in required},
                                     optional={p: value[p] for p in props if p not in required})
        return args.map(lambda kw: f"{doc['name']}({', '.join(f'{k}={v!r}' for k, v in kw.items())})")
    return st.one_of(*[call(d) for d in docs])


def bfcl_replies(docs: list[dict]):
    calls = st.one_of(bfcl_calls(docs), bfcl_calls(docs), bfcl_any_call)
    replies = st.lists(calls, min_size=1, max_size=3).map(lambda cs: "[" + ", ".join(cs) + "]")
    return st.lists(st.one_of(replies, model_text), min_size=1, max_size=6)


def check_info(info: dict) -> None:
    assert info["tool_error"] in (0, 1) and type(info["tool_error"]) is int
    extra = info.get("extra_calls", 0)
    assert type(extra) is int and extra >= 0


def check_observation(obs) -> None:
    assert isinstance(obs, list)
    for m in obs:
        assert isinstance(m["role"], str) and isinstance(m["content"], str)


# ----------------------------------------------------------------------------- parsers
@fuzz(300)
@given(model_text)
def test_parsers_never_raise_and_counts_are_counts(text):
    for name, parse in toolcall.PARSERS.items():
        res = parse(text)
        assert isinstance(res, (toolcall.ToolCall, toolcall.ParseError))
        if isinstance(res, toolcall.ToolCall):
            assert isinstance(res.name, str) and isinstance(res.args, dict)
        else:
            assert isinstance(res.message, str) and res.message
        n = toolcall.count_calls(text, name)
        assert type(n) is int and n >= 0
        assert toolcall.extra_calls(text, name) == max(n - 1, 0)


@pytest.fixture(scope="module")
def lookup_families():
    return {p: make_family("lookup", {"parser": p, "tool_failure": 0.3, "observation_noise": 0.3,
                                      "intermediate_reward": 0.5, "train_tasks": 4}) for p in toolcall.PARSERS}


@fuzz(300)
@given(items=st.lists(st.one_of(st.tuples(st.just("call"), tool_objects | nested_tool_objects),
                                st.tuples(st.just("plain"), plain_objects), st.tuples(st.just("text"), no_brace_text)),
                      max_size=6))
def test_json_call_count_is_exact(lookup_families, items):
    """A reply with n top-level JSON objects with a "tool" key (objects nested in them, objects without
    "tool" and text without braces around them) holds n calls: extra_calls = max(n - 1, 0)."""
    reply = "".join(json.dumps(x) if kind != "text" else x for kind, x in items)
    n = sum(kind == "call" for kind, _ in items)
    assert toolcall.count_calls(reply, "json") == n
    env = lookup_families["json"].make(lookup_families["json"].tasks("train")[0], seed=0)
    env.reset()
    res = env.step(reply)
    check_info(res.info)
    assert res.info["extra_calls"] == max(n - 1, 0)
    objects = [x for kind, x in items if kind != "text"]  # the parser acts on the first object
    if objects and isinstance(objects[0].get("tool"), str):
        assert toolcall.parse_json(reply) == toolcall.ToolCall(objects[0]["tool"],
                                                               {k: v for k, v in objects[0].items() if k != "tool"})
    else:
        assert isinstance(toolcall.parse_json(reply), toolcall.ParseError)


@fuzz(200)
@given(bodies=st.lists(hermes_bodies, max_size=5), fillers=st.lists(no_tag_text, min_size=6, max_size=6),
       unclosed=st.booleans())
def test_hermes_call_count_is_exact(lookup_families, bodies, fillers, unclosed):
    blocks = [f"<tool_call>{b}</tool_call>" for b in bodies]
    if blocks and unclosed:
        blocks[-1] = blocks[-1][: -len("</tool_call>")]
    reply = fillers[0] + "".join(b + f for b, f in zip(blocks, fillers[1:]))
    assert toolcall.count_calls(reply, "hermes") == len(bodies)
    fam = lookup_families["hermes"]
    env = fam.make(fam.tasks("train")[0], seed=0)
    env.reset()
    res = env.step(reply)
    check_info(res.info)
    assert res.info["extra_calls"] == max(len(bodies) - 1, 0)


def test_parsers_survive_known_hazards():
    """Inputs that made json raise past the parsers: an integer over Python's digit limit, deep nesting."""
    for text in ('{"tool": "answer", "value": ' + "1" * 5000 + "}", '{"tool": ' + "[" * 100000,
                 '<tool_call>{"name": "x", "arguments": "{\\"a\\": ' + "1" * 5000 + '}"}</tool_call>'):
        for name, parse in toolcall.PARSERS.items():
            assert isinstance(parse(text), toolcall.ParseError), (name, text[:40])
            assert toolcall.count_calls(text, name) <= 1


# ----------------------------------------------------------------------------- lookup
@fuzz(300)
@given(parser=st.sampled_from(sorted(toolcall.PARSERS)), task_index=st.integers(0, 3), seed=st.integers(0, 99),
       replies=lookup_replies())
def test_lookup_step_fuzz(lookup_families, parser, task_index, seed, replies):
    fam = lookup_families[parser]
    env = fam.make(fam.tasks("train")[task_index], seed=seed)
    check_observation(env.reset())
    for reply in replies[: env.max_turns]:
        res = env.step(reply)
        check_info(res.info)
        check_observation(res.observation)
        assert math.isfinite(res.reward) and 0.0 <= res.reward <= 1.5
        assert res.done or res.observation
        if res.done:
            break
    assert env.score() in (0.0, 1.0)


# ----------------------------------------------------------------------------- bfcl
@pytest.fixture(scope="module")
def bfcl():
    pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: run `seeupo setup bfcl`")
    fam = make_family("bfcl", {"category": "multi_turn_base", "max_tasks": 1})
    task = fam.tasks("train")[0]  # GorillaFileSystem and TwitterAPI
    return fam, task, bfcl_replies(task.data["docs"])


def rewritten_inside(call_string: str, names) -> bool:
    """Whether BFCL's executor would rewrite anything in ``call_string`` beyond its leading function name
    (BFCL's own rewriting function, not ours)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import _process_method_calls

    return _process_method_calls(call_string, {n: "INSTANCE" for n in names}) != "INSTANCE." + call_string


@fuzz(300)
@given(data=st.data())
def test_bfcl_decoder_and_checker_never_raise(bfcl, data):
    from seeupo.envs.bfcl import Call, Malformed, backend_signatures, check_call, decode_calls

    fam, task, replies = bfcl
    text = data.draw(st.one_of(model_text, replies.map(lambda r: r[-1])))
    sigs = backend_signatures(task.data["entry"]["involved_classes"])
    docs = {d["name"]: d for d in task.data["docs"]}
    try:
        calls = decode_calls(text)
    except Malformed as e:
        assert str(e)
        return
    assert all(isinstance(c, Call) for c in calls)
    for c in calls:
        try:
            s = check_call(c, docs, sigs)
        except Malformed as e:
            assert str(e)
            continue
        assert s.startswith(c.name + "(") and not rewritten_inside(s, sigs)


@fuzz(200)
@given(data=st.data(), seed=st.integers(0, 10**6))
def test_bfcl_step_fuzz(bfcl, data, seed):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    fam, task, replies = bfcl
    replies = data.draw(replies)
    env = fam.make(task, seed=seed)
    check_observation(env.reset())
    infos = []
    try:
        for reply in replies:
            res = env.step(reply)
            infos.append(res.info)
            check_info(res.info)
            check_observation(res.observation)
            assert res.reward == 0.0 and res.info["extra_calls"] == 0
            assert res.info["tool_error"] == int(res.info.get("error") == "malformed" or res.info["exec_errors"] > 0)
            if res.done:
                break
        assert env.counts == {"calls": sum(i["calls"] for i in infos),
                              "malformed": sum(i.get("error") == "malformed" for i in infos),
                              "exec_errors": sum(i["exec_errors"] for i in infos)}
        executed = [s for question in env.decoded for step in question for s in step]
        assert len(executed) == env.counts["calls"]
        assert not [s for s in executed if rewritten_inside(s, env.signatures)]
    finally:
        env.release()
    assert not [k for k in vars(multi_turn_utils) if k.startswith(env.key + "_")]


def test_bfcl_rejects_a_function_name_call_inside_a_string_argument(bfcl):
    """BFCL's executor rewrote mkdir(dir_name='ls(') into a folder named '..._instance.ls('."""
    fam, task, _ = bfcl
    env = fam.make(task, seed=0)
    env.reset()
    try:
        res = env.step("[mkdir(dir_name='ls(')]")
        assert res.info["tool_error"] == 1 and res.info["error"] == "malformed" and not res.done
        msg = res.observation[0]["content"]
        assert msg.startswith("Error:") and "dir_name" in msg and "'ls'" in msg and "(" in msg
        assert env.counts == {"calls": 0, "malformed": 1, "exec_errors": 0}
        res = env.step("[ls(), mkdir(dir_name='see ls')]")  # no parenthesis: a plain folder name
        assert res.info["tool_error"] == 0 and res.info["calls"] == 2
        listing = env.step("[ls()]").observation[0]["content"]
        assert "see ls" in listing and "instance" not in listing and "ls(" not in listing
        # several failed parallel calls are still one tool error, their number in exec_errors
        res = env.step("[cat(file_name=None), pwd(), cat(file_name=None)]")  # cat raises in the backend
        assert (res.info["calls"], res.info["exec_errors"], res.info["tool_error"]) == (3, 2, 1)
        assert env.counts == {"calls": 6, "malformed": 1, "exec_errors": 2}
    finally:
        env.release()


# ----------------------------------------------------------------------------- appworld
@fuzz(200)
@given(model_text)
def test_appworld_extract_code_never_raises(text):
    assert isinstance(extract_code(text), str)


@pytest.fixture(scope="module")
def appworld():
    if not os.environ.get("APPWORLD_PYTHON"):
        pytest.skip("AppWorld's environment is not configured (APPWORLD_PYTHON)")
    try:
        fam = make_family("appworld")
    except EnvUnavailable as e:
        pytest.skip(f"AppWorld unavailable: {str(e).splitlines()[0]}")
    return fam, fam.tasks("train")[0]


@fuzz(10)
@given(replies=st.lists(model_text, min_size=1, max_size=2))
def test_appworld_step_fuzz(appworld, replies):
    fam, task = appworld
    env = fam.make(task, seed=0)
    try:
        check_observation(env.reset())
        for reply in replies:
            res = env.step(reply)
            check_info(res.info)
            assert res.info["extra_calls"] == 0
            if res.done:
                break
    finally:
        env.worker.close()


# ----------------------------------------------------------------------------- textworld
@pytest.fixture(scope="module")
def textworld(tmp_path_factory):
    """One compiled game; the episodes run in an empty working folder (meta-commands must not write there)."""
    pytest.importorskip("textworld", reason="needs textworld: run `seeupo setup textworld`")
    mp = pytest.MonkeyPatch()
    mp.setenv("SEEUPO_CACHE", str(tmp_path_factory.mktemp("cache")))
    work = tmp_path_factory.mktemp("cwd")
    mp.chdir(work)
    try:
        fam = make_family("textworld", {"test_tasks": 1, "quest_length": 2, "max_steps": 6})
        yield fam, fam.tasks("test")[0], work
    finally:
        mp.undo()


@fuzz(300)
@given(model_text)
def test_textworld_parse_command_never_raises(text):
    from seeupo.envs.textworld import parse_command

    cmd = parse_command(text)
    assert isinstance(cmd, str) and len(cmd) <= 80 and cmd.isprintable() and "\\" not in cmd


@fuzz(100)
@given(words=st.lists(st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), min_size=1, max_size=4),
       junk=st.text(max_size=30))
def test_textworld_parse_command_keeps_a_plain_command(words, junk):
    from seeupo.envs.textworld import parse_command

    cmd = " ".join(words)[:80].strip()
    assert parse_command(f"  > {cmd.upper()}.\n{junk}") == cmd


@pytest.mark.filterwarnings("ignore:Game .* is not fully supported")  # jericho, about its own score tracking
@fuzz(100)
@given(replies=st.lists(st.one_of(model_text, st.sampled_from(TW_COMMANDS)), min_size=1, max_size=6))
def test_textworld_step_fuzz(textworld, replies):
    fam, task, work = textworld
    env = fam.make(task, seed=0)
    check_observation(env.reset())
    rewards = []
    try:
        for reply in replies[: env.max_turns]:
            res = env.step(reply)
            check_info(res.info)
            check_observation(res.observation)
            assert res.info["extra_calls"] == 0 and math.isfinite(res.reward)
            if res.info.get("error") == "meta_command":
                assert not res.done and res.reward == 0.0
            rewards.append(res.reward)
            if res.done:
                break
        final = env.state.score / max(env.state.max_score or 1, 1)
        assert abs(sum(rewards) - final) < 1e-9  # the game's own score is the sum of the step rewards
    finally:
        env.close()
    assert os.listdir(work) == []  # no save files or transcripts


@pytest.mark.filterwarnings("ignore:Game .* is not fully supported")
def test_textworld_interpreter_commands_never_reach_the_game(textworld):
    """Found by fuzzing: a NUL hangs or crashes the interpreter; a backslash starts dumb-frotz's own
    commands (\\s floods the output, \\R records into a file, others hang or crash it); save and script
    write files into the working folder; restart and quit reset or end the game."""
    fam, task, work = textworld
    env = fam.make(task, seed=0)
    env.reset()
    try:
        for text in ("a\x00b", "\\s", "\\R", "look \\P", "\\x", "save", "script", "transcripts", "restart",
                     "quit", "look. save", "restore"):
            res = env.step(text)
            # refused either way: no command in it (a format error) or one the game does not accept
            assert res.info["tool_error"] + res.info.get("count/inadmissible", 0) == 1, text
            assert not res.done and res.observation, text
        ok = env.step("look").info
        assert ok["tool_error"] == 0 and ok.get("count/inadmissible", 0) == 0
    finally:
        env.close()
    assert os.listdir(work) == []
