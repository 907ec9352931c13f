"""How many recorded rollouts of `carryover eval --offline` are a stored reply of the response store, token for token
(the reply's last token may carry no loss), run from the repository root after the commands of README.md. The 290
training prompts' rollouts are stored replies when eval and prepare share one numerics."""
import json

from carryover_jax.train.store import ResponseStore

store = ResponseStore.open("runs/levers/data")
replies = []
for i in range(290):  # the store's first 290 records: the eval's training prompts
    r = store.get(i, features=False)
    replies.append([int(t) for t, m in zip(r["input_ids"], r["loss_mask"]) if m])
rollouts = [json.loads(line)["tokens"] for line in open("runs/levers/rollouts/rollouts.jsonl")]


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


stored = [len(t) for t in rollouts if max(common_prefix(t, rep) for rep in replies) >= len(t) - 1]
print(f"{len(stored)} of {len(rollouts)} rollouts equal a stored reply of the first 290 records, "
      f"{sum(n >= 16 for n in stored)} of them 16 tokens or longer")
