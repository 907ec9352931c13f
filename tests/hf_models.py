"""Tiny random HF PyTorch models, saved to disk: the independent reference for target numerics."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import transformers

transformers.logging.set_verbosity_error()


@dataclasses.dataclass
class TinyModel:
    family: str
    path: Path
    hf: torch.nn.Module  # float32, eager attention, eval mode


def tiny_hf_config(family: str, **kw):
    common = dict(
        vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="eager",
    )
    if family == "llama":
        common.update(tie_word_embeddings=False,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64})
        common.update(kw)
        return transformers.LlamaConfig(**common)
    common.update(tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    common.update(kw)
    return transformers.Qwen3Config(**common)


def tiny_hf_model(family: str, path: Path, seed: int = 0, **kw) -> TinyModel:
    torch.manual_seed(seed)
    cfg = tiny_hf_config(family, **kw)
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.Qwen3ForCausalLM
    model = cls(cfg).float().eval()
    with torch.no_grad():  # norms start at 1; perturb them so a missing norm weight shows up
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return TinyModel(family, Path(path), model)


def hf_forward(model, ids):
    with torch.no_grad():
        out = model(torch.as_tensor(ids), output_hidden_states=True)
    return out.logits.numpy(), [h.numpy() for h in out.hidden_states]


def hf_greedy(model, ids: list[int], max_new_tokens: int, eos: list[int] | None = None) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.as_tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=eos, pad_token_id=0,
        )
    return out[0, len(ids):].tolist()


def add_word_tokenizer(folder) -> None:
    """A word-level tokenizer over the tiny vocabulary (`w5 w6 ...` are ids 5, 6, ...; `<empty_output>` is
    id 4, so a target's default MASK row is 4) with a plain chat template, saved into `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "<empty_output>": 4}
    vocab.update({f"w{i}": i for i in range(5, 97)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(folder)
