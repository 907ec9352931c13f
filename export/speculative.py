"""Speculative decoding with Carryover in PyTorch: an HF transformers target + an exported (z-lab, DeepSpec)
or native drafter, batch 1, greedy or lossless sampling, with or without carried rows.

Usable without JAX: nothing here (or in `torch_drafter`) imports a JAX module, so a PyTorch user runs an
exported Carryover drafter as it was trained. One round (the Carryover paper's inference):
- draft: block [anchor, MASK...] at the anchor's position L, attending to the drafter's committed-context
  cache and, with Carryover, to the previous round's rejected rows (r = P - a of them, at L + j) -> P
  proposals (+ the draft distributions q when sampling);
- verify: one target forward over [anchor, d_1..d_P] through its transformers `DynamicCache` ->
  accepted a, correction/bonus y; the cache is cropped back to L + a + 1 (rollback);
- the P+1 verify features are fused once: rows 0..a enter the drafter cache, rows a+1..P (+ e_rej)
  are the next round's carried rows, then dropped.

Command line:
    python -m carryover_jax.export.speculative --target DIR --drafter DIR --prompt TEXT --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from carryover_jax.errors import CarryoverError, CheckpointError, ConfigError, RequestError
from carryover_jax.export.torch_drafter import TorchDrafter, read_spec


@dataclass
class TorchGeneration:
    token_ids: list[int]  # generated ids (the first from the prefill), incl. a stop token that ended it
    accepted: list[int]  # accepted drafts per verification round
    stop_reason: str  # "stop_token" | "length"
    time_s: float = 0.0
    prefill_s: float = 0.0
    text: str | None = None

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Committed tokens per round after the prefill's first token (the JAX engine's `tau`)."""
        return (len(self.token_ids) - 1) / max(self.rounds, 1)

    def to_json(self) -> dict[str, Any]:
        n = len(self.token_ids)
        return {"token_ids": self.token_ids, "text": self.text, "accepted": self.accepted, "rounds": self.rounds,
                "tau": round(self.tau, 4), "stop_reason": self.stop_reason, "new_tokens": n,
                "time_s": round(self.time_s, 4), "prefill_s": round(self.prefill_s, 4),
                "tokens_per_s": round(n / max(self.time_s, 1e-9), 2)}


# ---- sampling (the same processing for draft and target distributions keeps verification lossless) ----
def process_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [..., V] -> tempered and filtered float32 logits (filtered entries -inf); temperature > 0."""
    x = logits.float() / temperature
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        srt = torch.sort(x, dim=-1, descending=True).values
        p = torch.softmax(srt, dim=-1)
        keep = (torch.cumsum(p, dim=-1) - p) < top_p  # the smallest prefix reaching top_p; the first always
        cutoff = torch.where(keep, srt, torch.full_like(srt, float("inf"))).min(dim=-1, keepdim=True).values
        x = x.masked_fill(x < cutoff, float("-inf"))
    return x


def distribution(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution [..., V]; a one-hot at the argmax when temperature is 0."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(process_logits(logits, temperature, top_k, top_p), dim=-1)


@dataclass
class SamplingSettings:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    greedy_drafts: bool = False  # z-lab's loop: argmax drafts at any temperature (q a point mass), still lossless
    seed: int = 0
    generator: torch.Generator = field(default=None, repr=False)

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(int(self.seed))

    def draw(self, p: torch.Tensor) -> int:
        return int(torch.multinomial(p.float().cpu(), 1, generator=self.generator)[0])

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


def check_sampling(temperature, top_k=0, top_p=1.0, max_new_tokens=1) -> None:
    """Request values, checked before anything is loaded (the same rules as the JAX engine)."""
    try:
        ok = float(temperature) >= 0 and float(temperature) != float("inf")
    except (TypeError, ValueError):
        ok = False
    if not ok or temperature != temperature:
        raise RequestError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise RequestError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    try:
        p = float(top_p)
    except (TypeError, ValueError):
        p = float("nan")
    if not 0.0 < p <= 1.0:
        raise RequestError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise RequestError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


# ---- target ----------------------------------------------------------------------------------------
def load_target(folder, *, dtype=torch.float32, device="cpu"):
    """An HF folder -> (transformers model in eval mode, tokenizer or None, stop ids). Eager attention
    in float32 matches the JAX engine's numerics; sdpa is the faster choice elsewhere."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # errors and --json output stay one clean stream
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} is not an HF target folder (no config.json); "
                              "`carryover convert --target NAME` writes one for an alias or GGUF file")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    except Exception as e:
        raise CheckpointError(f"transformers cannot load the target {folder} ({str(e).splitlines()[0]})") from None
    tok = None
    if any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tok = AutoTokenizer.from_pretrained(str(folder))
    stops: list[int] = []
    for src in (getattr(model, "generation_config", None), model.config, tok):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        for i in (e if isinstance(e, (list, tuple)) else [e]):
            if i is not None and int(i) not in stops:
                stops.append(int(i))
    return model, tok, stops


def target_head(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding and LM head weights, [V, d] each (the drafter's frozen inputs)."""
    return model.get_input_embeddings().weight, model.get_output_embeddings().weight


def encode(tok, prompt: str, *, chat: bool = True) -> list[int]:
    """A prompt through the chat template when the tokenizer has one (as `carryover generate` does)."""
    if tok is None:
        raise RequestError("this target has no tokenizer; pass token ids")
    if chat and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                       tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    return list(tok(prompt)["input_ids"])


# ---- the loop ----------------------------------------------------------------------------------------
class SpeculativeDecoder:
    """A target and a drafter paired once (checked), then `generate` per prompt."""

    def __init__(self, target, drafter_folder, *, dtype=torch.float32, tokenizer=None, stop_token_ids=()):
        self.target = target
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)
        embed, head = target_head(target)
        self.drafter = TorchDrafter(drafter_folder, embed=embed, head=head, dtype=dtype, device=embed.device)
        s, cfg = self.drafter.spec, target.config
        cfg = getattr(cfg, "text_config", cfg) if not hasattr(cfg, "num_hidden_layers") else cfg
        for what, a, b in (("hidden size", self.drafter.d, cfg.hidden_size),
                           ("vocabulary", s.hf["vocab_size"], cfg.vocab_size),
                           ("target layer count", s.num_target_layers, cfg.num_hidden_layers)):
            if int(a) != int(b):
                raise ConfigError(f"drafter/target mismatch: the drafter expects {what} {a}, the target has {b}")
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        # HF hidden_states[0] is the embedding output (id -1), [l + 1] the output of decoder layer l
        self.taps = [0 if l == -1 else l + 1 for l in s.target_layer_ids]
        # transformers renamed `past_key_values` to `cache` within 5.x; take whichever this version has
        import inspect

        self._cache_kw = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"

    def _target(self, ids: list[int], start: int, cache, *, last_only=False):
        dev = self.drafter.device
        x = torch.tensor([ids], dtype=torch.long, device=dev)
        pos = torch.arange(start, start + len(ids), device=dev)[None]
        out = self.target(input_ids=x, position_ids=pos, use_cache=True, output_hidden_states=True,
                          logits_to_keep=1 if last_only else 0, **{self._cache_kw: cache})
        feats = torch.cat([out.hidden_states[i] for i in self.taps], dim=-1)
        return out.logits[0].float(), feats

    def _propose(self, logits: torch.Tensor, anchor: int, ss: SamplingSettings):
        """Backbone logits [P, K] -> proposals (target ids) and q [P, V'] over the draft vocabulary (or
        None when drafts are argmaxes: q is then a point mass). Markov: each slot's bias from the token
        chosen at the slot before (the anchor for the first)."""
        d = self.drafter
        sample = ss.temperature > 0 and not ss.greedy_drafts
        markov = d.spec.kind == "markov"
        if not sample and not markov:
            idx = logits.argmax(-1)
            return (idx if d.draft_ids is None else d.draft_ids[idx]).tolist(), None
        toks, qs, prev = [], [], anchor
        for k in range(logits.shape[0]):
            lg = logits[k] + d.markov_bias(prev) if markov else logits[k]
            if sample:
                q = distribution(lg, ss.temperature, ss.top_k, ss.top_p)
                i = ss.draw(q)
                qs.append(q)
            else:
                i = int(lg.argmax())
            prev = i if d.draft_ids is None else int(d.draft_ids[i])
            toks.append(prev)
        return toks, (torch.stack(qs) if sample else None)

    def _accept(self, logits: torch.Tensor, proposals: list[int], q, ss: SamplingSettings) -> tuple[int, int]:
        """Accepted count a and the correction/bonus token y (greedy: longest matching prefix; sampling:
        accept d_i w.p. min(1, p(d_i)/q(d_i)), on the first rejection y ~ norm(max(p - q, 0)), else y ~ p_P)."""
        P = len(proposals)
        if ss.temperature == 0:
            tgt = logits.argmax(-1).tolist()
            a = 0
            while a < P and proposals[a] == tgt[a]:
                a += 1
            return a, tgt[a]
        p = distribution(logits, ss.temperature, ss.top_k, ss.top_p)  # [P+1, V]
        d = self.drafter
        for a in range(P):
            tok = proposals[a]
            if q is None:  # argmax drafts: q is a point mass at the proposal
                qd = 1.0
            else:
                qd = float(q[a, tok] if d.draft_ids is None else q[a, int(torch.searchsorted(d.draft_ids, tok))])
            if ss.uniform() >= min(1.0, float(p[a, tok]) / max(qd, 1e-10)):
                if q is None:
                    qa = torch.zeros_like(p[a])
                    qa[tok] = 1.0
                elif d.draft_ids is None:
                    qa = q[a]
                else:
                    qa = torch.zeros_like(p[a]).index_copy_(0, d.draft_ids, q[a])
                resid = torch.clamp(p[a] - qa, min=0.0)
                return a, ss.draw(resid if float(resid.sum()) > 1e-8 else p[a])
        return P, ss.draw(p[P])

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], *, max_new_tokens: int = 128, carryover: bool = True,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 greedy_drafts: bool = False, stop_token_ids: Sequence[int] | None = None) -> TorchGeneration:
        from transformers import DynamicCache

        check_sampling(temperature, top_k, top_p, max_new_tokens)
        ids = [int(t) for t in prompt_ids]
        vocab = int(self.drafter.spec.hf["vocab_size"])
        if not ids:
            raise RequestError("the prompt is empty")
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"the prompt has token id {min(ids) if min(ids) < 0 else max(ids)} outside the "
                               f"target's vocabulary [0, {vocab})")
        d, P = self.drafter, self.drafter.spec.num_proposals
        need = len(ids) + max_new_tokens + P + 1  # a verify chunk reaches P+1 positions past the committed text
        if len(ids) + max_new_tokens > self.max_positions:
            raise RequestError(f"the prompt has {len(ids):,} tokens + max_new_tokens {max_new_tokens:,}, more than "
                               f"the target's context of {self.max_positions:,} tokens")
        if carryover and d.e_rej is None:
            raise CarryoverError("this drafter has no Carryover embedding e_rej (no carryover.safetensors / not "
                                 "trained with carryover); decode with carryover off (--no-carryover)")
        stops = set(self.stop_token_ids if stop_token_ids is None else stop_token_ids)
        ss = SamplingSettings(temperature, top_k, top_p, greedy_drafts, seed)

        t0 = time.perf_counter()
        cache = DynamicCache()
        logits, feats = self._target(ids, 0, cache, last_only=True)
        first = int(logits[-1].argmax()) if temperature == 0 else ss.draw(distribution(logits[-1], temperature,
                                                                                       top_k, top_p))
        d.reset(need)
        d.commit(d.fuse(feats))
        prefill_s = time.perf_counter() - t0
        out, accepted, carried = [first], [], None
        done = first in stops or max_new_tokens <= 1
        pos, anchor = len(ids), first  # the anchor sits at `pos`; target cache and drafter cache hold < pos
        while not done:
            props, q = self._propose(d.block_logits(anchor, carried if carryover else None), anchor, ss)
            logits, feats = self._target([anchor] + props, pos, cache)
            a, y = self._accept(logits, props, q, ss)
            accepted.append(a)
            fused = d.fuse(feats)[:, : P + 1]  # fused once: committed rows 0..a, rejected a+1..P
            d.commit(fused[:, : a + 1])
            carried = d.mark_carried(fused[:, a + 1:]) if carryover else None
            _rollback(cache, pos + a + 1)
            seq = props[:a] + [y]
            for i, tok in enumerate(seq):
                out.append(tok)
                if tok in stops or len(out) >= max_new_tokens:
                    done = True
                    break
            pos, anchor = pos + a + 1, y
        elapsed = time.perf_counter() - t0
        reason = "stop_token" if out[-1] in stops else "length"
        text = self.tokenizer.decode(out, skip_special_tokens=True) if self.tokenizer is not None else None
        return TorchGeneration(out, accepted, reason, elapsed, prefill_s, text)


def _rollback(cache, length: int) -> None:
    """Crop the target cache to `length` positions. A negative count (tokens to remove) means the same in
    every transformers 5.x; newer versions refuse a positive (absolute) length."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def speculative_generate(target, drafter_folder, prompt_ids: Sequence[int], **kw) -> TorchGeneration:
    """One prompt, one call: `SpeculativeDecoder(target, drafter_folder).generate(prompt_ids, **kw)`."""
    return SpeculativeDecoder(target, drafter_folder).generate(prompt_ids, **kw)


# ---- command line --------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m carryover_jax.export.speculative",
        description="Speculative decoding with Carryover in PyTorch (HF target + exported or native drafter).")
    p.add_argument("--target", required=True, help="HF target folder (`carryover convert --target smollm2` prints one)")
    p.add_argument("--drafter", required=True, help="drafter folder: `carryover export` (z-lab / DeepSpec) or native")
    p.add_argument("--prompt", required=True, help="prompt text (through the target's chat template, if any)")
    p.add_argument("--no-chat", action="store_true", help="plain text, no chat template")
    p.add_argument("--no-carryover", action="store_true", help="decode without carried rows (the baseline drafter)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--greedy-drafts", action="store_true", help="argmax drafts at any temperature (z-lab's loop)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--json", action="store_true", help="print one JSON object (token_ids, accepted, tau, ...)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        check_sampling(args.temperature, args.top_k, args.top_p, args.max_new_tokens)
        for name in ("target", "drafter"):
            if not Path(getattr(args, name)).is_dir():
                raise CheckpointError(f"no such {name} folder: {getattr(args, name)}")
        read_spec(Path(args.drafter))  # a folder that is no drafter fails before the target is loaded
        dtype = getattr(torch, args.dtype)
        model, tok, stops = load_target(args.target, dtype=dtype)
        dec = SpeculativeDecoder(model, args.drafter, dtype=dtype, tokenizer=tok, stop_token_ids=stops)
        ids = encode(tok, args.prompt, chat=not args.no_chat)
        g = dec.generate(ids, max_new_tokens=args.max_new_tokens, carryover=not args.no_carryover,
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                         greedy_drafts=args.greedy_drafts)
    except CarryoverError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**g.to_json(), "prompt_tokens": len(ids), "carryover": not args.no_carryover,
                          "drafter_format": dec.drafter.spec.fmt}))
    else:
        print(g.text)
        print(f"[tau {g.tau:.3f}, {g.rounds} rounds, {len(g.token_ids)} tokens, "
              f"{len(g.token_ids) / max(g.time_s, 1e-9):.1f} tokens/s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
