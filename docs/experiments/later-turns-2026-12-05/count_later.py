"""How many later user turns of the packaged ShareGPT's training conversations fit a prompt-token limit, as prepare
encodes them (SmolLM2's chat template over the conversation up to that turn, generation prompt added):
`python docs/experiments/later-turns-2026-12-05/count_later.py` (~3 min; output in count_later.txt)."""
import numpy as np
from transformers import AutoTokenizer

from carryover_jax.config import DataConfig
from carryover_jax.train.sources import conversations
from carryover_jax.weights.registry import cache_dir

tok = AutoTokenizer.from_pretrained(cache_dir() / "targets" / "smollm2")
lens = np.array([len(tok(tok.apply_chat_template(c.prompt, add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"])
                 for c in conversations(DataConfig(prompt_turns="later"))])
print(f"{len(lens)} later user turns in training conversations")
for limit in (192, 256, 320, 384, 512):
    print(f"<= {limit} prompt tokens: {int((lens <= limit).sum())}")
