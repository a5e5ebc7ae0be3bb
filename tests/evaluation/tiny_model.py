"""A tiny Llama with a known output distribution, built in code (no downloads).

Every layer's output projection is zero, so the residual stream at a position is the one-hot
embedding of its token and the model is an exact bigram table (`NEXT`): after the chat template's
`<assistant>` token it writes `\\boxed{`, then `7` or `3` with equal probability, then `}` and
`</s>`. Greedy decoding (ties go to the lower token id) always answers `\\boxed{ 7 }`.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = ["<pad>", "<s>", "</s>", "[UNK]", "<assistant>", "\\boxed{", "7", "3", "}"]
NEXT = {
    "<assistant>": ["\\boxed{"],
    "\\boxed{": ["7", "3"],  # 50 / 50 under sampling at temperature 1
    "7": ["}"],
    "3": ["}"],
    "}": ["</s>"],
}
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}<assistant>"


def build_tiny_model(path: Path, scale: float = 30.0) -> Path:
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)

    hidden = 16  # >= vocab size: one-hot embeddings
    config = LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=hidden,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        emb = torch.zeros(len(VOCAB), hidden)  # (V, H)
        emb[:, : len(VOCAB)] = torch.eye(len(VOCAB))
        model.model.embed_tokens.weight.copy_(emb)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        # RMSNorm turns a one-hot row into sqrt(H) * one-hot.
        head = torch.zeros(len(VOCAB), hidden)  # (V, H)
        for tok, nexts in NEXT.items():
            for nxt in nexts:
                head[vocab[nxt], vocab[tok]] = scale / hidden**0.5
        for tok in VOCAB:  # anything else ends the completion
            if tok not in NEXT:
                head[vocab["</s>"], vocab[tok]] = scale / hidden**0.5
        model.lm_head.weight.copy_(head)
    model.generation_config.eos_token_id = vocab["</s>"]
    model.generation_config.pad_token_id = vocab["<pad>"]
    model.save_pretrained(path)
    return path
