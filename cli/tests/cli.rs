//! The `redlease` binary against real redis-server processes of the tests' own.
//!
//! Every process a test starts is bounded: commands are waited for with a limit and killed
//! past it, and the shell scripts run as children loop a bounded number of times.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{RedisServer, eventually, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_redlease");

/// What a finished `redlease` did.
#[derive(Debug)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Out {
    /// The single line on stderr (asserting there is exactly one, and no panic).
    fn one_line(&self) -> &str {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "expected one line on stderr: {self:?}");
        assert!(lines[0].starts_with("redlease: "), "{self:?}");
        assert!(!self.stderr.contains("panicked"), "{self:?}");
        lines[0]
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.stdout))
    }
}

/// `redlease ARGS` with nothing inherited that could point it at a server.
fn cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A running `redlease`, SIGKILLed (and so its command too) if the test drops it early.
struct Running {
    child: Option<Child>,
    started: Instant,
}

impl Running {
    fn spawn(mut cmd: Command) -> Running {
        let started = Instant::now();
        Running {
            child: Some(cmd.spawn().expect("spawn redlease")),
            started,
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn signal(&self, signo: i32) {
        // SAFETY: kill(2) on our own, not yet reaped, child.
        assert_eq!(unsafe { libc::kill(self.pid(), signo) }, 0);
    }

    /// Waits up to `limit` for the exit and collects the output; kills and panics past it.
    fn finish(mut self, limit: Duration) -> Out {
        let mut child = self.child.take().unwrap();
        let readers: Vec<_> = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .map(|pipe| {
            std::thread::spawn(move || {
                let mut text = String::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_string(&mut text);
                }
                text
            })
        })
        .collect();
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redlease did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = self.started.elapsed();
        let mut texts = readers.into_iter().map(|r| r.join().unwrap());
        Out {
            code: status.code(),
            stdout: texts.next().unwrap(),
            stderr: texts.next().unwrap(),
            took,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `redlease ARGS` to the end (at most 10 s).
fn exec(args: &[&str]) -> Out {
    Running::spawn(cmd(args)).finish(Duration::from_secs(10))
}

/// A command for `run` that writes its pid to `ready` (whole: written aside, then renamed,
/// so that a reader never sees the file empty), then waits (at most ~10 s) for a file `go`;
/// on SIGTERM it writes `term` and exits 9.
fn holder_script(dir: &Path) -> String {
    format!(
        "cd '{}' && trap 'echo term > term; exit 9' TERM; echo $$ > ready.tmp; mv ready.tmp ready; \
         i=0; while [ ! -e go ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done",
        dir.display()
    )
}

/// Starts `redlease run ARGS NAME -- sh -c HOLDER` in its own temp dir and waits until
/// the command runs.
struct Holder {
    run: Running,
    dir: tempfile::TempDir,
}

impl Holder {
    fn start(url: &str, name: &str, extra: &[&str]) -> Holder {
        let dir = tempfile::tempdir().unwrap();
        let script = holder_script(dir.path());
        let mut args = vec!["run", "--url", url];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[name, "--", "sh", "-c", &script]);
        let run = Running::spawn(cmd(&args));
        let ready = dir.path().join("ready");
        assert!(
            eventually(Duration::from_secs(5), || ready.exists()),
            "the command of {name:?} did not start"
        );
        Holder { run, dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn child_pid(&self) -> i32 {
        std::fs::read_to_string(self.path("ready"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Lets the command end normally; returns redlease's outcome.
    fn finish(self) -> Out {
        std::fs::write(self.path("go"), "").unwrap();
        self.run.finish(Duration::from_secs(10))
    }
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", key]) == 1
}

#[test]
fn run_passes_the_exit_status_and_the_fencing_token() {
    let server = RedisServer::start();
    let url = server.url();

    let out = exec(&[
        "run",
        "--url",
        &url,
        "job",
        "--",
        "sh",
        "-c",
        "echo \"$REDLEASE_FENCING_TOKEN\"; exit 3",
    ]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert_eq!(out.stderr, "");
    let token: u64 = out.stdout.trim().parse().expect("a fencing token");
    let status = exec(&["status", "--url", &url, "job", "--json"]).json();
    assert_eq!(
        status[0]["fencing_token"], token,
        "the token of the last acquire"
    );
    assert_eq!(status[0]["held"], false, "released after the command");
    assert!(!exists(&server, "job"));

    // Without `--`, with options of the command's own, and another variable.
    let out = exec(&[
        "run",
        "--url",
        &url,
        "--fence-env",
        "FENCE",
        "job",
        "sh",
        "-c",
        "echo $FENCE -x",
        "-x",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let (second, rest) = out.stdout.trim().split_once(' ').unwrap();
    assert!(
        second.parse::<u64>().unwrap() > token,
        "fencing tokens increase"
    );
    assert_eq!(rest, "-x");

    // Killed by a signal: 128 + N, as shells report it.
    let out = exec(&[
        "run",
        "--url",
        &url,
        "job",
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(out.code, Some(128 + libc::SIGTERM), "{out:?}");

    // A command that cannot run: 127 / 126, one line, the lock released.
    let out = exec(&["run", "--url", &url, "job", "--", "/nonexistent/cmd"]);
    assert_eq!(out.code, Some(127), "{out:?}");
    assert!(out.one_line().contains("/nonexistent/cmd"));
    let out = exec(&["run", "--url", &url, "job", "--", "/"]);
    assert_eq!(out.code, Some(126), "{out:?}");
    assert!(!exists(&server, "job"));
}

#[test]
fn two_runs_racing_one_runs_the_other_exits_75() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!("echo ran >> '{}'; sleep 0.5", log.display());
    let args = ["run", "--url", &url, "race", "--", "sh", "-c", &script];
    let a = Running::spawn(cmd(&args));
    let b = Running::spawn(cmd(&args));
    let (a, b) = (
        a.finish(Duration::from_secs(10)),
        b.finish(Duration::from_secs(10)),
    );
    let mut codes = [a.code, b.code];
    codes.sort();
    assert_eq!(codes, [Some(0), Some(75)], "{a:?} {b:?}");
    let busy = if a.code == Some(75) { &a } else { &b };
    let line = busy.one_line();
    assert!(line.contains("busy") && line.contains("\"race\""), "{line}");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "ran\n",
        "exactly one command ran"
    );

    // --busy-exit, and --wait that ends while the lock is still held.
    let holder = Holder::start(&url, "race", &[]);
    let out = exec(&["run", "--url", &url, "--busy-exit", "3", "race", "true"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(
        out.one_line().contains(&format!("/{}", holder.run.pid())),
        "the holder's pid: {out:?}"
    );
    let out = exec(&["run", "--url", &url, "--wait", "500ms", "race", "true"]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(out.took >= Duration::from_millis(450), "waited: {out:?}");
    assert!(out.one_line().contains("after waiting"), "{out:?}");
    assert_eq!(holder.finish().code, Some(0));
}

#[test]
fn two_runs_with_wait_run_one_after_the_other() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo start $REDLEASE_FENCING_TOKEN >> '{0}'; sleep 0.3; echo end >> '{0}'",
        log.display()
    );
    let args = [
        "run", "--url", &url, "--wait", "10s", "queue", "--", "sh", "-c", &script,
    ];
    let a = Running::spawn(cmd(&args));
    let b = Running::spawn(cmd(&args));
    let (a, b) = (
        a.finish(Duration::from_secs(10)),
        b.finish(Duration::from_secs(10)),
    );
    assert_eq!((a.code, b.code), (Some(0), Some(0)), "{a:?} {b:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("start ") && lines[1] == "end",
        "{text}"
    );
    assert!(
        lines[2].starts_with("start ") && lines[3] == "end",
        "never interleaved: {text}"
    );
    let token = |l: &str| l["start ".len()..].parse::<u64>().unwrap();
    assert!(token(lines[2]) > token(lines[0]), "{text}");
}

#[test]
fn a_lock_lost_mid_run_terminates_the_command_and_exits_76() {
    let server = RedisServer::start();
    let url = server.url();

    // Default --on-lost term: the command gets SIGTERM.
    let holder = Holder::start(&url, "lost", &["--ttl", "300ms"]);
    server.cmd::<i64>(&["DEL", "lost"]);
    let term = holder.path("term");
    let out = holder.run.finish(Duration::from_secs(5));
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(term.exists(), "the command got SIGTERM");
    assert!(out.stderr.contains("lost while the command ran"), "{out:?}");
    assert!(out.stderr.contains("sending SIGTERM"), "{out:?}");
    assert!(out.stderr.contains("exited with status 9"), "{out:?}");
    assert!(!out.stderr.contains("panicked"));

    // --on-lost kill, --lost-exit.
    let holder = Holder::start(
        &url,
        "lost",
        &["--ttl", "300ms", "--on-lost", "kill", "--lost-exit", "5"],
    );
    server.cmd::<i64>(&["DEL", "lost"]);
    let term = holder.path("term");
    let out = holder.run.finish(Duration::from_secs(5));
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(!term.exists(), "SIGKILL, not SIGTERM");
    assert!(out.stderr.contains("killed by SIGKILL"), "{out:?}");

    // A command that ignores SIGTERM: SIGKILL after --kill-after.
    let script = format!(
        "trap '' TERM; redis-cli -p {} DEL lost >/dev/null; \
         i=0; while [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done",
        server.port
    );
    let out = exec(&[
        "run",
        "--url",
        &url,
        "--ttl",
        "300ms",
        "--kill-after",
        "200ms",
        "lost",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(out.stderr.contains("outlived --kill-after"), "{out:?}");
    assert!(out.took < Duration::from_secs(3), "{out:?}");

    // A loss the renewal had not seen yet when the command ended: found by the release.
    let out = exec(&[
        "run",
        "--url",
        &url,
        "lost",
        "--",
        "redis-cli",
        "-p",
        &server.port.to_string(),
        "DEL",
        "lost",
    ]);
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(out.stderr.contains("ran unprotected"), "{out:?}");
}

#[test]
fn sigterm_to_redlease_is_forwarded_and_the_lock_released() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Holder::start(&url, "fwd", &[]);
    assert!(exists(&server, "fwd"));
    holder.run.signal(libc::SIGTERM);
    let term = holder.path("term");
    let out = holder.run.finish(Duration::from_secs(5));
    assert_eq!(out.code, Some(9), "the command's own status: {out:?}");
    assert!(term.exists(), "the command got SIGTERM");
    assert_eq!(out.stderr, "");
    assert!(!exists(&server, "fwd"), "released when the command ended");
}

#[test]
fn a_signal_stops_a_wait_promptly() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Holder::start(&url, "w", &[]);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let script = format!("touch '{}'", ran.display());
    let waiter = Running::spawn(cmd(&[
        "run", "--url", &url, "--wait", "forever", "w", "sh", "-c", &script,
    ]));
    wait_for_waiter(&url, "w");
    let sent = Instant::now();
    waiter.signal(libc::SIGINT);
    let out = waiter.finish(Duration::from_secs(5));
    assert!(
        sent.elapsed() < Duration::from_secs(1),
        "promptly: {:?}",
        sent.elapsed()
    );
    assert_eq!(out.code, Some(130), "{out:?}");
    assert!(out.one_line().contains("interrupted by SIGINT"), "{out:?}");
    assert!(!ran.exists(), "the command never ran");
    assert_eq!(holder.finish().code, Some(0));
}

/// A waiter registered on `name` (its first attempt found the lock held).
fn wait_for_waiter(url: &str, name: &str) {
    assert!(
        eventually(Duration::from_secs(5), || {
            exec(&["status", "--url", url, name, "--json"]).json()[0]["waiters"] == 1
        }),
        "the waiter registered"
    );
}

/// Runs a waiter on `name` behind a holder, sends it `signals` while it waits (after
/// `prepare` set up its process), and checks that it then ran its command to the end.
fn waiter_runs_its_command_after(name: &str, signals: &[i32], prepare: impl FnOnce(&mut Command)) {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Holder::start(&url, name, &[]);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let script = format!("sleep 0.2; touch '{}'", ran.display());
    let mut waiting = cmd(&[
        "run", "--url", &url, "--wait", "10s", name, "--", "sh", "-c", &script,
    ]);
    prepare(&mut waiting);
    let waiter = Running::spawn(waiting);
    wait_for_waiter(&url, name);
    for &signo in signals {
        waiter.signal(signo);
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(holder.finish().code, Some(0));
    let out = waiter.finish(Duration::from_secs(10));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(ran.exists(), "the command ran to its end");
}

/// A USR1 or USR2 that comes while `run` waits is dropped, not kept for the command (which
/// would die of it the moment it started, before it could set a handler).
#[test]
fn a_usr1_while_waiting_is_dropped_not_sent_to_the_command() {
    waiter_runs_its_command_after("u", &[libc::SIGUSR1, libc::SIGUSR2], |_| {});
}

/// A signal ignored by whoever started `redlease` (`nohup` ignores SIGHUP) stays ignored:
/// it neither stops a waiting run nor reaches the command.
#[test]
fn a_signal_ignored_by_the_caller_stays_ignored() {
    use std::os::unix::process::CommandExt;
    waiter_runs_its_command_after("nohup", &[libc::SIGHUP], |waiting| {
        // SAFETY: only signal(2) between fork and exec, as nohup does.
        unsafe {
            waiting.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                Ok(())
            });
        }
    });
}

/// A signal during the one attempt of a run that does not wait (which only its timeouts
/// end) stops the run once the attempt ends: 128+N, the command not run.
#[test]
fn a_signal_during_a_single_attempt_stops_the_run_when_it_ends() {
    let server = RedisServer::start();
    let url = server.url();
    assert_eq!(exec(&["status", "--url", &url, "warm"]).code, Some(0));
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let script = format!("touch '{}'", ran.display());
    server.pause();
    let run = Running::spawn(cmd(&[
        "run",
        "--url",
        &url,
        "--timeout",
        "1s",
        "stalled",
        "--",
        "sh",
        "-c",
        &script,
    ]));
    std::thread::sleep(Duration::from_millis(300));
    run.signal(libc::SIGTERM);
    let out = run.finish(Duration::from_secs(10));
    server.resume();
    assert_eq!(out.code, Some(143), "{out:?}");
    assert!(out.one_line().contains("interrupted by SIGTERM"), "{out:?}");
    assert!(!ran.exists(), "the command never ran");
}

/// The state letter of a process, None once it is gone.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim().chars().next()
}

#[test]
fn sigkill_of_redlease_kills_the_command() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Holder::start(&url, "orphan", &["--ttl", "5s"]);
    let child = holder.child_pid();
    assert_eq!(proc_state(child).map(|s| s != 'Z'), Some(true));
    holder.run.signal(libc::SIGKILL);
    let term = holder.path("term");
    let out = holder.run.finish(Duration::from_secs(5));
    assert_eq!(out.code, None, "killed");
    assert!(
        eventually(Duration::from_secs(3), || matches!(
            proc_state(child),
            None | Some('Z')
        )),
        "the command (pid {child}) still runs after redlease was killed: {:?}",
        proc_state(child)
    );
    assert!(!term.exists(), "SIGKILL, not a polite SIGTERM");
    // Nobody released it: the lock stays until its ttl ends.
    assert!(exists(&server, "orphan"));
}

/// Inodes of the TCP sockets connected to `port` (from /proc/net/tcp and tcp6).
fn sockets_to(port: u16) -> Vec<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = fields
                .get(2)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port) {
                inodes.push(fields[9].to_owned());
            }
        }
    }
    inodes
}

/// The socket inodes among the open descriptors of `pid`.
fn socket_fds(pid: i32) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(entry.path()) {
            let target = target.to_string_lossy().into_owned();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            {
                out.push(inode.to_owned());
            }
        }
    }
    out
}

#[test]
fn the_command_inherits_no_connection_to_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Holder::start(&url, "fds", &[]);
    let to_redis = sockets_to(server.port);
    let ours: Vec<_> = socket_fds(holder.run.pid())
        .into_iter()
        .filter(|i| to_redis.contains(i))
        .collect();
    assert!(
        !ours.is_empty(),
        "redlease itself holds a connection to Redis (the check can see one)"
    );
    let child = holder.child_pid();
    let leaked: Vec<_> = socket_fds(child)
        .into_iter()
        .filter(|i| to_redis.contains(i))
        .collect();
    assert!(
        leaked.is_empty(),
        "the command inherited Redis sockets {leaked:?}"
    );
    assert_eq!(holder.finish().code, Some(0));

    // Nor the signal mask redlease uses to receive signals on a thread of its own (grep
    // shows the mask exec left it; a shell would reset it).
    let out = exec(&[
        "run",
        "--url",
        &url,
        "fds",
        "--",
        "grep",
        "SigBlk",
        "/proc/self/status",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(
        out.stdout.split_whitespace().nth(1),
        Some("0000000000000000"),
        "{out:?}"
    );
}

#[test]
fn status_list_and_release_outputs() {
    let server = RedisServer::start();
    let url = server.url();
    let a = Holder::start(&url, "jobs:a", &[]);
    // A 3 s ttl, renewed every second: the forced release below is found within a second,
    // and b stays held through the status and list calls however loaded the host (a 300 ms
    // lease could be lost to a stalled renewal).
    let b = Holder::start(&url, "jobs:b", &["--ttl", "3s"]);
    let c = Holder::start(&url, "other", &[]);

    // status: text.
    let out = exec(&["status", "--url", &url, "jobs:a", "free"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out:?}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["KEY", "HOLDER", "TTL", "FENCE", "WAITERS"]);
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[0], "jobs:a");
    assert!(
        row[1].ends_with(&format!("/{}", a.run.pid())),
        "host/pid: {row:?}"
    );
    assert!(row[2].ends_with('s'), "ttl: {row:?}");
    assert!(row[3].parse::<u64>().is_ok(), "fence: {row:?}");
    assert_eq!(row[4], "0");
    let free: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(free, ["free", "-", "-", "-", "0"]);

    // status: JSON, with a name that needs escaping.
    let weird = "we\"ird\\name\nline";
    let out = exec(&["status", "--url", &url, "jobs:a", weird, "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let json = out.json();
    assert_eq!(json[0]["key"], "jobs:a");
    assert_eq!(json[0]["held"], true);
    let holder = json[0]["holder"].as_str().unwrap();
    assert_eq!(
        server.cmd::<String>(&["GET", "jobs:a"]),
        holder,
        "the whole token"
    );
    assert_eq!(json[0]["owner"], holder.split_once(':').unwrap().1);
    let ttl = json[0]["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 20_000 && ttl <= 30_000, "{ttl}");
    assert!(json[0]["fencing_token"].is_u64());
    assert_eq!(json[1]["key"], weird);
    assert_eq!(json[1]["held"], false);
    assert_eq!(json[1]["holder"], Value::Null);
    assert_eq!(json[1]["ttl_ms"], Value::Null);

    // list: text, a pattern, JSON.
    let out = exec(&["list", "--url", &url, "jobs:*"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let keys: Vec<&str> = out
        .stdout
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(keys, ["jobs:a", "jobs:b"], "{out:?}");
    let out = exec(&["list", "--url", &url, "--json"]);
    let json = out.json();
    let keys: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["jobs:a", "jobs:b", "other"]);
    assert!(json.as_array().unwrap().iter().all(|l| l["held"] == true));
    let out = exec(&["list", "--url", &url, "nothing*"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "no held lock matches \"nothing*\"\n")
    );
    assert_eq!(
        exec(&["list", "--url", &url, "nothing*", "--json"]).json(),
        serde_json::json!([])
    );

    // release: refused without --force, nothing sent.
    let out = exec(&["release", "--url", &url, "jobs:b"]);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.one_line().contains("--force"), "{out:?}");
    assert!(exists(&server, "jobs:b"));

    // release --force: who held it, then deleted; the holder's run finds it lost.
    let token = server.cmd::<String>(&["GET", "jobs:b"]);
    let out = exec(&["release", "--url", &url, "jobs:b", "--force"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let first = out.stdout.lines().next().unwrap();
    assert!(
        first.contains(&format!("/{}", b.run.pid())) && first.contains(&token),
        "{out:?}"
    );
    assert!(out.stdout.contains("released lock \"jobs:b\""), "{out:?}");
    assert!(!exists(&server, "jobs:b"));
    let lost = b.run.finish(Duration::from_secs(5));
    assert_eq!(lost.code, Some(76), "{lost:?}");

    // Again: nothing to do.
    let out = exec(&["release", "--url", &url, "jobs:b", "--force"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.one_line().contains("not held"));

    // --json.
    let token = server.cmd::<String>(&["GET", "other"]);
    let out = exec(&["release", "--url", &url, "other", "--force", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let json = out.json();
    assert_eq!(json["released"], true);
    assert_eq!(json["holder"], token.as_str());
    assert_eq!(json["owner"], token.split_once(':').unwrap().1);
    assert!(!exists(&server, "other"));
    drop(c);
    assert_eq!(a.finish().code, Some(0));
}

/// `release --force` breaks a read-write lock's writer as it breaks a mutex; a semaphore's
/// permits and a lock's readers it names and leaves alone (exit 1, nothing deleted).
#[test]
fn release_force_breaks_a_writer_and_names_the_holds_it_leaves() {
    let server = RedisServer::start();
    let url = server.url();
    for (extra, what) in [
        (
            &["--permits", "2"][..],
            "counting semaphore with 1 permit held",
        ),
        (&["--shared"][..], "held by 1 reader"),
    ] {
        let holder = Holder::start(&url, "k", extra);
        let out = exec(&["release", "--url", &url, "k", "--force"]);
        assert_eq!(out.code, Some(1), "{out:?}");
        assert!(out.one_line().contains(what), "{out:?}");
        assert!(exists(&server, "k"), "nothing deleted");
        assert_eq!(holder.finish().code, Some(0));
    }
    let writer = Holder::start(&url, "k", &["--exclusive"]);
    let out = exec(&["release", "--url", &url, "k", "--force"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("released lock"), "{out:?}");
    assert!(!exists(&server, "k"), "the writer's hold deleted");
    // Its run finds the lock lost at its next renewal: SIGTERM to the command, exit 76.
    let term = writer.path("term");
    let out = writer.run.finish(Duration::from_secs(40));
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(term.exists(), "the command got SIGTERM");
}

#[test]
fn bad_urls_and_unreachable_servers_fail_in_one_line_within_the_timeouts() {
    // No URL at all: no silent localhost.
    let out = exec(&["status", "job"]);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.one_line().contains("REDIS_URL"));

    // A malformed URL.
    let out = exec(&["status", "--url", "http://user:sekret-pw@host/0", "job"]);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(!out.one_line().contains("sekret-pw"), "{out:?}");

    // REDIS_URL is used, and nothing listens there.
    let refused = format!("redis://user:sekret-pw@127.0.0.1:{}/0", free_port());
    for args in [
        &["status", "job"][..],
        &["list"],
        &["check"],
        &["release", "job", "--force"],
        &["run", "job", "true"],
        &["run", "--wait", "forever", "job", "true"],
    ] {
        let out = Running::spawn({
            // The default timeouts (2 s) bound it too; a shorter one keeps the test short.
            let mut c = cmd(&[&["--timeout", "500ms"][..], args].concat());
            c.env("REDIS_URL", &refused);
            c
        })
        .finish(Duration::from_secs(10));
        assert_eq!(out.code, Some(69), "{args:?}: {out:?}");
        let line = out.one_line();
        assert!(
            !line.contains("sekret-pw") && line.contains("***"),
            "{line}"
        );
        assert!(
            out.took < Duration::from_secs(3),
            "{args:?} took {:?}",
            out.took
        );
    }

    // A server that accepts and never answers: the I/O timeout ends it.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "redis://:sekret-pw@127.0.0.1:{}/0",
        silent.local_addr().unwrap().port()
    );
    for args in [
        &["status", "job"][..],
        &["check"],
        &["run", "--wait", "10s", "job", "true"],
    ] {
        let mut full = vec!["--url", url.as_str(), "--timeout", "300ms"];
        full.extend_from_slice(args);
        let out = exec(&full);
        assert_eq!(out.code, Some(69), "{args:?}: {out:?}");
        assert!(!out.one_line().contains("sekret-pw"), "{out:?}");
        assert!(
            out.took < Duration::from_secs(4),
            "{args:?} took {:?}",
            out.took
        );
    }

    // A server that wants a password: the wrong one is refused, the right one never shown.
    let server = RedisServer::start_with(&["--requirepass", "right-pw"]);
    let wrong = format!("redis://:wrong-pw@127.0.0.1:{}/0", server.port);
    let out = exec(&["status", "--url", &wrong, "job"]);
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(!out.one_line().contains("wrong-pw"), "{out:?}");
    let right = format!("redis://:right-pw@127.0.0.1:{}/0", server.port);
    for args in [
        &["check"][..],
        &["check", "--json"],
        &["status", "job"],
        &["run", "-v", "job", "true"],
    ] {
        let mut full = vec!["--url", right.as_str()];
        full.extend_from_slice(args);
        let out = exec(&full);
        assert_eq!(out.code, Some(0), "{out:?}");
        assert!(
            !out.stdout.contains("right-pw") && !out.stderr.contains("right-pw"),
            "{out:?}"
        );
    }
}

#[test]
fn check_reports_eviction_persistence_and_latency() {
    let server = RedisServer::start();
    let out = exec(&["check", "--url", &server.url()]);
    assert_eq!(
        out.code,
        Some(0),
        "persistence off is only a warning: {out:?}"
    );
    let text = &out.stdout;
    assert!(text.lines().next().unwrap().contains("Redis "), "{text}");
    assert!(text.contains("noeviction"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("warning") && l.contains("persistence")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("latency") && l.contains("median")),
        "{text}"
    );
    let json = exec(&["check", "--url", &server.url(), "--json"]).json();
    assert_eq!(json["ok"], true);
    assert_eq!(json["maxmemory_policy"], "noeviction");
    assert_eq!(json["round_trips_ms"].as_array().unwrap().len(), 5);

    let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let out = exec(&["check", "--url", &evicting.url()]);
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains("allkeys-lru")),
        "{out:?}"
    );
    assert_eq!(
        exec(&["check", "--url", &evicting.url(), "--json"]).json()["ok"],
        false
    );
}

#[test]
fn usage_errors_are_one_line_and_help_documents_exit_codes() {
    for args in [
        &["run", "job"][..],
        &["run", "--ttl", "1.5", "job", "true"],
        &["run", "--ttl", "1.5s", "job", "true"],
        &["run", "--shared", "--permits", "2", "job", "true"],
        &["run", "--permits", "0", "job", "true"],
        &["run", "--quiet", "--verbose", "job", "true"],
        &["run", "--wait", "soon", "job", "true"],
        &["run", "--on-lost", "maybe", "job", "true"],
        &["run", "--bogus", "job", "true"],
        &["status"],
        &["frobnicate"],
    ] {
        let out = exec(args);
        assert_eq!(out.code, Some(64), "{args:?}: {out:?}");
        out.one_line();
    }
    // Durations are checked before anything is sent (no URL needed to be told).
    let out = exec(&["run", "--ttl", "30x", "job", "true"]);
    assert!(out.one_line().contains("500ms, 30s, 2m"), "{out:?}");

    let out = exec(&["--help"]);
    assert_eq!(out.code, Some(0));
    for needle in ["64", "69", "75", "76", "128+N", "REDIS_URL"] {
        assert!(
            out.stdout.contains(needle),
            "--help lacks {needle}: {}",
            out.stdout
        );
    }
    let out = exec(&["run", "--help"]);
    for needle in [
        "PR_SET_PDEATHSIG",
        "SIGKILL",
        "--wait",
        "Examples",
        "REDLEASE_FENCING_TOKEN",
    ] {
        assert!(out.stdout.contains(needle), "run --help lacks {needle}");
    }
    for sub in ["status", "list", "release", "check", "extend"] {
        let out = exec(&[sub, "--help"]);
        assert_eq!(out.code, Some(0));
        assert!(out.stdout.contains("Examples"), "{sub} --help");
    }
    // Every subcommand's help lists the statuses it can exit with.
    for (sub, codes) in [
        (
            "run",
            &["64", "69", "70", "71", "75", "76", "126/127", "128+N"][..],
        ),
        ("status", &["0", "64", "69", "70", "74"][..]),
        ("list", &["0", "64", "69", "70", "74"][..]),
        ("release", &["0", "1", "64", "69", "70", "74"][..]),
        ("check", &["0", "64", "69", "70", "74"][..]),
        ("extend", &["0", "1", "64", "69", "70"][..]),
    ] {
        let out = exec(&[sub, "--help"]);
        let statuses = out
            .stdout
            .split("Exit status:")
            .nth(1)
            .unwrap_or_else(|| panic!("{sub} --help lists no exit status: {}", out.stdout));
        for code in codes {
            assert!(
                statuses
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{code} "))),
                "{sub} --help lacks exit status {code}: {statuses}"
            );
        }
    }
}

#[test]
fn cluster_and_sentinel_urls_work() {
    use support::deploy::{LocalCluster, SentinelDeployment};

    let cluster = LocalCluster::start(3, 0);
    let url = cluster.url();
    // Names on different primaries, held at once.
    let names = ["a", "b", "c", "d"];
    let slots: std::collections::HashSet<u16> = names
        .iter()
        .map(|n| cluster.primary_of(redlease::key_slot(n.as_bytes())).port)
        .collect();
    assert!(slots.len() >= 2, "the names spread over primaries");
    let holders: Vec<Holder> = names.iter().map(|n| Holder::start(&url, n, &[])).collect();
    let out = exec(&["list", "--url", &url, "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let keys: Vec<String> = out
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, names, "SCAN on every primary");
    let out = exec(&["run", "--url", &url, "c", "true"]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(exec(&["check", "--url", &url]).code, Some(0));
    for holder in holders {
        assert_eq!(holder.finish().code, Some(0));
    }

    let sentinel = SentinelDeployment::start(0, 1, 5000);
    let url = sentinel.url();
    let out = exec(&[
        "run",
        "--url",
        &url,
        "job",
        "--",
        "sh",
        "-c",
        "echo $REDLEASE_FENCING_TOKEN",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let status = exec(&["status", "--url", &url, "job", "--json"]).json();
    assert_eq!(
        status[0]["fencing_token"].as_u64().unwrap().to_string(),
        out.stdout.trim()
    );
}

#[test]
fn a_bare_number_is_seconds_as_with_flock() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Holder::start(&url, "bare", &["--ttl", "20"]);
    let ttl: i64 = server.cmd(&["PTTL", "bare"]);
    assert!(ttl > 15_000 && ttl <= 20_000, "--ttl 20 is 20 s: {ttl}");
    let out = exec(&["run", "--url", &url, "--wait", "1", "bare", "true"]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(
        out.took >= Duration::from_millis(950),
        "--wait 1 waits 1 s: {out:?}"
    );
    assert!(out.one_line().contains("after waiting 1.0s"), "{out:?}");
    assert_eq!(holder.finish().code, Some(0));
}

#[test]
fn quiet_skips_a_busy_run_silently_and_keeps_its_status() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Holder::start(&url, "cron", &[]);
    let out = exec(&["run", "--url", &url, "--quiet", "cron", "true"]);
    assert_eq!(
        (out.code, out.stderr.as_str(), out.stdout.as_str()),
        (Some(75), "", "")
    );
    let out = exec(&[
        "run",
        "--url",
        &url,
        "-q",
        "--busy-exit",
        "3",
        "--wait",
        "300ms",
        "cron",
        "true",
    ]);
    assert_eq!((out.code, out.stderr.as_str()), (Some(3), ""), "{out:?}");
    assert_eq!(holder.finish().code, Some(0));
    // Quiet is about a busy lock only: other failures still say why.
    let port = free_port();
    let nowhere = format!("redis://127.0.0.1:{port}/0");
    let out = exec(&["run", "--url", &nowhere, "--quiet", "cron", "true"]);
    assert_eq!(out.code, Some(69), "{out:?}");
    out.one_line();
}

#[test]
fn shared_runs_go_together_and_an_exclusive_run_excludes_them() {
    let server = RedisServer::start();
    let url = server.url();
    let reader = Holder::start(&url, "report", &["--shared"]);
    let out = exec(&["run", "--url", &url, "--shared", "report", "true"]);
    assert_eq!(out.code, Some(0), "a second reader runs alongside: {out:?}");
    let out = exec(&["run", "--url", &url, "--exclusive", "report", "true"]);
    assert_eq!(
        out.code,
        Some(75),
        "the writer waits for the readers: {out:?}"
    );
    // A plain run takes a mutex: another kind, refused while NAME is a read-write lock.
    let out = exec(&["run", "--url", &url, "report", "true"]);
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.one_line().contains("another kind"), "{out:?}");
    assert_eq!(reader.finish().code, Some(0));
    let writer = Holder::start(&url, "report", &["-x"]);
    let out = exec(&["run", "--url", &url, "-s", "report", "true"]);
    assert_eq!(out.code, Some(75), "readers wait for the writer: {out:?}");
    assert!(out.one_line().contains("(writing)"), "{out:?}");
    assert_eq!(writer.finish().code, Some(0));
}

#[test]
fn permits_let_that_many_runs_go_at_once() {
    let server = RedisServer::start();
    let url = server.url();
    let a = Holder::start(&url, "pool", &["--permits", "2"]);
    let b = Holder::start(&url, "pool", &["--permits", "2"]);
    let out = exec(&["run", "--url", &url, "--permits", "2", "pool", "true"]);
    assert_eq!(out.code, Some(75), "a third run waits: {out:?}");
    assert!(out.one_line().contains("2 permits"), "{out:?}");
    assert_eq!(a.finish().code, Some(0));
    let out = exec(&["run", "--url", &url, "--permits", "2", "pool", "true"]);
    assert_eq!(out.code, Some(0), "a permit is free again: {out:?}");
    assert_eq!(b.finish().code, Some(0));
}

#[test]
fn status_shows_a_reentrant_owner_and_the_permits_and_readers_of_other_kinds() {
    let server = RedisServer::start();
    let url = server.url();
    let client = redlease::Client::open(&url).unwrap();
    let first = client
        .lock("re")
        .reentrant_as("svc-7")
        .try_acquire()
        .unwrap();
    let second = client
        .lock("re")
        .reentrant_as("svc-7")
        .try_acquire()
        .unwrap();
    let permits: Vec<_> = (0..2)
        .map(|_| client.semaphore("sem", 5).try_acquire().unwrap())
        .collect();
    let readers: Vec<_> = (0..3)
        .map(|_| client.rwlock("rw").read().try_acquire().unwrap())
        .collect();
    let writer = client.rwlock("rw-w").write().try_acquire().unwrap();

    let out = exec(&["status", "--url", &url, "re", "sem", "rw", "rw-w"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let line = |key: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no row for {key}: {}", out.stdout))
            .to_owned()
    };
    assert!(
        line("re").contains("(owner svc-7, 2 holds)"),
        "{}",
        out.stdout
    );
    assert!(line("sem").contains("2 permits"), "{}", out.stdout);
    assert!(line("rw").contains("3 readers"), "{}", out.stdout);
    assert!(line("rw-w").contains("(writing)"), "{}", out.stdout);

    let json = exec(&["status", "--url", &url, "--json", "re", "sem", "rw", "rw-w"]).json();
    assert_eq!(json[0]["kind"], "mutex");
    assert_eq!(
        (
            json[0]["reentrant_owner"].as_str(),
            json[0]["holds"].as_u64()
        ),
        (Some("svc-7"), Some(2))
    );
    assert_eq!(
        (json[1]["kind"].as_str(), json[1]["permits"].as_u64()),
        (Some("semaphore"), Some(2))
    );
    assert_eq!(
        (json[2]["kind"].as_str(), json[2]["readers"].as_u64()),
        (Some("rwlock"), Some(3))
    );
    assert_eq!(json[3]["holder"].as_str(), Some(writer.token()));
    // `list` shows every kind now held.
    let listed = exec(&["list", "--url", &url, "--json"]).json();
    let keys: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["re", "rw", "rw-w", "sem"]);
    drop((second, first, permits, readers, writer));
}

/// A pseudo-terminal: the master side (read by the test) and the slave side (given to the
/// child as its stderr).
fn pty() -> (std::fs::File, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors; the other arguments may be NULL.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors were just opened and are owned by nothing else.
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::os::fd::OwnedFd::from_raw_fd(slave),
        )
    }
}

#[test]
fn a_waiting_run_on_a_terminal_says_who_holds_the_lock_and_for_how_long() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Holder::start(&url, "tty", &[]);
    let (mut master, slave) = pty();
    let mut command = cmd(&["run", "--url", &url, "--wait", "2500ms", "tty", "true"]);
    command.stderr(Stdio::from(slave));
    let run = Running::spawn(command);
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        // Ends with EIO once the child (the last holder of the slave side) exits.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&text).into_owned()
    });
    let out = run.finish(Duration::from_secs(10));
    assert_eq!(out.code, Some(75), "{out:?}");
    let shown = reader.join().unwrap();
    let pid = format!("/{}", holder.run.pid());
    assert!(
        shown.contains("\r\x1b[Kredlease: waiting for lock tty held by"),
        "{shown:?}"
    );
    assert!(shown.contains(&pid), "the holder: {shown:?}");
    assert!(
        shown.contains(": 1.0s") && shown.contains(": 2.0s"),
        "the wait, rewritten: {shown:?}"
    );
    assert!(shown.contains("busy"), "then the usual line: {shown:?}");
    assert_eq!(holder.finish().code, Some(0));

    // Not on a terminal: no progress line, only the outcome.
    let holder = Holder::start(&url, "tty", &[]);
    let out = exec(&["run", "--url", &url, "--wait", "1500ms", "tty", "true"]);
    assert_eq!(out.code, Some(75), "{out:?}");
    let line = out.one_line();
    assert!(
        !line.contains("waiting for lock") && !out.stderr.contains('\r'),
        "{out:?}"
    );
    assert_eq!(holder.finish().code, Some(0));
}

#[test]
fn the_readme_exit_table_is_the_one_help_prints() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let section = readme
        .split("## Command line")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Command line section");
    let in_readme: Vec<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" |").next())
        .filter(|code| code.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .map(|code| code.replace(' ', ""))
        .collect();
    let help = exec(&["--help"]).stdout;
    let statuses = help
        .split("Exit status:")
        .nth(1)
        .expect("exit statuses in --help");
    let in_help: Vec<String> = statuses
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|code| code.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        in_readme, in_help,
        "README:\n{section}\n--help:\n{statuses}"
    );
}

#[test]
fn a_job_extends_and_releases_its_lock_with_the_token_it_was_given() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    // The command extends its own lock through the token, then records the lease. A ttl
    // under the shortest is a usage error under the right token as under a wrong one.
    let script = format!(
        "{BIN} extend --url {url} own --token \"$REDLEASE_TOKEN\" --ttl 5ms; echo \"short $?\" >> '{0}'; \
         {BIN} extend --url {url} own --token \"$REDLEASE_TOKEN\" --ttl 100s && echo extended >> '{0}'; \
         {BIN} status --url {url} own --json >> '{0}'",
        log.display()
    );
    let out = exec(&[
        "run", "--url", &url, "--ttl", "20s", "own", "--", "sh", "-c", &script,
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let head = "short 64\nextended\n";
    assert!(text.starts_with(head), "{text}");
    let status: Value = serde_json::from_str(&text[head.len()..]).unwrap();
    let ttl_ms = status[0]["ttl_ms"].as_u64().unwrap();
    assert!(ttl_ms > 90_000, "the extend set 100 s: {ttl_ms}");

    // The command releases its lock: the run finds it lost, as any loss.
    let script = format!("{BIN} release --url {url} gone --token \"$REDLEASE_TOKEN\"; sleep 3");
    let out = Running::spawn(cmd(&[
        "run", "--url", &url, "--ttl", "1s", "gone", "--", "sh", "-c", &script,
    ]))
    .finish(Duration::from_secs(20));
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(!exists(&server, "gone"));

    // A token that does not hold it: exit 1; nothing changes.
    let holder = Holder::start(&url, "kept", &[]);
    for args in [
        &["release", "--url", &url, "kept", "--token", "not-the-token"][..],
        &["extend", "--url", &url, "kept", "--token", "not-the-token"],
    ] {
        let out = exec(args);
        assert_eq!(out.code, Some(1), "{args:?}: {out:?}");
        assert!(
            out.one_line().contains("not held under that token"),
            "{out:?}"
        );
    }
    let short = [
        "extend",
        "--url",
        &url,
        "kept",
        "--token",
        "not-the-token",
        "--ttl",
        "5ms",
    ];
    let out = exec(&short);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.one_line().contains("at least 10ms"), "{out:?}");
    assert!(exists(&server, "kept"));
    assert_eq!(holder.finish().code, Some(0));
    for args in [
        &["extend", "kept"][..],
        &["release", "kept", "--token", "t", "--force"],
    ] {
        assert_eq!(exec(args).code, Some(64), "{args:?}");
    }
}

/// An attempt whose reply is lost (it ran on the server): `run` fails with 69, and gives
/// the attempt back before it exits rather than leave the key on the server for its ttl
/// (the give-back is held back a moment by the proxy: a process that exited at once
/// would be gone before it was sent).
#[test]
fn run_whose_attempt_went_unanswered_gives_it_back_before_exiting() {
    use support::proxy::{Action, Proxy};
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let url = proxy.url();
    // The server caches the scripts, so that the next attempt runs whichever way it is sent.
    let warm = exec(&["run", "--url", &url, "cron-warm", "--", "true"]);
    assert_eq!(warm.code, Some(0), "{warm:?}");
    let dropped = proxy.on_request(b"cron-job", 1, Action::DropReply);
    let held = proxy.on_request(
        b"cron-job",
        1,
        Action::DelayRequest(Duration::from_millis(300)),
    );
    let out = exec(&[
        "run",
        "--url",
        &url,
        "--timeout",
        "1s",
        "cron-job",
        "--",
        "true",
    ]);
    let left = exists(&server, "cron-job");
    assert_eq!(out.code, Some(69), "{out:?}");
    assert_eq!(proxy.matched(dropped), 1, "the attempt was not sent");
    assert_eq!(proxy.matched(held), 1, "no give-back was sent");
    assert!(
        !left,
        "the unanswered attempt's key outlived redlease: {out:?}"
    );
}
