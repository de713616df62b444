#!/usr/bin/env bash
# tests/bench/gsm8k_gpu.sh rehearsed on this machine's CPU before GPU time is spent on it: `start`
# (a controller and a worker in sessions of their own, a short SFT job submitted, followed to its
# end), `then` (a GRPO job from the SFT job's exported actor, steps printed), `watch` from another
# invocation (the daemons outlived the first), `stop` (the job cancelled, both daemons gone,
# metrics and logs collected). The tiny demo model stands in for the converted GGUF (a model
# directory present skips the conversion), four written conversations for the SFT data.
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

for i in 1 2 3 4; do
  echo "{\"messages\": [{\"role\": \"user\", \"content\": \"What is ${i} + ${i}?\"}, {\"role\": \"assistant\", \"content\": \"$((i + i))\"}]}"
done > "${work}/chats.jsonl"
cat > "${work}/sft.yaml" <<YAML
name: sft-rehearsal
model: {path: unused, dtype: fp32}
data: {train_files: [${work}/chats.jsonl], max_prompt_length: 64, max_response_length: 16,
       train_batch_size: 4}
roles:
  actor:
    gpus: 1
    train: {ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 4, lr: 1.0e-4}
placement: colocated
trainer: {mode: sft, total_steps: 2, save_every: 0, checkpoint_dir: ${work}/sft-ckpt,
          loggers: [console, jsonl]}
YAML
RLHFD_BIN_DIR="${work}/bundle/bin" RLHFD_WATCH_S=120 "${script}" start none "${work}/sft.yaml" \
  "${work}/out0" > "${work}/sft.txt" 2>&1 || { cat "${work}/sft.txt"; fail "start"; }
cat "${work}/sft.txt"
grep -q "^step 2: train/loss=" "${work}/sft.txt" || fail "start printed no SFT step"
grep -q "job-1 JOB_STATE_SUCCEEDED" "${work}/sft.txt" || fail "the SFT job did not succeed"

RLHFD_WATCH_S=20 "${script}" then configs/tiny-cpu-demo.yaml "${work}/out1" \
  "trainer.total_steps=100000 roles.actor.gpus=1 trainer.checkpoint_dir=${work}/ckpt \
   trainer.save_every=0 data.val_files=[tests/fixtures/data/repeat_test.jsonl] \
   roles.reward.val_rules=[exact_match] trainer.val_every=1000" > "${work}/start.txt" 2>&1 ||
  { cat "${work}/start.txt"; fail "then"; }
cat "${work}/start.txt"
grep -q "^submitted job-2" "${work}/start.txt" || fail "then submitted no second job"
[[ -f "${RLHFD_GSM8K_DIR}/model-job-1/config.json" ]] || fail "then exported no model"
grep -q "^step 0: val/score/mean=" "${work}/start.txt" || fail "then printed no validation"
grep -q "^step 1: critic/score/mean=" "${work}/start.txt" || fail "then printed no step"
grep -q "job-2 JOB_STATE_RUNNING after 20 s of watching" "${work}/start.txt" || fail "then's watch"
for daemon in controller worker; do
  kill -0 "$(cat "${RLHFD_GSM8K_DIR}/${daemon}.pid")" || fail "the ${daemon} did not outlive start"
done
[[ -s "${work}/out1/metrics.jsonl" && -s "${work}/out1/worker.log" ]] || fail "then collected nothing"

"${script}" watch 3 "${work}/out2" > "${work}/watch.txt" 2>&1 || { cat "${work}/watch.txt"; fail "watch"; }
# watch prints the steps since start's last line, not again those before.
grep -q "^step " "${work}/watch.txt" || fail "watch printed no new step"
first=$(grep -m1 -o "^step [0-9]*" "${work}/watch.txt" | cut -d' ' -f2)
last_start=$(grep -o "^step [0-9]*" "${work}/start.txt" | tail -1 | cut -d' ' -f2)
((first == last_start + 1)) || fail "watch began at step ${first}, start ended at ${last_start}"

"${script}" stop "${work}/out3" > "${work}/stop.txt" 2>&1 || { cat "${work}/stop.txt"; fail "stop"; }
grep -q "job-2 JOB_STATE_CANCELLED" "${work}/stop.txt" || { cat "${work}/stop.txt"; fail "not cancelled"; }
for daemon in controller worker; do
  pid=$(cat "${RLHFD_GSM8K_DIR}/${daemon}.pid")
  for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done  # being reaped
  ! kill -0 "${pid}" 2>/dev/null || fail "the ${daemon} survived stop"
done
[[ -s "${work}/out3/metrics.jsonl" ]] || fail "stop collected no metrics"
echo "PASS: start, then, watch and stop"
