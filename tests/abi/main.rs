//! The C ABI and what is shipped with it, in a test binary of its own: these tests build
//! the library and C programs (`cargo build`, `cc`, then runs under ASan/UBSan and
//! valgrind, minutes of CPU that would stretch the timing bounds of the `lock` binary's
//! tests if they ran beside them), and the log callback installs the process's one logger,
//! which a test of the `lock` binary installs too.
//!
//! - `c_programs`: the C tests and the example daemon, built and run against real servers;
//!   the header compiles as C99 and C++.
//! - `packaging`: the committed header is the generated one, its version and log-level
//!   macros, and log records reaching a C callback.
//! - `client_options`: the C client options that only C has (a CA file path).
//! - `fork`: forked children (with and without the fork handlers) and their parent's locks.
//! - `log_callback`: changing the C log callback while it runs, also across `fork()`.

#[path = "../support/mod.rs"]
mod support;

mod c_programs;
mod client_options;
mod fork;
mod fork_after_a_reply;
mod log_callback;
mod packaging;
