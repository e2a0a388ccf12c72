//! Client options of the C ABI that the Rust API does not have: a CA certificate given as a
//! file path (`tls_ca_cert_file`).

use std::time::Duration;

use crate::support::within;

/// Issue 9, item 11: a CA certificate path naming a FIFO (or a directory) is refused at
/// once instead of blocking `lock_client_open_opts` forever.
#[test]
fn a_ca_file_that_is_not_a_regular_file_is_refused_at_once() {
    use redlease::ffi::*;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ca.fifo");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let c_dir = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
    for path in [c_fifo, c_dir] {
        let status = within(Duration::from_secs(5), move || {
            let url = c"rediss://127.0.0.1:1/0";
            let mut opts = std::mem::MaybeUninit::<lock_client_options_t>::uninit();
            // SAFETY: valid pointers to a local struct and strings that outlive the calls.
            unsafe {
                assert_eq!(
                    lock_client_options_init(
                        opts.as_mut_ptr(),
                        std::mem::size_of::<lock_client_options_t>()
                    ),
                    LOCK_OK
                );
                let mut opts = opts.assume_init();
                opts.tls_ca_cert_file = path.as_ptr();
                let mut client = 0;
                lock_client_open_opts(url.as_ptr(), &opts, &mut client)
            }
        });
        assert_eq!(status, LOCK_ERR_ARGUMENT);
    }
}
