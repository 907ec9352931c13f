# The store's prepare at generation batch 64 / 32 / 64, 3 min each after 75 s of start-up (one process at a time):
# records committed per 180 s. From the repo root with the venv active; it resumes the store, so its records are kept.
rec() { python3 -c "import json; print(json.load(open('runs/e18k/data/commit.json'))['records'])"; }
for gb in 64 32 64; do
  carryover prepare --config smollm2 --dtype bfloat16 --set data.store=runs/e18k/data --set data.max_prompts=18432 \
    --set data.store_kv=None --set data.gen_batch_size=$gb > /tmp/gb_$gb.log 2>&1 &
  pid=$!
  sleep 75; a=$(rec); ta=$(date +%s)
  sleep 180; b=$(rec); tb=$(date +%s)
  kill $pid; wait $pid
  echo "gen_batch_size $gb: $((b - a)) records in $((tb - ta)) s"
done
