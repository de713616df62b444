#!/usr/bin/env bash
# The README's main job: a local cluster on this machine — one controller and two workers (CPU,
# or the GPUs when present) on loopback — shows the workers registered and the dashboard's URL,
# submits the demo job, follows it to its end with a progress bar, and shows how its mean reward
# and its validation score climbed.
# Daemons stop when the script ends; their logs stay in the state dir. Exits 1 unless the job
# succeeded.
#   RLHFD_DEMO_DIR=DIR      state and logs (default: a new temp dir)
#   RLHFD_DEMO_CONFIG=FILE  job to submit (default: configs/demo-digits.yaml)
#   RLHFD_BIN_DIR=DIR       use these binaries (a deploy/bundle.sh bin/) instead of building
#   RLHFD_DEMO_OVERRIDES="key=value ..."   overrides of the job config (e.g. trainer.total_steps=10)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# In an unpacked release (deploy/bundle.sh --tarball) this script sits beside bin/ and env.sh.
bundle_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${RLHFD_BIN_DIR:-}" && -x "${bundle_root}/bin/rlhfd-worker" && -f "${bundle_root}/env.sh" ]]; then
  repo_root="${bundle_root}"
  RLHFD_BIN_DIR="${bundle_root}/bin"
  source "${bundle_root}/env.sh"
fi
if [[ -n "${RLHFD_BIN_DIR:-}" ]]; then
  controller_bin="${RLHFD_BIN_DIR}/rlhfd-controller"
  worker_bin="${RLHFD_BIN_DIR}/rlhfd-worker"
  ctl="${RLHFD_BIN_DIR}/rlhfctl"
else
  build_dir="${RLHFD_BUILD_DIR:-${repo_root}/build}"
  "${repo_root}/deploy/setup.sh"
  # Only the three programs the demo runs (and the controller's Parquet plugin), not the tests
  # and benchmarks (docs/PERFORMANCE.md counts the build steps and times a first run). Ninja's
  # [step/total] lines are the progress.
  echo "== building rlhfd-controller, rlhfd-worker, rlhfctl in ${build_dir}"
  "${repo_root}/deploy/build.sh" rlhfd-controller rlhfd-worker rlhfctl
  controller_bin="${build_dir}/controller/rlhfd-controller"
  worker_bin="${build_dir}/worker/rlhfd-worker"
  ctl="${build_dir}/controller/rlhfctl"
fi

demo_dir="${RLHFD_DEMO_DIR:-$(mktemp -d /tmp/rlhfd-demo-XXXXXX)}"
config="${RLHFD_DEMO_CONFIG:-${repo_root}/configs/demo-digits.yaml}"
mkdir -p "${demo_dir}"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "${pid}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "demo: stopped; logs in ${demo_dir}"
}
trap cleanup EXIT

"${controller_bin}" --listen=127.0.0.1:0 --state_dir="${demo_dir}/state" \
  --port_file="${demo_dir}/controller.port" --http_listen="127.0.0.1:${RLHFD_DEMO_HTTP_PORT:-0}" \
  --http_port_file="${demo_dir}/http.port" >"${demo_dir}/controller.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s "${demo_dir}/controller.port" ]] && break; sleep 0.1; done
[[ -s "${demo_dir}/controller.port" ]] || { cat "${demo_dir}/controller.log"; exit 1; }
export RLHFD_CONTROLLER="127.0.0.1:$(cat "${demo_dir}/controller.port")"
export RLHFD_TOKEN_FILE="${demo_dir}/state/token"

# Two workers: on two GPUs when there are, else on the CPU. With one GPU, one GPU worker and the
# job's actor on it alone (a job runs on workers of one kind).
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
workers=2
overrides=()
if ((gpus == 1)); then
  workers=1
  overrides=(roles.actor.gpus=1)
fi
for ((i = 0; i < workers; i++)); do
  device=cpu
  if ((gpus >= 1)); then device="cuda:${i}"; fi
  "${worker_bin}" --controller="${RLHFD_CONTROLLER}" --device="${device}" \
    --worker_id="demo-worker-${i}" >"${demo_dir}/worker${i}.log" 2>&1 &
  pids+=($!)
done

for _ in $(seq 100); do
  [[ $("${ctl}" --json workers | grep -c WORKER_STATE_ALIVE) -ge ${workers} ]] && break
  sleep 0.1
done
echo "== rlhfctl workers"
"${ctl}" workers
echo "== dashboard: http://127.0.0.1:$(cat "${demo_dir}/http.port")/ (any user name; the password" \
  "is the token in ${RLHFD_TOKEN_FILE})"
echo "== rlhfctl submit --wait ${config}"
# The example's paths are relative to the checkout; rlhfctl resolves them against its directory.
read -r -a extra <<< "${RLHFD_DEMO_OVERRIDES:-}"
overrides+=("${extra[@]}")
(cd "${repo_root}" && "${ctl}" submit --wait "${config}" "${overrides[@]}") || true
echo "== rlhfctl status job-1"
"${ctl}" status job-1
echo "== the mean reward (critic/score/mean; an SFT job: train/loss) per ten steps, and validation (greedy, val-core)"
"${ctl}" --json metrics job-1 | python3 -c '
import json, sys
steps = json.load(sys.stdin).get("steps", [])
for key, label in (("critic/score/mean", "reward   "), ("train/loss", "sft loss ")):
    score = [(int(s["step"]), s["metrics"][key]) for s in steps if key in s["metrics"]]
    line = []
    for i in range(0, len(score), 10):
        window = score[i:i + 10]
        line.append("%d-%d: %.2f" % (window[0][0], window[-1][0], sum(v for _, v in window) / len(window)))
    for i in range(0, len(line), 5):
        print(label + "   ".join(line[i:i + 5]))
val = [(int(s.get("step", 0)), v) for s in steps for k, v in s["metrics"].items()
       if k.startswith("val-core/")]
print("val-core " + "  ".join("step %d: %.2f" % item for item in val))'
"${ctl}" metrics job-1 | awk '
  NR > 1 && $1 > 0 { n++; score[n] = $2 }
  END {
    if (n == 0) exit 1
    k = n < 10 ? n : 10
    for (i = 1; i <= k; i++) { first += score[i]; last += score[n - k + i] }
    printf "steps 1-%d: %.3f    steps %d-%d: %.3f\n", k, first / k, n - k + 1, n, last / k
  }'
"${ctl}" status job-1 | grep "^state: *succeeded" > /dev/null
