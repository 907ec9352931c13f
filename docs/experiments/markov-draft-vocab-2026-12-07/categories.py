"""τ per MT-Bench category from an offline eval's results.json, computed as the report computes a dataset's τ: the
tokens the rounds generate (all but the prefill's first) over the rounds, summed over the category's rollouts (the
category is what follows the ':' of a prompt id, e.g. '81:writing').
Usage: python categories.py RESULTS.json[:NAME] ...   (NAME: a label for the column; default the file's stem)"""
import collections
import json
import sys
from pathlib import Path

columns = {}
for arg in sys.argv[1:]:
    path, _, name = arg.partition(":")
    sums = collections.defaultdict(lambda: [0, 0])
    for entry in json.loads(Path(path).read_text())["log"]:
        if entry["dataset"] == "mtbench":
            for key in (entry["prompt"].split(":", 1)[1], "all"):
                sums[key][0] += entry["new_tokens"] - 1
                sums[key][1] += entry["rounds"]
    columns[name or Path(path).stem] = {k: gen / rounds for k, (gen, rounds) in sums.items()}
names = list(columns)
print("| category | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for key in sorted(next(iter(columns.values())), key=lambda k: (k == "all", k)):
    print(f"| {key} | " + " | ".join(f"{columns[n].get(key, float('nan')):.3f}" for n in names) + " |")
