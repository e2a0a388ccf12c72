#!/usr/bin/env bash
# The README's Performance figures: measures this checkout and an earlier commit in one
# run, rep by rep in turn, and writes the table between the README's perf markers.
#
#   scripts/perf.sh [--base REV] [--reps N] [--duration S] [--w3-locks N,M] [--w3-secs S]
#                   [--python PY] [--no-cluster] [--no-write]
#
# --base        the commit to compare with (default HEAD~1); built in target/perf/<sha>
# --reps        how many times each of the two benchmark programs runs (default 3)
# --python      the Python that runs the Python figures (default python3); with redis-py
#               installed there, redis-py's Lock is measured beside the package
# --no-cluster  skip W1 and W2 on a 3-primary cluster (run after each single-server run)
# --no-write    print the table and leave README.md alone
#
# Each run of examples/bench measures its own floor beside the library (see that file), so
# every figure is a ratio in one run; the table gives the median over the reps with the
# spread (min-max). The cluster's figures are set against the same commit's single-server
# figures of the same rep. The machine should be otherwise idle: timings are the machine's
# too. About 7 minutes per rep with the defaults. Raw JSON lines: target/perf/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

base=HEAD~1 reps=3 duration=2 w3_locks=200,1000 w3_secs=15 python=python3 cluster=yes write=yes
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --w3-locks) w3_locks=$2; shift 2 ;;
    --w3-secs) w3_secs=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --no-cluster) cluster=no; shift ;;
    --no-write) write=no; shift ;;
    *) echo "usage: see the comment at the top of $0" >&2; exit 2 ;;
  esac
done

head_sha=$(git rev-parse --short HEAD)
base_sha=$(git rev-parse --short "$base^{commit}")
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo "+changes" || true)
out=target/perf
mkdir -p "$out"
base_tree="$out/$base_sha"

# Both builds first, so that no compile runs while anything is measured.
cargo build --quiet --release --lib --example bench
if [ ! -d "$base_tree" ]; then
  git worktree add --quiet --detach "$base_tree" "$base_sha"
fi
(cd "$base_tree" && cargo build --quiet --release --lib --example bench)

args=(--reps 1 --duration "$duration" --w3-locks "$w3_locks" --w3-secs "$w3_secs"
      --redlock 3,5 --python "$python")
results="$out/results.jsonl"
: > "$results"
run() { # label tree
  "$2/target/release/examples/bench" "${args[@]}" \
    | sed "s/^{/{\"commit\": \"$1\", \"rep\": $rep, /" >> "$results"
  if [ "$cluster" = yes ]; then
    "$2/target/release/examples/bench" --cluster --only w1,w2 --python none --redlock none \
        --reps 1 --duration "$duration" \
      | sed "s/^{/{\"commit\": \"$1\", \"rep\": $rep, \"cluster\": 1, /" >> "$results"
  fi
}
for rep in $(seq 1 "$reps"); do
  # Alternate which one goes first, so that neither always runs on a warmer machine.
  if [ $((rep % 2)) = 1 ]; then
    run "$head_sha$dirty" . && run "$base_sha" "$base_tree"
  else
    run "$base_sha" "$base_tree" && run "$head_sha$dirty" .
  fi
  echo "perf.sh: rep $rep of $reps done" >&2
done

table=$(python3 scripts/perf_table.py "$results" "$head_sha$dirty" "$base_sha" \
  "$reps" "$duration" "$w3_secs")
if [ "$write" = no ]; then
  echo "$table"
  exit 0
fi
python3 - "$table" <<'EOF'
import re, sys
readme = open("README.md").read()
begin, end = "<!-- perf:begin -->", "<!-- perf:end -->"
if begin not in readme or end not in readme:
    sys.exit("README.md has no perf markers")
head, rest = readme.split(begin, 1)
_, tail = rest.split(end, 1)
open("README.md", "w").write(head + begin + "\n" + sys.argv[1] + "\n" + end + tail)
EOF
echo "perf.sh: README.md updated" >&2
