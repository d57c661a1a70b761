import pytest

from seeupo.data.episode import Episode


def test_episode_first_turns_cuts_at_a_turn_end():
    e = Episode(0, "t", 0, 0, 0)
    e.append([1, 2])
    e.append([3, 4], turn=0, logp=[-0.1, -0.2])
    e.turn_ends.append(4)
    e.append([5])
    e.append([6, 7], turn=1, logp=[-0.3, -0.4])
    e.turn_ends.append(7)
    e.step_rewards = [0.0, 1.0]
    one = e.first_turns(1)
    assert one.ids == [1, 2, 3, 4] and one.turn_ends == [4] and one.step_rewards == [0.0] and one.reward == 0.0
    assert one.logp == [0.0, 0.0, -0.1, -0.2] and e.n_turns == 2  # the original is unchanged
    with pytest.raises(ValueError, match="has 2 turns"):
        e.first_turns(3)
