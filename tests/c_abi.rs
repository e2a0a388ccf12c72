//! Builds the C tests and the example daemon against the library and runs them against a
//! real redis-server: once under AddressSanitizer + UndefinedBehaviorSanitizer, once under
//! valgrind. Also checks that the header compiles as C99 and as C++.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::RedisServer;

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
        .env("REDIS_PORT", server.port.to_string());
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

#[test]
fn c_tests_pass_under_address_and_undefined_behaviour_sanitizers() {
    let lib = library_dir();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("test_abi_asan");
    compile_c(
        "bindings/c/tests/test_abi.c",
        &exe,
        &lib.join("libredlease.a"),
        &[
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer",
        ],
    );
    let server = RedisServer::start();
    let mut cmd = Command::new(&exe);
    env_for(&mut cmd, &server);
    cmd.env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0");
    let out = run(&mut cmd, "test_abi under ASan/UBSan");
    eprintln!("{out}");
    assert!(out.contains(" passed, 0 failed"), "{out}");
}

#[test]
fn c_tests_pass_under_valgrind_without_errors_or_leaks() {
    let lib = library_dir();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("test_abi");
    compile_c(
        "bindings/c/tests/test_abi.c",
        &exe,
        &lib.join("libredlease.a"),
        &["-O1"],
    );
    let server = RedisServer::start();
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--quiet",
        "--error-exitcode=1",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
    ])
    .arg(&exe)
    .env("REDLEASE_TEST_ROUNDS", "25");
    env_for(&mut cmd, &server);
    let out = run(&mut cmd, "test_abi under valgrind");
    eprintln!("{out}");
    assert!(out.contains(" passed, 0 failed"), "{out}");
    assert!(!out.contains("definitely lost"), "{out}");
}

#[test]
fn the_example_worker_builds_runs_and_stops_cleanly_on_sigterm() {
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
    let mut child = Command::new(&exe)
        .arg(server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let worked = support::eventually(Duration::from_secs(10), || server.calls("evalsha") >= 20);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = started + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the worker did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(worked, "the worker did no jobs: {stdout}");
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("stopped cleanly"), "{stdout}");
    let keys: i64 = server.cmd(&["EXISTS", "worker-example:job:0", "worker-example:job:1"]);
    assert_eq!(keys, 0, "the worker left a lock behind");
}
