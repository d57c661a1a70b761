"""The training driver (``Trainer.update``) on fixed episodes: schedules, turn orders, alignment,
clamps and the factor rule, each checked through the record a user sees in metrics.jsonl."""

import copy
import dataclasses

import pytest
import torch

from seeupo.train.config import load_config
from seeupo.train.trainer import Trainer

SMALL = ["warmup.enabled=off", "eval.tasks=2", "eval.k=2", "rollout.tasks_per_iteration=3", "rollout.group_size=3",
         "run.loggers=[jsonl]", "env.options={}", "rollout.max_turns=3"]




def trainer(tmp_path, *overrides, preset="tiny"):
    extra = ["model.name=tiny-random:4x64", "model.lora=false"] if preset != "tiny" else []
    tr = Trainer(load_config(preset, [*SMALL, *extra, f"run.out={tmp_path}", *overrides]))
    tr.reference_state = {n: p.detach().clone() for n, p in tr.named_params}  # the KL anchor, as run() sets it
    return tr


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    """Nine episodes of three tasks: 3, 2 or 1 turns, rewards that differ within each group."""
    eps = trainer(tmp_path_factory.mktemp("eps"))._episodes(0)
    out = []
    for i, e in enumerate(eps):
        n = [3, 2, 1][i % 3] if i < 6 else 3
        e = e.first_turns(min(n, e.n_turns))
        out.append(dataclasses.replace(e, step_rewards=[0.0] * (e.n_turns - 1) + [float((i * 7) % 4) / 3]))
    assert sorted({e.n_turns for e in out}) == [1, 2, 3]
    return out


def update(tr, episodes, it=0):
    return tr.update(copy.deepcopy(episodes), it)


@pytest.mark.parametrize("preset", ["tiny", "default"])
def test_matched_presets_take_as_many_optimizer_steps_as_seeupo(tmp_path, episodes, preset):
    steps = {a: update(trainer(tmp_path / a, f"algo.name={a}", preset=preset), episodes)
             for a in ("seeupo", "grpo", "gspo", "ppo", "reinforce", "rloo")}
    seeupo = steps["seeupo"]["optimizer_steps"]
    epochs = load_config(preset).algo.schedule("seeupo").epochs
    assert seeupo == 3 * epochs  # three turn phases
    for a in ("grpo", "gspo", "ppo"):
        assert steps[a]["optimizer_steps"] == seeupo, a
    assert steps["reinforce"]["optimizer_steps"] == steps["rloo"]["optimizer_steps"] == 1
    assert steps["gspo"]["clipfrac"] > 0  # GSPO's sequence-level range binds after the first step


def test_a_schedule_set_for_one_algorithm_leaves_the_others_alone(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("base: tiny\nalgo:\n  name: seeupo\n  epochs: 3\n")
    assert load_config(str(preset)).algo.schedule().epochs == 3
    assert load_config(str(preset), ["algo.name=reinforce"]).algo.schedule().epochs == 1
    cli = load_config("tiny", ["algo.name=grpo", "algo.epochs=5"])  # command line: the running algorithm's
    assert cli.algo.schedule().epochs == 5 and cli.algo.schedule("seeupo").epochs == 2


def test_reverse_means_latest_stage_first_in_either_alignment(tmp_path, episodes):
    a = update(trainer(tmp_path / "a"), episodes)
    assert a["phase_order"] == [[2], [1], [0]]
    assert a["turn"]["2"]["rows"] == sum(e.n_turns == 3 for e in episodes)
    b = update(trainer(tmp_path / "b", "algo.turn_alignment=from_end"), episodes)
    assert b["phase_order"] == [[0], [1], [2]]  # label 0 is each episode's last turn
    assert b["turn"]["0"]["rows"] == len(episodes)
    assert b["turn"]["0"]["factor_max"] == b["turn"]["0"]["factor_min"] == 1.0  # updated first: no factor yet
    n = update(trainer(tmp_path / "n", "algo.turn_alignment=from_end", "algo.order=natural"), episodes)
    assert n["phase_order"] == [[2], [1], [0]]


def test_custom_order_from_the_config_skips_absent_turns(tmp_path, episodes):
    tr = trainer(tmp_path, "algo.order=[0, 2, 1]")
    assert update(tr, episodes)["phase_order"] == [[0], [2], [1]]
    short = [e.first_turns(min(2, e.n_turns)) for e in episodes]
    assert update(tr, short)["phase_order"] == [[0], [1]]


def test_random_order_is_fresh_each_iteration_and_reproducible(tmp_path, episodes):
    tr = trainer(tmp_path, "algo.name=seeupo-random")
    orders = [tuple(map(tuple, update(tr, episodes, it)["phase_order"])) for it in range(6)]
    assert len(set(orders)) > 1
    assert all(sorted(o) == [(0,), (1,), (2,)] for o in orders)
    again = trainer(tmp_path / "again", "algo.name=seeupo-random")
    assert tuple(map(tuple, update(again, episodes, 3)["phase_order"])) == orders[3]


def test_window_runs_the_latest_turns_alone_then_the_rest_jointly(tmp_path, episodes):
    r = update(trainer(tmp_path, "algo.order=window:1"), episodes)
    assert r["phase_order"] == [[2], [0, 1]]
    assert r["optimizer_steps"] == 2 * 2  # two phases, the tiny preset's two epochs
    assert r["turn"]["2"]["factor_max"] == 1.0
    assert r["turn"]["0"]["phase"] == r["turn"]["1"]["phase"] == 1
    assert r["turn"]["0"]["factor_max"] != 1.0 or r["turn"]["0"]["factor_min"] != 1.0


def test_buckets_run_through_the_trainer(tmp_path, episodes):
    r = update(trainer(tmp_path, "algo.order=buckets:2"), episodes)
    assert r["phase_order"] == [[1, 2], [0]]
    assert r["optimizer_steps"] == 2 * 2
    assert r["turn"]["1"]["phase"] == r["turn"]["2"]["phase"] == 0 and r["turn"]["0"]["phase"] == 1
    assert r["turn"]["0"]["fused"] and r["turn"]["0"]["factor_max"] != r["turn"]["0"]["factor_min"]
    # the KL anchor of a segment row covers every turn of its bucket: the same order of KL as the reverse
    # schedule's turn phases (it measured 19624 when the anchor's log-probs were those of the last turn only)
    rev = update(trainer(tmp_path / "rev"), episodes)
    assert 0 <= r["turn"]["1"]["kl"] < 5 * max(rev["turn"][t]["kl"] for t in "12"), (r["turn"]["1"], rev["turn"])


def test_buckets_anchor_every_segment_at_four_turns(tmp_path):
    """Two segment phases, the second over rows narrower than the pools (it crashed on the width)."""
    import random

    from seeupo.data.episode import Episode

    tr = trainer(tmp_path, "algo.order=buckets:2", "rollout.max_turns=4")
    rng, eps = random.Random(0), []
    for i in range(4):
        e = Episode(episode_id=i, task_id=f"t{i // 2}", group=i // 2, sample=i % 2, seed=i)
        e.append([rng.randrange(50) for _ in range(6)])
        for t in range(4):
            if t:
                e.append([rng.randrange(50) for _ in range(3)])
            e.append([rng.randrange(50) for _ in range(4)], turn=t, logp=[0.0] * 4)
            e.turn_ends.append(len(e.ids))
            e.step_rewards.append(0.0)
        e.step_rewards[-1] = float(i % 2)
        e.end_reason = "done"
        eps.append(e)
    from seeupo.data.episode import trajectory_rows
    from seeupo.train.learner import score

    rows = trajectory_rows(eps, tr.tokenizer.pad_token_id)
    logp, _ = score(tr.model, rows, temperature=1.0, budget_tokens=4096)
    for i, e in enumerate(eps):  # sampled by the model itself: ratio 1 and KL 0 at the first step
        e.logp = [float(x) if m else 0.0 for x, m in zip(logp[i, : len(e.ids)].tolist(), e.gen_mask)]
    r = tr.update(eps, 0)
    assert r["phase_order"] == [[2, 3], [0, 1]]
    for t in "0123":
        assert 0 <= r["turn"][t]["kl"] < 0.1, (t, r["turn"][t])


def test_update_turns_trains_only_the_chosen_turns(tmp_path, episodes):
    from seeupo.data.episode import trajectory_rows
    from seeupo.train.trainer import keep_turns

    r = update(trainer(tmp_path / "last", "algo.update_turns=last:1"), episodes)
    for t in range(3):  # a turn's pool: the episodes whose last turn it is
        assert r["turn"][str(t)]["rows"] == sum(e.n_turns == t + 1 for e in episodes), t
    s = update(trainer(tmp_path / "skip", "algo.update_turns=skip:0"), episodes)
    assert s["phase_order"] == [[2], [1]]  # turn 0 frozen: no phase
    # trajectory rows (the joint algorithms): the frozen turns' tokens leave the loss mask
    rows = trajectory_rows(episodes, 0)
    kept = keep_turns(rows, n_turns=[e.n_turns for e in episodes], spec="skip:0")
    assert int((kept.loss_mask.bool() & (rows.token_turn == 0)).sum()) == 0
    assert torch.equal(kept.loss_mask.bool(), rows.loss_mask.bool() & (rows.token_turn != 0))
    g = update(trainer(tmp_path / "g", "algo.name=grpo", "algo.update_turns=last:1"), episodes)
    assert g["optimizer_steps"] >= 1


def test_advantage_clip_reaches_the_update(tmp_path, episodes):
    free = update(trainer(tmp_path / "a"), episodes)
    clipped = update(trainer(tmp_path / "b", "algo.advantage_clip=0.5"), episodes)
    assert free["advantage_abs_max"] > 0.5
    assert clipped["advantage_abs_max"] == pytest.approx(0.5)
    assert clipped["loss"] != pytest.approx(free["loss"])


def test_only_sequential_algorithms_carry_the_factor(tmp_path, episodes):
    seq = update(trainer(tmp_path / "s"), episodes)
    joint = update(trainer(tmp_path / "g", "algo.name=grpo", "algo.order=reverse",
                           "algo.schedules.grpo.minibatches=1"), episodes)
    off = update(trainer(tmp_path / "o", "algo.factor_ratio=off"), episodes)
    assert joint["phase_order"] == seq["phase_order"] == [[2], [1], [0]]
    assert any(d["factor_min"] != 1.0 or d["factor_max"] != 1.0 for d in seq["turn"].values())
    for r in (joint, off):
        assert all(d["factor_min"] == d["factor_max"] == 1.0 for d in r["turn"].values())


def test_geometric_and_full_factor_ratios_differ(tmp_path, episodes):
    full = update(trainer(tmp_path / "f", "algo.factor_ratio=full"), episodes)
    geo = update(trainer(tmp_path / "g"), episodes)
    first = {k: v for k, v in full["turn"]["2"].items() if k != "ratio_mean"}  # ratio_mean: the weight itself
    assert first == pytest.approx({k: geo["turn"]["2"][k] for k in first})  # the first phase has no factor
    assert full["turn"]["0"]["factor_max"] != pytest.approx(geo["turn"]["0"]["factor_max"])


def test_minibatches_take_exactly_that_many_steps_per_pass(tmp_path, episodes):
    """9 trajectory rows in 4 minibatches: 4 optimizer steps per pass (rows 3, 2, 2, 2), not 3."""
    r = update(trainer(tmp_path, "algo.name=grpo", "algo.schedules.grpo.minibatches=4"), episodes)
    assert r["optimizer_steps"] == 2 * 4  # the tiny preset's two passes
