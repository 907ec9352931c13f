#!/usr/bin/env bash
# The Carryover A/B on the embedded default, as one resumable run (`carryover pipeline --preset full`):
# target-regenerated data (1,536 ShareGPT conversations) -> a baseline drafter (1,200 steps, a snapshot every
# 300) -> from its steps 1,200, 300 and 600: DVD training (Carryover) and its equal-steps and equal-compute
# controls (120 continuation steps; the equal-compute control's steps measured on this machine) -> every arm,
# plus the DVD drafter with carried rows withheld, scored by the exact offline evaluator on the same 534 held-out
# rollouts (ShareGPT's held-out split, HumanEval, MT-Bench first turns; T = 0) -> Carryover's paired gain
# against each start's τ (table + PNG) -> report.md. Then, on the same store and rollouts:
#   PROJECTION=1 (default): the projection-module arm (`drafter.carry_module=projection`), DVD from the final
#   baseline with the DVD arm's settings, scored beside that start's baseline, equal-steps control and Carryover
#   arm (into $OUT/projection);
#   T1=1 (default): the final start's five arms at T = 1 on 534 sampled rollouts (into $OUT/offline-T1).
# Re-running resumes: finished stages are skipped, a killed stage resumes from its store, checkpoints or rollout
# cache, an eval whose results are written is not run again.
# Stage times on 2 CPU cores: in the run's report.md and docs/experiments/carryover-ab-*/README.md.
# Extra arguments go to `carryover pipeline`, e.g. --eval-set temperatures=[0.0,1.0].
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
C=.venv/bin/carryover
OUT="${OUT:-runs/carryover-ab}"
"$C" pipeline --config smollm2 --preset full --out "$OUT" "$@"
S=1200  # the final baseline: the main comparison's start
ev=(--datasets sharegpt humaneval mtbench --prompts-per-dataset 400 --max-new-tokens 64 --offline-batch 16)
arms=(--drafter "baseline@$S=$OUT/baseline/drafter" --drafter "control-steps@$S=$OUT/from_$S/control/drafter"
      --drafter "control-compute@$S=$OUT/from_$S/control_compute/drafter"
      --drafter "dvd-nocarry@$S=$OUT/from_$S/dvd/drafter" --drafter "carryover@$S=$OUT/from_$S/dvd/drafter:carryover")
if [[ "${PROJECTION:-1}" == 1 ]]; then
  # the DVD arm's own settings (pipeline.json's from_1200/dvd stage) with the projection module
  "$C" train --config smollm2:dvd --set "data.store=$OUT/data" --set data.max_prompts=1536 --set steps=120 \
    --set save_every=60 --set snapshot_every=300 --set "init_from=$OUT/baseline/drafter" \
    --set drafter.carry_module=projection --set "name=smollm2-dvd-projection-from$S" \
    --set "out_dir=$OUT/from_$S/dvd_projection"
  [[ -f "$OUT/projection/results.json" ]] || "$C" eval --offline "${arms[@]:0:4}" "${arms[@]:8:2}" \
    --drafter "carryover-projection@$S=$OUT/from_$S/dvd_projection/drafter:carryover" "${ev[@]}" --temperatures 0 \
    --rollouts "$OUT/rollouts" --out "$OUT/projection"
fi
if [[ "${T1:-1}" == 1 ]]; then
  [[ -f "$OUT/offline-T1/results.json" ]] || "$C" eval --offline "${arms[@]}" "${ev[@]}" --temperatures 1 \
    --rollouts "$OUT/rollouts" --out "$OUT/offline-T1"
fi
