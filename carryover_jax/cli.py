"""carryover: train and run speculative-decoding drafters with Carryover Drafting (JAX/Flax)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from carryover_jax import bounds as B
from carryover_jax.numerics import ATTENTION_BACKENDS
from carryover_jax.errors import CarryoverError, ConfigError, RequestError
from carryover_jax.paths import name_or_path, user_path

# Each command imports its modules inside its function, so that `carryover --help` and a refused
# argument load none of the training stack (orbax, grain, tensorstore), transformers, torch or matplotlib.
# Every path option is made absolute by its argparse type (`user_path`; `name_or_path` where an alias or
# a config name is also accepted), every numeric option is range-checked by its type (`bounds.arg`).
SIZE, COUNT0, SEED = B.arg(B.size()), B.arg(B.count(0)), B.arg(B.SEED)


def _add_target_args(p: argparse.ArgumentParser):
    p.add_argument("--target", default="smollm2", type=name_or_path,
                   help="alias (smollm2), HF checkpoint folder, or .gguf file (default: smollm2)")
    _add_numerics_args(p)


# the numerics flags (carryover_jax/numerics.py): one group on every command that runs a model; unset =
# the platform's default. prepare/train map them onto the config's `numerics.*` (like --set numerics.X=...)
_NUMERICS_FLAGS = (("dtype", "compute dtype; target params and KV caches follow it unless set"),
                   ("param_dtype", "target param dtype (a checkpoint of any float dtype is cast to it)"),
                   ("drafter_param_dtype", "drafter param dtype (default float32: training's master copy)"),
                   ("drafter_dtype", "drafter compute and context-cache dtype (default: --dtype's); the output stays "
                    "the target's, whatever the drafter computes in"),
                   ("cache_dtype", "KV cache dtype (target and drafter context caches)"),
                   ("attention_backend", "attention kernels (models/layers.py attention_core)"),
                   ("lm_head", "tied LM head form: vocab_major (the CPU default) or plain"),
                   ("decode_products", "float32 / bf16 products of 1-8 rows, float32 ones of up to 64 (a tied head 24; "
                    "bf16 too with avx512_bf16 and no AMX), on CPU: stream (the CPU default: a kernel built with the "
                    "system C++ compiler) or xla"))


def _add_numerics_args(p: argparse.ArgumentParser):
    from carryover_jax.numerics import DECODE_PRODUCTS, DTYPES, LM_HEADS

    g = p.add_argument_group("numerics", "dtypes and kernels of this run; default: the platform's (bfloat16 "
                             "and attention auto on GPU/TPU, float32 and attention cpu on CPU)")
    for name, text in _NUMERICS_FLAGS:
        choices = {"attention_backend": ATTENTION_BACKENDS, "lm_head": LM_HEADS,
                   "decode_products": DECODE_PRODUCTS}.get(name, DTYPES)
        g.add_argument("--" + name.replace("_", "-"), dest=name, default=None, choices=choices, help=text)


def _numerics(args):
    """The numerics flags given -> a `Numerics` spec (unset fields stay None: the platform's default)."""
    from carryover_jax.numerics import Numerics

    return Numerics.from_args(args)


def _run_numerics(args):
    """The flags resolved for this process's platform."""
    return _numerics(args).resolve()


def _cmd_generate(args) -> int:
    from carryover_jax.decode.generate import check_sampling, generate
    from carryover_jax.loading import load_target

    check_sampling(top_k=args.top_k, top_p=args.top_p, temperature=args.temperature,
                   max_new_tokens=args.max_new_tokens, max_len=args.max_len)  # before loading anything
    prompts = list(args.prompt or [])
    if args.prompts_file:
        from carryover_jax.train.sources import iter_jsonl

        for conv in iter_jsonl(args.prompts_file):  # {"prompt": ...} or {"messages": [...]} per line
            first_user = next(i for i, m in enumerate(conv.messages) if m["role"] == "user")
            msgs = conv.messages[: first_user + 1]
            prompts.append(msgs[0]["content"] if args.no_chat and len(msgs) == 1 else msgs)
    if not prompts:
        raise CarryoverError(f"no prompts in {args.prompts_file}" if args.prompts_file
                             else "give at least one --prompt or a --prompts-file")
    target = load_target(args.target, numerics=_run_numerics(args))
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
              top_p=args.top_p, seed=args.seed, chat=not args.no_chat, max_len=args.max_len)
    if args.drafter:
        from carryover_jax.decode.generate import speculative_generate
        from carryover_jax.loading import load_drafter

        # a drafter released without e_rej gets a zero one: Carryover's initialisation
        drafter = load_drafter(args.drafter, target=target, carryover=not args.no_carryover)
        results, run_stats = speculative_generate(target, drafter, prompts, carryover=not args.no_carryover,
                                                  stepwise=args.stepwise, greedy_drafts=args.greedy_drafts, **kw)
        print(f"[speculative: tau {run_stats['tau']}, {run_stats['rounds']} rounds, "
              f"{run_stats['tokens_per_s']} tok/s, carryover {'on' if not args.no_carryover else 'off'}]",
              file=sys.stderr)
    else:
        results = generate(target, prompts, **kw)
    for r in results:
        if args.json:
            print(json.dumps(r.to_json(), ensure_ascii=False))
        else:
            print(r.text)
            s = r.stats
            tau = f", tau {s['tau']}" if "tau" in s else ""
            print(f"[{s['new_tokens']} tokens, {s['time_s']:.2f} s, {s['tokens_per_s']:.1f} tok/s{tau}, "
                  f"stop: {r.stop_reason}]", file=sys.stderr)
    return 0


def _cmd_convert(args) -> int:
    from carryover_jax.weights.registry import resolve_target

    print(resolve_target(args.target))
    return 0


def _cmd_init_drafter(args) -> int:
    from carryover_jax.loading import init_drafter, load_target
    from carryover_jax.weights.drafter_formats import save_drafter

    target = load_target(args.target)
    try:
        ids = tuple(int(x) for x in args.layer_ids.split(",")) if args.layer_ids else None
    except ValueError:
        raise CarryoverError(f"--layer-ids must be comma-separated integers, got {args.layer_ids!r}") from None
    d = init_drafter(target, kind=args.kind, layout=args.layout, num_proposals=args.proposals,
                     num_layers=args.layers, target_layer_ids=ids, mask_token_id=args.mask_token_id,
                     carryover=not args.no_carryover, seed=args.seed)
    print(save_drafter(d.cfg, d.params, args.out))
    return 0


def _cmd_export(args) -> int:
    from carryover_jax.loading import load_drafter, load_target
    from carryover_jax.models.drafter import frozen_from_target
    from carryover_jax.weights.drafter_formats import DEEPSPEC_DEFAULT_ANCHORS, export_drafter, recorded_num_anchors

    frozen = None
    target = None
    anchors = None
    if args.format == "deepspec":
        target = load_target(args.target, tokenizer=False)
        frozen = frozen_from_target(target.params, target.cfg)
        found = recorded_num_anchors(args.drafter)
        anchors = found[0] if found else None
        print(f"export: num_anchors {found[0]} (from {found[1]})" if found else
              f"export: num_anchors {DEEPSPEC_DEFAULT_ANCHORS} is DeepSpec's default: this drafter's training anchors "
              "are not recorded (no train_config.json beside it)", file=sys.stderr)
    d = load_drafter(args.drafter, target=target)
    print(export_drafter(d.cfg, d.params, args.out, args.format, frozen=frozen,
                         dtype=None if args.dtype == "keep" else args.dtype, num_anchors=anchors,
                         card={"source": str(args.drafter), "target": str(args.target) if target else None}))
    return 0


def _train_config(args):
    from carryover_jax.config import apply_overrides
    from carryover_jax.configs import load_config

    cfg = apply_overrides(load_config(args.config), args.set or [])
    flags = {k: v for k, v in vars(_numerics(args)).items() if v is not None}
    if not flags:
        return cfg
    # a flag wins over the config, including its compute_dtype / attention_backend shorthands
    return cfg.replace(numerics=cfg.numerics.replace(**flags),
                       compute_dtype=None if "dtype" in flags else cfg.compute_dtype,
                       attention_backend=None if "attention_backend" in flags else cfg.attention_backend)


def _cmd_prepare(args) -> int:
    from carryover_jax.loading import load_target
    from carryover_jax.train.responses import prepare_responses

    if args.shard >= args.num_shards:  # before loading anything
        raise ConfigError(f"--shard {args.shard} is outside [0, {args.num_shards}) (--num-shards {args.num_shards})")
    cfg = _train_config(args)
    numerics = cfg.run_numerics(prepare=True)
    print(f"prepare: numerics: {numerics.describe()}", file=sys.stderr)
    target = load_target(cfg.target, numerics=numerics)
    store = prepare_responses(cfg.data, target, progress=not args.quiet, shard=args.shard,
                              num_shards=args.num_shards)
    print(json.dumps({"store": str(cfg.data.store), "written": str(store.path), "records": len(store),
                      "tokens": store.num_tokens}))
    return 0


def _cmd_pipeline(args) -> int:
    from carryover_jax.pipeline import run_pipeline

    out = user_path(args.out or f"runs/pipeline-{Path(args.config.partition(':')[0]).stem}-{args.preset}")
    res = run_pipeline(args.config, out, preset=args.preset, overrides=args.set or [],
                       continue_overrides=args.continue_set or [], eval_overrides=_eval_sets(args.eval_set or []),
                       progress=not args.quiet, budget_s=args.budget_s, dry_run=args.dry_run, starts=args.starts)
    if args.dry_run:
        print(json.dumps(res["plan"]))
        return 0
    print(Path(out) / "report.md" if "report" in res else out)
    return 0


def _eval_sets(items: list[str]) -> dict:
    """`--eval-set key=value` -> {key: value}, values as Python literals where they parse (lists included)."""
    import ast

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--eval-set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def _cmd_train(args) -> int:
    from carryover_jax.train.loop import train

    summary = train(_train_config(args), progress=not args.quiet)
    print(json.dumps(summary))
    return 0


def _cmd_plot(args) -> int:
    from carryover_jax.train.plots import plot_metrics

    print(plot_metrics(args.run, args.out))
    return 0


def _write_result(result: dict, out: str | None):
    if out:
        from carryover_jax.io import atomic_write_json

        atomic_write_json(out, result)


def _cmd_bench(args) -> int:
    from carryover_jax.loading import load_target

    if args.what == "ar":
        from carryover_jax.bench import ar

        target = load_target(args.target, numerics=_run_numerics(args))
        result = ar.run(target, batch_sizes=tuple(args.batch_sizes), max_new_tokens=args.max_new_tokens,
                        repeats=args.repeats or 1)
        print(ar.format_table(result))
        _write_result(result, args.out)
        return 0
    if args.what == "decode":
        from carryover_jax.bench import decode
        from carryover_jax.loading import init_drafter, load_drafter

        if args.profile and not args.breakdown:
            raise RequestError("--profile splits the --breakdown steps' time: add --breakdown")

        target = load_target(args.target, numerics=_run_numerics(args))
        if args.drafter:
            drafter = load_drafter(args.drafter, target=target, carryover=True)
        else:
            print("bench decode: no --drafter given; using an untrained random drafter (tau ~ 1): the numbers "
                  "then measure engine overheads, not speedups", file=sys.stderr)
            shape = {"num_proposals": args.proposals, "num_layers": args.draft_layers} if args.breakdown else {}
            if args.draft_vocab:  # timing only: which K ids does not matter
                shape["draft_vocab"] = tuple(range(args.draft_vocab))
            drafter = init_drafter(target, kind="dflash", layout="zlab", **shape)
        if args.torch:  # the PyTorch loop beside transformers AR, z-lab's loop and the JAX engine
            from carryover_jax.bench import torch_decode

            result = torch_decode.run(target, drafter, num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                                      zlab=args.zlab, repeats=args.repeats or 1)
            print(torch_decode.format_table(result))
            _write_result(result, args.out)
            return 0
        if args.breakdown:
            result = decode.breakdown(target, drafter, max_lens=tuple(args.max_lens),
                                      repeats=args.repeats or 25, batch=args.batch, profile=args.profile)
            print(decode.format_breakdown(result))
            _write_result(result, args.out)
            return 0
        result = decode.run(target, drafter, num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                            batch_sizes=tuple(args.batch_sizes))
        print(decode.format_table(result))
        _write_result(result, args.out)
        return 0
    if args.what == "steps":
        from carryover_jax.bench import steps as bench_steps
        from carryover_jax.config import preset

        spec = _numerics(args)  # this platform's numerics, bf16 unless --dtype / --param-dtype say otherwise
        if spec.dtype is None and spec.param_dtype is None:
            spec = spec.replace(dtype="bfloat16")
        tcfg = preset(args.preset).with_numerics(spec.resolve())
        if args.layers:
            tcfg = tcfg.replace(num_layers=args.layers)
        result = bench_steps.run(tcfg, kind=args.kind, layout=args.layout,
                                 proposals=args.proposals, draft_layers=args.draft_layers, batch=args.batch,
                                 context=args.context, train_batch=args.train_batch, train_len=args.train_len,
                                 anchors=args.anchors, backends=tuple(args.backend or ["einsum"]))
        print(bench_steps.format_table(result))
        _write_result(result, args.out)
        return 0
    if args.what == "train":
        from carryover_jax.bench import train as bench_train
        from carryover_jax.config import DrafterConfig, apply_overrides, preset
        from carryover_jax.configs import load_config

        if args.memory:  # compiled per-device memory of the paper configs' stages, per attention backend
            sets = list(args.set or [])
            if args.mesh:  # the configs' own mesh unless given
                try:
                    mesh = {k: int(v) for k, v in (kv.split("=") for kv in args.mesh.split(","))}
                except ValueError:
                    raise CarryoverError(f"--mesh must be AXIS=SIZE[,AXIS=SIZE...] with axes data, fsdp, tensor, "
                                         f"got {args.mesh!r}") from None
                if not mesh or set(mesh) - {"data", "fsdp", "tensor"}:
                    raise CarryoverError(f"--mesh must be AXIS=SIZE[,AXIS=SIZE...] with axes data, fsdp, tensor, "
                                         f"got {args.mesh!r}")
                sets = [f"mesh.{k}={mesh.get(k, 1)}" for k in ("data", "fsdp", "tensor")] + sets
            entries = bench_train.stage_entries(args.memory_configs.split(","), args.stages, sets)
            pool = bench_train.tpu_topology_devices(args.tpu_topology) if args.tpu_topology else None
            devices = args.devices or (len(pool) if pool else 8)
            rows = []
            for row in bench_train.memory_rows(entries, devices=devices, backends=tuple(args.backend or ["auto"]),
                                               device_list=pool, platform="tpu" if pool else "cuda"):
                rows.append(row)
                if args.json:
                    print(bench_train.memory_json(row), flush=True)
            result = {"benchmark": "train-memory", "devices": devices, "rows": rows}
            if not args.json:
                print(bench_train.format_memory(result))
            _write_result(result, args.out)
            return 0
        cfg = apply_overrides(load_config(args.config), args.set or [])
        dvd = args.mode == "dvd"
        result = (bench_train.run_dvd if dvd else bench_train.run)(cfg, steps=args.steps)
        paper = load_config("qwen3_4b")
        q = preset("qwen3-4b")
        dcfg = DrafterConfig.for_target(q, paper.drafter)
        result["qwen3_4b_memory_per_device"] = bench_train.memory_estimate(paper, q, dcfg, devices=args.devices or 64,
                                                                           dvd=dvd)
        for r in result["rows"]:
            if dvd:
                print(f"{r['step']:28s} {r['ms']:8.1f} ms  {r['x_baseline_stored']:.2f}x baseline (stored)  "
                      f"{r['x_baseline_online']:.2f}x baseline (online)  {r['x_control']:.2f}x control")
                continue
            print(f"features={r['features']:6s}  {r['steps_per_s']:.3f} steps/s  {r['tokens_per_s']:.0f} tokens/s"
                  + (f"  ({r['speedup_vs_online']}x online)" if "speedup_vs_online" in r else ""))
        print("qwen3_4b memory per device (GB):", json.dumps(result["qwen3_4b_memory_per_device"]))
        _write_result(result, args.out)
        return 0
    if args.what == "roofline":
        from carryover_jax.bench import roofline

        cfg = _train_config(args)  # --config / --set / the numerics flags: drafter, training and prepare shapes
        target = load_target(args.target, numerics=cfg.run_numerics())
        result = roofline.run(cfg, target, rows=args.rows or roofline.ROWS, matmul_rows=tuple(args.matmul_rows),
                              repeats=args.repeats or 5, new_tokens=args.max_new_tokens,
                              stream_bytes=args.stream_mb << 20)
        table = roofline.format_table(result)
        print(json.dumps(result) if args.json else table)
        if args.json:
            print(table, file=sys.stderr)
        _write_result(result, args.out)
        return 0
    raise CarryoverError(f"unknown benchmark {args.what!r}")


_MEMORY_STAGES = ("baseline", "dvd", "control")  # bench.train.MEMORY_STAGES (parsing imports no jax)
_ROOFLINE_ROWS = ("ar", "gen16", "gen64", "gen128", "features", "baseline", "dvd", "control", "verify3", "verify7",
                  "verify15")  # bench.roofline.ROWS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="carryover", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text: autoregressive, or speculative with --drafter")
    _add_target_args(g)
    g.add_argument("--prompt", action="append", help="a user prompt (repeat for a batch)")
    g.add_argument("--prompts-file", type=user_path, help='JSONL with {"prompt": ...} or {"messages": [...]} per line')
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=SEED, default=0)
    g.add_argument("--max-len", type=int, default=None, help="KV cache length (default: fits the request)")
    g.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    g.add_argument("--drafter", type=user_path,
                   help="drafter folder (native, z-lab or DeepSpec format): speculative decoding")
    g.add_argument("--no-carryover", action="store_true", help="plain drafter: do not carry rejected states")
    g.add_argument("--greedy-drafts", action="store_true",
                   help="draft by argmax at any temperature (z-lab's reference loop); still lossless")
    g.add_argument("--stepwise", action="store_true",
                   help="host-driven rounds (reports draft/verify time split) instead of one while_loop")
    g.set_defaults(func=_cmd_generate)

    i = sub.add_parser("init-drafter", help="write a randomly initialised drafter for a target (native format)")
    i.add_argument("--target", default="smollm2", type=name_or_path)
    i.add_argument("--kind", choices=["dflash", "markov"], default="dflash")
    i.add_argument("--layout", choices=["zlab", "deepspec"], default="zlab")
    i.add_argument("--proposals", type=SIZE, default=15, help="draft tokens per round (paper: 15)")
    i.add_argument("--layers", type=SIZE, default=5)
    i.add_argument("--layer-ids", help="comma-separated target layer ids (default: z-lab spacing)")
    i.add_argument("--mask-token-id", type=COUNT0, default=None)
    i.add_argument("--no-carryover", action="store_true")
    i.add_argument("--seed", type=SEED, default=0)
    i.add_argument("--out", required=True, type=user_path)
    i.set_defaults(func=_cmd_init_drafter)

    e = sub.add_parser("export", help="write a drafter as a PyTorch checkpoint (z-lab DFlash or DeepSpec format)")
    e.add_argument("--drafter", required=True, type=user_path, help="drafter folder (native, z-lab or DeepSpec)")
    e.add_argument("--format", choices=["zlab", "deepspec"], required=True)
    e.add_argument("--target", default="smollm2", type=name_or_path,
                   help="target whose embed/lm_head the DeepSpec format stores")
    e.add_argument("--dtype", choices=["bfloat16", "float32", "keep"], default="bfloat16")
    e.add_argument("--out", required=True, type=user_path)
    e.set_defaults(func=_cmd_export)

    c = sub.add_parser("convert", help="convert a GGUF target (or alias) to an HF folder in the cache; print it")
    c.add_argument("--target", default="smollm2", type=name_or_path)
    c.set_defaults(func=_cmd_convert)

    for name, fn, text in (("prepare", _cmd_prepare, "regenerate training responses with the target (resumable)"),
                           ("train", _cmd_train, "train a drafter (resumes from the run's last checkpoint)")):
        t = sub.add_parser(name, help=text)
        t.add_argument("--config", default="smollm2", type=name_or_path,
                       help="tiny | smollm2 | qwen3_4b | path/to/config.py")
        t.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config field, e.g. --set steps=100 --set data.max_len=512")
        t.add_argument("--quiet", action="store_true", help="no progress bar")
        _add_numerics_args(t)  # = --set numerics.<field>=...
        if name == "prepare":
            # independent processes (no collective): shard I writes <data.store>/shard-IIIII-of-NNNNN/, and
            # training reads all N as one store
            t.add_argument("--shard", type=COUNT0, default=0, metavar="I",
                           help="this process's shard of the prompts, 0 .. N-1 (default 0)")
            t.add_argument("--num-shards", type=SIZE, default=1, metavar="N",
                           help="processes preparing the store together, e.g. one per host or GPU (default 1)")
        t.set_defaults(func=fn)

    pp = sub.add_parser("pipeline", help="the main job in one resumable run: prepare -> baseline -> its curve -> "
                        "DVD and its equal-steps and equal-compute controls -> eval -> report (Markdown + JSON + "
                        "PNG) in --out")
    pp.add_argument("--config", default="smollm2", type=name_or_path, help="tiny | smollm2 | qwen3_4b | path/to/config.py")
    pp.add_argument("--preset", choices=["quick", "full", "gpu"], default="quick",
                    help="quick: a complete small report (~15 min on 2 CPU cores); full: the Carryover A/B "
                         "(launch/carryover_ab.sh: snapshots, DVD and both controls from each, offline scores); gpu: "
                         "stages sized to a wall budget from rates measured first (with --config smollm2_gpu)")
    pp.add_argument("--out", default=None, type=user_path, help="output folder (default: runs/pipeline-<config>-<preset>)")
    pp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field of every training stage")
    pp.add_argument("--continue-set", action="append", metavar="KEY=VALUE",
                    help="override a field of the control and DVD continuations only, e.g. --continue-set steps=50 "
                         "(the equal-compute control's steps follow from DVD's)")
    pp.add_argument("--eval-set", action="append", metavar="KEY=VALUE",
                    help="override an eval setting of the preset, e.g. --eval-set prompts_per_dataset=4")
    pp.add_argument("--starts", nargs="+", type=SIZE, default=None, metavar="STEP",
                    help="the full preset (the Carryover A/B): baseline steps to continue DVD and its controls from "
                         "(the final step or multiples of snapshot_every; default 1200 300 600)")
    pp.add_argument("--budget-s", type=B.arg(B.positive(86400.0)), default=None,
                    help="the wall budget of a budgeted preset (gpu: 420 s)")
    pp.add_argument("--dry-run", action="store_true",
                    help="a budgeted preset: measure this device, print the stage plan (JSON; the table on stderr), "
                         "run nothing")
    pp.add_argument("--quiet", action="store_true", help="no progress bars")
    pp.set_defaults(func=_cmd_pipeline)

    pl = sub.add_parser("plot", help="PNG of a run's metrics (loss, estimated tau, per-slot accept rate)")
    pl.add_argument("--run", required=True, type=user_path, help="training output folder (holds metrics.jsonl)")
    pl.add_argument("--out", default=None, type=user_path)
    pl.set_defaults(func=_cmd_plot)

    b = sub.add_parser("bench", help="benchmarks that print ratios measured side by side in one run")
    b.add_argument("what", choices=["ar", "decode", "train", "steps", "roofline"])
    b.add_argument("--preset", default="qwen3-4b", help="bench steps: target shape preset (random weights)")
    b.add_argument("--layers", type=SIZE, default=None, help="bench steps: cut the target to N layers (CPU)")
    b.add_argument("--kind", choices=["dflash", "markov"], default="dflash")
    b.add_argument("--layout", choices=["zlab", "deepspec"], default="zlab")
    b.add_argument("--proposals", type=SIZE, default=15)
    b.add_argument("--draft-layers", type=SIZE, default=5)
    b.add_argument("--batch", type=SIZE, default=1, help="bench steps, bench decode --breakdown: sequences per step")
    b.add_argument("--context", type=SIZE, default=512)
    b.add_argument("--train-batch", type=SIZE, default=1)
    b.add_argument("--train-len", type=B.arg(B.size(2)), default=1024)
    b.add_argument("--anchors", type=SIZE, default=64)
    b.add_argument("--config", default="smollm2", type=name_or_path,
                   help="bench train, bench roofline: config name or path (roofline: the drafter, training and "
                        "prepare shapes; the target is --target)")
    b.add_argument("--set", action="append", metavar="KEY=VALUE", help="bench train, bench roofline: config overrides")
    b.add_argument("--steps", type=SIZE, default=6, help="bench train: timed steps per mode")
    b.add_argument("--mode", choices=["features", "dvd"], default="features",
                   help="bench train: online vs stored features, or DVD/control/EDR steps vs baseline steps on one batch")
    b.add_argument("--devices", type=SIZE, default=None, help="bench train: devices for the Qwen3-4B memory estimate "
                   "(default 64); with --memory, the devices compiled for (default 8: one node)")
    b.add_argument("--memory", action="store_true", help="bench train: per-device memory of the compiled step of "
                   "the paper configs' stages (--memory-configs, --stages) on --devices, per --backend")
    b.add_argument("--memory-configs", default="qwen3_4b,gemma4_12b", help="bench train --memory: config names")
    b.add_argument("--stages", nargs="+", default=list(_MEMORY_STAGES), choices=_MEMORY_STAGES,
                   help="bench train --memory: the stages compiled (control_compute runs control's step)")
    b.add_argument("--mesh", default=None, help="bench train --memory: e.g. data=4,tensor=2 (default: each config's)")
    b.add_argument("--tpu-topology", default=None, help="bench train --memory: compile the TPU program with the TPU "
                   "compiler for a compile-only slice, e.g. v5p:2x2x1, v6e:2x4, v5e:4x4 (needs libtpu: .[tpu])")
    b.add_argument("--json", action="store_true", help="bench train --memory: one JSON object per line per "
                   "(config, stage, mesh, backend) instead of the table; bench roofline: the result as JSON on "
                   "stdout, the table on stderr")
    b.add_argument("--rows", nargs="+", choices=_ROOFLINE_ROWS, default=None, metavar="ROW",
                   help=f"bench roofline: the paths measured (default all: {' '.join(_ROOFLINE_ROWS)})")
    b.add_argument("--matmul-rows", type=SIZE, nargs="+", default=[1, 16, 64, 128, 2048],
                   help="bench roofline: row counts of the matmul rates")
    b.add_argument("--stream-mb", type=B.arg(B.size(1, 1 << 16)), default=256,
                   help="bench roofline: MiB streamed for the bandwidth (above the caches)")
    b.add_argument("--backend", nargs="+", default=None, choices=ATTENTION_BACKENDS,
                   help="bench steps: train step per attention backend (default einsum); "
                        "bench train --memory: backends compiled (default auto, the GPU default)")
    b.add_argument("--drafter", type=user_path, help="bench decode: drafter folder (default: an untrained random drafter)")
    b.add_argument("--prompts", type=SIZE, default=4, help="bench decode: prompts decoded one by one")
    b.add_argument("--breakdown", action="store_true", help="bench decode: AR step / draft / verify / round times "
                   "and ratios at several cache sizes (--max-lens; --proposals, --draft-layers for the random drafter)")
    b.add_argument("--max-lens", type=SIZE, nargs="+", default=[256, 1024, 4096], help="bench decode --breakdown")
    b.add_argument("--profile", type=COUNT0, default=0, metavar="N", help="bench decode --breakdown: N more calls of "
                   "each step under jax.profiler, each call's time split by XLA op kind (matmuls, the attention "
                   "loop, cache reads and writes, ...) and host idle time")
    b.add_argument("--torch", action="store_true", help="bench decode: tokens/s of transformers AR, z-lab's "
                   "dflash_generate (--zlab), the PyTorch Carryover loop (carried rows off/on) and the JAX engine")
    b.add_argument("--zlab", type=user_path, default=None, help="bench decode --torch: a z-lab/dflash checkout, "
                   "imported at run time (default $CARRYOVER_ZLAB_DFLASH; none: the column is skipped)")
    b.add_argument("--draft-vocab", type=COUNT0, default=0, metavar="K",
                   help="bench decode: the random drafter proposes from a draft vocabulary of K tokens")
    _add_target_args(b)  # --dtype also sets bench steps' dtype (default bfloat16)
    b.add_argument("--batch-sizes", type=SIZE, nargs="+", default=[1, 8])
    b.add_argument("--max-new-tokens", type=SIZE, default=64)
    b.add_argument("--repeats", type=SIZE, default=None,
                   help="timed calls (default: ar, decode 1; decode --breakdown 25; roofline 5); the in-loop steps of "
                        "--breakdown and the roofline's verify rows: max(10, repeats / 2) rotated rounds")
    b.add_argument("--out", type=user_path, help="also write the result as JSON here")
    b.set_defaults(func=_cmd_bench)

    from carryover_jax.eval.command import add_parser as add_eval_parser

    add_eval_parser(sub, _add_target_args)  # `carryover eval`: carryover_jax/eval/command.py
    return parser


def _compile_cache() -> None:
    """The commands keep XLA's compiled programs in a persistent cache, `$CARRYOVER_CACHE/jax-programs` (default
    ~/.cache/carryover_jax; at most 2 GiB, the least recently used go first): a command that compiles what an
    earlier one compiled (the next stage of a launch script, a resumed prepare, a second eval over the same prompt
    buckets) loads the program instead (SmolLM2's prefill at one prompt bucket: ~3-5 s of XLA compile each). The
    cache's key holds the program, the compile options and the jax version. A JAX_COMPILATION_CACHE_DIR set by
    the caller is used as given; CARRYOVER_COMPILE_CACHE=0 turns it off. Set before jax is imported (jax reads
    these at import, and building the parser imports it)."""
    if os.environ.get("CARRYOVER_COMPILE_CACHE", "1") == "0" or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    from carryover_jax.weights.registry import cache_dir

    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir() / "jax-programs")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))


def main(argv=None) -> int:
    _compile_cache()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CarryoverError as e:
        print(f"carryover {args.command}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the command writes or reads: permissions, a full disk, ...
        where = f" in {e.filename}" if getattr(e, "filename", None) else ""
        print(f"carryover {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"carryover {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
