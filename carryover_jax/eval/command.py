"""The `carryover eval` subcommand: argparse wiring (kept out of cli.py) and the command body."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from carryover_jax import bounds as B
from carryover_jax.errors import CarryoverError
from carryover_jax.eval.paired import MIN_PROMPTS, MIN_TIMING_REPEATS, TIMING_REPEATS, check_resolvable
from carryover_jax.eval.settings import BOUNDS, check_settings
from carryover_jax.loading import load_target
from carryover_jax.numerics import Numerics
from carryover_jax.paths import name_or_path, user_path


def _dataset_arg(spec: str) -> str:
    """A --datasets value with its path made absolute: NAME (a built-in) | PATH.jsonl | LABEL=PATH."""
    label, sep, path = spec.partition("=")
    return f"{label}={user_path(path)}" if sep and path else name_or_path(spec)


def add_parser(sub, add_target_args) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval", help="τ, speedup and throughput of one target with several drafters on the same prompts",
        description="Evaluate drafters side by side: AR and every --drafter on the same prompts in one run "
                    "(τ per dataset and over the mix at each temperature, speedup over AR at batch 1, "
                    "throughput per batch size, T = 0 sequences checked against AR). Writes results.json, "
                    "report.md and PNG plots into --out.")
    add_target_args(p)
    p.add_argument("--drafter", action="append", metavar="LABEL=DIR[:carryover]",
                   help="an arm of the comparison, e.g. --drafter baseline=DIR --drafter control=DIR "
                        "--drafter carryover=DIR:carryover; only ':carryover' arms attend to carried rows")
    p.add_argument("--curve", default=None, metavar="RUN", type=user_path,
                   help="τ and speedup against training time: every drafter snapshot of the training run RUN "
                        "(train with snapshot_every) and its final drafter become arms; adds a table and curve.png")
    p.add_argument("--datasets", nargs="+", default=["humaneval", "mtbench", "sharegpt"], type=_dataset_arg,
                   metavar="NAME", help="humaneval | mtbench | sharegpt (held-out split) | PATH.jsonl | LABEL=PATH")
    p.add_argument("--prompts-per-dataset", type=B.arg(BOUNDS["prompts_per_dataset"]), default=8,
                   help="the first N prompts of each dataset that fit")
    p.add_argument("--max-prompt-tokens", type=B.arg(BOUNDS["max_prompt_tokens"]), default=512,
                   help="skip longer prompts (after the chat template)")
    p.add_argument("--system", default=None, help="a system prompt (default: none is added)")
    p.add_argument("--heldout-per-mille", type=B.arg(BOUNDS["heldout_per_mille"]), default=None,
                   help="ShareGPT held-out split (default: the training default, DataConfig.heldout_per_mille)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--max-new-tokens", type=B.arg(BOUNDS["max_new_tokens"]), default=128)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--seeds", type=B.arg(BOUNDS["seeds"]), default=3,
                   help="passes per temperature > 0 (for the confidence interval)")
    p.add_argument("--batch-sizes", type=B.arg(BOUNDS["batch_sizes"]), nargs="*", default=[1, 2, 4, 8],
                   help="throughput pass at T = 0 (none: skip it)")
    p.add_argument("--max-len", type=B.arg(BOUNDS["max_len"]), default=None,
                   help="KV cache length (default: fits each request)")
    p.add_argument("--timing-repeats", type=B.arg(BOUNDS["timing_repeats"]), default=TIMING_REPEATS,
                   help="time AR and every arm N times per prompt, interleaved (the tokens are the same); a speedup "
                        f"comparison is resolved only with >= {MIN_TIMING_REPEATS}")
    p.add_argument("--mask-token-id", type=B.arg(BOUNDS["mask_token_id"]), default=None,
                   help="the MASK row every drafter must use (default: the target's)")
    p.add_argument("--diagnostics", action="store_true",
                   help="also the ON/OFF replay (Carryover arms) and re-convergence of rejected branches, T = 0")
    p.add_argument("--diagnostic-prompts", type=B.arg(BOUNDS["diagnostic_prompts"]), default=4,
                   help="prompts per dataset for --diagnostics")
    p.add_argument("--offline", action="store_true",
                   help="no AR decoding: the decoding rounds of every arm on the target's own rollouts of the "
                        "prompts (recorded once, shared by every arm; T = 0 exact greedy round counts, T > 0 expected "
                        "rounds, or for ':carryover' arms a seeded replay of the engine's rounds); τ only (no speed)")
    p.add_argument("--rollouts", default=None, metavar="DIR",
                   help="--offline: rollout cache folder (rollouts.jsonl); recorded rollouts are reused, new "
                        "ones appended (default: none kept)")
    p.add_argument("--offline-batch", type=B.arg(BOUNDS["batch_size"]), default=8,
                   help="--offline: rollouts recorded and scored per batch")
    p.add_argument("--from-json", default=None, metavar="RESULTS", type=user_path,
                   help="re-render report.md and plots from a stored results.json (or its folder) into --out")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--out", required=True, type=user_path, help="output folder (written atomically)")
    p.set_defaults(func=main)
    return p


def _check_args(args):
    check_settings({"temperatures": args.temperatures}, ("temperatures",))


def main(args) -> int:
    # the eval engine (and the training code its diagnostics reuse) loads only when the command runs,
    # not for every `carryover` invocation (this module builds the CLI's parser)
    from carryover_jax.eval.curve import curve_rows, snapshot_arms
    from carryover_jax.eval.report import render_markdown
    from carryover_jax.eval.run import evaluate, load_result, parse_drafter_spec, write_outputs

    if args.from_json:
        out = write_outputs(load_result(args.from_json), args.out, plots=not args.no_plots)
        print(out / "report.md")
        return 0
    _check_args(args)
    entries = [parse_drafter_spec(s) for s in (args.drafter or []) + (snapshot_arms(args.curve) if args.curve else [])]
    entries = [dataclasses.replace(e, path=user_path(e.path)) for e in entries]  # paths absolute, once
    if not entries:
        raise CarryoverError("give at least one --drafter LABEL=DIR[:carryover] (or --curve RUN)")
    if args.offline and args.curve:
        raise CarryoverError("--offline with --curve: give the snapshots as --drafter arms (the pipeline's curve "
                             "stage does this)")
    # an A/B (two or more --drafter arms) that could not resolve anything is refused before the target loads;
    # `min_prompts` refuses it again when fewer of the prompts fit (--curve is a trend over snapshots, not an A/B)
    min_prompts = MIN_PROMPTS if len(args.drafter or []) >= 2 else None
    if min_prompts:
        check_resolvable(args.prompts_per_dataset * len(args.datasets),
                         f"{len(args.drafter)} arms on {args.prompts_per_dataset} prompts per dataset x "
                         f"{len(args.datasets)} dataset{'s' * (len(args.datasets) != 1)}")
    if args.offline:
        from carryover_jax.eval.offline import evaluate_offline
        from carryover_jax.eval.report import render_offline

        target = load_target(args.target, numerics=Numerics.from_args(args).resolve())
        result = evaluate_offline(
            target, entries, datasets=args.datasets, prompts_per_dataset=args.prompts_per_dataset,
            max_prompt_tokens=args.max_prompt_tokens, system=args.system, heldout_per_mille=args.heldout_per_mille,
            chat=not args.no_chat, max_new_tokens=args.max_new_tokens, temperatures=args.temperatures,
            seeds=args.seeds, max_len=args.max_len, mask_token_id=args.mask_token_id, dtype=args.dtype,
            rollouts=args.rollouts, batch_size=args.offline_batch, progress=not args.quiet,
            log=lambda msg: print(msg, file=sys.stderr), min_prompts=min_prompts)
        out = write_outputs(result, args.out)
        print(render_offline(result))
        print(f"eval: wrote {out}", file=sys.stderr)
        return 0
    target = load_target(args.target, numerics=Numerics.from_args(args).resolve())
    result = evaluate(
        target, entries, datasets=args.datasets, prompts_per_dataset=args.prompts_per_dataset,
        max_prompt_tokens=args.max_prompt_tokens, system=args.system, heldout_per_mille=args.heldout_per_mille,
        chat=not args.no_chat, max_new_tokens=args.max_new_tokens, temperatures=args.temperatures, seeds=args.seeds,
        batch_sizes=args.batch_sizes, max_len=args.max_len, mask_token_id=args.mask_token_id, dtype=args.dtype,
        diagnostics=args.diagnostics, diagnostic_prompts=args.diagnostic_prompts, progress=not args.quiet,
        log=lambda msg: print(msg, file=sys.stderr), timing_repeats=args.timing_repeats, min_prompts=min_prompts)
    if args.curve:
        result["curve"] = curve_rows(result, args.curve)
    out = write_outputs(result, args.out, plots=not args.no_plots)
    print(render_markdown(result))
    ck = result["summary"]["check"]
    if ck["mismatches"] or not ck.get("throughput_identical_to_ar", True):
        print(f"eval: WARNING: speculative output differs from AR at T = 0: {ck['mismatches'][:5]}", file=sys.stderr)
    print(f"eval: wrote {out}", file=sys.stderr)
    return 0
