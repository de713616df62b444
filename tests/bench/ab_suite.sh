#!/usr/bin/env bash
# A change to the training or generation path measured against the build before it, on one GPU
# machine, in phases that fit device calls of at most SECONDS each (resumable like
# peer_suite.sh: a phase starts only when its estimated time is left; the next call, the machine
# kept warm, goes on after the last phase done, /tmp/ab_suite.done). Each phase's output goes to
# OUT_DIR/<phase>.txt.
#   BEFORE=/tmp/before/rlhfd AFTER=/tmp/after/rlhfd tests/bench/ab_suite.sh SECONDS OUT_DIR
# BEFORE and AFTER: deploy/bundle.sh folders, AFTER's with model_gpu_test, train_gpu_test and
# rollout_gpu_test among its extra binaries (RLHFD_FIXTURES_DIR: tests/fixtures here). The phases:
#   tests     the GPU tests of AFTER (a failure is printed; the measurements still run)
#   train     train_bench 0.5B 16 x 1,024 with the actor's loss (--loss=chunked, named: the
#             default before 2026-12-06 was full), before/after/before/after, then --breakdown
#   grpo      the GRPO benchmark job 64 x 8, N 256, micro-batch 64, before then after
#   profile   AFTER's job again with step 3 profiled; each stage's kernels summed
#   long      the GRPO job 32 x 8, N 1,024, micro-batch 32, before then after
#   trl       AFTER's short job with TRL tuned in the same call (TRL importable: PYTHONPATH)
#   ppo       the short job as PPO (GAE, a critic colocated with the actor), before then after
# AB_PHASES: the phases to run, in order (default all but trl).
set -uo pipefail
seconds=${1:?SECONDS}; out=${2:?OUT_DIR}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
before="${BEFORE:?set BEFORE to the bundle before the change}"
after="${AFTER:?set AFTER to the bundle with the change}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export RLHFD_FIXTURES_DIR="${RLHFD_FIXTURES_DIR:-${here}/../fixtures}"
# shellcheck source=tests/bench/phases.sh
source "${here}/phases.sh"
phases_begin "${seconds}" "${out}" /tmp/ab_suite.done

# In a subshell: each bundle's env.sh sets its own library path.
gpu_tests() {
  source "${after}/env.sh"
  for test in model_gpu_test train_gpu_test rollout_gpu_test; do
    echo "-- ${test}"
    timeout 200 "${after}/bin/${test}" 2>&1 | tail -40
  done
}
train_benches() {  # FLAGS BUNDLE...
  local flags=$1
  shift
  for bundle in "$@"; do
    echo "-- ${bundle}"
    (source "${bundle}/env.sh"
     # shellcheck disable=SC2086  # the flags are words
     "${bundle}/bin/train_bench" --preset=qwen2.5-0.5b --micro_batch=16 --seq_len=1024 \
       --steps=10 --warmup=3 ${flags} 2>&1 | grep '^{')
  done
}
grpo() {  # BUNDLE TRL_RUNS grpo_vs_trl.sh arguments...
  local bundle=$1 trl=$2
  shift 2
  echo "-- ${bundle}"
  (source "${bundle}/env.sh"
   TRL_RUNS="${trl}" RLHFD_BIN_DIR="${bundle}/bin" "${here}/grpo_vs_trl.sh" "$@")
}
profiled() {
  rm -rf /tmp/ab_profile
  RLHFD_OVERRIDES="trainer.profile_steps=[3] trainer.profile_dir=/tmp/ab_profile" \
    grpo "${after}" " " 64 8 256 256 4 64 | tail -5
  for trace in /tmp/ab_profile/step_3/*rank_0.json; do
    echo "-- ${trace}"
    python3 "${here}/summarize_trace.py" "${trace}" 1 25
  done
  # The reward stage's host work (it runs no kernels) and the reference's before it, to read
  # back here (their timestamps share one clock).
  for stage in rewards ref_log_probs; do
    trace="/tmp/ab_profile/step_3/${stage}_rank_0.json"
    if [[ -f "${trace}" ]]; then gzip -c "${trace}" >"${out}/${stage}_rank_0.json.gz"; fi
  done
}

export here before after out
export -f gpu_tests train_benches grpo profiled
# shellcheck disable=SC2016  # each phase's shell expands the exported paths
for name in ${AB_PHASES:-tests train grpo profile long}; do
  case "${name}" in
    tests) phase tests 120 bash -c gpu_tests ;;
    train) phase train 150 bash -c 'train_benches --loss=chunked "${before}" "${after}" "${before}" "${after}"
      train_benches "--loss=chunked --breakdown" "${before}" "${after}"' ;;
    grpo) phase grpo 220 bash -c 'grpo "${before}" " " 64 8 256 256 4 64
      grpo "${after}" " " 64 8 256 256 4 64' ;;
    profile) phase profile 150 bash -c profiled ;;
    long) phase long 300 bash -c 'grpo "${before}" " " 32 8 256 1024 4 32
      grpo "${after}" " " 32 8 256 1024 4 32' ;;
    trl) phase trl 280 bash -c 'grpo "${after}" "64:0" 64 8 256 256 4 64' ;;
    ppo) phase ppo 240 bash -c 'grpo "${before}" " " 64 8 256 256 4 64 --critic
      grpo "${after}" " " 64 8 256 256 4 64 --critic' ;;
    *) echo "ab_suite: no phase '${name}'" >&2; exit 2 ;;
  esac
done
echo "== all phases done"
