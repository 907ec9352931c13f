"""τ per MT-Bench category of each arm in a `carryover eval --offline` results file (T = 0; ten prompts a category,
so a picture of where the rounds go, not a test): python categories.py RESULTS.json"""
import json
import sys
from collections import defaultdict

log = [e for e in json.load(open(sys.argv[1]))["log"] if e["dataset"] == "mtbench" and e["temperature"] == 0]
arms = list(dict.fromkeys(e["mode"] for e in log))  # the eval's drafter order
sums = defaultdict(lambda: [0, 0])
for e in log:
    s = sums[e["mode"], e["prompt"].split(":")[1]]
    s[0] += e["new_tokens"] - 1
    s[1] += e["rounds"]
cats = sorted({c for _, c in sums}, key=lambda c: -sums[arms[0], c][0] / sums[arms[0], c][1])
print("| category | " + " | ".join(arms) + " |")
print("|---|" + "---|" * len(arms))
for c in cats:
    print(f"| {c} | " + " | ".join(f"{sums[a, c][0] / sums[a, c][1]:.3f}" for a in arms) + " |")
