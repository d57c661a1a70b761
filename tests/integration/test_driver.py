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
    tr.updater.reference_state = {n: p.detach().clone() for n, p in tr.stack.named_params}  # the KL anchor, as run() sets it
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
    matched = ("grpo", "gspo", "ppo", "gigpo", "mt-grpo", "grpo-togo", "turn-ppo")
    steps = {a: update(trainer(tmp_path / a, f"algo.name={a}", preset=preset), episodes)
             for a in ("seeupo", "reinforce", "rloo") + matched}
    seeupo = steps["seeupo"]["optimizer_steps"]
    epochs = load_config(preset).algo.schedule("seeupo").epochs
    assert seeupo == 3 * epochs  # three turn phases
    for a in matched:
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

    rows = trajectory_rows(eps, tr.stack.tokenizer.pad_token_id)
    logp, _ = score(tr.stack.model, rows, temperature=1.0, budget_tokens=4096)
    for i, e in enumerate(eps):  # sampled by the model itself: ratio 1 and KL 0 at the first step
        e.logp = [float(x) if m else 0.0 for x, m in zip(logp[i, : len(e.ids)].tolist(), e.gen_mask)]
    r = tr.update(eps, 0)
    assert r["phase_order"] == [[2, 3], [0, 1]]
    for t in "0123":
        assert 0 <= r["turn"][t]["kl"] < 0.1, (t, r["turn"][t])


def test_update_turns_trains_only_the_chosen_turns(tmp_path, episodes):
    from seeupo.data.episode import trajectory_rows
    from seeupo.train.iteration import keep_turns

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


def _togo_loop(episodes, norm):
    """Group-relative reward-to-go per (episode, turn) by plain loops: groups are (task, turn) over
    the episodes that reached the turn; ``norm`` "group" divides by the unbiased std + 1e-6."""
    import statistics

    G = [[sum(e.step_rewards[t:]) for t in range(e.n_turns)] for e in episodes]
    out = {}
    for i, e in enumerate(episodes):
        for t in range(e.n_turns):
            peers = [G[j][t] for j, f in enumerate(episodes) if f.group == e.group and f.n_turns > t]
            if len(peers) < 2:
                out[i, t] = 0.0
                continue
            c = G[i][t] - sum(peers) / len(peers)
            out[i, t] = c / (statistics.stdev(peers) + 1e-6) if norm == "group" else c
    return out


def test_per_turn_advantages_reach_the_update(tmp_path, episodes, monkeypatch):
    """What grpo-togo's joint update and SeeUPO's phases (algo.estimator=grae_to_go) receive: each
    turn row's advantage is the loop's reward-to-go advantage of its (episode, turn), with and without
    a reward earned on turn 0; the record's advantage sizes are those values'."""
    from seeupo.train import iteration as trainer_mod

    seen = {}

    def joint(ctx, rows, adv, **kw):
        seen["pairs"] = {(int(e), int(t)): float(a) for e, t, a in zip(rows.episode, rows.turn, adv)}
        return {"optimizer_steps": 0, "nonfinite_skips": 0, "_skips": []}

    def phases(ctx, pools, adv, opts=None):
        seen["pairs"] = {(int(e), int(t)): float(adv[e, t]) for e, t in zip(pools.episode, pools.turn)}
        return {"optimizer_steps": 0, "nonfinite_skips": 0, "_skips": [], "phases": 0, "phase_order": []}, {}

    monkeypatch.setattr(trainer_mod, "joint_update", joint)
    monkeypatch.setattr(trainer_mod, "sequential_update", phases)
    eps = [dataclasses.replace(e, step_rewards=[0.5 * (i % 2)] + list(e.step_rewards[1:]))
           if e.n_turns > 1 else e for i, e in enumerate(episodes)]
    assert _togo_loop(eps, "group") != _togo_loop(episodes, "group")
    for k, data in enumerate((eps, episodes)):
        want = _togo_loop(data, "group")
        for name, over in (("g", ["algo.name=grpo-togo"]), ("s", ["algo.estimator=grae_to_go", "algo.norm=group"])):
            seen.clear()
            r = update(trainer(tmp_path / f"{name}{k}", *over), data)
            assert seen["pairs"].keys() == want.keys(), over
            for key, v in want.items():
                assert seen["pairs"][key] == pytest.approx(v, abs=1e-5), (over, key)
            sizes = [abs(v) for v in want.values()]
            assert r["advantage_abs_mean"] == pytest.approx(sum(sizes) / len(sizes), rel=1e-5)
            assert r["advantage_abs_max"] == pytest.approx(max(sizes), rel=1e-5)


def test_turn_ppo_trains_its_critic_on_turn_states(tmp_path, episodes):
    tr = trainer(tmp_path / "t", "algo.name=turn-ppo")
    before = [p.detach().clone() for p in tr.stack.value_head.parameters()]
    r = update(tr, episodes)
    assert r["value_loss"] > 0 and r["optimizer_steps"] >= 1
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.stack.value_head.parameters()))


def test_turn_ppo_values_sit_at_each_turns_first_action_token(tmp_path, episodes, monkeypatch):
    """What Turn-PPO hands the update, against a loop: the value mask marks each turn row's first
    action token only; the return there is turn-level GAE (gamma 0.99, lam 0.9) over the episode's
    turns with the critic's values read at those tokens, an episode cut at max_turns bootstrapped from
    its last turn's value; the advantage of every row is its turn's."""
    from seeupo.train import iteration as trainer_mod

    tr = trainer(tmp_path / "t", "algo.name=turn-ppo")
    seen = {}

    def capture(ctx, rows, adv, *, returns=None, old_values=None, value_mask=None):
        seen.update(rows=rows, adv=adv, returns=returns, old_values=old_values, value_mask=value_mask)
        return {"optimizer_steps": 0, "nonfinite_skips": 0, "_skips": []}

    monkeypatch.setattr(trainer_mod, "joint_update", capture)
    tr.stack.value_head.linear.bias.data.fill_(0.3)  # values that vary across tokens: a nonzero head
    torch.nn.init.normal_(tr.stack.value_head.linear.weight, std=0.5)
    episodes = [dataclasses.replace(e, end_reason="max_turns" if k % 2 else "done") for k, e in enumerate(episodes)]
    update(tr, episodes)
    rows, vm = seen["rows"], seen["value_mask"]
    gamma, lam = 0.99, 0.9
    by_ep = {}
    for r in range(len(rows)):
        first = int(torch.nonzero(rows.loss_mask[r])[0])
        assert torch.nonzero(vm[r]).flatten().tolist() == [first]
        by_ep.setdefault(int(rows.episode[r]), {})[int(rows.turn[r])] = (r, first)
    for e, turns in by_ep.items():
        ep = episodes[e]
        v = [float(seen["old_values"][turns[t][0], turns[t][1]]) for t in range(ep.n_turns)]
        a, adv = 0.0, [0.0] * ep.n_turns
        cut = ep.end_reason in ("max_turns", "context")  # issue 59: a cut episode goes on from its last value
        for t in reversed(range(ep.n_turns)):
            nxt = v[t + 1] if t + 1 < ep.n_turns else (v[t] if cut else 0.0)
            a = ep.step_rewards[t] + gamma * nxt - v[t] + gamma * lam * a
            adv[t] = a
        for t, (r, first) in turns.items():
            assert float(seen["adv"][r]) == pytest.approx(adv[t], abs=1e-5)
            assert float(seen["returns"][r, first]) == pytest.approx(adv[t] + v[t], abs=1e-5)


def test_per_turn_advantages_follow_the_pools_alignment():
    """from_end pools label each episode's last turn 0: the per-turn table is flipped per episode."""
    from types import SimpleNamespace

    from seeupo.train.iteration import _aligned

    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    eps = [SimpleNamespace(n_turns=3), SimpleNamespace(n_turns=2)]
    assert _aligned(adv, eps, "from_start", 3).tolist() == adv.tolist()
    assert _aligned(adv, eps, "from_end", 3).tolist() == [[3.0, 2.0, 1.0], [5.0, 4.0, 0.0]]
    assert _aligned(adv, eps, "from_start", 5).shape == (2, 5)  # placeholders up to max_turns: 0
