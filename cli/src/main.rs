//! `redlease`: a distributed flock(1) over Redis, for cron jobs and operators.

mod duration;
mod handover;
mod inspect;
mod run;
mod signals;
mod text;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redlease::{Client, ClientOptions, ErrorKind};

use crate::duration::Wait;
use crate::run::OnLost;
use crate::text::warn;

/// Exit statuses (sysexits.h where one fits).
pub mod exit {
    pub const OK: i32 = 0;
    /// `release --force`: nothing was deleted (the lock was free or changed hands).
    pub const NOTHING_DONE: i32 = 1;
    /// EX_USAGE: bad arguments, no URL, a malformed URL or lock name.
    pub const USAGE: i32 = 64;
    /// EX_UNAVAILABLE: Redis unreachable, timed out or answered with an error; `check`
    /// also when the eviction policy can delete lock keys.
    pub const UNAVAILABLE: i32 = 69;
    /// EX_SOFTWARE: a bug in redlease.
    pub const SOFTWARE: i32 = 70;
    /// EX_OSERR: the OS refused a thread, a signal mask or a wait.
    pub const OSERR: i32 = 71;
    /// EX_IOERR: stdout could not be written (a closed pipe).
    pub const IOERR: i32 = 74;
    /// EX_TEMPFAIL: the lock was busy (the default of `--busy-exit`).
    pub const BUSY: u8 = 75;
    /// The lock was lost while the command ran (the default of `--lost-exit`).
    pub const LOST: u8 = 76;
    /// The command could not be executed / was not found (as in shells).
    pub const CANNOT_EXECUTE: i32 = 126;
    pub const NOT_FOUND: i32 = 127;
}

const EXIT_CODES: &str = "\
Exit status:
  0        success (run: the command's own status is passed through)
  1        release --force: nothing deleted (the lock was free or changed hands, or
           is a semaphore or held by readers); extend, release --token: the lock is
           not held under that token
  64       usage: bad arguments, no URL (give --url or REDIS_URL), malformed URL or lock name
  69       Redis unreachable, timed out or answered with an error;
           check: also when the eviction policy can delete lock keys
  70       internal error (a bug)
  71       run: the OS refused a signal mask or a wait
  74       standard output could not be written (a closed pipe)
  75       run: the lock was busy after the wait (--busy-exit N to change)
  76       run: the lock was lost while the command ran (--lost-exit N to change)
  126/127  run: the command could not be executed / was not found
  128+N    run: the command was killed by signal N, or redlease was stopped by
           signal N while acquiring the lock";

/// The exit statuses of `run`.
const RUN_EXIT_CODES: &str = "\
Exit status:
  0-255    the command's own status, passed through
  64       usage: bad arguments, no URL (give --url or REDIS_URL), malformed URL or lock name
  69       Redis unreachable, timed out or answered with an error
  70       internal error (a bug)
  71       the OS refused a signal mask or a wait
  75       the lock was busy after the wait (--busy-exit N to change)
  76       the lock was lost while the command ran (--lost-exit N to change)
  126/127  the command could not be executed / was not found
  128+N    the command was killed by signal N, or redlease was stopped by signal N
           while acquiring the lock";

/// The exit statuses of `status` and `list`.
const SHOW_EXIT_CODES: &str = "\
Exit status:
  0   printed (a free lock is not an error)
  64  usage: bad arguments, no URL (give --url or REDIS_URL), malformed URL or lock name
  69  Redis unreachable, timed out or answered with an error
  70  internal error (a bug)
  74  standard output could not be written (a closed pipe)";

/// The exit statuses of `release`.
const RELEASE_EXIT_CODES: &str = "\
Exit status:
  0   released
  1   nothing deleted (the lock was free, or changed hands meanwhile, or is a semaphore
      or held by readers, whose holds end with their own leases)
  64  usage: without --force, bad arguments, no URL, malformed URL or lock name
  69  Redis unreachable, timed out or answered with an error
  70  internal error (a bug)
  74  standard output could not be written (a closed pipe)";

/// The exit statuses of `extend` and `release --token`.
const HANDOVER_EXIT_CODES: &str = "\
Exit status:
  0   done
  1   the lock is not held under that token (it expired, or was released or taken)
  64  usage: bad arguments, no URL, malformed URL or lock name
  69  Redis unreachable, timed out or answered with an error
  70  internal error (a bug)";

/// The exit statuses of `check`.
const CHECK_EXIT_CODES: &str = "\
Exit status:
  0   fit for locks (persistence off is a warning only)
  64  usage: bad arguments, no URL (give --url or REDIS_URL), malformed URL
  69  Redis unreachable, timed out or answered with an error, or its eviction policy
      can delete lock keys (anything but noeviction)
  70  internal error (a bug)
  74  standard output could not be written (a closed pipe)";

const TOP_EXAMPLES: &str = "\
Examples:
  export REDIS_URL=redis://:secret@redis.internal:6379/0
  redlease run nightly-report -- /usr/local/bin/report --full
  redlease run --wait 10m deploy -- ./deploy.sh
  redlease status nightly-report deploy
  redlease list 'jobs:*' --json
  redlease release nightly-report --force
  redlease check";

/// A distributed flock(1) over Redis: run a command on one host at a time, see who holds a
/// lock, break one.
///
/// The server comes from --url or REDIS_URL (redis://, rediss://, redis+unix://,
/// redis+cluster://, redis+sentinel://). There is no default server: a lock on each host's
/// own localhost would exclude nothing, so redlease refuses to guess.
#[derive(Parser)]
#[command(name = "redlease", version, after_help = format!("{TOP_EXAMPLES}\n\n{EXIT_CODES}"))]
struct Cli {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Args)]
struct Conn {
    /// Redis URL [default: $REDIS_URL]. Prefer REDIS_URL for a URL with a password:
    /// command lines are visible to every user in ps.
    #[arg(long, global = true, value_name = "URL")]
    url: Option<String>,
    /// Connect and reply timeout of each request to Redis.
    #[arg(long, global = true, value_name = "DURATION", default_value = "2s", value_parser = duration::parse)]
    timeout: Duration,
    /// Prefix put before every lock name to form its key (as the applications' ClientOptions::key_prefix).
    #[arg(long, global = true, value_name = "PREFIX")]
    key_prefix: Option<String>,
    /// PEM CA certificate to trust for rediss:// instead of the system's.
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca_cert: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    Run(RunArgs),
    Status(StatusArgs),
    List(ListArgs),
    Release(ReleaseArgs),
    Extend(ExtendArgs),
    Check(CheckArgs),
}

/// Hold the lock NAME while a command runs: acquire, run CMD with the lock renewed, release
/// when it exits, exit with its status.
///
/// The lock's fencing token is in the command's environment (REDLEASE_FENCING_TOKEN): hand it
/// to the storage the job writes, so that a stale holder's writes can be rejected. Its token
/// is in REDLEASE_TOKEN: with it the job (or a process it hands it to) can `redlease extend`
/// or `redlease release --token` the lock, or adopt it through the library.
///
/// By default redlease does not wait (like `flock -n`): a cron job whose previous run, on
/// this host or another, still holds the lock is skipped with status 75, rather than queued
/// behind it. Use --wait 10m or --wait forever to queue.
///
/// If the lock is lost while the command runs (renewal found the key gone or taken, or Redis
/// stayed unreachable until the lease ran out), redlease sends the command SIGTERM
/// (--on-lost), says why on stderr, and exits 76 whatever the command's own status, since
/// part of the work ran unprotected. If only the final release fails (Redis unreachable), a
/// warning is printed, the command's status is kept, and the lock expires after --ttl.
///
/// SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 sent to redlease are forwarded to
/// the command (a terminal's Ctrl-C, which the command receives itself, is not sent twice);
/// the lock is released when the command ends. Before the command starts they stop the wait
/// (exit 128+N).
///
/// If redlease itself dies (even by SIGKILL), the kernel kills the command with SIGKILL
/// (PR_SET_PDEATHSIG), so it never runs on without its lock being renewed. Limits: this
/// covers the command's own process, not processes it started that outlive it, and the
/// kernel drops it when the command executes a set-user-ID, set-group-ID or file-capability
/// program (e.g. sudo). The lock itself then expires after --ttl.
#[derive(Args)]
#[command(after_help = format!("\
Examples:
  # cron, on every host: at most one host runs the report; the others skip (status 75)
  */5 * * * * REDIS_URL=redis://redis.internal/0 redlease run reports -- /opt/report.sh
  # queue for up to 10 minutes, then give up with status 75
  redlease run --wait 10m deploy -- ./deploy.sh production
  # pass the fencing token on to the storage
  redlease run --fence-env FENCE migrate -- sh -c 'migrate --fencing-token \"$FENCE\"'

{RUN_EXIT_CODES}"))]
pub struct RunArgs {
    /// Lock name (the key is the --key-prefix plus NAME).
    name: String,
    /// Lease: how long the lock outlives a redlease that stops renewing (crash, pause,
    /// network loss). Renewed every ttl/3 while the command runs.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::parse_ttl)]
    ttl: Duration,
    /// How long to wait for a busy lock: 0 (try once), a duration, or forever.
    #[arg(long, value_name = "0|DURATION|forever", default_value = "0", value_parser = duration::parse_wait)]
    wait: Wait,
    /// Environment variable that carries the fencing token to the command.
    #[arg(long, value_name = "VAR", default_value = "REDLEASE_FENCING_TOKEN")]
    fence_env: String,
    /// Exit status when the lock is still busy after the wait.
    #[arg(long, value_name = "N", default_value_t = exit::BUSY)]
    busy_exit: u8,
    /// What to do to the command when the lock is lost.
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = OnLost::Term)]
    on_lost: OnLost,
    /// With --on-lost term: send SIGKILL if the command is still running this long after
    /// the SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    kill_after: Option<Duration>,
    /// Exit status when the lock was lost while the command ran.
    #[arg(long, value_name = "N", default_value_t = exit::LOST)]
    lost_exit: u8,
    /// Say on stderr when the lock is acquired (with its fencing token) and released.
    #[arg(short, long, conflicts_with = "quiet")]
    verbose: bool,
    /// Print nothing when the run is skipped because the lock is busy (cron mails every
    /// line of output; `flock -n` is silent too). The exit status is kept.
    #[arg(short, long)]
    quiet: bool,
    /// Hold NAME shared: as a reader of the read-write lock NAME (like `flock -s`). Runs
    /// with --shared go on together; a run with --exclusive excludes them all.
    #[arg(short, long, conflicts_with_all = ["exclusive", "permits"])]
    shared: bool,
    /// Hold NAME as the writer of the read-write lock NAME: alone, excluding --shared runs
    /// (a plain run takes a mutex, a lock of another kind that cannot share NAME with them).
    #[arg(short = 'x', long, conflicts_with = "permits")]
    exclusive: bool,
    /// Take one of N permits of the counting semaphore NAME: at most N runs at once,
    /// fleet-wide. Every run of NAME should give the same N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// The command and its arguments (everything after NAME, or after `--`).
    #[arg(
        value_name = "CMD",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// Show who holds each lock: holder (host/pid from its token), remaining ttl, last fencing
/// token, waiters.
#[derive(Args)]
#[command(after_help = format!("\
Examples:
  redlease status nightly-report
  redlease status deploy migrate --json

Columns: KEY, HOLDER (host/pid of the holding redlease or program, with a reentrant lock's
owner and holds; a semaphore's permits held; a read-write lock's writer or readers; - when
free), TTL (time left unless renewed), FENCE (last fencing token handed out), WAITERS
(clients waiting now). --json prints an array of {{key, held, kind (mutex, semaphore,
rwlock or null), holder (the whole token), owner, ttl_ms, fencing_token, waiters,
reentrant_owner, holds, permits, readers}}.

{SHOW_EXIT_CODES}"))]
struct StatusArgs {
    /// Lock names.
    #[arg(value_name = "NAME", required = true)]
    names: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// List the locks held now (found with SCAN through their fencing counters, never KEYS).
///
/// Locks only ever taken by other clients with plain SET NX have no counter and are not
/// listed.
#[derive(Args)]
#[command(after_help = format!("\
Examples:
  redlease list
  redlease list 'jobs:*' --json

Same columns and JSON as `status`.

{SHOW_EXIT_CODES}"))]
struct ListArgs {
    /// Glob on the lock key (* and ?; the key includes any --key-prefix).
    #[arg(value_name = "PATTERN", default_value = "*")]
    pattern: String,
    /// List at most this many locks.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    limit: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Break a lock held by someone else: print who holds it, then delete it if it still holds
/// that same token.
///
/// Refuses without --force. The old holder learns it lost the lock at its next renewal
/// (`redlease run` then stops its command), but its work may still be running: use this only
/// for a holder known to be gone, and rely on fencing tokens.
#[derive(Args)]
#[command(after_help = format!("\
Examples:
  redlease release nightly-report --force

{RELEASE_EXIT_CODES}"))]
struct ReleaseArgs {
    /// Lock name.
    name: String,
    /// Really delete the lock.
    #[arg(long, conflicts_with = "token")]
    force: bool,
    /// Release the lock held under this token (a job started by `redlease run` has it in
    /// REDLEASE_TOKEN): no --force needed. Exits 1 when the lock is not held under it.
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Print JSON: {key, released, holder, owner, fencing_token}.
    #[arg(long)]
    json: bool,
}

/// Extend the lock held under a token: the lock of a job started by `redlease run` (its
/// token is in REDLEASE_TOKEN), or a lock handed over by any redlease holder.
///
/// Sets the lease to --ttl from now while the key still holds the token; renews nothing
/// afterwards (a holder that renews, as `redlease run` does, sets its own ttl again at its
/// next renewal).
#[derive(Args)]
#[command(after_help = format!("\
Examples:
  redlease extend nightly-report --token \"$REDLEASE_TOKEN\" --ttl 10m

{HANDOVER_EXIT_CODES}"))]
struct ExtendArgs {
    /// Lock name.
    name: String,
    /// The token the lock is held under.
    #[arg(long, value_name = "TOKEN")]
    token: String,
    /// The new lease, from now.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::parse_ttl)]
    ttl: Duration,
}

/// Check a server for use with locks: version, eviction policy, persistence, latency.
///
/// Exits 69 when the server is unreachable or its maxmemory-policy can delete lock keys
/// (anything but noeviction); persistence off is a warning only (exit 0).
#[derive(Args)]
#[command(after_help = format!("\
Examples:
  redlease check --url redis://redis.internal:6379/0
  redlease check --json

{CHECK_EXIT_CODES}"))]
struct CheckArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// A failure: the exit status and one line for stderr.
#[derive(Debug)]
pub struct Fail {
    pub code: i32,
    pub message: String,
}

pub type Outcome = Result<i32, Fail>;

impl Fail {
    pub fn new(code: i32, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Fail {
        Fail::new(exit::USAGE, message)
    }

    /// A library error while `doing` something against `client`'s server. The library's
    /// messages and the client's URL never contain the password.
    pub fn from_error(e: &redlease::Error, client: &Client, doing: &str) -> Fail {
        let code = match e.kind() {
            ErrorKind::InvalidArgument => exit::USAGE,
            ErrorKind::Busy => i32::from(exit::BUSY),
            ErrorKind::NotHeld => exit::NOTHING_DONE,
            ErrorKind::Internal => exit::SOFTWARE,
            _ => exit::UNAVAILABLE,
        };
        let message = if e.is_unreachable() || e.kind() == ErrorKind::Server {
            format!("{doing} at {}: {e}", client.url())
        } else {
            format!("{doing}: {e}")
        };
        Fail::new(code, message)
    }
}

/// The owner label of a redlease token (`uuid:host/pid` → `host/pid`); other values whole.
pub fn owner(token: &str) -> &str {
    token.split_once(':').map_or(token, |(_, label)| label)
}

fn connect(conn: &Conn) -> Result<Client, Fail> {
    let url = match &conn.url {
        Some(url) => url.clone(),
        None => match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => {
                return Err(Fail::usage(
                    "no Redis URL: give --url URL or set REDIS_URL (e.g. redis://host:6379/0)",
                ));
            }
        },
    };
    let mut options = ClientOptions::default()
        .connect_timeout(conn.timeout)
        .io_timeout(conn.timeout)
        .pool_wait(conn.timeout)
        .pool_size(4);
    if let Some(prefix) = &conn.key_prefix {
        options = options.key_prefix(prefix.clone());
    }
    if let Some(path) = &conn.tls_ca_cert {
        let pem = std::fs::read(path).map_err(|e| {
            Fail::usage(format!("cannot read --tls-ca-cert {}: {e}", path.display()))
        })?;
        options = options.tls_ca_cert(pem);
    }
    Client::with_options(&url, options).map_err(|e| {
        let code = match e.kind() {
            ErrorKind::InvalidArgument => exit::USAGE,
            _ => exit::UNAVAILABLE,
        };
        Fail::new(code, format!("cannot use the Redis URL: {e}"))
    })
}

/// Runs the command line and returns the exit status.
fn main_inner(cli: Cli) -> i32 {
    let conn = &cli.conn;
    let outcome = match cli.command {
        Cmd::Run(args) => run::run(args, || connect(conn)),
        Cmd::Status(args) => {
            connect(conn).and_then(|c| inspect::status(&c, &args.names, args.json))
        }
        Cmd::List(args) => connect(conn)
            .and_then(|c| inspect::list(&c, &args.pattern, args.limit.max(1), args.json)),
        Cmd::Release(args) => match (&args.token, args.force) {
            (Some(token), _) => {
                connect(conn).and_then(|c| handover::release(&c, &args.name, token))
            }
            (None, false) => inspect::release_refused(&args.name),
            (None, true) => connect(conn).and_then(|c| inspect::release(&c, &args.name, args.json)),
        },
        Cmd::Extend(args) => {
            connect(conn).and_then(|c| handover::extend(&c, &args.name, &args.token, args.ttl))
        }
        Cmd::Check(args) => connect(conn).and_then(|c| inspect::check(&c, args.json)),
    };
    // An attempt whose reply never came is given back on a thread of the library's own:
    // let it finish (within one more timeout) before the process exits, or what the
    // attempt may have taken stays on the server until its ttl.
    redlease::wait_for_background_withdrawals(conn.timeout + Duration::from_millis(500));
    match outcome {
        Ok(code) => code,
        Err(fail) => {
            warn(&fail.message.replace(['\n', '\r'], " "));
            fail.code
        }
    }
}

/// A usage error from clap, in one line: its message (with any list of values or tip that
/// clap puts on the lines below it), and where to read more.
fn usage_error(e: &clap::Error, args: &[OsString]) -> String {
    let rendered = e.render().to_string();
    let mut parts: Vec<String> = Vec::new();
    for line in rendered.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() {
            continue;
        }
        if let Some(tip) = line.strip_prefix("tip: ") {
            parts.push(format!("({tip})"));
        } else {
            parts.push(line.trim_start_matches("error: ").to_owned());
        }
    }
    let message = if parts.is_empty() {
        "invalid arguments".to_owned()
    } else {
        parts.join(" ")
    };
    let sub = args
        .iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .find(|a| ["run", "status", "list", "release", "check"].contains(a));
    let help = match sub {
        Some(sub) => format!("redlease {sub} --help"),
        None => "redlease --help".to_owned(),
    };
    format!("{message}; see '{help}'")
}

fn main() {
    // One line, no backtrace, for a panic anywhere; the main thread's exits 70 below.
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_owned());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        warn(&format!("internal error (a bug): {what}{at}"));
    }));
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
                text::print(&e.render().to_string());
                std::process::exit(exit::OK);
            }
            if e.kind() == K::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                std::process::exit(exit::USAGE);
            }
            warn(&usage_error(&e, &args));
            std::process::exit(exit::USAGE);
        }
    };
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| main_inner(cli)))
        .unwrap_or(exit::SOFTWARE);
    std::process::exit(code);
}
