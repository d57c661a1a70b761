"""docs/experiments.md reads as a manual, not a lab notebook (issue 61: "its readings carry no dates or
machine names outside generated tables").

The rule, applied to the hand-written text only (the blocks between ``<!-- claims:SPEC -->`` and
``<!-- /claims:SPEC -->`` are written by scripts/claims.py from the records and left out; so are code
spans and fenced code, which are names and commands: `robustness_intel` is an experiment):

- **No day anywhere**: no date (2026-12-06), no month and day (Dec 6), no time of day (13:34). When a
  trial ran is in its records, not in the prose.
- **No machine under "## Results"** (the experiments' sections: their questions, designs, commands,
  readings and mechanisms): no CPU make or model (Intel, AMD, Xeon, EPYC, ...), no kernel level (AVX2,
  AVX512), no "this machine", host, session or checkout. A reading that needs to say two trials ran on
  different CPU kinds says so and points to the section's generated ``provenance:NAME`` table, which
  names the kinds from each trial's ``platforms`` and gives the trials' ``wall_seconds`` beside them:
  there a time always names its CPU kind (issue 60: "figures name their CPU kind wherever a time is
  given"), so the readings give no trial times at all.
- **Before "## Results"** (the manual proper: the engine, the report, the shipped experiments,
  statistics) a CPU kind may be named: "Platforms" explains why AVX2 and AVX512 kernels train different
  parameters, and a time given there (the quick TextWorld sweep's) must name its CPU kind.

Each experiment section under "## Results" (a ``### `NAME``` heading) gives the command that runs it,
``seeupo sweep NAME``, before its first generated table, and, where it has a per-arm table from the
records, the generated ``provenance:NAME`` table of where its trials ran.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "experiments.md"

MONTH = r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
DAY = re.compile(rf"\b20\d\d-\d\d-\d\d\b|\b{MONTH}\.? \d{{1,2}}\b|\b\d{{1,2}} {MONTH}\b|\b\d{{1,2}}:\d\d\b")
MACHINE = re.compile(r"\b(?:Intel|AMD|Xeon|EPYC|Ryzen|Threadripper|Core i\d|Graviton|Neoverse|Apple M\d|AVX\w*|SSE\d\w*|"
                     r"this machine|that machine|the same machine|hosts?|hostnames?|sessions?|checkouts?)\b", re.I)
BLOCK = re.compile(r"<!-- claims:(?P<spec>[^ ]+) -->\n.*?<!-- /claims:(?P=spec) -->", re.S)
SECTION = re.compile(r"^### `(?P<name>[a-z0-9_]+)`", re.M)


def _prose(text: str) -> str:
    """The hand-written text: generated blocks, fenced code and code spans left out (lines kept, so
    a finding's line number is the file's)."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = BLOCK.sub(blank, text)
    text = re.sub(r"```.*?```", blank, text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "``", text)


def offences(text: str) -> list[tuple[int, str, str]]:
    """``(line, what, the words)`` for each day anywhere, and each machine name under "## Results",
    in the hand-written text of a docs/experiments.md."""
    prose = _prose(text)
    results_at = prose.index("\n## Results\n") if "\n## Results\n" in prose else len(prose)
    found = []
    for m in DAY.finditer(prose):
        found.append((prose.count("\n", 0, m.start()) + 1, "day", m.group(0)))
    for m in MACHINE.finditer(prose, results_at):
        found.append((prose.count("\n", 0, m.start()) + 1, "machine", m.group(0)))
    return sorted(found)


def sections(text: str) -> dict[str, str]:
    """Each experiment section under "## Results" by its experiment's name: the text from its heading
    to the next heading of level 3 or above."""
    results = text[text.index("\n## Results\n"):]
    heads = list(re.finditer(r"^#{1,3} ", results, re.M))
    out = {}
    for i, h in enumerate(heads):
        m = SECTION.match(results, h.start())
        if m:
            end = heads[i + 1].start() if i + 1 < len(heads) else len(results)
            out[m["name"]] = results[h.start():end]
    return out


def section_problems(text: str) -> list[str]:
    """An experiment section without its command before its first generated block, or with a per-arm
    table and no provenance table."""
    problems = []
    for name, body in sections(text).items():
        first = body.find("<!-- claims:")
        head = body if first < 0 else body[:first]
        if f"seeupo sweep {name}" not in " ".join(head.split()):
            problems.append(f"{name}: no `seeupo sweep {name}` before its tables")
        if f"<!-- claims:arms:{name} -->" in body and f"<!-- claims:provenance:{name} -->" not in body:
            problems.append(f"{name}: a per-arm table and no provenance:{name} table")
    return problems


def test_the_readings_name_no_day_and_no_machine():
    found = offences(DOC.read_text())
    assert found == [], "\n".join(f"docs/experiments.md:{line}: {what}: {words!r}" for line, what, words in found)


def test_each_experiment_section_gives_its_command_and_provenance():
    text = DOC.read_text()
    named = sections(text)
    assert len(named) >= 19, sorted(named)  # every shipped experiment with records has its section
    assert section_problems(text) == []


# Sentences the readings carried before issue 61 (the issue quotes the first), each put back after a
# per-arm table under "## Results"; and what the manual part may keep.
NOTEBOOK = [
    "GiGPO (2026-12-06, Intel Xeon; its seeds 0 and 1 run again after a checkout lost them unpacked) -0.006.",
    "`compare_textworld` ran from 2026-12-04 to 2026-12-07, 10-59 minutes a trial.",
    "These trials ran on an AMD EPYC (AVX512) at one thread.",
    "On this machine natural ends at 0.598.",
    "(2 workers x 1 thread, 2026-12-03 13:34-14:33, 59 min for the 40 trials).",
    "Seed 4 ran where torch dispatches its AVX2 kernels.",
    "Resumed across three sessions.",
    "From Dec 6 on.",
]


@pytest.mark.parametrize("sentence", NOTEBOOK)
def test_a_notebook_sentence_put_back_is_caught(sentence):
    text = DOC.read_text()
    anchor = "<!-- /claims:arms:compare -->\n"
    assert anchor in text
    found = offences(text.replace(anchor, anchor + "\n" + sentence + "\n", 1))
    assert found and all(what in ("day", "machine") for _, what, _ in found)


def test_the_rule_reads_only_the_hand_written_text():
    text = DOC.read_text()
    head, results = text.split("\n## Results\n", 1)
    # a CPU kind in the manual part, beside its time, stands; a date there does not
    assert offences(head + "\nIt took 6 min on a 2-core Intel Xeon (AVX512).\n\n## Results\n" + results) == []
    assert [w for _, w, _ in offences(head + "\nIt ran on 2026-12-03.\n\n## Results\n" + results)] == ["day"]
    # inside a generated block, or as a code span, a machine's name is the records' or a name
    inside = "<!-- claims:x -->\nTrials ran on Intel(R) Xeon(R) Processor (AVX512), 2026-12-03.\n<!-- /claims:x -->\n"
    assert offences(text + "\n" + inside + "\nSee `results/robustness_intel`.\n") == []
    assert re.search(r"Trials ran on .*(Xeon|EPYC)", text), "the generated tables no longer name the CPU kinds"


def test_a_section_without_its_command_or_provenance_is_caught():
    text = DOC.read_text()
    cmd = "`seeupo sweep cost --out runs/sweeps/cost --workers 2 --records results/cost`"
    assert text.count(cmd) == 1
    assert section_problems(text.replace(cmd, "`seeupo report runs/sweeps/cost`")) == [
        "cost: no `seeupo sweep cost` before its tables"]
    prov = re.search(r"<!-- claims:provenance:cost -->\n.*?<!-- /claims:provenance:cost -->\n", text, re.S)
    assert prov
    assert section_problems(text.replace(prov.group(0), "")) == ["cost: a per-arm table and no provenance:cost table"]
