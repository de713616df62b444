#!/usr/bin/env bash
# What a checkpoint every step costs the demo job, in the foreground and in the background
# (trainer.async_save). The README's demo (configs/demo-digits.yaml: a local controller and two
# CPU workers) runs three ways, interleaved REPEATS times: never saving, saving every step in the
# foreground, saving every step in the background. Prints, as JSON and then a table, each way's
# median step time (timing_s/step from metrics.jsonl, the first 5 steps of each run left out)
# and its overhead over the runs that never save.
#   tests/bench/async_save_bench.sh [STEPS=100] [REPEATS=3]
#   RLHFD_BIN_DIR=DIR  the binaries (default: build/'s)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
steps="${1:-100}"
repeats="${2:-3}"
work="$(mktemp -d /tmp/rlhfd-async-save-XXXXXX)"
trap 'rm -rf "${work}"' EXIT
if [[ -z "${RLHFD_BIN_DIR:-}" ]]; then
  mkdir -p "${work}/bin"
  for program in controller/rlhfd-controller worker/rlhfd-worker controller/rlhfctl; do
    ln -s "${repo_root}/build/${program}" "${work}/bin/"
  done
  export RLHFD_BIN_DIR="${work}/bin"
fi

declare -A save_every=([none]=-1 [foreground]=1 [background]=1)
declare -A async_save=([none]=false [foreground]=false [background]=true)
for repeat in $(seq "${repeats}"); do
  for way in none foreground background; do
    run="${work}/${way}-${repeat}"
    overrides=(trainer.total_steps="${steps}" trainer.val_every=0 "trainer.loggers=[console,jsonl]"
      trainer.save_every="${save_every[${way}]}" trainer.async_save="${async_save[${way}]}"
      trainer.checkpoint_dir="${RLHFD_BENCH_CHECKPOINTS:-${run}}/checkpoints-${way}-${repeat}")
    RLHFD_DEMO_DIR="${run}" RLHFD_DEMO_OVERRIDES="${overrides[*]}" \
      "${repo_root}/deploy/demo.sh" > "${run}.log" 2>&1 || {
        echo "the ${way} run failed: ${run}.log" >&2
        tail -20 "${run}.log" >&2
        exit 1
      }
    echo "${way} ${repeat}: done" >&2
  done
done

python3 - "${work}" "${repeats}" <<'PY'
import glob, json, statistics, sys

work, repeats = sys.argv[1], int(sys.argv[2])
result = {"ways": {}}
for way in ("none", "foreground", "background"):
    times, per_run = [], []
    for repeat in range(1, repeats + 1):
        files = glob.glob(f"{work}/{way}-{repeat}/**/metrics.jsonl", recursive=True)
        assert len(files) == 1, files
        run = [json.loads(line)["data"]["timing_s/step"]
               for line in open(files[0]) if json.loads(line)["step"] > 5]
        times += run
        per_run.append(statistics.median(run))
    result["ways"][way] = {"median_step_s": statistics.median(times),
                           "run_medians_s": per_run, "steps": len(times)}
base = result["ways"]["none"]["median_step_s"]
for way in result["ways"].values():
    way["overhead"] = way["median_step_s"] / base - 1
print(json.dumps(result, indent=2))
print()
print("| checkpoint every step | median step (ms) | per-run medians (ms) | overhead |")
print("| --- | --- | --- | --- |")
for name, way in result["ways"].items():
    runs = ", ".join(f"{1000 * t:.1f}" for t in way["run_medians_s"])
    print(f"| {name} | {1000 * way['median_step_s']:.1f} | {runs} | {100 * way['overhead']:+.1f} % |")
PY
