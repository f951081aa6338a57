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
#   icache   tools/probes/icache.cu, built here with nvcc: what code out of the SM's
#            instruction cache costs while the other SMs stream
#   stalls   (only when named) Nsight Compute's PC samples of one MoE shared-indexer launch:
#            RECORDS/stalls.csv, for tools/sass/stalls.py (no records)
# MONO_RUN_SECONDS, where set, bounds the whole run: a job that would start later is skipped, and
# the one running then is stopped, so that a run with a time limit still leaves the records of the
# jobs that finished.
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,20p "$0"; exit 2; }
dir=$1 records=$2; shift 2
jobs=${*:-step trace check probes mailbox indexer select linear moe half mla head front chain pages icache}
: "${MONO_BENCH_COMMIT:?name the commit the binaries were built from}"
export MONO_BENCH_COMMIT MONO_CACHE=${MONO_CACHE:-/tmp/mono-cache}
mkdir -p "$records" && records=$(cd "$records" && pwd)
start=$(date +%s) budget=${MONO_RUN_SECONDS:-}
extra=${MONO_STEP_ARGS:+ $MONO_STEP_ARGS}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

# run JOB COMMAND-AS-RECORDED PROGRAM ARGS...: the program with its records file and command named.
run() {
  local job=$1 command=$2; shift 2
  local limit=()
  if [ -n "$budget" ]; then
    local left=$((budget - ($(date +%s) - start)))
    if [ "$left" -lt 15 ]; then echo "== $job: skipped, the run's $budget s are spent"; return; fi
    limit=(timeout "$left")
  fi
  echo "== $job ($(date +%T)): $command"
  MONO_BENCH_JSON=$records/$job.jsonl MONO_BENCH_COMMAND=$command "${limit[@]}" "$@" 2>&1 |
    grep -v -e '^\s*$' -e '^weights: '
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || echo "== $job: exit status $rc"
}

# mono JOB ARGS [-- MORE]: mono with ARGS (and MONO_STEP_ARGS), recorded as `mono ARGS`; MORE
# (where its output goes) is passed but not recorded.
mono() {
  local job=$1 args=$2$extra; shift 2
  run "$job" "mono $args" "$dir/mono" $args "$@"
}

# bench JOB CRATE NAME: `cargo bench -p CRATE --bench NAME` as stage.sh staged it.
bench() { run "$1" "${picked:-}cargo bench -p $2 --bench $3" "$dir/bench-$2-$3" --bench; }

# torch JOB SCRIPT: a PyTorch baseline, its records beside the job's.
torch() { run "$1-torch" "python3 tools/bench/$2" python3 "tools/bench/$2"; }

for job in $jobs; do
  case $job in
    step) mono step "bench --preset glm-5.2 --tp 8 --contexts 8192,131072 --rows 1,4 --replays 20" ;;
    trace) mono trace "trace --preset glm-5.2 --tp 8 --context 8192 --rows 1" --out "$records/trace"
           [ -f "$records/trace/step.json" ] && gzip -f "$records/trace/step.json" ;;
    check) for rows in 1 4; do mono "check-$rows" "check --select --replays 12 --rows $rows"; done ;;
    probes) bench probes device probes; torch probes torch_copy.py ;;
    mailbox) t="--ignored --nocapture --test-threads=1 handoff_latency_ring"
             run mailbox "cargo test --release -p mailbox --test gpu -- $t" "$dir/test-mailbox-gpu" $t ;;
    indexer) bench indexer indexer gpu; torch indexer indexer_torch.py ;;
    select) picked=$(env | grep '^SELECT_BENCH_' | sort | tr '\n' ' ')  # the cases, if narrowed
            bench select select gpu; picked=
            torch select select_torch.py ;;
    linear) bench linear linear gpu; torch linear linear_torch.py ;;
    moe) bench moe executor moe; torch moe moe_torch.py ;;
    mla) bench mla mla gpu; torch mla mla_torch.py ;;
    half | head | front | chain) bench "$job" executor "$job" ;;
    pages) bench pages device pages ;;
    icache) build="-O3 -gencode=arch=compute_90a,code=sm_90a tools/probes/icache.cu"
            nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
            "$nvcc" $build -o /tmp/icache && run icache "nvcc $build" /tmp/icache ;;
    stalls) ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
            # shellcheck disable=SC2086 # $extra is MONO_STEP_ARGS, split into its options
            run stalls "ncu ... mono dump --preset glm-5.2 --tp 8 --rows 1$extra" "$ncu" --replay-mode application \
              --cache-control none --clock-control none -k regex:mono_layer --launch-skip 46 --launch-count 1 \
              --section SourceCounters -f -o "$records/stalls" "$dir/mono" dump --preset glm-5.2 --tp 8 --rows 1 \
              $extra --out /tmp/stalls-digests &&
              "$ncu" -i "$records/stalls.ncu-rep" --page source --csv --print-source sass > "$records/stalls.csv" ;;
    *) echo "run.sh: no job named $job (see the list at the top of $0)"; exit 2 ;;
  esac
done
echo "== done ($(date +%T), $(($(date +%s) - start)) s)"
