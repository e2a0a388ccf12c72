"""The README's Performance table, from the JSON lines scripts/perf.sh collected.

Usage: perf_table.py RESULTS.jsonl HEAD BASE REPS DURATION_S W3_SECS

Each line is one workload's JSON object from examples/bench (run with --reps 1), tagged
with "commit" and "rep". A cell is the median over the reps, with the spread (min-max).
"""

import datetime
import json
import platform
import subprocess
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def values(rows, commit, match, key):
    out = []
    for r in rows:
        if r.get("commit") != commit or not match(r):
            continue
        v = dig(r, key)
        if key == "cpu_ratio_to_reference":
            # Older benchmarks give the two figures, not their ratio.
            ours = r.get("cpu_percent_of_one_core")
            ref = r.get("idle_thread_per_lock_cpu_percent")
            v = ours / ref if ours and ref else v
        if isinstance(v, (int, float)):
            out.append(float(v))
    return out


def cell(vs, fmt):
    if not vs:
        return "-"
    vs = sorted(vs)
    med = vs[len(vs) // 2]
    if len(vs) == 1 or vs[0] == vs[-1]:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(vs[0])}-{fmt.format(vs[-1])}]"


def workload(prefix, cluster=False, **fields):
    """Rows of the workload whose name begins with ``prefix`` (and whose fields equal
    ``fields``), on one server or, with ``cluster``, on the 3-primary cluster."""

    def match(r):
        w = r.get("workload", "")
        return (
            w.startswith(prefix)
            and bool(r.get("cluster")) == cluster
            and all(r.get(k) == v for k, v in fields.items())
        )

    return match


def ends(prefix, ms):
    def match(r):
        w = r.get("workload", "")
        return (
            w.startswith(prefix)
            and w.endswith(f" {ms} ms critical section")
            and not r.get("cluster")
        )

    return match


def on_cluster(rows, commit, prefix, key, rate):
    """Per rep, the cluster's figure ``key`` of workload ``prefix`` ÷ the single server's
    of the same rep; ``rate``: the figure is a rate (else a time per cycle, inverted)."""
    out = []
    for r in rows:
        on_it = r.get("commit") == commit and r.get("cluster")
        if not on_it or not r.get("workload", "").startswith(prefix):
            continue
        single = [
            s for s in rows
            if s.get("commit") == commit and s.get("rep") == r.get("rep")
            and not s.get("cluster") and s.get("workload") == r.get("workload")
        ]
        a, b = dig(r, key), dig(single[0], key) if single else None
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0:
            out.append(a / b if rate else b / a)
    return out


def dig(row, key):
    v = row
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) // 1024 // 1024} GB"
    except OSError:
        pass
    redis = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True
    ).stdout.split()
    version = next((w[2:] for w in redis if w.startswith("v=")), "?")
    return f"{cpu}, {cores} cores, {mem}, Linux {platform.release()}, Redis {version}"


def main():
    path, head, base, reps, duration, w3_secs = sys.argv[1:7]
    rows = load(path)
    w1 = workload("W1 uncontended")
    w1py = workload("W1 from Python")
    w2 = lambda ms: workload(f"W2 contended, 8 threads, {ms} ms")  # noqa: E731
    w2c = lambda ms: workload(f"W2 contended, 8 threads, {ms} ms", cluster=True)  # noqa: E731
    w2py = workload("W2 from Python threads")
    w2r = lambda n, ms: workload(f"W2 Redlock {n}, 8 threads, {ms} ms")  # noqa: E731
    sem = lambda ms: ends("semaphore", ms)  # noqa: E731
    rw = lambda ms: ends("read-write", ms)  # noqa: E731
    w3 = lambda n: workload("W3 renewal", locks=n)  # noqa: E731

    lines = [
        # (label, match, key, format)
        ("W1 Rust API, cycles/s ÷ floor's", w1, "rust_ratio_to_floor", "inv"),
        ("W1 C ABI, cycles/s ÷ floor's", w1, "c_abi_ratio_to_floor", "inv"),
        ("W1 Python, cycles/s ÷ floor's", w1py, "python_ratio_to_floor", "inv"),
        ("W1 Python, redis-py's `Lock` (peer), cycles/s ÷ floor's", w1py, "redis_py_lock_ratio_to_floor", "inv"),
        ("W1 Python, `redlease.redis_py.Lock` (drop-in), cycles/s ÷ floor's", w1py, "drop_in_ratio_to_floor", "inv"),
        ("W1 floor cycle, µs", w1, "floor_cycle_us", "{:.0f}"),
        ("W1 server CPU per cycle, µs: floor / Rust", w1, "floor_server_cpu_us_per_cycle", "{:.1f}"),
        ("", w1, "rust_server_cpu_us_per_cycle", "{:.1f}"),
        ("W1 client CPU per cycle, µs: floor / Rust", w1, "floor_client_cpu_us_per_cycle", "{:.1f}"),
        ("", w1, "rust_client_cpu_us_per_cycle", "{:.1f}"),
        ("W1 Redlock 3, cycles/s ÷ 3-node floor's", w1, "redlock_3_ratio_to_nodes_floor", "inv"),
        ("W1 Redlock 5, cycles/s ÷ 5-node floor's", w1, "redlock_5_ratio_to_nodes_floor", "inv"),
        ("W1 Redlock 3 / 5, cycle ÷ one server's", w1, "redlock_3_ratio_to_single_server", "{:.2f}"),
        ("", w1, "redlock_5_ratio_to_single_server", "{:.2f}"),
        ("W2 0 ms, acquisitions/s ÷ floor's", w2(0), "acquisitions_ratio_to_floor", "{:.2f}"),
        ("W2 0 ms, fair floor's acquisitions/s ÷ floor's", w2(0), "fair_floor_acquisitions_ratio_to_floor", "{:.2f}"),
        ("W2 0 ms, acquisitions/s ÷ fair floor's", w2(0), "acquisitions_ratio_to_fair_floor", "{:.2f}"),
        ("W2 0 ms, fairness", w2(0), "redlease.fairness_min_over_max", "{:.2f}"),
        ("W2 0 ms, server commands per acquisition", w2(0), "redlease.server_commands_per_acquisition", "{:.1f}"),
        ("W2 1 ms, acquisitions/s ÷ floor's", w2(1), "acquisitions_ratio_to_floor", "{:.2f}"),
        ("W2 1 ms, fairness", w2(1), "redlease.fairness_min_over_max", "{:.3f}"),
        ("W2 Python 0 ms, acquisitions/s", w2py, "acquisitions_per_s", "{:.0f}"),
        ("W2 Redlock 3 / 5, 0 ms, acquisitions/s ÷ N-node floor's", w2r(3, 0), "acquisitions_ratio_to_nodes_floor", "{:.2f}"),
        ("", w2r(5, 0), "acquisitions_ratio_to_nodes_floor", "{:.2f}"),
        ("W2 Redlock 3 / 5, 0 ms, fairness", w2r(3, 0), "redlease.fairness_min_over_max", "{:.2f}"),
        ("", w2r(5, 0), "redlease.fairness_min_over_max", "{:.2f}"),
        ("W2 Redlock 3 / 5, 1 ms, acquisitions/s ÷ N-node floor's", w2r(3, 1), "acquisitions_ratio_to_nodes_floor", "{:.2f}"),
        ("", w2r(5, 1), "acquisitions_ratio_to_nodes_floor", "{:.2f}"),
        ("Semaphore 0 ms, acquisitions/s ÷ floor's", sem(0), "acquisitions_ratio_to_floor", "{:.2f}"),
        ("Semaphore 1 ms, acquisitions/s ÷ floor's", sem(1), "acquisitions_ratio_to_floor", "{:.2f}"),
        ("Read-write 0 ms, acquisitions/s ÷ floor's", rw(0), "acquisitions_ratio_to_floor", "{:.2f}"),
        ("Read-write 1 ms, acquisitions/s ÷ floor's", rw(1), "acquisitions_ratio_to_floor", "{:.2f}"),
        ("W3 200 locks, CPU ÷ idle thread-per-lock", w3(200), "cpu_ratio_to_reference", "{:.2f}"),
        ("W3 200 locks, renewal lateness p99, ms", w3(200), "renewal_lateness_p99_ms", "{:.0f}"),
        ("W3 1000 locks, CPU ÷ idle thread-per-lock", w3(1000), "cpu_ratio_to_reference", "{:.2f}"),
        ("W3 1000 locks, renewal lateness p99, ms", w3(1000), "renewal_lateness_p99_ms", "{:.0f}"),
        ("W3 1000 locks, locks lost", w3(1000), "lost", "{:.0f}"),
        # The same commit on a 3-primary cluster, right after its single-server run.
        ("Cluster W1 Rust / C, cycles/s ÷ one server's", "W1 uncontended", "rust_cycle_us", "cluster-time"),
        ("", "W1 uncontended", "c_abi_cycle_us", "cluster-time"),
        ("Cluster W1 floor, cycles/s ÷ one server's", "W1 uncontended", "floor_cycle_us", "cluster-time"),
        ("Cluster W2 0 ms / 1 ms, acquisitions/s ÷ one server's", "W2 contended, 8 threads, 0 ms", "redlease.acquisitions_per_s", "cluster-rate"),
        ("", "W2 contended, 8 threads, 1 ms", "redlease.acquisitions_per_s", "cluster-rate"),
        ("Cluster W2 0 ms / 1 ms, fairness", w2c(0), "redlease.fairness_min_over_max", "{:.2f}"),
        ("", w2c(1), "redlease.fairness_min_over_max", "{:.3f}"),
    ]
    out = [
        f"Measured {datetime.date.today().isoformat()} by `scripts/perf.sh` ({reps} reps of "
        f"{duration} s per figure, W3 held {w3_secs} s), on {machine()}; release build, "
        "loopback TCP. Each figure is the median over the reps with the spread [min-max]; "
        "a ratio compares the library with its floor measured in the same process, moments "
        "apart (higher is better for /s, lower for CPU and lateness).",
        "",
        f"| figure | `{head}` | `{base}` (earlier commit, same run) |",
        "| --- | --- | --- |",
    ]
    for label, match, key, fmt in lines:
        cells = []
        for commit in (head, base):
            if fmt.startswith("cluster-"):
                # `match` is the workload's name: the cluster's figure ÷ one server's.
                vs = on_cluster(rows, commit, match, key, rate=fmt == "cluster-rate")
                fmt_ = "{:.2f}"
            elif fmt == "inv":
                # The benchmark gives cycle time ÷ the floor's; a rate ratio is its inverse.
                vs = [1.0 / v for v in values(rows, commit, match, key) if v > 0]
                fmt_ = "{:.2f}"
            else:
                vs = values(rows, commit, match, key)
                fmt_ = fmt
            cells.append(cell(vs, fmt_))
        if label == "":
            # The second half of a "3 / 5" row.
            prev = out.pop()
            parts = prev.split(" | ")
            out.append(
                f"{parts[0]} | {parts[1]} / {cells[0]} | {parts[2].rstrip(' |')} / {cells[1]} |"
            )
            continue
        out.append(f"| {label} | {cells[0]} | {cells[1]} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
