"""The policy as the learner sees it: a causal LM (optionally LoRA-wrapped), an optional value head,
and log-probabilities of chosen tokens computed only where they are needed.

``token_logprobs`` runs the decoder once and applies the LM head only at the positions whose next
token is scored (the generated tokens), so a long context with a short response does not pay for
a ``[B, L, vocab]`` logits tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def apply_lora(model: nn.Module, *, r: int = 16, alpha: int = 32, dropout: float = 0.0,
               target_modules: tuple[str, ...] = LORA_TARGETS, seed: int = 0) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in target_modules if t in present]
    if not targets:
        raise ValueError(f"none of the LoRA target modules {list(target_modules)} exist in this model")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                                target_modules=targets, bias="none"))


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def _parts(model: nn.Module):
    base = model.get_base_model() if is_peft(model) else model
    return base.get_decoder(), base.get_output_embeddings()


class ValueHead(nn.Module):
    """A linear value head on the final hidden state, zero-initialised (PPO's critic)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h).squeeze(-1)


@dataclass
class TokenScores:
    logp: torch.Tensor  # [B, L] log-prob of input_ids[:, j] given the prefix; 0 where not scored
    entropy: torch.Tensor  # [B, L] entropy of that next-token distribution; 0 where not scored
    values: torch.Tensor | None  # [B, L] value of the state before token j (with a value head)


def token_logprobs(
    model: nn.Module,
    input_ids_BL: torch.Tensor,
    attention_mask_BL: torch.Tensor,
    score_mask_BL: torch.Tensor,
    *,
    temperature: float = 1.0,
    value_head: ValueHead | None = None,
    with_entropy: bool = True,
) -> TokenScores:
    """Log-probs (at ``temperature``) of the tokens marked in ``score_mask_BL`` (position 0 is never
    scored). Shapes ``[B, L]``; right padding. ``model`` is a causal LM or a ``Scorer`` (which then
    brings its own value head)."""
    if isinstance(model, Scorer):
        logp, entropy, values = model(input_ids_BL, attention_mask_BL, score_mask_BL, temperature=temperature,
                                      with_entropy=with_entropy, with_values=value_head is not None)
        return TokenScores(logp=logp, entropy=entropy, values=values)
    return TokenScores(*_score(model, value_head, input_ids_BL, attention_mask_BL, score_mask_BL,
                               temperature, with_entropy))


class Scorer(nn.Module):
    """The learner's forward pass as one module: the causal LM (and value head) it holds, called
    through this module's ``forward``. FSDP2 shards it with this module as the root, so every
    parameter (also the LM head, tied to the embeddings) is gathered by the root's hooks."""

    def __init__(self, model: nn.Module, value_head: ValueHead | None = None):
        super().__init__()
        self.model = model
        self.value_head = value_head

    def forward(self, input_ids_BL, attention_mask_BL, score_mask_BL, *, temperature: float = 1.0,
                with_entropy: bool = True, with_values: bool = False):
        return _score(self.model, self.value_head if with_values else None, input_ids_BL, attention_mask_BL,
                      score_mask_BL, temperature, with_entropy)


def _score(model, value_head, input_ids_BL, attention_mask_BL, score_mask_BL, temperature, with_entropy):
    decoder, lm_head = _parts(model)
    hidden = decoder(input_ids=input_ids_BL, attention_mask=attention_mask_BL).last_hidden_state
    sel = score_mask_BL[:, 1:].bool()
    h = hidden[:, :-1][sel]  # [K, H] states that predict the scored tokens
    logits = lm_head(h).float()
    if temperature != 1.0:  # a [K, vocab] division and its backward: skipped when it is a no-op
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, -1)
    targets = input_ids_BL[:, 1:][sel]
    logp_K = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(input_ids_BL.shape, dtype=logp_K.dtype, device=logp_K.device)
    logp = out.clone()
    logp[:, 1:][sel] = logp_K
    entropy = out.clone()
    if with_entropy:
        with torch.no_grad():  # in place: one [K, vocab] buffer instead of two
            lp = logp_all.detach()
            entropy[:, 1:][sel] = -lp.exp().mul_(lp).sum(-1)
    values = None
    if value_head is not None:
        values = out.clone()
        values[:, 1:][sel] = value_head(h).float()
    return logp, entropy, values
