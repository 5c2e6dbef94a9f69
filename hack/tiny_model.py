"""Builds the tiny models the real vLLM engine serves in the tests, with nothing from a hub.

Runs in the engine's venv (hack/real-engine.sh), which has torch, transformers and tokenizers:
    python hack/tiny_model.py OUT_DIR
writes OUT_DIR/target (a 2-layer Llama with random weights and a byte-level BPE tokenizer
trained here on generated text), OUT_DIR/draft (the target's first layer, embeddings and
head: a 1-layer draft that shares the target's vocabulary) and OUT_DIR/eagle3 (an EAGLE-3 head
with random weights in the layout of published EAGLE-3 checkpoints, reading the hidden states
of both target layers), and OUT_DIR/pair/{target,draft}: a pair for which draft-model
speculation pays on a CPU (`pair_target_and_draft`; `bench/real_engine.py --pair` measures it).
Deterministic: fixed seeds, a corpus generated from a seeded generator.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 0
VOCAB_SIZE = 4096
HIDDEN = 128
HEADS = 4
KV_HEADS = 2
MAX_POSITIONS = 4096
PAIR_HIDDEN = 768
PAIR_LAYERS = 8
PAIR_HEAD_DIM = 64
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = (
    "the a of to and in is it for on with as was by at be this that from or have an are not "
    "def return class import self if else elif for while try except with yield lambda None True "
    "False print len range list dict str int float json request response token model engine "
    "draft accepted speculative decoding prompt class latency throughput kernel cache batch "
    "tool call schema function argument value name type object array string number boolean"
)


def corpus(lines: int) -> list[str]:
    """Seeded text mixing prose-like and code-like lines, so BPE learns both."""
    rng = random.Random(SEED)
    pool = WORDS.split()
    out = []
    for i in range(lines):
        words = rng.choices(pool, k=rng.randint(4, 16))
        if i % 3 == 0:
            out.append(f"def {words[0]}_{i}({', '.join(words[1:3])}):\n    return {words[3]}")
        elif i % 3 == 1:
            out.append(json.dumps({words[0]: words[1:4], "n": i}))
        else:
            out.append(" ".join(words).capitalize() + ".")
    return out


def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(20_000), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def llama_config(
    tok: PreTrainedTokenizerFast,
    layers: int,
    hidden: int = HIDDEN,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )


def save(model: torch.nn.Module, tok: PreTrainedTokenizerFast, out: Path) -> None:
    model.save_pretrained(out)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny_model: {out.name}: {params / 1e6:.2f} M parameters", file=sys.stderr)


def target_and_draft(tok: PreTrainedTokenizerFast, out: Path) -> None:
    torch.manual_seed(SEED)
    target = LlamaForCausalLM(llama_config(tok, layers=2)).eval()
    save(target, tok, out / "target")
    save(prefix_draft(target, llama_config(tok, layers=1)), tok, out / "draft")


def prefix_draft(target: LlamaForCausalLM, config: LlamaConfig) -> LlamaForCausalLM:
    """A 1-layer model (`config`) holding the target's first layer, embeddings, norm and head."""
    draft = LlamaForCausalLM(config).eval()
    weights = target.state_dict()
    draft.load_state_dict({name: weights[name] for name in draft.state_dict()})
    return draft


def pair_target_and_draft(
    tok: PreTrainedTokenizerFast, out: Path, hidden: int = PAIR_HIDDEN, layers: int = PAIR_LAYERS
) -> None:
    """out/target: a Llama wide and deep enough that its layers, not the framework, dominate a
    decode step on a CPU, whose layers after the first add nothing to the residual stream
    (o_proj and down_proj zero: they cost a full layer's weights and attention, and change no
    logit); out/draft: its 1-layer prefix (same embeddings, head and tokenizer). The target's
    logits are its draft's, so greedy drafts are all accepted (sampled ones hardly any: the
    logits are a random model's, nearly flat), and a draft step costs a fraction of a target
    step. 768 wide and 8 layers: 43 M parameters, 170 MB in float32."""
    torch.manual_seed(SEED)
    heads = hidden // PAIR_HEAD_DIM
    config = llama_config(tok, layers, hidden, heads=heads, kv_heads=max(1, heads // 4))
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    save(target, tok, out / "target")
    draft_config = llama_config(tok, 1, hidden, heads, max(1, heads // 4))
    save(prefix_draft(target, draft_config), tok, out / "draft")


def eagle3_head(tok: PreTrainedTokenizerFast, out: Path) -> None:
    """One decoder layer over [token embedding; fused hidden state] (2H wide), `fc` fusing the
    target's per-layer hidden states, its own norm and LM head; embeddings come from the
    target (vLLM shares them when the head has none)."""
    config = llama_config(tok, layers=1).to_dict()
    target_layers = [0, 1]
    config |= {
        "architectures": ["LlamaForCausalLMEagle3"],
        "tie_word_embeddings": False,
        "draft_vocab_size": len(tok),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": target_layers},
    }
    head_dim = HIDDEN // HEADS
    shapes = {
        "midlayer.input_layernorm.weight": None,
        "midlayer.hidden_norm.weight": None,
        "midlayer.post_attention_layernorm.weight": None,
        "norm.weight": None,
        "midlayer.self_attn.q_proj.weight": (HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": (KV_HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": (KV_HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
        "midlayer.mlp.gate_proj.weight": (2 * HIDDEN, HIDDEN),
        "midlayer.mlp.up_proj.weight": (2 * HIDDEN, HIDDEN),
        "midlayer.mlp.down_proj.weight": (HIDDEN, 2 * HIDDEN),
        "fc.weight": (HIDDEN, len(target_layers) * HIDDEN),
        "lm_head.weight": (len(tok), HIDDEN),
    }
    rng = torch.Generator().manual_seed(SEED)
    weights = {
        name: torch.ones(HIDDEN) if shape is None else 0.02 * torch.randn(shape, generator=rng)
        for name, shape in shapes.items()
    }
    out.mkdir()
    save_file(weights, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(out)
    params = sum(w.numel() for w in weights.values())
    print(f"tiny_model: {out.name}: {params / 1e6:.2f} M parameters", file=sys.stderr)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True)
    tok = tokenizer()
    target_and_draft(tok, out)
    eagle3_head(tok, out / "eagle3")
    pair_target_and_draft(tok, out / "pair")


if __name__ == "__main__":
    main()
