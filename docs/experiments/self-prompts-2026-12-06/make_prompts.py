"""Prompts the target writes itself (the Magpie recipe): the chat template up to an open user turn, sampled until
the turn ends, so each sample is a user request in the target's own idea of what users ask. Usage (repo root):
`python docs/experiments/self-prompts-2026-12-06/make_prompts.py OUT.jsonl N [BATCH=64] [SEED=0]` writes the first
N distinct requests as `{"id": "self-<k>", "prompt": text}` lines, `data.source=OUT.jsonl` for `carryover prepare`.

Kept: a sample the target ended itself (its stop token within 96 new tokens, so no request is cut), 3 to 400
characters once stripped, not a repeat of an earlier one (compared lower-cased, whitespace collapsed). bf16
numerics, temperature 1, top-p 0.95; batch b draws with seed SEED + b, so a run is reproducible on one host. The file
is written to a temporary name and renamed once complete, and a rerun with the same arguments resumes nothing:
it regenerates (8,192 prompts took 50 min on 2 cores of an AMD EPYC)."""
import json
import os
import sys
import time

from tqdm import tqdm

from carryover_jax.decode.generate import generate
from carryover_jax.loading import load_target

out, n = sys.argv[1], int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 64
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
MAX_NEW, TEMPERATURE, TOP_P, MAX_CHARS = 96, 1.0, 0.95, 400

target = load_target("smollm2", dtype="bfloat16")
tok = target.tokenizer
sentinel = "\u0000USER\u0000"
text = tok.apply_chat_template([{"role": "user", "content": sentinel}], add_generation_prompt=False, tokenize=False)
prefix = tok(text[: text.index(sentinel)], add_special_tokens=False)["input_ids"]
stops = list(target.stop_token_ids)

seen, kept, drawn, t0 = set(), [], 0, time.time()
bar = tqdm(total=n, desc="self prompts", unit="prompt")
b = 0
while len(kept) < n:
    gens = generate(target, [prefix] * batch, max_new_tokens=MAX_NEW, temperature=TEMPERATURE, top_p=TOP_P,
                    seed=seed + b, chat=False, stop_token_ids=stops)
    b += 1
    for g in gens:
        drawn += 1
        if g.stop_reason != "stop_token":
            continue
        prompt = tok.decode(g.token_ids[:-1], skip_special_tokens=True).strip()
        key = " ".join(prompt.lower().split())
        if not 3 <= len(prompt) <= MAX_CHARS or key in seen:
            continue
        seen.add(key)
        kept.append(prompt)
        bar.update()
        if len(kept) == n:
            break
    bar.set_postfix(drawn=drawn, batches=b)
bar.close()
tmp = out + ".tmp"
with open(tmp, "w") as f:
    for k, p in enumerate(kept):
        f.write(json.dumps({"id": f"self-{k + 1}", "prompt": p}) + "\n")
os.replace(tmp, out)
print(f"{n} prompts from {drawn} samples in {b} batches of {batch} ({time.time() - t0:.0f} s) -> {out}")
