"""Every generated table in README.md and docs/ matches what its records in results/ give today
(scripts/claims.py --check), and a changed digit is caught."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def claims(load_script):
    return load_script("claims")


def test_the_published_tables_are_what_the_records_give(claims, capsys):
    rc = claims.run(write=False)
    out = capsys.readouterr().out
    assert rc == 0, out
    kinds = {m["spec"] for _, m in claims.blocks()}
    assert {"findings", "coverage", "arms:turns", "arms:cost", "robustness", "robustness-onecpu"} <= kinds


def test_a_changed_digit_is_caught(claims, tmp_path, capsys):
    readme = (ROOT / "README.md").read_text()
    block = next(m for path, m in claims.blocks() if path.name == "README.md" and m["spec"] == "findings")
    body = block["body"]
    i = body.index("| -0.506 [")
    changed = body[:i] + "| -0.507 [" + body[i + len("| -0.506 ["):]
    copy = tmp_path / "README.md"
    copy.write_text(readme.replace(body, changed))
    assert claims.run(write=False, files=[copy]) == 1
    assert "-0.507" in capsys.readouterr().out
    copy.write_text(readme)
    assert claims.run(write=False, files=[copy]) == 0


def test_a_sentence_may_say_differ_only_where_holm_says_so(claims):
    """The findings' reading column as the generator writes it: 'lower'/'higher' exactly where
    p_holm < 0.05 (the published block is that output: the first test)."""
    block = claims.findings()
    for q, name, c in claims.findings_rows():
        row = next(line for line in block.splitlines() if line.startswith(f"| {q} |"))
        reading = row.rstrip(" |").rsplit("| ", 1)[1]
        assert (reading in ("lower", "higher")) == (c["p_holm"] < 0.05), (q, reading, c["p_holm"])


def test_a_reading_quotes_only_figures_the_blocks_give(claims, tmp_path, monkeypatch):
    """The prose after each per-arm table copies its figures from the generated blocks; a figure
    copied wrong (natural order's lead over reverse on TextWorld, 0.056, written 0.057) is caught."""
    assert claims.prose_figures() == []
    doc = (ROOT / "docs" / "experiments.md").read_text()
    said = "Both other orders end above reverse, natural by 0.056"
    assert said in doc
    copy = tmp_path / "experiments.md"
    copy.write_text(doc.replace(said, said[:-1] + "7"))
    assert claims.prose_figures([copy]) == [("experiments.md", "arms:order_textworld", "0.057")]
    # a figure quoted from another experiment's table is held to the table it is listed with
    key = ("experiments.md", "arms:compare_turn", "0.621")
    assert claims.QUOTED_ELSEWHERE[key] == "claims:arms:compare"
    monkeypatch.setitem(claims.QUOTED_ELSEWHERE, key, "claims:arms:order_textworld")
    assert claims.prose_figures() == [key]


def test_a_stated_trial_count_is_what_the_records_hold(claims, tmp_path):
    """The records-state rows say how many of an experiment's trials are in results/; a count left
    behind when trials landed (one fewer than the records hold) is caught."""
    assert claims.trial_counts() == []
    doc = (ROOT / "docs" / "experiments.md").read_text()
    m = claims.COUNT.search(doc)
    assert m is not None, "docs/experiments.md no longer states a trial count"
    group = "n" if m["n"] else "cn"
    n, total = int(m[group]), m["m"] or m["cm"]
    copy = tmp_path / "experiments.md"
    copy.write_text(doc[:m.start(group)] + str(n - 1) + doc[m.end(group):])
    assert claims.trial_counts([copy]) == [("experiments.md", m["name"], f"{n - 1} of {total}", f"{n} of {total}")]
