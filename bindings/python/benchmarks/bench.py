"""W1 and W2 from Python threads through the package (run by examples/bench.rs).

Usage: bench.py w1|w2 URL DURATION_S THREADS. Prints one JSON object.
"""

import json
import sys
import threading
import time

import redlease


def w1(client, duration):
    for _ in range(200):
        client.acquire("bench:py:w1", wait=0).release()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        for _ in range(50):
            client.acquire("bench:py:w1", wait=0).release()
        n += 50
    return {"cycle_us": (time.perf_counter() - start) * 1e6 / n, "cycles": n}


def w2(client, duration, threads):
    # Handoff latency of acquisition n: its acquire's return minus the return of release
    # n - 1 (negative when the lock reached n before that release returned).
    stop = threading.Event()
    sequence = [0]
    events, counts = [], [0] * threads
    barrier = threading.Barrier(threads + 1)

    def run(i):
        mine = []
        barrier.wait()
        while not stop.is_set():
            lk = client.acquire("bench:py:w2", wait=None)
            acquired = time.perf_counter()
            n = sequence[0]
            sequence[0] = n + 1
            lk.release()
            mine.append((n, acquired, time.perf_counter()))
            counts[i] += 1
        events.extend(mine)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    time.sleep(duration)
    stop.set()
    elapsed = time.perf_counter() - start
    for t in ts:
        t.join()
    events.sort()
    latencies = sorted(
        (b[1] - a[2]) * 1e6 for a, b in zip(events, events[1:]) if b[0] == a[0] + 1
    )
    pick = lambda p: latencies[int((len(latencies) - 1) * p)] if latencies else float("nan")  # noqa: E731
    return {
        "acquisitions_per_s": sum(counts) / elapsed,
        "fairness_min_over_max": min(counts) / max(max(counts), 1),
        "handoff_p50_us": pick(0.5),
        "handoff_p99_us": pick(0.99),
    }


def main():
    workload, url, duration, threads = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    with redlease.Client(url) as client:
        result = w1(client, duration) if workload == "w1" else w2(client, duration, threads)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
