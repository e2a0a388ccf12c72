"""W1 and W2 from Python threads through the package (run by examples/bench.rs).

Usage: bench.py w1|w2 URL DURATION_S THREADS. Prints one JSON object.
"""

import json
import sys
import threading
import time

import redlease


def w1(client, url, duration):
    """Cycles of acquire + release through the package; with redis-py installed, also of
    redis-py's ``Lock`` (``SET NX PX`` and its release script, no fencing token, no
    renewal) and of the package's drop-in for it (``lock_class=redlease.redis_py.Lock``)
    through a redis-py client of the same server, in alternating slices of 200 ms so that
    the machine's drift hits them alike."""

    def ours():
        client.acquire("bench:py:w1", wait=0).release()

    def redis_py():
        lock = peer.lock("bench:py:w1:redis-py", timeout=30)
        lock.acquire(blocking=False)
        lock.release()

    def drop_in():
        lock = peer.lock("bench:py:w1:drop-in", lock_class=DropInLock, timeout=30)
        lock.acquire(blocking=False)
        lock.release()

    loops = [("cycle_us", ours)]
    try:
        import redis

        from redlease.redis_py import Lock as DropInLock

        peer = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        for _ in range(200):
            redis_py()
            drop_in()
        loops.append(("redis_py_lock_cycle_us", redis_py))
        loops.append(("drop_in_cycle_us", drop_in))
    except Exception as e:  # noqa: BLE001 (no redis-py, or it cannot reach this server)
        print(f"bench.py: redis-py's Lock not measured: {e!r}", file=sys.stderr)
    spent = {name: [0.0, 0] for name, _ in loops}
    for _ in range(200):
        ours()
    end = time.perf_counter() + duration * len(loops)
    while time.perf_counter() < end:
        for name, f in loops:
            start = time.perf_counter()
            n = 0
            while time.perf_counter() - start < 0.2:
                for _ in range(10):
                    f()
                n += 10
            spent[name][0] += time.perf_counter() - start
            spent[name][1] += n
    result = {name: t * 1e6 / n for name, (t, n) in spent.items()}
    result["cycles"] = spent["cycle_us"][1]
    return result


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
        result = w1(client, url, duration) if workload == "w1" else w2(client, duration, threads)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
