"""DVD's draft-1 acceptance on a recording sampled at T > 0, against real speculative sampling with the same
drafter on the same prefixes (the setup of tests/test_dvd_sampled.py): the coupled rule (`dvd.coupled_proposals`,
the default) and the greedy rule (draft 1 greedy, accepted iff it equals the recorded token).

    .venv/bin/python -m tests.dvd_sampled_rule
"""

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import chi2_contingency

from carryover_jax.config import LossConfig, TrainConfig
from carryover_jax.models.drafter import frozen_from_target
from carryover_jax.models.target import TargetLM
from carryover_jax.train import anchors as A
from carryover_jax.train import dvd
from carryover_jax.train.step import step_config
from tests import test_dvd_sampled as t


def greedy_accepts(tp, dc, params, ids):
    sc = step_config(TrainConfig(loss=LossConfig(mode="dvd", dvd_temperature=0.0), num_anchors=1), t.TCFG, dc)
    n, s = ids.shape
    taps, _ = TargetLM(t.TCFG).apply({"params": tp}, ids, t.LAYERS, method=TargetLM.features)
    lm = jnp.zeros((n, s), jnp.int32).at[:, len(t.PROMPT):].set(1)
    blk = A.build_blocks(dc, ids, lm, jnp.full((n, 1), len(t.PROMPT), jnp.int32), jnp.ones((n, 1), bool),
                         jnp.ones((n,), jnp.int32))
    props = dvd.draft_proposals(sc, params, frozen_from_target(tp, t.TCFG), jnp.concatenate(taps, -1), blk)
    return np.asarray(dvd.accept_counts(props, blk)[:, 0])


def main():
    print(f"T = {t.T}, {t.P} proposals, {t.N} prefixes per row (prompt + a sampled t0)\n")
    print("| drafter | rule | accepted 0..P (counts) | tau | chi-square p vs speculative sampling |")
    print("|---|---|---|---|---|")
    for kind in ("dflash", "markov"):
        tp, dc, params = t._models(kind)
        ids = t._recordings(tp, jax.random.key(3), t.N)
        ref = t._engine_accepts(tp, dc, params, t.N)
        rows = {"speculative sampling (engine)": ref,
                "coupled (default)": np.asarray(t._dvd_accepts(tp, dc, params, ids)),
                "greedy": greedy_accepts(tp, dc, params, ids)}
        h_ref = np.bincount(ref, minlength=t.P + 1)
        for name, a in rows.items():
            h = np.bincount(a, minlength=t.P + 1)
            pv = "-" if a is ref else f"{chi2_contingency(np.stack([h, h_ref])).pvalue:.3g}"
            print(f"| {kind} | {name} | {h.tolist()} | {1 + a.mean():.3f} | {pv} |")


if __name__ == "__main__":
    main()
