#!/usr/bin/env bash
# Stage of tools/gpu-session.sh (and the serving part of `make test-gpu`, tools/run-gpu-tests.sh):
# `tandem bench` against `tandem serve --device cuda` on the built-in
# model, DSpark K=5 and no speculation (issue 23's serving target: counting at one stream >= 4,000
# tok/s with DSpark). SERVING_WORKLOADS (default count,dataclasses,prose) and SERVING_CONCURRENCY
# (default "1 8") narrow it; SERVING_BUILD is the build directory (default build-cuda); SERVING_ARMS
# (default "dspark plain") may add dspark-fixed (DSpark drafting and verifying all 5 tokens every
# step, verify_mode "fixed"). JSON
# $1/serving-builtin.json, the arms' reports and logs under $1/serving/.
set -uo pipefail
OUT=$1
cd "$(dirname "$0")/.."
arms_dir=$OUT/serving
mkdir -p "$arms_dir"
port=${SERVING_PORT:-18779}
build=${SERVING_BUILD:-build-cuda}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
rc=0
arms=${SERVING_ARMS:-dspark plain}
for arm in $arms; do
  case $arm in dspark|dspark-fixed|plain) ;; *) echo "gpu-stage-serving: unknown arm '$arm' (dspark, dspark-fixed, plain)" >&2; exit 2 ;; esac
  args=()
  [[ $arm == dspark ]] && args=(--speculative-config '{"method":"dspark","num_speculative_tokens":5}')
  [[ $arm == dspark-fixed ]] && args=(--speculative-config '{"method":"dspark","num_speculative_tokens":5,"verify_mode":"fixed"}')
  "$build/tandem" serve --model data/builtin --device "${SERVING_DEVICE:-cuda}" --served-model-name builtin --port "$port" "${args[@]}" \
    > "$arms_dir/serve-$arm.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 1; done
  # shellcheck disable=SC2086
  "$build/tandem" bench --base-url "http://127.0.0.1:$port" --model builtin \
    --workloads "${SERVING_WORKLOADS:-count,dataclasses,prose}" --concurrency ${SERVING_CONCURRENCY:-1 8} --repeats 2 \
    --max-tokens 512 --notes "$gpu, tandem serve --device cuda, $arm" --output "$arms_dir/bench-$arm.json" \
    > "$arms_dir/bench-$arm.log" 2>&1 || rc=1
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
done
python3 - "$OUT" "$arms_dir" "$gpu" "$driver" "${TANDEM_COMMIT:-unknown}" "$arms" <<'PY' || rc=1
import json, sys, datetime
out, arms_dir, gpu, driver, commit, arm_names = sys.argv[1:]
arms = {}
for arm in arm_names.split():
    r = json.load(open(f"{arms_dir}/bench-{arm}.json"))
    arms[arm] = {k: r.get(k) for k in ("settings", "summary", "totals", "target")}
    # Where the engine thread's time went, per step that ran a batch (the server's tandem:engine_*
    # counters over each run), us.
    phases = []
    for run in r.get("runs", []):
        names = (run.get("server") or {}).get("names") or {}
        steps = names.get("tandem:engine_steps_total", 0)
        if steps <= 0:
            continue
        row = {"workload": run.get("workload"), "concurrency": run.get("concurrency"), "steps": steps,
               "wall_s": run.get("wall_s")}
        for k, v in names.items():
            if k.startswith("tandem:engine_") and k.endswith("_seconds_total"):
                row[k[len("tandem:engine_"):-len("_seconds_total")] + "_us_per_step"] = 1e6 * v / steps
            elif k in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                       "vllm:spec_decode_num_accepted_tokens_total"):
                row[k[len("vllm:spec_decode_num_"):-len("_total")]] = v  # drafts verified, tokens verified, accepted
        phases.append(row)
    arms[arm]["engine_phases"] = phases
json.dump({"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "commit": commit, "gpu": gpu, "driver": driver,
           "what": "tandem bench (streamed chat completions, greedy, 512 tokens) against tandem serve --device cuda "
                   "on the built-in model, DSpark K=5 (arms: " + arm_names + ")", "arms": arms},
          open(f"{out}/serving-builtin.json", "w"), indent=1)
for arm, a in arms.items():
    for row in a["summary"]:
        print(arm, json.dumps({k: row.get(k) for k in ("workload", "concurrency", "aggregate_tok_s", "per_stream_decode_tok_s", "ttft_s", "acceptance_rate")}))
    for row in a["engine_phases"]:
        print(arm, "engine", json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}))
PY
exit $rc
