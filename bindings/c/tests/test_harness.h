/*
 * What the C test programs share: CHECK macros, the server's address, a raw RESP client for
 * checking the server's state behind the library's back, and clocks.
 *
 * Include it once per program, after the feature-test macro and before anything else of the
 * program's own. Everything here is static (each program is one translation unit); the
 * helpers are static inline so that a program need not use them all.
 *
 * Environment: REDIS_URL, REDIS_HOST, REDIS_PORT (set by tests/abi/c_programs.rs);
 * REDLEASE_TEST_SLOW (set under the sanitizers and valgrind: timing bounds, and the short
 * leases that must survive or lapse on time, are multiplied by it).
 */
#ifndef REDLEASE_TEST_HARNESS_H
#define REDLEASE_TEST_HARNESS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "redlease.h"

/* CHECK and CHECK_STATUS count into these; use them on the main thread only (threads record
 * what they saw, the main thread checks it after joining them). */
static int passed, failed;

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (cond) {                                                                \
            passed++;                                                              \
        } else {                                                                   \
            failed++;                                                              \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, \
                    __LINE__, #cond, lock_last_error());                          \
        }                                                                          \
    } while (0)

#define CHECK_STATUS(call, expected)                                                \
    do {                                                                            \
        int32_t status_ = (call);                                                   \
        if (status_ == (expected)) {                                                \
            passed++;                                                               \
        } else {                                                                    \
            failed++;                                                               \
            fprintf(stderr, "%s:%d: %s gave %s, expected %s (last error: %s)\n",    \
                    __FILE__, __LINE__, #call, lock_status_name(status_),           \
                    lock_status_name(expected), lock_last_error());                 \
        }                                                                           \
    } while (0)

static const char *url;
static const char *host;
static int port;
/* Timing bounds and short leases are multiplied by this (REDLEASE_TEST_SLOW, 1 by default). */
static long slack = 1;

/* Reads the environment; returns 0, or prints what is missing and returns -1. */
static inline int harness_init(void) {
    const char *port_text = getenv("REDIS_PORT");
    const char *slow = getenv("REDLEASE_TEST_SLOW");
    url = getenv("REDIS_URL");
    host = getenv("REDIS_HOST");
    if (!url || !host || !port_text) {
        fprintf(stderr, "set REDIS_URL, REDIS_HOST and REDIS_PORT\n");
        return -1;
    }
    port = atoi(port_text);
    if (slow && atol(slow) > 1) slack = atol(slow);
    return 0;
}

/* A positive integer from the environment, or fallback. */
static inline long env_long(const char *name, long fallback) {
    const char *text = getenv(name);
    long value = text ? atol(text) : 0;
    return value > 0 ? value : fallback;
}

/* Sleeps ms milliseconds, also when a signal interrupts the sleep. */
static inline void sleep_ms(long ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A monotonic clock in milliseconds. */
static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* Sends one command (RESP) on a fresh connection and returns the first reply line in
 * reply (without CRLF); for a bulk string, the string itself. Returns 0 on success. */
static inline int raw_command(char *reply, size_t reply_len, int argc, const char **argv) {
    char buf[4096];
    size_t n = 0;
    int i, fd;
    ssize_t got;
    struct sockaddr_in addr;

    n += (size_t)snprintf(buf + n, sizeof buf - n, "*%d\r\n", argc);
    for (i = 0; i < argc; i++) {
        n += (size_t)snprintf(buf + n, sizeof buf - n, "$%zu\r\n%s\r\n", strlen(argv[i]),
                              argv[i]);
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &addr.sin_addr);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        write(fd, buf, n) != (ssize_t)n) {
        close(fd);
        return -1;
    }
    do {
        got = read(fd, buf, sizeof buf - 1);
    } while (got < 0 && errno == EINTR);
    close(fd);
    if (got <= 0) return -1;
    buf[got] = '\0';
    if (buf[0] == '$') {
        char *body = strstr(buf, "\r\n");
        if (buf[1] == '-') {
            snprintf(reply, reply_len, "(nil)");
            return 0;
        }
        if (!body) return -1;
        body += 2;
        body[strcspn(body, "\r")] = '\0';
        snprintf(reply, reply_len, "%s", body);
    } else {
        buf[strcspn(buf, "\r")] = '\0';
        snprintf(reply, reply_len, "%s", buf + 1);
    }
    return 0;
}

/* An integer reply to a command of at most one argument; -1000 when it failed. */
static inline long raw_integer(const char *cmd, const char *arg) {
    char reply[256];
    const char *argv[2];
    argv[0] = cmd;
    argv[1] = arg;
    if (raw_command(reply, sizeof reply, arg ? 2 : 1, argv) != 0) return -1000;
    return strtol(reply, NULL, 10);
}

static inline lock_client_t open_client(void) {
    lock_client_t client = 0;
    CHECK_STATUS(lock_client_open(url, &client), LOCK_OK);
    return client;
}

/* Prints the tally; the exit status of main. */
static inline int harness_report(void) {
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}

#endif /* REDLEASE_TEST_HARNESS_H */
