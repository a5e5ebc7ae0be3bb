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

    from d3s.app.models import tiny_llama, word_level_tokenizer

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tokenizer = word_level_tokenizer(VOCAB, unk_token="[UNK]", bos_token="<s>", eos_token="</s>",
                                     chat_template=CHAT_TEMPLATE)
    tokenizer.save_pretrained(path)

    hidden = 16  # >= vocab size: one-hot embeddings
    model = tiny_llama(tokenizer, hidden, 1, intermediate_size=8, num_attention_heads=2, max_position_embeddings=256)
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
