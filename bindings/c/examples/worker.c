/*
 * An example worker daemon: takes a lock per job, hands the fencing token to the storage,
 * handles LOCK_BUSY and lost locks, and shuts down cleanly on SIGTERM or SIGINT, also while
 * it is blocked waiting for a lock: the signal handler calls lock_cancel_all (which is
 * async-signal-safe), and every waiting acquire returns LOCK_CANCELLED.
 *
 *   cc -std=c99 -Wall -Wextra -Iinclude bindings/c/examples/worker.c \
 *      -Ltarget/release -lredlease -o worker
 *   LD_LIBRARY_PATH=target/release ./worker redis://127.0.0.1:6379/0
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redlease.h"

static volatile sig_atomic_t stopping;

/* A job waits this long for its lock before it is left for later (another worker may hold
 * it for a long time). SIGTERM does not wait for it: see on_signal. */
#define JOB_LOCK_WAIT_MS 30000

static void on_signal(int sig) {
    int saved_errno = errno;
    (void)sig;
    stopping = 1;
    /* Wakes every thread blocked in lock_acquire (LOCK_CANCELLED), and makes every acquire
     * that would wait from now on return LOCK_CANCELLED at once, so that a signal that
     * lands between the check of `stopping` and the acquire is not missed either. */
    lock_cancel_all();
    errno = saved_errno;
}

/* Set from the renewal thread when a lock is lost; checked before committing a job. */
static volatile sig_atomic_t lost;

static void on_lost(lock_t lock, int32_t reason, void *user_data) {
    (void)lock;
    (void)user_data;
    lost = 1;
    fprintf(stderr, "worker: lock lost (%s)\n",
            reason == LOCK_LOST_UNREACHABLE ? "Redis unreachable" : "taken or expired");
}

/* Stands in for a storage that rejects writes older than the newest fencing token. */
static uint64_t storage_highest_token;

static int storage_write(unsigned job, uint64_t fencing_token) {
    if (fencing_token <= storage_highest_token) return -1;
    storage_highest_token = fencing_token;
    (void)job;
    return 0;
}

static void sleep_ms(long ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    const char *url = argc > 1 ? argv[1] : "redis://127.0.0.1:6379/0";
    struct sigaction sa;
    lock_client_options_t client_opts;
    lock_acquire_options_t lock_opts;
    lock_client_t client;
    unsigned job = 0, done = 0, busy = 0, errors = 0;
    int32_t status;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    lock_client_options_init(&client_opts, sizeof client_opts);
    client_opts.key_prefix = "worker-example:";
    client_opts.io_timeout_ms = 1000;
    if (lock_client_open_opts(url, &client_opts, &client) != LOCK_OK) {
        fprintf(stderr, "worker: cannot open client: %s\n", lock_last_error());
        return 1;
    }
    lock_acquire_options_init(&lock_opts, sizeof lock_opts);
    lock_opts.on_lost = on_lost;

    printf("worker: redlease %s, processing jobs until SIGTERM\n", lock_version());
    fflush(stdout);
    while (!stopping) {
        char key[64];
        lock_t lock;
        uint64_t fencing_token = 0;

        job++;
        snprintf(key, sizeof key, "job:%u", job % 4);
        status = lock_acquire_opts(client, key, 5000, JOB_LOCK_WAIT_MS, &lock_opts, &lock);
        if (status == LOCK_CANCELLED) {
            /* Stopping: SIGTERM or SIGINT arrived while we waited (or just before). */
            printf("worker: waiting for %s cancelled: stopping\n", key);
            break;
        }
        if (status == LOCK_BUSY) {
            busy++; /* another worker has had this job all along; try the next one */
            continue;
        }
        if (status != LOCK_OK) {
            errors++;
            fprintf(stderr, "worker: acquire %s: %s: %s\n", key, lock_status_name(status),
                    lock_last_error());
            sleep_ms(200); /* Redis unreachable: back off, then go on */
            continue;
        }
        lost = 0;
        lock_fencing_token(lock, &fencing_token);
        sleep_ms(2); /* the job's work */
        if (lost || storage_write(job, fencing_token) != 0) {
            fprintf(stderr, "worker: job %u not committed (lock lost or stale token)\n", job);
        } else {
            done++;
        }
        status = lock_release(lock);
        if (status == LOCK_NOT_HELD) {
            fprintf(stderr, "worker: job %u outlived its lease\n", job);
        } else if (status != LOCK_OK) {
            fprintf(stderr, "worker: release: %s\n", lock_last_error());
        }
    }
    lock_client_close(client);
    printf("worker: stopped cleanly: %u jobs done, %u busy, %u errors\n", done, busy, errors);
    return 0;
}
