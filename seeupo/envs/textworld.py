r"""``textworld``: text adventure games generated locally by TextWorld (``seeupo setup textworld``).

Each task is a game generated from a seed (rooms, objects and quest length are options) and
compiled once into the seeupo cache. The model reads the objective and the room, and replies with
one command per message; the reward is the game's score normalised to [0, 1] (the change in score
after each command, so an episode's rewards sum to its final normalised score; ``reward: outcome``
gives the whole sum on the episode's last turn instead, however the episode ended; ``reward:
progress`` is TextWorld's own intermediate reward, a step towards or away from the goal). With
``admissible: true`` every observation lists the commands the game accepts there; ``observation:
brief`` keeps only the first line of the game's text (a room's name, a command's one-line answer).

A reply with no command in it (empty once parsed) is a format error, ``info["tool_error"] = 1``: the
trainer's health warning watches that rate. A well-formed command the game does not accept in that
state (not among its admissible commands) is a wrong move, not a broken format: it is answered by the
game as usual and counted apart, ``info["count/inadmissible"] = 1`` (the run logs ``env/inadmissible``
per episode). Two kinds are answered by us and never reach the game: an empty reply, and a command
naming one of the interpreter's out-of-world verbs (also inadmissible, and counted in
``count/meta_command``: (``META_VERBS``: ``save`` and ``script`` write files into the working folder,
``restart``/``quit`` end or reset the game)). ``parse_command`` turns backslashes, control and other
unprintable characters into spaces: the interpreter (jericho's dumb-frotz) reads ``\`` as the start
of its own commands (``\s`` floods the output with screen dumps, an unknown one prints an error line
forever: 41 GB in one fuzz run; ``\R`` records into a file in the working folder; others hang or
crash it) and a NUL byte hangs or crashes it. ``info["extra_calls"]`` is always 0: only the first
line of a reply is used.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import tempfile
from pathlib import Path

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from seeupo.envs.base import Env, EnvFamily, EnvUnavailable, Message, StepResult, Task, register

TEXTWORLD_VERSION = "1.7.0"
SETUP_HINT = "the textworld environment needs the package textworld: run `seeupo setup textworld`"

INSTRUCTIONS = ("You are playing a text adventure game. Reach the goal described below. Reply with exactly "
                "one command per message, like: go north / open box / take key / put key on table.")


def require_textworld():
    try:
        import textworld
        import textworld.generator  # noqa: F401
    except ImportError as e:
        raise EnvUnavailable(f"{SETUP_HINT} (import failed: {e})") from None
    return textworld


class TextWorldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rooms: int = Field(3, ge=1, le=20, description="rooms per game")
    objects: int = Field(5, ge=0, le=40, description="objects per game")
    quest_length: int = Field(3, ge=1, le=20, description="commands the shortest winning walkthrough needs")
    max_steps: int = Field(12, ge=1, description="most commands per episode")
    admissible: bool = Field(True, description="list the admissible commands in every observation")
    observation: Literal["full", "brief"] = Field(
        "full", description="full: the game's text as it prints it; brief: only its first line (a room's "
        "name, or the one-line answer to a command), the goal and the admissible list kept whole: about half "
        "the tokens per turn, the same game (needs admissible: true, which names what the room holds)")
    train_tasks: int = Field(64, ge=1, description="games in the train split")
    test_tasks: int = Field(16, ge=1, description="games in the held-out test split")
    test_from: int = Field(0, ge=0, description="index of the test split's first game: test game i is the "
                           "game of index test_from + i, so a later evaluation can be scored on games no earlier "
                           "one saw (the textworld preset takes 16 onward: games 0-15 scored the experiments "
                           "that chose its sizes)")
    seed: int = Field(0, description="seed of the game sets")
    anchor: Literal["observation", "state"] = Field(
        "observation", description="the key of a turn's anchor state (GiGPO's and HGPO's step groups): "
        "observation, the messages the turn starts from (the game's text and the command list); state, the "
        "game's own state (every fact the engine holds: rooms, where each object is, the inventory, what is "
        "open), so the same state reached by different commands is one anchor")
    reward: Literal["score_delta", "outcome", "progress"] = Field(
        "score_delta", description="score_delta: each command's reward is the change in the game's normalised "
        "score (on generated one-quest games the score moves only at the win, so this equals outcome); outcome: "
        "0 until the episode's last turn, which gets the final normalised score; progress: TextWorld's own "
        "intermediate reward (+1 a step closer to the goal along its winning policy, -1 farther, 0 neither) "
        "divided by the walkthrough's length at the start, so rewards arrive during the game and a won game "
        "walked straight sums to 1 (a lost or unfinished one gets its net progress)")

    def model_post_init(self, _):
        if self.observation == "brief" and not self.admissible:
            raise ValueError("textworld observation: brief needs admissible: true (the list is what names the "
                             "room's objects and exits once the description is cut to its first line)")


def first_line(text: str) -> str:
    return next((x.strip() for x in text.strip().splitlines() if x.strip()), "")


def game_seed(opts: TextWorldOptions, split: str, index: int) -> int:
    h = hashlib.sha256(f"textworld|{opts.seed}|{split}|{index}".encode()).digest()
    return int.from_bytes(h[:4], "little")


def game_path(opts: TextWorldOptions, seed: int) -> Path:
    """The compiled game for ``seed``, generated and compiled on first use (atomic, cached)."""
    from seeupo.models.loading import cache_dir

    tw = require_textworld()
    folder = cache_dir() / "textworld" / f"v{TEXTWORLD_VERSION}-r{opts.rooms}-o{opts.objects}-q{opts.quest_length}"
    path = folder / f"game-{seed}.z8"
    if path.exists() and path.with_suffix(".json").exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    go = tw.GameOptions()
    go.seeds = seed
    go.nb_rooms, go.nb_objects, go.quest_length = opts.rooms, opts.objects, opts.quest_length
    go.file_ext = ".z8"
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        go.path = str(Path(tmp) / path.name)
        compiled = Path(tw.generator.compile_game(tw.generator.make_game(go), go))
        os.replace(compiled.with_suffix(".json"), path.with_suffix(".json"))
        os.replace(compiled, path)  # the .z8 last: its presence means the pair is complete
    return path


# the Inform interpreter's out-of-world verbs that touch files or the game's run; it reads only the
# first 9 letters of a word ("transcripts" is "transcript")
META_VERBS = ("save", "restore", "restart", "quit", "q", "script", "transcript", "unscript", "noscript",
              "undo", "verify")
_META9 = {v[:9] for v in META_VERBS}


def is_meta_command(cmd: str) -> bool:
    """Whether any word of ``cmd`` (split on anything but letters and digits) is an out-of-world verb."""
    return any(w[:9] in _META9 for w in re.findall(r"\w+", cmd.lower()))


def parse_command(text: str) -> str:
    """The first non-empty line, without quotes, a trailing period or a leading '>'; backslashes and
    unprintable characters (control characters, NUL, lone surrogates, ...) become spaces, runs of
    spaces one (see the module docstring: both reach the interpreter's own command layer)."""
    for line in text.splitlines():
        line = re.sub(r"\s+", " ", "".join(c if c.isprintable() and c != "\\" else " " for c in line))
        line = line.strip().strip("`'\"").strip()
        line = re.sub(r"^>\s*", "", line).rstrip(".!").strip().lower()
        if line:
            return line[:80]
    return ""


class TextWorldEnv(Env):
    def __init__(self, task: Task, opts: TextWorldOptions, seed: int):
        tw = require_textworld()
        self.task, self.opts = task, opts
        self.max_turns = opts.max_steps
        infos = tw.EnvInfos(admissible_commands=True, policy_commands=True, max_score=True, score=True,
                            won=True, lost=True, objective=True, description=True,
                            intermediate_reward=opts.reward == "progress", facts=opts.anchor == "state")
        self.game = tw.start(str(game_path(opts, task.data["game_seed"])), request_infos=infos)
        self.state = None
        self.last_score = 0
        self.closed = False

    def _listing(self) -> str:
        if not self.opts.admissible:
            return ""
        cmds = sorted(c for c in self.state.admissible_commands if c not in ("inventory", "look"))
        return "\nCommands you can use: " + ", ".join(cmds) + "."

    def anchor_state(self) -> int | None:
        """With ``anchor: state``: a key of the game's facts (sorted), else None (the observation's)."""
        if self.opts.anchor != "state" or self.state is None:
            return None
        text = "\n".join(sorted(str(f) for f in (self.state.facts or ())))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1

    def _text(self, text: str) -> str:
        return first_line(text) if self.opts.observation == "brief" else text.strip()

    def reset(self) -> list[Message]:
        self.state = self.game.reset()
        self.last_score = 0
        self.walkthrough = max(len(self.state.policy_commands or ()), 1)  # reward=progress: its scale
        text = (f"{INSTRUCTIONS}\n\nGoal: {self.state.objective.strip()}\n\n{self._text(self.state.description)}"
                f"{self._listing()}")
        return [{"role": "user", "content": text}]

    def step(self, assistant_text: str) -> StepResult:
        cmd = parse_command(assistant_text)
        if not cmd:
            # the list again (as after any other command): the reply names the room's state, so GiGPO's
            # anchor of the next turn does not merge every empty reply of a group into one state
            return StepResult([{"role": "user", "content": f"Write one command, e.g. look.{self._listing()}"}], 0.0, False,
                              {"tool_error": 1, "error": "empty", "extra_calls": 0})
        valid = cmd in {c.lower() for c in self.state.admissible_commands}  # the parser is case-blind
        if not valid and is_meta_command(cmd):  # never sent: files, restarts and quits stay out of reach
            return StepResult([{"role": "user", "content": "That command is not available here (save, restore, "
                                f"restart, quit, undo and transcripts are not).{self._listing()}"}], 0.0, False,
                              {"tool_error": 0, "count/inadmissible": 1, "count/meta_command": 1, "extra_calls": 0})
        self.state, _, done = self.game.step(cmd)
        max_score = max(self.state.max_score or 1, 1)
        reward = (self.state.score - self.last_score) / max_score
        if self.opts.reward == "progress":
            reward = float(self.state.intermediate_reward or 0) / self.walkthrough
        self.last_score = self.state.score
        done = bool(done or self.state.won or self.state.lost)
        feedback = self._text(re.split(r"\n\s*>", self.state.feedback)[0])  # drop the prompt and status line
        obs = [] if done else [{"role": "user", "content": f"{feedback}{self._listing()}"}]
        return StepResult(obs, reward, done, {"tool_error": 0, "count/inadmissible": int(not valid), "extra_calls": 0})

    def score(self) -> float:
        try:
            return self.state.score / max(self.state.max_score or 1, 1) if self.state is not None else 0.0
        finally:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.game.close()

    def oracle_action(self) -> str:
        """The next command of TextWorld's own winning policy from the current state."""
        cmds = self.state.policy_commands or ["look"]
        return cmds[0]

    def demo_action(self, rng: random.Random) -> str:
        """A random admissible command (format-correct, goal-blind)."""
        return rng.choice(sorted(self.state.admissible_commands))


@register("textworld")
class TextWorldFamily(EnvFamily):
    name = "textworld"
    counters = ("inadmissible", "meta_command")  # always reported (env/inadmissible, ...): per episode

    def __init__(self, **options):
        self.opts = TextWorldOptions(**options)
        require_textworld()
        self.reward_at_end = self.opts.reward == "outcome"  # the runner moves the rewards to the last turn

    def tasks(self, split: str) -> list[Task]:
        start = {"train": 0, "test": self.opts.test_from}
        return self._sized_split(split, {"train": self.opts.train_tasks, "test": self.opts.test_tasks},
                                 lambda sp, i: Task(id=f"textworld-{sp}-{start[sp] + i}", split=sp,
                                                    data={"game_seed": game_seed(self.opts, sp, start[sp] + i)}))

    def make(self, task: Task, *, seed: int) -> TextWorldEnv:
        return TextWorldEnv(task, self.opts, seed)
