#!/bin/bash
# Runs what tools/bench/stage.sh put in DIR, on a GPU machine, from the repository root (the PyTorch
# baselines are tools/bench/*_torch.py). Each job writes its records to RECORDS/<job>.jsonl, named by
# MONO_BENCH_COMMIT (the commit DIR was built from); back in the repository,
# `python3 tools/bench/benchmarks.py --take RECORDS/<job>.jsonl` takes each into BENCHMARKS.md.
#
#     MONO_BENCH_COMMIT=<commit> bash tools/bench/run.sh DIR RECORDS [JOB...]
#
# Jobs, in the order run when none is named:
#   step     mono bench: the whole step at 8K and 128K, 1 and 4 rows (MONO_STEP_ARGS adds options,
#            e.g. --layers 40 where one rank's 93 GB of weights do not fit)
#   trace    mono trace at 8K x 1 row: RECORDS/trace/ (step.json gzipped, the SVGs)
#   check    mono check --select at 1 and 4 rows (prints; no records)
#   probes mailbox indexer select linear moe half mla head front chain pages
#            the stage benches, each followed by its PyTorch baseline where it has one
# MONO_RUN_SECONDS (default 570) bounds the whole run: a job that would start later is skipped, and
# the one running then is stopped, so that a device call with a time limit still returns the
# records of the jobs that finished.
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,20p "$0"; exit 2; }
dir=$1 records=$2; shift 2
jobs=${*:-step trace check probes mailbox indexer select linear moe half mla head front chain pages}
: "${MONO_BENCH_COMMIT:?name the commit the binaries were built from}"
export MONO_BENCH_COMMIT MONO_CACHE=${MONO_CACHE:-/tmp/mono-cache}
mkdir -p "$records" && records=$(cd "$records" && pwd)
start=$(date +%s) budget=${MONO_RUN_SECONDS:-570}
extra=${MONO_STEP_ARGS:+ $MONO_STEP_ARGS}
step="--preset glm-5.2 --tp 8 --contexts 8192,131072 --rows 1,4 --replays 20$extra"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

# run JOB COMMAND-AS-RECORDED PROGRAM ARGS...: the program with its records file and command named.
run() {
  local job=$1 command=$2; shift 2
  local left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 15 ]; then echo "== $job: skipped, the run's $budget s are spent"; return; fi
  echo "== $job ($(date +%T), $left s left): $command"
  MONO_BENCH_JSON=$records/$job.jsonl MONO_BENCH_COMMAND=$command timeout "$left" "$@" 2>&1 |
    grep -v -e '^\s*$' -e '^weights: '
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || echo "== $job: exit status $rc"
}

# torch JOB SCRIPT: a PyTorch baseline, its records beside the job's.
torch() { run "$1-torch" "python3 tools/bench/$2" python3 "tools/bench/$2"; }

for job in $jobs; do
  case $job in
    step) run step "mono bench $step" "$dir/mono" bench $step ;;
    trace) run trace "mono trace --preset glm-5.2 --tp 8 --context 8192 --rows 1$extra" \
             "$dir/mono" trace --preset glm-5.2 --tp 8 --context 8192 --rows 1 ${MONO_STEP_ARGS:-} \
             --out "$records/trace"
           [ -f "$records/trace/step.json" ] && gzip -f "$records/trace/step.json" ;;
    check) for rows in 1 4; do
             run "check-$rows" "mono check --select --replays 12 --rows $rows$extra" \
               "$dir/mono" check --select --replays 12 --rows "$rows" ${MONO_STEP_ARGS:-}
           done ;;
    probes) run probes "cargo bench -p device --bench probes" "$dir/bench-device-probes" --bench
            torch probes torch_copy.py ;;
    mailbox) t="--ignored --nocapture --test-threads=1 handoff_latency_ring"
             run mailbox "cargo test --release -p mailbox --test gpu -- $t" "$dir/test-mailbox-gpu" $t ;;
    indexer) run indexer "cargo bench -p indexer --bench gpu" "$dir/bench-indexer-gpu" --bench
             torch indexer indexer_torch.py ;;
    select) picked=$(env | grep '^SELECT_BENCH_' | sort | tr '\n' ' ')  # the cases, if narrowed
            run select "${picked}cargo bench -p select --bench gpu" "$dir/bench-select-gpu" --bench
            torch select select_torch.py ;;
    linear) run linear "cargo bench -p linear --bench gpu" "$dir/bench-linear-gpu" --bench
            torch linear linear_torch.py ;;
    moe) run moe "cargo bench -p executor --bench moe" "$dir/bench-executor-moe" --bench
         torch moe moe_torch.py ;;
    mla) run mla "cargo bench -p mla --bench gpu" "$dir/bench-mla-gpu" --bench
         torch mla mla_torch.py ;;
    half | head | front | chain)
      run "$job" "cargo bench -p executor --bench $job" "$dir/bench-executor-$job" --bench ;;
    pages) run pages "cargo bench -p device --bench pages" "$dir/bench-device-pages" --bench ;;
    *) echo "run.sh: no job named $job (see the list at the top of $0)"; exit 2 ;;
  esac
done
echo "== done ($(date +%T), $(($(date +%s) - start)) s)"
