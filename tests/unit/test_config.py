import pytest

from seeupo.train.config import ConfigError, load_config, presets


def test_presets_load_and_inherit():
    assert {"default", "tiny", "authors_code"} <= set(presets())
    a = load_config("authors_code")
    d = load_config("default")
    assert a.algo.ratio_reference == "incremental" and a.algo.factor_clip == (0.8, 1.2)
    assert a.rollout == d.rollout and a.model == d.model  # inherited from default
    assert load_config("tiny").model.name == "tiny-random:4x64"


def test_overrides_are_typed():
    c = load_config("default", ["algo.name=grpo", "rollout.group_size=8", "algo.factor_clip=[0.9, 1.1]"])
    assert c.algo.name == "grpo" and c.rollout.group_size == 8 and c.algo.factor_clip == (0.9, 1.1)


@pytest.mark.parametrize("override, message", [
    ("algo.nmae=grpo", "algo.nmae: Extra inputs are not permitted"),
    ("algo.name=dpo", "use one of: ppo, grpo"),
    ("rollout.group_size=1", "group_size >= 2"),
    ("algo.order=sideways", "unknown turn order"),
    ("rollout.temperature=0", "greater than 0"),
    ("algo.kl_estimator=k9", "k1, k2, k3"),
    ("algo.order=[0,2]", "must list every turn index 0..3 once"),
    ("algo.minibatches=turns", "an update in turn phases takes an integer"),
    ("algo.schedules.grpo2.epochs=2", "unknown algorithms ['grpo2']"),
    ("algo.epochs=0", "greater than or equal to 1"),
    ("algo.factor_ratio=sqrt", "'full', 'geometric' or 'off'"),
    ("algo.minibatches=true", "an integer >= 1 or 'turns'"),
    ("algo.name=ppo algo.order=reverse", "GAE update is joint"),
    ("algo.placeholders=true algo.turn_alignment=from_end", "cannot be combined"),
    ("algo.order=buckets:0", "bucket count must be a positive integer"),
    ("model.turn_adapters=every", "shared, per_turn, buckets:B"),
    ("algo.update_turns=first:1", "all, last:W, skip:T"),
    ("model.turn_adapters=per_turn algo.name=grpo", "set algo.rows=turn"),
    ("model.turn_adapters=per_turn algo.name=ppo", "PPO's GAE update"),
    ("model.turn_adapters=per_turn algo.order=buckets:2", "cannot be combined"),
    ("model.turn_adapters=per_turn rollout.backend=vllm model.lora=false", "needs LoRA turn adapters"),
    ("model.turn_embedding=true rollout.backend=vllm", "needs LoRA turn adapters"),
    ("algo.order=buckets:2 algo.turn_alignment=from_end", "needs algo.turn_alignment=from_start"),
    ("rollout.history=last", "full or last:K with K >= 0"),
    ("rollout.history=last:-1", "full or last:K with K >= 0"),
    ("rollout.history=last:1 algo.name=grpo", "set algo.rows=turn"),
    ("rollout.history=last:1 algo.order=buckets:2", "cannot be combined"),
    ("warmup.oracle_prob=0.5", "needs warmup.source=oracle"),
    ("algo.estimator=gae", "algo.estimator='gae' learns a critic; it comes with its algorithm"), ("algo.estimator=nope", "unknown advantage estimator 'nope'"), ("algo.name=gigpo algo.params.gamma=0.5 algo.gamma=0.5", "both set"), ("algo.name=gigpo algo.params.history=2", "algo.history has no effect on gigpo"),
    ("algo.name=ppo algo.estimator=gigpo", "learns a critic"),
    ("algo.estimator=gigpo algo.order=buckets:2", "one segment row with one advantage"),
    ("algo.name=turn-ppo algo.update_turns=last:1", "algo.update_turns must be 'all'"),
    ("algo.name=turn-ppo algo.order=reverse", "GAE update is joint"),
    ("algo.name=gigpo rollout.group_size=1", "group_size >= 2"),
    ("algo.name=rloo algo.estimator=gigpo", "leave-one-out baseline has no per-turn form"),
    ("algo.name=grpo algo.lam=0.9", "algo.lam has no effect on grpo"),
    ("algo.name=mt-grpo algo.gamma=0.9", "algo.gamma has no effect on mt-grpo"),
    ("algo.estimator=grae_to_go algo.step_weight=2", "algo.step_weight has no effect"),
    ("nonsense", "section.key=value"),
])
def test_bad_config_fails_with_the_fix(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config("default", override.split(" "))


def test_unknown_preset_lists_the_available_ones():
    with pytest.raises(ConfigError, match="available: authors_code, bfcl_gpu, default, textworld, tiny"):
        load_config("huge")


def test_env_options_are_validated_by_the_env():
    from seeupo.envs import make_family

    with pytest.raises(Exception, match="hops_min"):
        make_family("lookup", {"hops_min": 3, "hops_max": 1})
    with pytest.raises(Exception, match="extra"):
        make_family("lookup", {"hopz": 1})
    with pytest.raises(ValueError, match="valid names: .*lookup"):
        make_family("appworld-typo")


def test_health_warnings_flag_collapse_signals():
    import torch

    from seeupo.train.iteration import _groups_with_signal, health_warnings

    assert health_warnings({"entropy": 0.5, "tool/error_rate": 0.1, "groups_with_signal": 0.5}) == []
    w = health_warnings({"entropy": 0.001, "tool/error_rate": 0.9, "groups_with_signal": 0.0})
    assert len(w) == 3 and "deterministic" in w[0] and "format" in w[1] and "no group" in w[2]
    r, g = torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])
    assert _groups_with_signal(r, g) == 0.5


def test_lr_warmup_schedule_and_the_tiny_preset_uses_it():
    import doctest

    import seeupo.train.iteration as iteration_mod
    from seeupo.train.iteration import scheduled_lr

    assert scheduled_lr(2.0, 0, 0) == 2.0 and scheduled_lr(2.0, 5, 0) == 0.4 and scheduled_lr(2.0, 5, 9) == 2.0
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for t in finder.find(iteration_mod.scheduled_lr, "scheduled_lr", globs={"scheduled_lr": scheduled_lr}):
        runner.run(t)
    assert runner.failures == 0
    assert load_config("tiny").optim.lr_warmup_iterations == 5 and load_config("default").optim.lr_warmup_iterations == 0


def test_schedules_per_preset_are_matched_and_gspo_keeps_its_range():
    for preset in ("default", "tiny", "authors_code", "textworld"):
        c = load_config(preset)
        seeupo = c.algo.schedule("seeupo")
        assert seeupo.minibatches == 1
        for name in ("ppo", "grpo", "gspo"):
            s = c.algo.schedule(name)
            assert s.minibatches == "turns" and s.epochs == seeupo.epochs, (preset, name)
        for name in ("reinforce", "rloo"):
            assert c.algo.schedule(name).optimizer_steps(n_turns=4, phases=1) == 1
        gspo = c.algo.schedule("gspo")
        if preset == "authors_code":
            assert gspo.clip_eps == gspo.clip_eps_high == 0.2  # the authors' GSPO ran with the token range
        else:
            assert gspo.clip_eps <= 1e-3 and gspo.clip_eps_high <= 1e-3


def test_saved_config_states_the_effective_schedule_and_loads_back(tmp_path):
    from seeupo.train.config import save_config

    c = load_config("tiny", ["algo.name=gspo", "algo.factor_ratio=off"])
    save_config(c, tmp_path / "config.yaml")
    back = load_config(str(tmp_path / "config.yaml"))
    assert back.algo.schedules["gspo"].model_dump() == {"epochs": 2, "minibatches": "turns", "clip_eps": 3e-4,
                                                        "clip_eps_high": 4e-4}
    assert back.algo.schedule() == c.algo.schedule() and back.algo.factor_ratio == "off"
    save_config(load_config("tiny", ["algo.order=[1, 0]"]), tmp_path / "ordered.yaml")
    assert load_config(str(tmp_path / "ordered.yaml")).algo.order == [1, 0]



def test_a_clip_range_set_by_its_low_side_is_symmetric(tmp_path):
    from seeupo.train.config import save_config

    gspo = load_config("default", ["algo.name=gspo", "algo.clip_eps=0.2"]).algo.schedule()
    assert (gspo.clip_eps, gspo.as_dict()["clip_eps_high"]) == (0.2, 0.2)  # not [0.8, 1.0004]
    both = load_config("default", ["algo.name=gspo", "algo.clip_eps=0.1", "algo.clip_eps_high=0.3"]).algo.schedule()
    assert (both.clip_eps, both.clip_eps_high) == (0.1, 0.3)
    # resuming a saved run (its schedule written out in full) with a new low side only
    save_config(load_config("authors_code", ["algo.name=gspo"]), tmp_path / "config.yaml")
    resumed = load_config(str(tmp_path / "config.yaml"), ["algo.clip_eps=0.1"]).algo.schedule()
    assert resumed.as_dict()["clip_eps_high"] == 0.1
    assert load_config("default", ["algo.name=gspo"]).algo.schedule().clip_eps_high == 4e-4  # untouched


def test_lora_turn_adapters_load_on_the_vllm_backend():
    cfg = load_config("default", ["model.turn_adapters=per_turn", "rollout.backend=vllm"])
    assert cfg.model.lora and cfg.model.turn_adapters == "per_turn"


def test_estimator_parameters_default_to_the_algorithm_and_can_be_set():
    cfg = load_config("tiny", ["algo.name=turn-ppo"])
    assert (cfg.algo.estimator_param("gamma"), cfg.algo.estimator_param("lam")) == (0.99, 0.9)
    assert load_config("tiny", ["algo.name=gigpo"]).algo.estimator_param("gamma") == 0.95
    assert load_config("tiny", ["algo.name=ppo"]).algo.estimator_param("gamma") == 1.0
    cfg = load_config("tiny", ["algo.name=gigpo", "algo.gamma=0.5", "algo.step_weight=2"])
    assert (cfg.algo.estimator_param("gamma"), cfg.algo.estimator_param("step_weight")) == (0.5, 2.0)
    cfg = load_config("tiny", ["algo.estimator=grae_to_go"])
    assert (cfg.algo.name, cfg.algo.effective_estimator()) == ("seeupo", "grae_to_go")


def test_an_estimator_fed_to_another_algorithm_keeps_its_own_defaults():
    """SeeUPO fed GiGPO's advantages discounts with GiGPO's 0.95 and takes its episode baseline over
    step rows (issue 59), unless the run sets them; the summary's record says which."""
    cfg = load_config("tiny", ["algo.estimator=gigpo"])
    assert cfg.algo.estimator_params() == {"name": "gigpo", "gamma": 0.95, "step_weight": 1.0, "episode_norm": "step"}
    cfg = load_config("tiny", ["algo.estimator=gigpo", "algo.gamma=1.0", "algo.episode_norm=episode"])
    assert (cfg.algo.estimator_param("gamma"), cfg.algo.estimator_param("episode_norm")) == (1.0, "episode")
    assert load_config("tiny", ["algo.name=gigpo"]).algo.estimator_params()["episode_norm"] == "step"
    assert load_config("tiny", []).algo.estimator_params() == {"name": "grae"}
    with pytest.raises(ConfigError, match="episode_norm has no effect"):
        load_config("tiny", ["algo.episode_norm=episode"])
    for name in ("gigpo", "hgpo", "mt-grpo", "grpo-togo", "turn-ppo"):  # the presets match their steps to SeeUPO's
        for preset in ("tiny", "default"):
            assert load_config(preset, [f"algo.name={name}"]).algo.schedule().minibatches == "turns", (name, preset)
