"""Policy losses and KL estimators, chosen by name from plain dicts.

Every policy loss has one signature::

    loss_fn(logp_new_NL, logp_old_NL, adv, mask_NL, *, clip_eps=0.2, clip_eps_high=None,
            factor_N=None, weights_N=None, agg=None, denom=None) -> (loss, metrics)

- ``adv`` is ``[N]`` (one advantage per row, broadcast over its tokens) or ``[N, L]`` (per token).
- ``factor_N`` multiplies the advantage row-wise (SeeUPO's ``M_i``); default 1.
- ``weights_N`` weights each row's contribution (default 1); the lab uses trajectory probabilities.
- aggregation ``agg``: ``"token_mean"`` (sum of token losses over the number of tokens),
  ``"seq_mean"`` (per-row token mean, then mean over rows), ``"seq_sum"`` (per-row token sum, then
  mean over rows). Sequence-level losses have one loss per row and always average rows.
- ``denom``: a fixed denominator replacing the batch's own count (token count or row count, as
  ``agg`` says, weighted). Passing the *global* count makes the loss of a micro-batch add up exactly
  to the loss of the whole batch, whatever the split.

``metrics`` is a dict of detached scalar tensors (``clipfrac``, ``ratio_mean``, ``approx_kl``, ...).
Rows whose mask is empty contribute nothing and are not counted.
"""

from __future__ import annotations

from typing import Callable

import torch

from seeupo.core.registry import pick

AGGS = ("token_mean", "seq_mean", "seq_sum")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() if dim is None else (x * m).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of ``x`` over ``mask``; 0 where the mask is empty."""
    m = mask.to(x.dtype)
    count = m.sum() if dim is None else m.sum(dim)
    return masked_sum(x, m, dim) / count.clamp_min(1)


def sequence_log_ratio(
    logp_new_NL: torch.Tensor, logp_old_NL: torch.Tensor, mask_NL: torch.Tensor
) -> torch.Tensor:
    """Length-normalised log importance ratio of each row: ``mean_{j: mask=1}(logp_new - logp_old)``.

    ``exp`` of it is GSPO's / SeeUPO's sequence ratio. A row with an empty mask gives 0 (ratio 1).

    Example:
        >>> sequence_log_ratio(torch.tensor([[0., -1., 5.]]), torch.tensor([[-1., -1., 0.]]),
        ...                    torch.tensor([[1, 1, 0]]))
        tensor([0.5000])
    """
    return masked_mean(logp_new_NL - logp_old_NL, mask_NL, dim=-1)


def _prepare(logp_new_NL, logp_old_NL, adv, mask_NL, factor_N, weights_N):
    if logp_new_NL.shape != logp_old_NL.shape or logp_new_NL.shape != mask_NL.shape:
        raise ValueError(
            f"logp_new {tuple(logp_new_NL.shape)}, logp_old {tuple(logp_old_NL.shape)} and mask "
            f"{tuple(mask_NL.shape)} must share one [N, L] shape"
        )
    n = logp_new_NL.shape[0]
    if adv.dim() == 1:
        if adv.shape[0] != n:
            raise ValueError(f"advantages [N] must have N={n} rows, got {adv.shape[0]}")
        adv = adv.unsqueeze(-1)
    elif adv.shape != logp_new_NL.shape:
        raise ValueError(f"token advantages must be [N, L]={tuple(logp_new_NL.shape)}, got {tuple(adv.shape)}")
    dtype = logp_new_NL.dtype
    mask = mask_NL.to(dtype)
    w = torch.ones(n, dtype=dtype, device=logp_new_NL.device) if weights_N is None else weights_N.to(dtype)
    if factor_N is not None:
        adv = adv * factor_N.to(dtype).unsqueeze(-1)
    return adv.to(dtype), mask, w


def _aggregate(tok_loss_NL, mask_NL, w_N, agg, denom):
    """Reduce per-token losses to a scalar according to ``agg`` (see module docstring)."""
    pick({a: a for a in AGGS}, agg, "loss aggregation")
    n_tok = mask_NL.sum(-1)
    real = (n_tok > 0).to(w_N.dtype)
    row_sum = (tok_loss_NL * mask_NL).sum(-1)
    if agg == "token_mean":
        num, den = (w_N * row_sum).sum(), (w_N * n_tok).sum()
    elif agg == "seq_mean":
        num, den = (w_N * row_sum / n_tok.clamp_min(1)).sum(), (w_N * real).sum()
    else:
        num, den = (w_N * row_sum).sum(), (w_N * real).sum()
    if denom is not None:
        return num / torch.as_tensor(denom, dtype=num.dtype, device=num.device)
    return num / den.clamp_min(torch.finfo(num.dtype).tiny)


def _token_stats(logp_new, logp_old, mask, w):
    """Weighted token means of the ratio and of the k3 KL(old||new) estimate."""
    with torch.no_grad():
        log_ratio = logp_new - logp_old
        wm = mask * w.unsqueeze(-1)
        den = wm.sum().clamp_min(1e-12)
        ratio = torch.exp(log_ratio)
        approx_kl = ((ratio - 1) - log_ratio) * wm
        return (ratio * wm).sum() / den, approx_kl.sum() / den, wm, den


def reinforce(
    logp_new_NL, logp_old_NL, adv, mask_NL, *, clip_eps=0.2, clip_eps_high=None,
    factor_N=None, weights_N=None, agg=None, denom=None,
):
    """REINFORCE in ratio form: per token ``-A * exp(logp_new - sg(logp_old))``.

    At ``logp_new == logp_old`` its gradient is ``-A * grad logp_new``, the policy gradient; the
    default ``agg="seq_sum"`` sums over a row's tokens, so one row's gradient is
    ``-A * grad log pi(response)``. ``clip_eps`` is ignored (no clipping).

    Example: one row, two tokens, on-policy, ``A = 2``: loss ``= -2 * (1 + 1) = -4``.
    """
    agg = agg or "seq_sum"
    a, mask, w = _prepare(logp_new_NL, logp_old_NL, adv, mask_NL, factor_N, weights_N)
    ratio = torch.exp(logp_new_NL - logp_old_NL.detach())
    loss = _aggregate(-a * ratio, mask, w, agg, denom)
    ratio_mean, approx_kl, _, _ = _token_stats(logp_new_NL, logp_old_NL, mask, w)
    return loss, {"loss": loss.detach(), "ratio_mean": ratio_mean, "approx_kl": approx_kl,
                  "clipfrac": torch.zeros((), dtype=loss.dtype)}


def clip_token(
    logp_new_NL, logp_old_NL, adv, mask_NL, *, clip_eps=0.2, clip_eps_high=None,
    factor_N=None, weights_N=None, agg=None, denom=None,
):
    """PPO/GRPO clipped surrogate with a ratio per token.

    ``l_j = -min(rho_j * A, clip(rho_j, 1 - eps, 1 + eps_high) * A)``, ``rho_j = exp(logp_new_j -
    logp_old_j)``; default ``agg="token_mean"``.

    Example: ``rho = 1.5``, ``A = 1``, ``eps = 0.2``: ``l = -min(1.5, 1.2) = -1.2``.
    """
    agg = agg or "token_mean"
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    a, mask, w = _prepare(logp_new_NL, logp_old_NL, adv, mask_NL, factor_N, weights_N)
    ratio = torch.exp(logp_new_NL - logp_old_NL)
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + hi)
    surr = torch.minimum(ratio * a, clipped * a)
    loss = _aggregate(-surr, mask, w, agg, denom)
    ratio_mean, approx_kl, wm, den = _token_stats(logp_new_NL, logp_old_NL, mask, w)
    with torch.no_grad():
        active = ((ratio * a) > (clipped * a)).to(wm.dtype)  # the clipped branch is the min
        clipfrac = (active * wm).sum() / den
    return loss, {"loss": loss.detach(), "ratio_mean": ratio_mean, "approx_kl": approx_kl,
                  "clipfrac": clipfrac}


def clip_sequence(
    logp_new_NL, logp_old_NL, adv, mask_NL, *, clip_eps=0.2, clip_eps_high=None,
    factor_N=None, weights_N=None, agg=None, denom=None,
):
    """GSPO/SeeUPO clipped surrogate with one length-normalised ratio per row.

    ``rho_i = exp(sequence_log_ratio_i)``, ``l_i = -min(rho_i * A_i * M_i, clip(rho_i, 1 - eps,
    1 + eps_high) * A_i * M_i)``; the loss is the (weighted) mean of ``l_i`` over real rows, or
    ``sum / denom``. ``adv`` must be ``[N]``. Only ``agg=None``/``"seq_mean"`` is accepted.

    Example: ``rho = exp(0.5)``, ``A = 1``, ``M = 2``, ``eps = 0.2``: ``l = -1.2 * 2 = -2.4``.
    """
    if agg not in (None, "seq_mean"):
        raise ValueError(f"clip_sequence has one loss per row; agg must be 'seq_mean', got {agg!r}")
    if adv.dim() != 1:
        raise ValueError("clip_sequence needs one advantage per row ([N])")
    a, mask, w = _prepare(logp_new_NL, logp_old_NL, adv, mask_NL, factor_N, weights_N)
    a = a.squeeze(-1)
    real = (mask.sum(-1) > 0).to(a.dtype)
    log_ratio = sequence_log_ratio(logp_new_NL, logp_old_NL, mask)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + (clip_eps if clip_eps_high is None else clip_eps_high))
    row_loss = -torch.minimum(ratio * a, clipped * a)
    loss = _aggregate(row_loss.unsqueeze(-1), real.unsqueeze(-1), w, "seq_sum", denom)
    with torch.no_grad():
        wr = w * real
        wden = wr.sum().clamp_min(1e-12)
        active = ((ratio * a) > (clipped * a)).to(a.dtype)
        _, approx_kl, _, _ = _token_stats(logp_new_NL, logp_old_NL, mask, w)
        metrics = {
            "loss": loss.detach(),
            "ratio_mean": (ratio * wr).sum() / wden,
            "approx_kl": approx_kl,
            "clipfrac": (active * wr).sum() / wden,
        }
    return loss, metrics


PolicyLoss = Callable[..., tuple[torch.Tensor, dict]]
POLICY_LOSSES: dict[str, PolicyLoss] = {
    "reinforce": reinforce,
    "clip_token": clip_token,
    "clip_sequence": clip_sequence,
}


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss called ``name``; see ``POLICY_LOSSES``."""
    return pick(POLICY_LOSSES, name, "policy loss")


def kl_k1(logp_NL: torch.Tensor, logp_ref_NL: torch.Tensor) -> torch.Tensor:
    """``k1 = logp - logp_ref`` per token (unbiased for KL(pi||ref) under pi, high variance)."""
    return logp_NL - logp_ref_NL


def kl_k2(logp_NL: torch.Tensor, logp_ref_NL: torch.Tensor) -> torch.Tensor:
    """``k2 = (logp - logp_ref)^2 / 2`` per token (biased, low variance)."""
    return 0.5 * (logp_NL - logp_ref_NL) ** 2


def kl_k3(logp_NL: torch.Tensor, logp_ref_NL: torch.Tensor) -> torch.Tensor:
    """``k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1`` per token (unbiased, >= 0, low variance).

    Example: ``logp = logp_ref`` gives 0.
    """
    d = logp_ref_NL - logp_NL
    return torch.exp(d) - d - 1


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def get_kl(name: str):
    """The per-token KL estimator called ``name`` (``k1``, ``k2`` or ``k3``)."""
    return pick(KL_ESTIMATORS, name, "KL estimator")
