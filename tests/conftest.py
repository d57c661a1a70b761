import os
import shutil

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


@pytest.fixture(autouse=True)
def _drop_checkpoints(request):
    """Run folders' checkpoints are removed after each test (a tiny run's are ~80 MB; the suite
    writes dozens), so the suite's disk use stays bounded."""
    path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if path is not None:
        for d in path.rglob("checkpoints"):
            shutil.rmtree(d, ignore_errors=True)
