#!/usr/bin/env bash
# tests/bench/gsm8k_gpu.sh rehearsed on this machine's CPU before GPU time is spent on it: `start`
# (a controller and a worker in sessions of their own, the job submitted, steps printed), `watch`
# from a second invocation (the daemons outlived the first), `stop` (the job cancelled, both
# daemons gone, metrics and logs collected). The tiny demo model stands in for the converted GGUF
# (a model directory present skips the conversion).
#   tests/integration/gsm8k_gpu_script_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=${1:?source dir}; build_dir=${2:?build dir}
work="$(mktemp -d /tmp/rlhfd-gsm8k-script-XXXXXX)"
export RLHFD_GSM8K_DIR="${work}/run" RLHFD_GSM8K_DEVICE=cpu
fail() { echo "FAIL: $*"; for f in "${RLHFD_GSM8K_DIR}"/*.log; do tail -5 "$f"; done; exit 1; }
cleanup() {
  for daemon in worker controller; do
    kill -9 "$(cat "${RLHFD_GSM8K_DIR}/${daemon}.pid" 2>/dev/null)" 2>/dev/null || true
  done
  rm -rf "${work}"
}
trap cleanup EXIT

# A bundle's shape (bin/ and env.sh) around the build's binaries, which find their libraries.
mkdir -p "${work}/bundle/bin" "${RLHFD_GSM8K_DIR}"
ln -s "${build_dir}/controller/rlhfd-controller" "${build_dir}/worker/rlhfd-worker" \
  "${build_dir}/controller/rlhfctl" "${work}/bundle/bin/"
: > "${work}/bundle/env.sh"
ln -s "${source_dir}/tests/fixtures/models/tiny-qwen2" "${RLHFD_GSM8K_DIR}/model"
script="${source_dir}/tests/bench/gsm8k_gpu.sh"
cd "${source_dir}"

RLHFD_BIN_DIR="${work}/bundle/bin" RLHFD_WATCH_S=20 "${script}" start none \
  configs/tiny-cpu-demo.yaml "${work}/out1" \
  "trainer.total_steps=100000 roles.actor.gpus=1 trainer.checkpoint_dir=${work}/ckpt \
   trainer.save_every=0 data.val_files=[tests/fixtures/data/repeat_test.jsonl] \
   roles.reward.val_rules=[exact_match] trainer.val_every=1000" > "${work}/start.txt" 2>&1 ||
  { cat "${work}/start.txt"; fail "start"; }
cat "${work}/start.txt"
grep -q "^step 0: val/score/mean=" "${work}/start.txt" || fail "start printed no validation"
grep -q "^step 1: critic/score/mean=" "${work}/start.txt" || fail "start printed no step"
grep -q "JOB_STATE_RUNNING after 20 s of watching" "${work}/start.txt" || fail "start's watch"
for daemon in controller worker; do
  kill -0 "$(cat "${RLHFD_GSM8K_DIR}/${daemon}.pid")" || fail "the ${daemon} did not outlive start"
done
[[ -s "${work}/out1/metrics.jsonl" && -s "${work}/out1/worker.log" ]] || fail "start collected nothing"

"${script}" watch 3 "${work}/out2" > "${work}/watch.txt" 2>&1 || { cat "${work}/watch.txt"; fail "watch"; }
# watch prints the steps since start's last line, not again those before.
grep -q "^step " "${work}/watch.txt" || fail "watch printed no new step"
first=$(grep -m1 -o "^step [0-9]*" "${work}/watch.txt" | cut -d' ' -f2)
last_start=$(grep -o "^step [0-9]*" "${work}/start.txt" | tail -1 | cut -d' ' -f2)
((first == last_start + 1)) || fail "watch began at step ${first}, start ended at ${last_start}"

"${script}" stop "${work}/out3" > "${work}/stop.txt" 2>&1 || { cat "${work}/stop.txt"; fail "stop"; }
grep -q "job-1 JOB_STATE_CANCELLED" "${work}/stop.txt" || { cat "${work}/stop.txt"; fail "not cancelled"; }
for daemon in controller worker; do
  pid=$(cat "${RLHFD_GSM8K_DIR}/${daemon}.pid")
  for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done  # being reaped
  ! kill -0 "${pid}" 2>/dev/null || fail "the ${daemon} survived stop"
done
[[ -s "${work}/out3/metrics.jsonl" ]] || fail "stop collected no metrics"
echo "PASS: start, watch and stop"
