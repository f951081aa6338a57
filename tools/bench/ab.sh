#!/bin/bash
# Builds timed against each other on one GPU: each revision's `mono`, built here and run there in
# turn, so that every build's figure comes from the same call on the same card (two calls, or two
# cards, differ by more than most changes move the step).
#
#     bash tools/bench/ab.sh stage DIR REV...            # here: DIR/mono-<REV> for each revision
#     bash tools/bench/ab.sh run DIR ROUNDS NAME... [-- BENCH ARGS...]   # there, from the root
#
# stage builds each revision in a worktree of its own under target/ab/ (its own target folder, so
# that no artifact of one revision is taken for another's; the first build of each is a full one),
# and puts a stripped `mono` in DIR under the name mono-<REV> (a '/' in REV becomes '-'). The
# worktrees stay for the next stage, which then builds only what changed (`git worktree remove
# target/ab/<REV>` drops one).
#
# run times DIR/NAME's `mono bench` for each NAME in turn, ROUNDS times over (A B A B ...: a drift
# of the card over the call then shows as a difference between rounds, not between builds). The
# bench arguments default to `--preset glm-5.2 --tp 8 --contexts 8192 --rows 1,4 --replays 20`;
# add `--layers 40` where the rank's weights do not fit. Each build's output goes to
# DIR/ab/NAME.txt; at the end a table gives each case's step and launch kinds, a column a run.
# MONO_RUN_SECONDS, where set, bounds the run: a bench that would start later than the longest
# so far could end is skipped, so that a device call with a limit still prints its table. A
# build's first run builds its kernels (about 80 s on an H100; MONO_CACHE keeps them for the next).
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,22p "$0"; exit 2; }
mode=$1 dir=$2; shift 2
mkdir -p "$dir"

case $mode in
  stage)
    [ $# -ge 1 ] || { echo "ab.sh stage: name at least one revision" >&2; exit 2; }
    root=$(git rev-parse --show-toplevel) || exit 1
    for rev in "$@"; do
      slug=${rev//\//-}
      name=mono-$slug tree=$root/target/ab/$slug
      commit=$(git rev-parse --verify "$rev^{commit}") || exit 1
      if [ -d "$tree" ]; then
        git -C "$tree" checkout -q --detach "$commit" || exit 1
      else
        git worktree add -q --detach "$tree" "$commit" || exit 1
      fi
      echo "== $rev ($commit)"
      (cd "$tree" && CARGO_TARGET_DIR=$tree-build cargo build --release --bin mono) || exit 1
      cp "$tree-build/release/mono" "$dir/$name" && strip "$dir/$name" || exit 1
      echo "$dir/$name"
    done
    ;;
  run)
    [ $# -ge 1 ] || { echo "ab.sh run: name ROUNDS and at least one build" >&2; exit 2; }
    rounds=$1; shift
    names=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do names+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    [[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh run: ROUNDS is a count, not '$rounds'" >&2; exit 2; }
    [ ${#names[@]} -gt 0 ] || { echo "ab.sh run: name at least one build" >&2; exit 2; }
    args=("$@")
    [ ${#args[@]} -gt 0 ] || args=(--preset glm-5.2 --tp 8 --contexts 8192 --rows 1,4 --replays 20)
    for n in "${names[@]}"; do
      [ -x "$dir/$n" ] || { echo "ab.sh run: no build $dir/$n" >&2; exit 2; }
    done
    export MONO_CACHE=${MONO_CACHE:-/tmp/mono-cache}
    mkdir -p "$dir/ab" && rm -f "$dir/ab"/*.txt
    start=$(date +%s) budget=${MONO_RUN_SECONDS:-} longest=0
    for ((r = 1; r <= rounds; r++)); do
      for n in "${names[@]}"; do
        now=$(date +%s)
        if [ -n "$budget" ] && [ $((now - start + longest)) -gt "$budget" ]; then
          echo "== $n, round $r: skipped, the run's $budget s would be spent"
          continue
        fi
        echo "== $n, round $r ($(date +%T))"
        echo "== round $r" >> "$dir/ab/$n.txt"
        "$dir/$n" bench "${args[@]}" 2>&1 | tr '\r' '\n' | grep -v -e '^weights: ' -e '^\s*$' |
          tee -a "$dir/ab/$n.txt"
        took=$(($(date +%s) - now))
        [ "$took" -gt "$longest" ] && longest=$took
      done
    done
    python3 - "$dir/ab" "${names[@]}" <<'EOF'
"""Each build's step and launch kinds, a column a run, from the bench output ab.sh kept."""
import re, sys, pathlib
folder, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
rows = {}
for name in names:
    case = None
    for line in (folder / f"{name}.txt").read_text().splitlines():
        step = re.match(r"(.*?): step ([0-9.]+) ms", line)
        if step:
            case = step.group(1)
            rows.setdefault((case, "step"), {}).setdefault(name, []).append(step.group(2))
            continue
        kind = re.match(r"\s+(.*?): ([0-9.]+) ms each", line)
        if kind and case:
            rows.setdefault((case, kind.group(1)), {}).setdefault(name, []).append(kind.group(2))
print("\n" + " | ".join(["case", "what"] + [f"{n} (ms, a run each)" for n in names]))
for (case, what), by in rows.items():
    print(" | ".join([case, what] + [" ".join(by.get(n, ["-"])) for n in names]))
EOF
    ;;
  *)
    echo "ab.sh: stage or run (see the top of $0)" >&2
    exit 2
    ;;
esac
