"""seeupo: multi-turn agent RL for LLMs (SeeUPO and its backbones on one code path).

Layers (imports only point down): cli -> train -> rollout -> envs/models -> data -> core.
`seeupo.lab` is the tabular convergence lab; it uses `seeupo.core` only.
"""

__version__ = "0.1.0"
