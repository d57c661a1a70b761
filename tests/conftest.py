import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny():
    """A tiny random Llama with the default model's tokenizer and chat template."""
    from seeupo.models.loading import load_model

    return load_model("tiny-random", seed=0)


@pytest.fixture(scope="session")
def chat(tiny):
    from seeupo.rollout.runner import Chat

    return Chat(tiny.tokenizer)
