//! Builds the C tests and the example daemon against the library and runs them against a
//! real redis-server: once under AddressSanitizer + UndefinedBehaviorSanitizer, once under
//! valgrind. Also checks that the header compiles as C99 and as C++.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, RedisServer};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Builds the library (static and shared) in the profile of this test and returns the
/// directory holding them.
fn library_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(build_library).clone()
}

fn build_library() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--lib", "--quiet"])
        .current_dir(ROOT)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build --lib failed");
    // This test runs from <target>/debug/deps/.
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target profile directory")
        .to_path_buf()
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout + &stderr
}

const NATIVE_LIBS: &[&str] = &["-lpthread", "-ldl", "-lm", "-lrt", "-lutil", "-lgcc_s"];

fn compile_c(source: &str, output: &Path, static_lib: &Path, extra: &[&str]) {
    let mut cc = Command::new("cc");
    cc.args(["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(extra)
        .arg(format!("-I{ROOT}/include"))
        .arg(Path::new(ROOT).join(source))
        .arg(static_lib)
        .args(NATIVE_LIBS)
        .arg("-o")
        .arg(output);
    run(&mut cc, &format!("cc {source}"));
}

fn env_for(cmd: &mut Command, server: &RedisServer) {
    cmd.env("REDIS_URL", server.url())
        .env("REDIS_HOST", "127.0.0.1")
        .env("REDIS_PORT", server.port.to_string())
        .env("REDIS_PID", server.pid().to_string());
}

#[test]
fn the_header_compiles_as_c99_and_as_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("header.c");
    std::fs::write(
        &source,
        "#include \"redlease.h\"\nint main(void) { return LOCK_OK; }\n",
    )
    .unwrap();
    let include = format!("-I{ROOT}/include");
    run(
        Command::new("cc")
            .args([
                "-std=c99",
                "-pedantic",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fsyntax-only",
            ])
            .arg(&include)
            .arg(&source),
        "cc -std=c99 header",
    );
    run(
        Command::new("c++")
            .args([
                "-std=c++11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fsyntax-only",
                "-x",
                "c++",
            ])
            .arg(&include)
            .arg(&source),
        "c++ header",
    );
}

/// The C test programs, each run under both tools against a redis-server of its own (the
/// ABI tests count the server's keys). Each prints "N passed, M failed".
/// - test_abi.c: the calls, handles, errors, callbacks, threads, and option structs of older
///   headers (the ABI can grow);
/// - test_signals.c: signals never end a call, cancel handles, `lock_cancel_all` from a
///   SIGTERM handler, the `on_interrupt` callback;
/// - test_kinds.c: semaphores, read-write locks and locks over several names, whose holds
///   are ordinary lock handles;
/// - test_inspect.c: the operators' views (inspect, list, break, check, renewal figures),
///   whose results the caller frees.
const C_TESTS: &[&str] = &[
    "bindings/c/tests/test_abi.c",
    "bindings/c/tests/test_signals.c",
    "bindings/c/tests/test_kinds.c",
    "bindings/c/tests/test_inspect.c",
];

fn stem(source: &str) -> &str {
    Path::new(source)
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a C source file name")
}

/// Runs one C test program (`cmd` ready but for the server's address) against a server of
/// its own and checks its tally.
fn run_c_test(mut cmd: Command, what: &str) -> String {
    let server = RedisServer::start();
    env_for(&mut cmd, &server);
    let started = Instant::now();
    let out = run(&mut cmd, what);
    eprintln!("{what} ({:.1} s):\n{out}", started.elapsed().as_secs_f64());
    assert!(out.contains(" passed, 0 failed"), "{out}");
    out
}

#[test]
fn c_tests_pass_under_address_and_undefined_behaviour_sanitizers() {
    let lib = library_dir();
    let dir = tempfile::tempdir().unwrap();
    for source in C_TESTS {
        let exe = dir.path().join(format!("{}_asan", stem(source)));
        compile_c(
            source,
            &exe,
            &lib.join("libredlease.a"),
            &[
                "-fsanitize=address,undefined",
                "-fno-sanitize-recover=undefined",
                "-fno-omit-frame-pointer",
            ],
        );
        let mut cmd = Command::new(&exe);
        cmd.env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
            // The sanitizers slow every call down: timing bounds twice as loose (the
            // signal tests' 500 ms promptness bounds become 1 s, still short of the 2 s
            // I/O timeout a slow withdrawal would wait), and the short leases twice as
            // long.
            .env("REDLEASE_TEST_SLOW", "2");
        run_c_test(cmd, &format!("{} under ASan/UBSan", stem(source)));
    }
}

#[test]
fn c_tests_pass_under_valgrind_without_errors_or_leaks() {
    let lib = library_dir();
    let dir = tempfile::tempdir().unwrap();
    for source in C_TESTS {
        let exe = dir.path().join(stem(source));
        compile_c(source, &exe, &lib.join("libredlease.a"), &["-O1"]);
        let mut cmd = Command::new("valgrind");
        cmd.args([
            "--quiet",
            "--error-exitcode=1",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
        ])
        .arg(&exe)
        // Fewer rounds and storm cycles, and timing bounds four times as loose.
        .env("REDLEASE_TEST_ROUNDS", "25")
        .env("REDLEASE_TEST_STORM_CYCLES", "500")
        .env("REDLEASE_TEST_SLOW", "4");
        let out = run_c_test(cmd, &format!("{} under valgrind", stem(source)));
        assert!(!out.contains("definitely lost"), "{out}");
    }
}

/// Clients blocked in a command (`BLPOP`) on the server, from `INFO clients`.
fn blocked_clients(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "clients"]);
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// What is left to read from a child's pipe.
fn read_all(pipe: Option<impl Read>) -> String {
    let mut text = String::new();
    if let Some(mut pipe) = pipe {
        pipe.read_to_string(&mut text)
            .expect("read a pipe of the child");
    }
    text
}

/// A child process killed (by its pid) and reaped if the test ends before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn the_example_worker_builds_runs_and_stops_cleanly_on_sigterm_while_blocked() {
    let lib = library_dir();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("worker");
    // Built against the shared library, as a daemon would link it.
    run(
        Command::new("cc")
            .args(["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror"])
            .arg(format!("-I{ROOT}/include"))
            .arg(Path::new(ROOT).join("bindings/c/examples/worker.c"))
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .args(["-lredlease", "-o"])
            .arg(&exe),
        "cc worker.c",
    );
    let server = RedisServer::start();
    let mut worker = KillOnDrop(
        Command::new(&exe)
            .arg(server.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let worked = support::eventually(Duration::from_secs(10), || server.calls("evalsha") >= 20);
    assert!(worked, "the worker did no jobs");

    // Hold one of the worker's job locks (its keys are worker-example:job:0 to 3): the
    // worker blocks on it for up to 30 s when it comes to that job.
    let client = redlease::Client::open(&server.url()).unwrap();
    let held = client
        .lock("worker-example:job:3")
        .ttl(Duration::from_secs(30))
        .acquire_timeout(Duration::from_secs(10))
        .expect("take the worker's job:3 lock");
    let blocked = support::eventually(Duration::from_secs(10), || blocked_clients(&server) >= 1);
    assert!(blocked, "the worker did not block on job:3");

    // SIGTERM while it is blocked: it must exit, cleanly, within a few seconds (it stops at
    // once; the bound leaves room for a loaded host, and a wait that SIGTERM did not end
    // lasts its 30 s: the 5 s loop below catches it).
    let sent = Instant::now();
    // SAFETY: kill(2) on our own child, by its pid.
    unsafe { libc::kill(worker.0.id() as i32, libc::SIGTERM) };
    let mut status = None;
    while status.is_none() && sent.elapsed() < Duration::from_secs(5) {
        status = worker.0.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let stopped_after = sent.elapsed();
    let status = status.expect("the worker blocked on a lock did not stop on SIGTERM in 5 s");
    let stdout = read_all(worker.0.stdout.take());
    let stderr = read_all(worker.0.stderr.take());
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    assert!(
        stopped_after < Duration::from_secs(3),
        "the worker took {stopped_after:?} to stop on SIGTERM\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("waiting for job:3 cancelled"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("stopped cleanly"), "{stdout}\n{stderr}");
    assert!(
        !stderr.contains("acquire"),
        "the worker's acquires failed: {stderr}"
    );

    // The worker took nothing on its way out: the test still holds job:3, whose release
    // deletes the key, and the worker left no lock behind.
    assert!(held.is_held());
    held.release().expect("release job:3");
    let keys: i64 = server.cmd(&[
        "EXISTS",
        "worker-example:job:0",
        "worker-example:job:1",
        "worker-example:job:2",
        "worker-example:job:3",
    ]);
    assert_eq!(keys, 0, "a lock was left behind");
}
