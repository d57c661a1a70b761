import contextlib
import os
import shutil

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# at most 2 intra-op threads, and the cores shared among the pytest-xdist workers (pyproject's addopts)
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _workers)))


@contextlib.contextmanager
def _threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# Runs compared to the bit must use one CPU thread. With two intra-op threads torch's CPU kernels are
# not bit-reproducible on a loaded machine (one run twice in a process differed in the 8th digit of its
# entropy, at 1210fa6 and after); with one they are, as sweep trials run.
@pytest.fixture
def one_thread():
    with _threads(1):
        yield


@pytest.fixture(scope="module")
def one_thread_module():
    with _threads(1):
        yield


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
