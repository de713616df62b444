# Resumable phases for the GPU suites (peer_suite.sh, ab_suite.sh), sourced: a phase starts only
# when its estimated time is left of SECONDS, and a later call (the machine kept warm, /tmp kept)
# goes on after the last phase done.
#   phases_begin SECONDS OUT_DIR DONE_FILE
#   phase NAME ESTIMATE_S COMMAND...   (output tee'd to OUT_DIR/NAME.txt)
# shellcheck shell=bash
phases_begin() {
  phases_end=$(($(date +%s) + $1))
  phases_out=$2
  phases_done=$3
  mkdir -p "${phases_out}"
}

phases_left() { echo $((phases_end - $(date +%s))); }

phase() {  # NAME ESTIMATE_S COMMAND...
  local name=$1 estimate=$2
  shift 2
  grep -qx "${name}" "${phases_done}" 2>/dev/null && return 0
  if (($(phases_left) <= estimate)); then
    echo "== ${name} needs about ${estimate} s, $(phases_left) s left: run again for the rest"
    exit 0
  fi
  echo "== ${name} ($(phases_left) s left, $(date +%T))"
  local start
  start=$(date +%s)
  timeout $(($(phases_left) - 5)) "$@" 2>&1 | tee "${phases_out}/${name}.txt"
  echo "== ${name} took $(($(date +%s) - start)) s"
  echo "${name}" >> "${phases_done}"
}
