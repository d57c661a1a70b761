"""Advantage estimators: group-relative (GRAE, critic-free) and GAE (token level, with a critic).

Pure functions on tensors. Shapes are in the names: ``_N`` one value per episode, ``_NL`` one per
token of a row of length ``L``.
"""

from __future__ import annotations

import torch

NORMS = ("none", "group", "batch")


def _group_index(group_ids_N: torch.Tensor) -> tuple[torch.Tensor, int]:
    _, inverse = torch.unique(group_ids_N, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


def _group_sum(values_N: torch.Tensor, inverse_N: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=values_N.dtype, device=values_N.device).index_add_(
        0, inverse_N, values_N
    )


def grae(
    rewards_N: torch.Tensor,
    group_ids_N: torch.Tensor,
    *,
    norm: str = "batch",
    leave_one_out: bool = False,
    eps: float = 1e-6,
    weights_N: torch.Tensor | None = None,
) -> torch.Tensor:
    """Group-relative advantage, one scalar per episode.

    Centring: ``c_i = R_i - mean_{j in g(i)} R_j``, or with ``leave_one_out=True``
    ``c_i = R_i - mean_{j in g(i), j != i} R_j`` (RLOO). A group of one member gets ``c_i = 0``.
    Normalisation:

    - ``"none"``:  ``A_i = c_i``
    - ``"group"``: ``A_i = c_i / (std_{g(i)}(R) + eps)``, unbiased std (torch's default); 0 for a
      group of one.
    - ``"batch"``: ``A_i = (c_i - mean_N(c)) / (std_N(c) + eps)``, unbiased std over the batch.

    ``weights_N`` (optional, non-negative) turns every mean into a weighted mean and every std into
    the weighted population std; the lab uses it with trajectory probabilities to take exact
    expectations. It cannot be combined with ``leave_one_out``.

    Args:
        rewards_N: ``[N]`` float episode rewards.
        group_ids_N: ``[N]`` integer group (task) id of each episode; any integer values.
    Returns:
        ``[N]`` advantages, same dtype as ``rewards_N``.

    Example (two groups, ``norm="none"``):
        >>> grae(torch.tensor([1., 0., 3., 5.]), torch.tensor([7, 7, 2, 2]), norm="none")
        tensor([ 0.5000, -0.5000, -1.0000,  1.0000])
    """
    if norm not in NORMS:
        raise ValueError(f"unknown advantage norm {norm!r}; valid names: {', '.join(NORMS)}")
    if rewards_N.dim() != 1 or group_ids_N.shape != rewards_N.shape:
        raise ValueError(
            f"rewards_N and group_ids_N must be 1-D of equal length, got {tuple(rewards_N.shape)}"
            f" and {tuple(group_ids_N.shape)}"
        )
    if weights_N is not None and leave_one_out:
        raise ValueError("leave_one_out has no meaning with weights_N (exact expectations)")
    r = rewards_N if rewards_N.is_floating_point() else rewards_N.float()
    if r.numel() == 0:
        return r.clone()
    inverse, n_groups = _group_index(group_ids_N)
    count_G = _group_sum(torch.ones_like(r), inverse, n_groups)
    w = torch.ones_like(r) if weights_N is None else weights_N.to(r.dtype)
    wsum_G = _group_sum(w, inverse, n_groups)
    sum_G = _group_sum(w * r, inverse, n_groups)
    mean_N = (sum_G / wsum_G.clamp_min(torch.finfo(r.dtype).tiny))[inverse]
    n_N = count_G[inverse]
    alone = n_N < 2
    if leave_one_out:
        others_mean = (sum_G[inverse] - r) / (n_N - 1).clamp_min(1)
        centred = r - others_mean
    else:
        centred = r - mean_N
    centred = torch.where(alone, torch.zeros_like(centred), centred)
    if norm == "none":
        return centred
    if norm == "group":
        dev2_G = _group_sum(w * (r - mean_N) ** 2, inverse, n_groups)
        denom_G = (count_G - 1) if weights_N is None else wsum_G
        std_N = torch.sqrt(dev2_G / denom_G.clamp_min(torch.finfo(r.dtype).tiny))[inverse]
        std_N = torch.where(alone, torch.zeros_like(std_N), std_N)
        return centred / (std_N + eps)
    # batch
    if weights_N is None:
        batch_mean = centred.mean()
        batch_std = centred.std() if centred.numel() > 1 else centred.new_zeros(())
    else:
        batch_mean = (w * centred).sum() / w.sum()
        batch_std = torch.sqrt((w * (centred - batch_mean) ** 2).sum() / w.sum())
    return (centred - batch_mean) / (batch_std + eps)


def gae(
    rewards_NL: torch.Tensor,
    values_NL: torch.Tensor,
    mask_NL: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the action tokens of each row.

    Only positions with ``mask=1`` are decision steps; masked positions (observation tokens,
    template headers, padding) are skipped, so the recursion links consecutive action tokens even
    across an observation. For action positions ``j < k`` consecutive in the mask:
    ``delta_j = r_j + gamma * V_k - V_j`` (``V_k = 0`` after the last action),
    ``A_j = delta_j + gamma * lam * A_k``; returns ``R_j = A_j + V_j``.

    Rewards must sit on action tokens: a non-zero reward on a masked position raises.

    Args:
        rewards_NL, values_NL, mask_NL: ``[N, L]``.
    Returns:
        ``(advantages_NL, returns_NL)``, zero at masked positions.

    Example (one row, two actions, outcome reward 1, gamma=lam=1):
        >>> adv, ret = gae(torch.tensor([[0., 1.]]), torch.tensor([[0.5, 0.8]]), torch.ones(1, 2))
        >>> adv
        tensor([[0.5000, 0.2000]])
    """
    if not (rewards_NL.shape == values_NL.shape == mask_NL.shape) or rewards_NL.dim() != 2:
        raise ValueError(
            "rewards_NL, values_NL and mask_NL must share one [N, L] shape, got "
            f"{tuple(rewards_NL.shape)}, {tuple(values_NL.shape)}, {tuple(mask_NL.shape)}"
        )
    m = mask_NL.to(rewards_NL.dtype)
    if bool(((rewards_NL != 0) & (m == 0)).any()):
        raise ValueError("gae: non-zero reward on a masked (non-action) position; put it on an action token")
    n, length = rewards_NL.shape
    adv = torch.zeros_like(rewards_NL)
    next_value = rewards_NL.new_zeros(n)
    next_adv = rewards_NL.new_zeros(n)
    for j in range(length - 1, -1, -1):
        mj = m[:, j]
        delta = rewards_NL[:, j] + gamma * next_value - values_NL[:, j]
        a = delta + gamma * lam * next_adv
        adv[:, j] = a * mj
        # Carry the recursion unchanged through masked positions.
        next_value = torch.where(mj > 0, values_NL[:, j], next_value)
        next_adv = torch.where(mj > 0, a, next_adv)
    return adv, (adv + values_NL) * m



def gae_by_episode(
    rewards_R: torch.Tensor,
    values_RL: torch.Tensor,
    mask_RL: torch.Tensor,
    episode_R: torch.Tensor,
    turn_R: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gae`` where an episode's action tokens are spread over several rows, one per turn, each with
    its own context (bounded turn contexts, ``rollout.history=last:K``): each row's turn reward sits on
    its last action token; an episode's action positions, taken row by row in turn order, form one
    sequence of decision steps; ``gae`` runs over those sequences, and the results go back to their
    rows. With one row per episode it is ``gae`` with the reward on the last action.

    Args:
        rewards_R: ``[R]``, the reward of each row's turn; values_RL, mask_RL: ``[R, L]``;
        episode_R, turn_R: ``[R]``.
    Returns:
        ``(advantages_RL, returns_RL)``, zero at masked positions.

    Example (one episode in two rows, an action each, outcome reward 1 on the second turn,
    gamma=lam=1): the same advantages as one row holding both actions (``gae``'s example).
        >>> adv, _ = gae_by_episode(torch.tensor([1., 0.]), torch.tensor([[0., 0.8], [0.5, 0.]]),
        ...                         torch.tensor([[0, 1], [1, 0]]), torch.tensor([0, 0]), torch.tensor([1, 0]))
        >>> adv
        tensor([[0.0000, 0.2000],
                [0.5000, 0.0000]])
    """
    if values_RL.shape != mask_RL.shape or values_RL.dim() != 2 or rewards_R.shape != values_RL.shape[:1]:
        raise ValueError("values_RL and mask_RL must share one [R, L] shape and rewards_R be [R]")
    seqs: dict[int, list[tuple[int, int, float]]] = {}
    for r in sorted(range(values_RL.shape[0]), key=lambda r: (int(episode_R[r]), int(turn_R[r]))):
        pos = torch.nonzero(mask_RL[r]).flatten().tolist()
        seqs.setdefault(int(episode_R[r]), []).extend(
            (r, j, float(rewards_R[r]) if j == pos[-1] else 0.0) for j in pos)
    n, width = len(seqs), max((len(s) for s in seqs.values()), default=0)
    rw, vl, mk = (values_RL.new_zeros(n, width) for _ in range(3))
    for i, s in enumerate(seqs.values()):
        for k, (r, j, x) in enumerate(s):
            rw[i, k], vl[i, k], mk[i, k] = x, values_RL[r, j], 1.0
    adv_E, ret_E = gae(rw, vl, mk, gamma=gamma, lam=lam)
    adv, ret = torch.zeros_like(values_RL), torch.zeros_like(values_RL)
    for i, s in enumerate(seqs.values()):
        for k, (r, j, _) in enumerate(s):
            adv[r, j], ret[r, j] = adv_E[i, k], ret_E[i, k]
    return adv, ret


# --- per-turn advantages (issue 34): ``_NT`` one value per episode and turn, ``mask_NT`` 1 where the
# episode reached turn t (reached turns are a prefix of each row) ---


def _check_NT(name: str, x_NT: torch.Tensor, mask_NT: torch.Tensor, n: int | None = None) -> None:
    if x_NT.dim() != 2 or x_NT.shape != mask_NT.shape or (n is not None and x_NT.shape[0] != n):
        raise ValueError(f"{name} and mask_NT must share one [N, T] shape (N episodes), got "
                         f"{tuple(x_NT.shape)} and {tuple(mask_NT.shape)}")


def last_reached(mask_NT: torch.Tensor) -> torch.Tensor:
    """``[N, 1]`` the index of each episode's last reached turn (0 for an episode with none).

    >>> last_reached(torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])).flatten().tolist()
    [1, 2, 0]
    """
    m = mask_NT.long()
    return (m.cumsum(-1) * m).argmax(-1, keepdim=True)


def reward_to_go(rewards_NT: torch.Tensor, mask_NT: torch.Tensor, *, gamma: float = 1.0) -> torch.Tensor:
    """``G_{i,t} = sum_{k >= t, reached} gamma^(k-t) r_{i,k}``, 0 where turn t was not reached.

    Example:
        >>> reward_to_go(torch.tensor([[1., 0., 2.]]), torch.ones(1, 3), gamma=0.5)
        tensor([[1.5000, 1.0000, 2.0000]])
    """
    _check_NT("rewards_NT", rewards_NT, mask_NT)
    r = rewards_NT.float() if not rewards_NT.is_floating_point() else rewards_NT
    m = mask_NT.to(r.dtype)
    out = torch.zeros_like(r)
    acc = r.new_zeros(r.shape[0])
    for t in range(r.shape[1] - 1, -1, -1):
        acc = r[:, t] * m[:, t] + gamma * acc
        out[:, t] = acc * m[:, t]
    return out


def _reached_grae(values_NT: torch.Tensor, key_NTK: torch.Tensor, mask_NT: torch.Tensor, *, norm: str,
                  eps: float) -> torch.Tensor:
    """``grae`` over the reached (episode, turn) entries, grouped by equal key vectors ``key_NTK[i, t]``;
    0 where not reached."""
    reached = mask_NT.bool()
    out = torch.zeros_like(values_NT)
    if not bool(reached.any()):
        return out
    _, ids = torch.unique(key_NTK[reached], dim=0, return_inverse=True)
    out[reached] = grae(values_NT[reached], ids, norm=norm, eps=eps)
    return out


EPISODE_NORMS = ("step", "episode")  # GiGPO's episode baseline: over step rows (authors' code) or episodes


def _step_row_baseline(r_N: torch.Tensor, group_ids_N: torch.Tensor, mask_NT: torch.Tensor, *, norm: str,
                       eps: float) -> torch.Tensor:
    """GiGPO's episode part as the authors' code computes it: each reached turn a row holding its
    episode's reward; ``R_i`` minus the mean of its group's rows (``norm="group"``: over their unbiased
    std + eps); a group of a single row: mean 0, std 1. An episode without a reached turn gets 0."""
    rows_N = mask_NT.to(r_N.dtype).sum(-1)
    inverse, n_groups = _group_index(group_ids_N)
    count_G = _group_sum(rows_N, inverse, n_groups)
    sum_G = _group_sum(rows_N * r_N, inverse, n_groups)
    mean_G = sum_G / count_G.clamp_min(1)
    sq_G = _group_sum(rows_N * (r_N - mean_G[inverse]) ** 2, inverse, n_groups)
    std_G = torch.sqrt(sq_G / (count_G - 1).clamp_min(1))
    single = count_G < 2
    mean_G = torch.where(single, torch.zeros_like(mean_G), mean_G)
    std_G = torch.where(single, torch.ones_like(std_G), std_G)
    out = r_N - mean_G[inverse]
    if norm == "group":
        out = out / (std_G[inverse] + eps)
    return torch.where(rows_N > 0, out, torch.zeros_like(out))


def gigpo(
    episode_rewards_N: torch.Tensor,
    group_ids_N: torch.Tensor,
    step_rewards_NT: torch.Tensor,
    anchor_keys_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    omega: float = 1.0,
    gamma: float = 0.95,
    norm: str = "none",
    episode_norm: str = "step",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GiGPO (Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent Training"): an
    episode-level group-relative advantage plus a step-level one among the turns of the group that
    start from the same state.

    - Episode part, ``episode_norm="step"`` (the authors' code, verl-agent's ``episode_norm_reward``
      with ``compute_mean_std_cross_all_data=True``): every reached turn of the group is a row holding
      its episode's reward, and ``A^E_i = R_i - mean over the group's rows`` (``norm="group"``: divided
      by the rows' unbiased std + eps), so a longer episode weighs more; a group of a single row keeps
      its reward (mean 0, std 1). ``episode_norm="episode"`` (the paper's Eq. 3): ``A^E_i = R_i -
      mean_{j in g(i)} R_j`` over episodes (``norm="group"``: divided by their unbiased std + eps; a
      group of one gets 0): ``grae(R, g, norm)``. Rewards [1, 0] in one group with 1 and 4 reached
      turns: "episode" gives [+0.5, -0.5], "step" [+0.8, -0.2] (the mean is (1 + 0 * 4) / 5).
    - Step part: ``G_{i,t}`` the discounted return from turn t (``reward_to_go``); the step group of
      ``(i, t)`` is every reached ``(j, s)`` with ``g(j) == g(i)`` and ``anchor_keys[j, s] ==
      anchor_keys[i, t]`` (an anchor state: the same observation before the turn, at any turn index);
      ``A^S_{i,t} = G_{i,t} - mean over the step group`` (``norm="group"``: divided by its unbiased std
      + eps; a step group of one gets 0).
    - ``A_{i,t} = A^E_i + omega * A^S_{i,t}`` where reached, 0 elsewhere.

    GiGPO's defaults: omega 1, gamma 0.95, no std division (its "mean_norm"), the episode baseline
    over step rows.

    Example: group 0 holds episodes 0 and 1, which both start in state 5 and whose second turns start
    in different states (singleton step groups); group 1 holds episode 2 alone. gamma 1, returns
    ``G = [[1, 1], [0, 0], [1, -]]``; ``A^E = [0.5, -0.5, 0]``; the turn-0 step group {(0,0), (1,0)}
    has mean 0.5, so ``A^S[0,0] = 0.5``, ``A^S[1,0] = -0.5``, every other step group is a singleton:
        >>> gigpo(torch.tensor([1., 0., 1.]), torch.tensor([0, 0, 1]),
        ...       torch.tensor([[0., 1.], [0., 0.], [1., 0.]]), torch.tensor([[5, 6], [5, 7], [5, 0]]),
        ...       torch.tensor([[1, 1], [1, 1], [1, 0]]), gamma=1.0, episode_norm="episode")
        tensor([[ 1.0000,  0.5000],
                [-1.0000, -0.5000],
                [ 0.0000,  0.0000]])

    The same with the authors' episode baseline over step rows: group 0's rows are two turns of each
    episode (mean 0.5, as before); group 1's single row keeps its reward 1:
        >>> gigpo(torch.tensor([1., 0., 1.]), torch.tensor([0, 0, 1]),
        ...       torch.tensor([[0., 1.], [0., 0.], [1., 0.]]), torch.tensor([[5, 6], [5, 7], [5, 0]]),
        ...       torch.tensor([[1, 1], [1, 1], [1, 0]]), gamma=1.0)
        tensor([[ 1.0000,  0.5000],
                [-1.0000, -0.5000],
                [ 1.0000,  0.0000]])
    """
    n = episode_rewards_N.shape[0]
    _check_NT("step_rewards_NT", step_rewards_NT, mask_NT, n)
    _check_NT("anchor_keys_NT", anchor_keys_NT, mask_NT, n)
    if norm not in ("none", "group"):
        raise ValueError(f"gigpo norm must be 'none' or 'group', got {norm!r}")
    if episode_norm not in EPISODE_NORMS:
        raise ValueError(f"gigpo episode_norm must be one of {', '.join(EPISODE_NORMS)}, got {episode_norm!r}")
    r = episode_rewards_N if episode_rewards_N.is_floating_point() else episode_rewards_N.float()
    m = mask_NT.to(r.dtype)
    a_e = (grae(r, group_ids_N, norm=norm, eps=eps) if episode_norm == "episode"
           else _step_row_baseline(r, group_ids_N, mask_NT, norm=norm, eps=eps))
    g = reward_to_go(step_rewards_NT.to(r.dtype), mask_NT, gamma=gamma)
    keys = torch.stack([group_ids_N.long()[:, None].expand_as(anchor_keys_NT), anchor_keys_NT.long()], dim=-1)
    a_s = _reached_grae(g, keys, mask_NT, norm=norm, eps=eps)
    return torch.where(m > 0, a_e[:, None] + omega * a_s, torch.zeros_like(a_s))


def shared_anchor_fraction(group_ids_N: torch.Tensor, anchor_keys_NT: torch.Tensor, mask_NT: torch.Tensor) -> float:
    """GiGPO's diagnostic: the fraction of reached turns whose step group (``gigpo``: the reached turns
    of the same episode group with the same anchor key) has two or more members; 0 with no reached turn.

    Example (the ``gigpo`` example's episodes: 5 reached turns, two of them share an anchor state):
        >>> shared_anchor_fraction(torch.tensor([0, 0, 1]), torch.tensor([[5, 6], [5, 7], [5, 0]]),
        ...                        torch.tensor([[1, 1], [1, 1], [1, 0]]))
        0.4
    """
    _check_NT("anchor_keys_NT", anchor_keys_NT, mask_NT, group_ids_N.shape[0])
    reached = mask_NT.bool()
    if not bool(reached.any()):
        return 0.0
    keys = torch.stack([group_ids_N.long()[:, None].expand_as(anchor_keys_NT), anchor_keys_NT.long()], dim=-1)[reached]
    _, ids, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    return float((counts[ids] >= 2).double().mean())


def _turn_keys(group_ids_N: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    n, t = mask_NT.shape
    turns = torch.arange(t, device=mask_NT.device)[None, :].expand(n, t)
    return torch.stack([group_ids_N.long()[:, None].expand(n, t), turns], dim=-1)


def grae_to_go(
    rewards_NT: torch.Tensor,
    group_ids_N: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    norm: str = "none",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative reward-to-go: ``A_{i,t} = G_{i,t} - mean_{j in g(i), reached t} G_{j,t}`` with
    ``G`` the undiscounted reward-to-go; ``norm`` as in ``grae`` over each (group, turn) set
    (``"group"``: divided by its unbiased std + eps, a set of one gets 0; ``"batch"``: over every
    reached entry). A reward earned before turn t does not enter turn t's advantage.

    Example (one group of two episodes; a reward 1 on episode 0's first turn only):
        >>> grae_to_go(torch.tensor([[1., 0.], [0., 0.]]), torch.tensor([3, 3]), torch.ones(2, 2))
        tensor([[ 0.5000,  0.0000],
                [-0.5000,  0.0000]])
    """
    _check_NT("rewards_NT", rewards_NT, mask_NT, group_ids_N.shape[0])
    g = reward_to_go(rewards_NT, mask_NT)
    return _reached_grae(g, _turn_keys(group_ids_N, mask_NT), mask_NT, norm=norm, eps=eps)


def turn_grae(
    outcome_rewards_N: torch.Tensor,
    group_ids_N: torch.Tensor,
    turn_rewards_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    lam: float = 1.0,
    norm: str = "group",
    turn_mask_NT: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """MT-GRPO's turn-level advantage (Zeng et al., 2025, "Reinforcing Multi-Turn Reasoning in LLM
    Agents via Turn-Level Credit Assignment"): ``A_{i,t} = A^O_i + lam * A^T_{i,t}`` where reached, 0
    elsewhere; ``A^O = grae(outcome, group, norm)`` and ``A^T_{i,t}`` the turn reward's group-relative
    advantage among the group's episodes that have a turn reward at t (``turn_mask_NT``, default
    ``mask_NT``; ``grae`` with ``norm`` over each (group, turn) set), 0 where they have none. lam 1 is
    the authors' default. The ``turn_grae`` estimator (``core.estimators``) passes each episode's return
    as the outcome and gives the turns before each episode's last a turn reward, their own.

    Example (``norm="none"``; one group of two; turn rewards only on turn 0):
        >>> turn_grae(torch.tensor([1., 0.]), torch.tensor([0, 0]), torch.tensor([[1., 0.], [0., 0.]]),
        ...           torch.tensor([[1, 1], [1, 0]]), norm="none")
        tensor([[ 1.0000,  0.5000],
                [-1.0000,  0.0000]])
    """
    n = outcome_rewards_N.shape[0]
    _check_NT("turn_rewards_NT", turn_rewards_NT, mask_NT, n)
    r = outcome_rewards_N if outcome_rewards_N.is_floating_point() else outcome_rewards_N.float()
    a_o = grae(r, group_ids_N, norm=norm, eps=eps)
    tm = mask_NT if turn_mask_NT is None else turn_mask_NT * mask_NT
    a_t = _reached_grae(turn_rewards_NT.to(r.dtype), _turn_keys(group_ids_N, mask_NT), tm, norm=norm, eps=eps)
    return torch.where(mask_NT.bool(), a_o[:, None] + lam * a_t, torch.zeros_like(a_t))


def turn_gae(
    rewards_NT: torch.Tensor,
    values_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    bootstrap_N: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over turns (Turn-PPO, arXiv 2512.17008): one decision per turn, one value per turn state (the
    value head at the turn's last prompt token). ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t =
    delta_t + gamma * lam * A_{t+1}``; returns ``A + V``. After the last reached turn ``V`` is 0 (the
    episode ended) or ``bootstrap_N`` (an episode cut before its end: the value it would have gone on
    from). It is ``gae`` with each turn a position and ``mask_NT`` the decisions.

    Example (two turns, outcome 1 on the last, gamma=lam=1):
        >>> adv, ret = turn_gae(torch.tensor([[0., 1.]]), torch.tensor([[0.5, 0.8]]), torch.ones(1, 2))
        >>> adv
        tensor([[0.5000, 0.2000]])
    """
    _check_NT("rewards_NT", rewards_NT, mask_NT)
    _check_NT("values_NT", values_NT, mask_NT)
    if bootstrap_N is not None:  # gamma * V_boot joins the last reached turn's delta, as a reward there would
        m = mask_NT.long()
        last = last_reached(m)
        tail = (gamma * bootstrap_N.to(rewards_NT.dtype))[:, None] * m.gather(1, last).to(rewards_NT.dtype)
        rewards_NT = rewards_NT.scatter_add(1, last, tail)
    return gae(rewards_NT, values_NT, mask_NT, gamma=gamma, lam=lam)


def _history_keys(group_ids_N: torch.Tensor, anchor_keys_NT: torch.Tensor, k: int) -> torch.Tensor:
    """``[N, T, k + 1]`` the key of each turn at history level ``k``: its episode group, then the anchor
    keys of its last ``k`` observations (the current one first); positions before the first turn are
    0 (such turns have no level ``k``)."""
    n, t = anchor_keys_NT.shape
    cols = [group_ids_N.long()[:, None].expand(n, t)]
    for j in range(k):
        shifted = torch.zeros_like(anchor_keys_NT, dtype=torch.long)
        shifted[:, j:] = anchor_keys_NT[:, : t - j].long()
        cols.append(shifted)
    return torch.stack(cols, dim=-1)


def hgpo(
    group_ids_N: torch.Tensor,
    step_rewards_NT: torch.Tensor,
    anchor_keys_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    history: int = 2,
    alpha: float = 1.0,
    gamma: float = 0.95,
    norm: str = "group",
    base_group: bool = False,
    episode_rewards_N: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """HGPO (Hierarchy-of-Groups Policy Optimization, arXiv 2602.22817), as the authors' code computes
    it (verl-agent ``recipe/hgpo/core_hgpo.py``, ``hgpo_advantage_estimate``).

    - ``G_{i,t}``: the discounted return from turn t (``reward_to_go`` over the step rewards).
    - Levels ``k = 1 .. history + 1``: the level-k group of ``(i, t)`` is every reached ``(j, s)`` of
      the same episode group whose last k observations (anchor keys ``anchors[., s-k+1 .. s]``, the
      current one included) equal those of ``(i, t)``, at any turn index. A turn with fewer than k
      observations so far has no level k (turn 0 has level 1 only).
    - Each level-k group of two or more members gives ``a_k = G - mean`` (``norm="group"``: divided by
      the group's population std + eps, the authors' ``mean_std_norm``; ``"none"``: their
      ``mean_norm``); a group of one gives nothing.
    - ``base_group`` (off in their scripts): also GiGPO's episode term over step rows
      (``_step_row_baseline`` of ``episode_rewards_N``) as a level-0 item.
    - ``A_{i,t} = sum_k w_k a_k / (sum_k w_k + eps)`` with ``w_k = (k + 1)^alpha`` over the items that
      exist and are not exactly 0 (the authors drop zero advantages before weighting); 0 if none.

    Defaults are the authors' scripts' (history 2, alpha 1, gamma 0.95; ALFWorld's mean_std_norm).

    Example (the authors' code gives the same; docs/core.md): one group, states 0, 1, 2; episode A
    visits 0, 1, 2 and earns 10 at the end, B visits 0, 2, 1 and C visits 0, 1, 2, both earning
    nothing; history 1 (levels 1 and 2), gamma 1. Level 1: every state's group has returns
    {10, 0, 0}: +1.414 for A's turns, -0.707 for the others. Level 2: (0, 1) holds A1 and C1, (1, 2)
    holds A2 and C2, each +1 / -1; B's pairs are singletons. A1 = (2 * 1.414 + 3 * 1) / 5 = 1.166:
        >>> hgpo(torch.tensor([0, 0, 0]), torch.tensor([[0., 0., 10.], [0., 0., 0.], [0., 0., 0.]]),
        ...      torch.tensor([[0, 1, 2], [0, 2, 1], [0, 1, 2]]), torch.ones(3, 3), history=1, gamma=1.0)
        tensor([[ 1.4142,  1.1657,  1.1657],
                [-0.7071, -0.7071, -0.7071],
                [-0.7071, -0.8828, -0.8828]])
    """
    _check_NT("step_rewards_NT", step_rewards_NT, mask_NT, group_ids_N.shape[0])
    _check_NT("anchor_keys_NT", anchor_keys_NT, mask_NT, group_ids_N.shape[0])
    if norm not in ("none", "group"):
        raise ValueError(f"hgpo norm must be 'none' or 'group', got {norm!r}")
    if int(history) != history or history < 0:
        raise ValueError(f"hgpo history must be an integer >= 0, got {history!r}")
    r = step_rewards_NT if step_rewards_NT.is_floating_point() else step_rewards_NT.float()
    g = reward_to_go(r, mask_NT, gamma=gamma)
    reached = mask_NT.bool()
    n, t = mask_NT.shape
    num = torch.zeros_like(g)
    den = torch.zeros_like(g)

    def add(a_NT: torch.Tensor, ok_NT: torch.Tensor, w: float) -> None:
        use = ok_NT & (a_NT != 0)
        num.add_(torch.where(use, w * a_NT, torch.zeros_like(a_NT)))
        den.add_(use.to(g.dtype) * w)

    if base_group:
        if episode_rewards_N is None:
            raise ValueError("hgpo base_group needs episode_rewards_N")
        base = _step_row_baseline(episode_rewards_N.to(g.dtype), group_ids_N, mask_NT, norm=norm, eps=eps)
        add(base[:, None].expand(n, t), reached, 1.0)
    turn_idx = torch.arange(t)[None, :].expand(n, t)
    for k in range(1, int(history) + 2):
        valid = reached & (turn_idx >= k - 1)
        if not bool(valid.any()):
            break
        keys = _history_keys(group_ids_N, anchor_keys_NT, k)[valid]
        _, ids, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
        vals = g[valid]
        size = counts.to(g.dtype)
        mean = torch.zeros(len(counts), dtype=g.dtype).index_add_(0, ids, vals) / size
        dev = vals - mean[ids]
        a = dev
        if norm == "group":
            var = torch.zeros(len(counts), dtype=g.dtype).index_add_(0, ids, dev**2) / size  # population
            a = dev / (var.sqrt()[ids] + eps)
        a_NT = torch.zeros_like(g)
        ok_NT = torch.zeros_like(reached)
        a_NT[valid] = a
        ok_NT[valid] = counts[ids] >= 2
        add(a_NT, ok_NT, float((k + 1) ** alpha))
    return torch.where(den > 0, num / (den + eps), torch.zeros_like(num))
