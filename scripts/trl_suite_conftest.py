"""pytest conftest for scripts/trl_suite.py: TRL's GRPOTrainer tests, offline, in one of three modes.

`scripts/trl_suite.py` copies this file as `conftest.py` into the folder that holds a copy of TRL's
test files and runs pytest there once per mode. It is read from the environment:

    D3S_SUITE_MODE     "trl": nothing is replaced; "off": `GRPOTrainer`/`GRPOConfig` are D3S's
                       `D3SGRPOTrainer`/`D3SConfig` (D3S off); "d3s": the same with `variant="d3s"`
                       wherever a config does not set a variant
    D3S_SUITE_REPORT   JSON-lines file receiving one record per test phase (outcome, first error line)
    HF_HUB_CACHE       a private hub cache; the stand-in models below are written into it once
    D3S_SUITE_TEST_TIMEOUT  seconds one test may run (0: no limit), enforced with SIGALRM
    D3S_SUITE_VOCAB    "compact" (default): stand-in vocabularies of 2048 tokens plus the family's special
                       tokens; "real": the real vocabulary sizes and special token ids (slow on CPU)
    D3S_SUITE_MAX_STEPS  when set, every config's `max_steps` is capped to it (a smaller compute budget;
                       the same in every mode)

Offline stand-ins (nothing is fetched; HF_HUB_OFFLINE=1):

- models: the hub ids in `MODELS` are written into the hub cache as tiny, randomly initialised
  checkpoints of the same architecture as TRL's tiny test models (hidden size 8 or 16, 2 layers,
  bf16) with a byte-level tokenizer carrying the family's special tokens (Qwen's <|endoftext|>,
  <|im_end|>, <tool_call>, ...; Llama 3's 256) and the chat template TRL ships for that family.
  With D3S_SUITE_VOCAB=real the vocabulary has the real size and the special tokens sit at the real
  ids (151643... for Qwen, 128000... for Llama 3), so the few tests that hard-code token ids decode
  them as TRL's CI does and EOS is as rare as with the real tiny models; "compact" (2048 regular
  tokens) is about ten times faster on CPU and only those tests see other token ids.
  Every other hub id fails to load, in every mode alike.
- datasets: `load_dataset("trl-internal-testing/zen", <config>)` for the prompt-only configs is
  built in code from the Zen of Python (19 rows, train 17 / test 2; the standard prompts are the
  leading words of each aphorism, as in TRL's dataset; the conversational ones are our own), with
  `split=` and `streaming=` honoured. Other datasets go to the real `load_dataset` (offline).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import pytest  # noqa: E402

MODE = os.environ.get("D3S_SUITE_MODE", "trl")
REPORT = os.environ.get("D3S_SUITE_REPORT")
TEST_TIMEOUT = int(os.environ.get("D3S_SUITE_TEST_TIMEOUT", "0") or 0)
VOCAB = os.environ.get("D3S_SUITE_VOCAB", "compact")
MAX_STEPS = int(os.environ.get("D3S_SUITE_MAX_STEPS", "0") or 0)
COMPACT_REGULAR = 2048
if MODE not in ("trl", "off", "d3s"):
    raise pytest.UsageError(f"D3S_SUITE_MODE={MODE!r}; valid: 'trl', 'off', 'd3s'")
if VOCAB not in ("compact", "real"):
    raise pytest.UsageError(f"D3S_SUITE_VOCAB={VOCAB!r}; valid: 'compact', 'real'")

# ----------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------

_QWEN_SPECIAL = [  # (content, special), from id 151643 on, in Qwen2.5/Qwen3 order
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
]
_QWEN3_EXTRA = [("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]
_LLAMA3_NAMED = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>",
                 8: "<|eom_id|>", 9: "<|eot_id|>", 10: "<|python_tag|>"}
_LLAMA3_SPECIAL = [(_LLAMA3_NAMED.get(i, f"<|reserved_special_token_{i}|>"), True) for i in range(256)]


def _filler_vocab(size: int) -> dict[str, int]:
    """`size` byte-level BPE tokens: the 256 byte symbols, then 2- and 3-letter pseudo-words (never produced
    by encoding, which has no merges, but decodable: generated ids turn into text of varying length)."""
    from tokenizers import pre_tokenizers

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols)}
    letters = "\u0120abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # \u0120 is the byte-level space
    for n in (2, 3):
        for i in range(len(letters) ** n):
            if len(vocab) >= size:
                return vocab
            word, k = "", i
            for _ in range(n):
                word, k = letters[k % len(letters)] + word, k // len(letters)
            vocab.setdefault(word, len(vocab))
    if len(vocab) < size:
        raise ValueError(f"filler vocabulary too small for {size}")
    return vocab


def _chat_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def _tokenizer(family: str):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if family in ("qwen2.5", "qwen3"):
        regular, special = 151643, _QWEN_SPECIAL + (_QWEN3_EXTRA if family == "qwen3" else [])
        names = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")
        ids = dict(bos_token_id="<|endoftext|>", eos_token_id="<|im_end|>", pad_token_id="<|endoftext|>")
        template = _chat_template("qwen2_5" if family == "qwen2.5" else "qwen3")
    elif family == "llama3.2":
        regular, special = 128000, _LLAMA3_SPECIAL
        names = dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        ids = dict(bos_token_id="<|begin_of_text|>", eos_token_id=["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"])
        template = _chat_template("llama3_2")
    else:
        raise ValueError(family)
    if VOCAB == "compact":
        regular = COMPACT_REGULAR
    backend = Tokenizer(models.BPE(vocab=_filler_vocab(regular), merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens([AddedToken(c, special=s, normalized=False) for c, s in special])
    if family == "llama3.2":
        backend.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", regular)])
    assert backend.token_to_id(special[0][0]) == regular, "special tokens follow the regular vocabulary"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template, **names)
    token_ids = {k: ([backend.token_to_id(t) for t in v] if isinstance(v, list) else backend.token_to_id(v))
                 for k, v in ids.items()}
    return tokenizer, token_ids


# ----------------------------------------------------------------------------------------------
# Models: hub id -> (architecture, config fields, tokenizer family)
# ----------------------------------------------------------------------------------------------

_SMALL = dict(hidden_size=8, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=32)
_REWARD = dict(_SMALL, hidden_size=16, num_labels=1)
_LLAMA = dict(tie_word_embeddings=True)  # bos/eos/pad token ids: the tokenizer's (see `_tokenizer`)

MODELS = {
    "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5": ("Qwen2ForCausalLM", dict(_SMALL), "qwen2.5"),
    "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5":
        ("Qwen2ForSequenceClassification", dict(_REWARD), "qwen2.5"),
    "trl-internal-testing/tiny-Qwen3ForCausalLM": ("Qwen3ForCausalLM", dict(_SMALL), "qwen3"),
    "trl-internal-testing/tiny-Qwen3ForSequenceClassification":
        ("Qwen3ForSequenceClassification", dict(_REWARD), "qwen3"),
    "trl-internal-testing/tiny-Qwen3MoeForCausalLM":
        ("Qwen3MoeForCausalLM", dict(_SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                     norm_topk_prob=True), "qwen3"),
    "trl-internal-testing/tiny-LlamaForCausalLM-3.2": ("LlamaForCausalLM", dict(_SMALL, **_LLAMA), "llama3.2"),
    "trl-internal-testing/tiny-LlamaForSequenceClassification-3.2":
        ("LlamaForSequenceClassification", dict(_REWARD, **_LLAMA), "llama3.2"),
}

_STANDIN_VERSION = "2"  # bump when the stand-ins change, so a reused cache is rebuilt


def _write_hub_repo(cache: Path, repo_id: str, save) -> None:
    """Write `repo_id` into the hub cache layout that offline loading reads (refs/main -> snapshots/<commit>)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}-{_STANDIN_VERSION}-{VOCAB}".encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    save(snapshot)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def build_standins(cache: str | os.PathLike) -> None:
    """Write every stand-in model of `MODELS` into the hub cache `cache` (skipped when already there)."""
    import torch
    import transformers
    from transformers import GenerationConfig

    cache = Path(cache)
    marker = cache / f".d3s-suite-standins-{_STANDIN_VERSION}-{VOCAB}"
    if marker.exists():
        return
    cache.mkdir(parents=True, exist_ok=True)
    tokenizers = {}
    for i, (repo_id, (arch, fields, family)) in enumerate(MODELS.items()):
        if family not in tokenizers:
            tokenizers[family] = _tokenizer(family)
        tok, token_ids = tokenizers[family]
        model_cls = getattr(transformers, arch)
        fields = dict(fields, **token_ids)
        fields.setdefault("vocab_size", len(tok))
        config = model_cls.config_class(**fields)
        torch.manual_seed(i)
        model = model_cls(config).to(torch.bfloat16)
        gen_ids = {k: fields[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in fields}

        def save(path, model=model, tok=tok, gen_ids=gen_ids):
            model.save_pretrained(path)
            tok.save_pretrained(path)
            if not arch.endswith("SequenceClassification"):
                GenerationConfig(**gen_ids).save_pretrained(path)

        _write_hub_repo(cache, repo_id, save)
    marker.write_text("ok\n")


# ----------------------------------------------------------------------------------------------
# Datasets
# ----------------------------------------------------------------------------------------------


def _zen_lines() -> list[str]:
    import codecs

    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (prints the Zen on first import)
    text = codecs.decode(this.s, "rot13")
    return [line for line in text.splitlines()[2:] if line.strip()]  # the 19 aphorisms


# Leading words of each aphorism that TRL's zen prompt-only rows keep ("Beautiful is better than", "Explicit is",
# ...): a test compares the prompts of the first generation batches with these.
ZEN_PROMPT_WORDS = (4, 2, 3, 1, 4, 3, 1, 4, 3, 3, 2, 6, 6, 11, 2, 4, 7, 5, 5)


def zen_dataset(config_name: str):
    """TRL's `trl-internal-testing/zen` prompt-only configs, rebuilt: 19 rows, train 17 / test 2."""
    from datasets import Dataset

    lines = _zen_lines()
    prompts = [" ".join(line.split()[:n]) for line, n in zip(lines, ZEN_PROMPT_WORDS, strict=True)]
    if config_name == "standard_prompt_only":
        data = {"prompt": prompts}
    elif config_name == "conversational_prompt_only":
        data = {"prompt": [[{"role": "user", "content": f"How does this go on: {p}?"}] for p in prompts]}
    else:
        raise ValueError(f"trl-internal-testing/zen config {config_name!r} has no offline stand-in")
    return Dataset.from_dict(data).train_test_split(test_size=0.1, shuffle=False)


def _install_load_dataset() -> None:
    import datasets

    real = datasets.load_dataset

    def load_dataset(path, name=None, *args, split=None, streaming=False, **kwargs):
        if path != "trl-internal-testing/zen":
            return real(path, name, *args, split=split, streaming=streaming, **kwargs)
        dd = zen_dataset(name)
        if streaming:
            dd = datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in dd.items()})
        return dd if split is None else dd[split]

    datasets.load_dataset = load_dataset


# ----------------------------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------------------------


def _install_mode() -> None:
    if MODE == "trl":
        return
    import trl

    from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer

    if MODE == "d3s":
        post_init = D3SConfig.__post_init__

        def d3s_on_post_init(self):
            if self.variant is None:
                self.variant = "d3s"
            post_init(self)

        D3SConfig.__post_init__ = d3s_on_post_init
    # The test module does `from trl import GRPOConfig, GRPOTrainer` after this conftest is imported
    trl.GRPOTrainer = D3SGRPOTrainer
    trl.GRPOConfig = D3SConfig


def _install_availability_fallback() -> None:
    """TRL's test helpers import `is_<package>_available` checks that a different TRL release may lack: answer
    those missing from `trl.import_utils` by whether the package is importable (the same in every mode)."""
    import importlib.util

    import trl.import_utils as iu

    if "__getattr__" in vars(iu):
        return

    def __getattr__(name):
        if name.startswith("is_") and name.endswith("_available"):
            package = name[3:-len("_available")]
            return lambda: importlib.util.find_spec(package) is not None
        raise AttributeError(f"module 'trl.import_utils' has no attribute {name!r}")

    iu.__getattr__ = __getattr__


def _install_max_steps() -> None:
    if MAX_STEPS <= 0:
        return
    from trl.trainer.base_config import _BaseConfig

    post_init = _BaseConfig.__post_init__

    def capped_post_init(self):
        if self.max_steps is None or self.max_steps <= 0 or self.max_steps > MAX_STEPS:
            self.max_steps = MAX_STEPS
        post_init(self)

    _BaseConfig.__post_init__ = capped_post_init


if os.environ.get("D3S_SUITE_MODE") and os.environ.get("HF_HUB_CACHE"):  # only under trl_suite.py
    build_standins(os.environ["HF_HUB_CACHE"])
_install_availability_fallback()
_install_max_steps()
_install_load_dataset()
_install_mode()


# ----------------------------------------------------------------------------------------------
# Per-test records and a per-test time limit
# ----------------------------------------------------------------------------------------------


class SuiteTestTimeout(Exception):
    pass


def _first_line(report) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # skip: (path, line, reason)
        return str(longrepr[2]).splitlines()[0] if longrepr[2] else ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.strip().splitlines()[0]
    text = str(longrepr).strip().splitlines()
    errors = [line for line in text if line.startswith("E ")]
    return (errors[0][1:].strip() if errors else (text[-1] if text else ""))[:500]


def _write(record: dict) -> None:
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps(record) + "\n")


def pytest_configure(config):
    config.addinivalue_line("markers", "d3s_suite: internal")
    _write({"event": "start", "mode": MODE, "time": time.time()})


def pytest_collectreport(report):
    if report.failed:
        _write({"event": "collect", "nodeid": report.nodeid, "outcome": "error", "message": _first_line(report)})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if TEST_TIMEOUT <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise SuiteTestTimeout(f"test ran past {TEST_TIMEOUT} s (D3S_SUITE_TEST_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def pytest_runtest_logreport(report):
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    _write({"event": "test", "nodeid": report.nodeid, "when": report.when, "outcome": outcome,
            "message": _first_line(report) if outcome != "passed" else "",
            "duration": round(report.duration, 3)})
