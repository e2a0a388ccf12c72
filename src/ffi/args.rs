//! Converting C arguments: strings and output pointers.

use std::ffi::{CStr, c_char};
use std::os::unix::fs::OpenOptionsExt;

use super::status::Failure;

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn str_arg<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if ptr.is_null() {
        return Err(Failure::argument(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| Failure::argument(format!("{what} is not valid UTF-8")))
}

/// As [`str_arg`], but NULL means "not given".
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn opt_str_arg<'a>(
    ptr: *const c_char,
    what: &str,
) -> Result<Option<&'a str>, Failure> {
    if ptr.is_null() {
        Ok(None)
    } else {
        // SAFETY: as the caller promised.
        unsafe { str_arg(ptr, what) }.map(Some)
    }
}

/// An output pointer, checked for NULL up front and written only on success.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// # Safety
    /// `ptr` is NULL or valid for writing a `T`.
    pub unsafe fn new(ptr: *mut T, what: &str) -> Result<Self, Failure> {
        if ptr.is_null() {
            Err(Failure::argument(format!("{what} is NULL")))
        } else {
            Ok(Out(ptr))
        }
    }

    pub fn write(self, value: T) {
        // SAFETY: non-NULL and writable by the contract of `new`; `write` does not read or
        // drop the old (possibly uninitialised) value.
        unsafe { self.0.write(value) }
    }
}

/// Up to this size a `size` larger than ours is taken for a newer header (a clearer
/// message); beyond it, for garbage.
const MAX_OPTIONS_SIZE: usize = 4096;

/// The size of a prefix of a struct aligned to `align` that ends at byte `end`.
pub(crate) const fn prefix_size(end: usize, align: usize) -> usize {
    end.div_ceil(align) * align
}

/// Reads a caller's options struct whose first field is its own size in bytes (set by its
/// `_init` function). A caller compiled against an older, smaller struct passes a smaller
/// size: the fields past it keep `defaults`. `sizes` lists the sizes of every version of
/// the struct (each a prefix ending after a field, padded to the struct's alignment); any
/// other size, larger ones included (a newer header than this library), is refused.
///
/// # Safety
/// `ptr` is NULL or points to at least `size` readable bytes starting with a `size_t`, and
/// every field within `size` holds a valid value of its type.
pub(crate) unsafe fn read_sized<T: Copy>(
    ptr: *const T,
    defaults: T,
    sizes: &[usize],
    what: &str,
) -> Result<T, Failure> {
    if ptr.is_null() {
        return Err(Failure::argument(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and every options struct begins with a size_t (caller's contract).
    let size = unsafe { ptr.cast::<usize>().read_unaligned() };
    check_struct_size::<T>(
        size,
        sizes,
        &format!("{what}->size is {size}"),
        "fill it with its _init function first",
    )?;
    let mut out = defaults;
    // SAFETY: `size` bytes are readable at `ptr` (caller's contract), `size <= ours` bytes fit
    // in `out`, and the two do not overlap (`out` is a local).
    unsafe {
        std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&raw mut out).cast::<u8>(), size);
    }
    Ok(out)
}

/// Refuses `size` unless it is one of `sizes` (the sizes of every version of `T`), saying
/// when it is larger than this library's `T`: a program built against a newer header. The
/// message begins with `subject` (which names the size) and ends with `remedy` for a size
/// no version had.
pub(crate) fn check_struct_size<T>(
    size: usize,
    sizes: &[usize],
    subject: &str,
    remedy: &str,
) -> Result<(), Failure> {
    let ours = std::mem::size_of::<T>();
    if size > ours && size <= MAX_OPTIONS_SIZE {
        return Err(Failure::argument(format!(
            "{subject}, larger than this library's {ours}: the program was built against a \
             newer redlease.h than the library it runs with"
        )));
    }
    if !sizes.contains(&size) || size > ours {
        return Err(Failure::argument(format!(
            "{subject}, not the size of any version of the struct: {remedy}"
        )));
    }
    Ok(())
}

/// Copies `text` and a terminating NUL into `buf` of `buf_len` bytes.
///
/// # Safety
/// `buf` is NULL or valid for writing `buf_len` bytes.
pub(crate) unsafe fn copy_out(text: &str, buf: *mut c_char, buf_len: usize) -> Result<(), Failure> {
    if buf.is_null() {
        return Err(Failure::argument("buf is NULL"));
    }
    if text.len() >= buf_len {
        return Err(Failure::argument(format!(
            "buf_len {buf_len} is too small: {} bytes are needed with the NUL",
            text.len() + 1
        )));
    }
    // SAFETY: buf is non-NULL and has room for text and the NUL (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(())
}

/// Reads a small regular file (a CA certificate): never a FIFO or a device, which could
/// block or never end, and at most [`crate::tls::MAX_CA_FILE`] bytes.
pub(crate) fn read_small_file(path: &str, what: &str) -> Result<Vec<u8>, Failure> {
    use std::io::Read;
    let fail = |why: String| Failure::argument(format!("cannot read {what} {path:?}: {why}"));
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| fail(e.to_string()))?;
    let meta = file.metadata().map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    let limit = crate::tls::MAX_CA_FILE;
    if meta.len() > limit {
        return Err(fail(format!("larger than {limit} bytes")));
    }
    let mut data = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut data)
        .map_err(|e| fail(e.to_string()))?;
    if data.len() as u64 > limit {
        return Err(fail(format!("larger than {limit} bytes")));
    }
    Ok(data)
}
