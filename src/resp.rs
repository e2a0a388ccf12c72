//! Reading RESP2 replies from a connection's buffer.
//!
//! The redis crate's parser allocates and zeroes a fresh read buffer for every reply
//! (`combine`'s buffered reader), which cost an uncontended acquire and release more
//! instructions than the rest of the client together. Replies here are small and RESP2
//! only (no `HELLO 3` is sent), so a connection keeps one buffer and this module reads
//! values out of it as they complete: a reply that is not complete yet is read again from
//! its start once more bytes have come (no parser state between reads).

use redis::Value;

/// The largest bulk string or array accepted (Redis's own `proto-max-bulk-len` default).
const MAX_LEN: i64 = 512 * 1024 * 1024;

/// How deep arrays may nest (script replies nest one level).
const MAX_DEPTH: usize = 16;

/// Bytes that are not a RESP2 reply.
#[derive(Debug)]
pub(crate) struct NotResp;

/// A connection's read buffer: bytes read and not yet consumed are `buf[start..end]`.
pub(crate) struct ReplyBuffer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReplyBuffer {
    pub fn new() -> Self {
        ReplyBuffer {
            buf: vec![0; 16 * 1024],
            start: 0,
            end: 0,
        }
    }

    /// The next complete reply, consumed; `Ok(None)` when more bytes are needed.
    pub fn next_reply(&mut self) -> Result<Option<Value>, NotResp> {
        let mut at = self.start;
        match value(&self.buf[..self.end], &mut at, 0)? {
            Some(v) => {
                self.start = at;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(Some(v))
            }
            None => Ok(None),
        }
    }

    /// Room to read into (at least 4 KiB), making it by moving the unread bytes to the
    /// front or growing the buffer. Call [`filled`](Self::filled) with what was read.
    pub fn room(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < 4096 {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() - self.end < 4096 {
                let len = self.buf.len() * 2;
                self.buf.resize(len, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`room`](Self::room).
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Whether bytes are waiting that no reply consumed yet.
    pub fn has_unread(&self) -> bool {
        self.end > self.start
    }
}

/// The line starting at `*at` (without its CRLF), moving `*at` past it; `None` when it is
/// not complete.
fn line<'a>(buf: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let rest = &buf[*at..];
    let cr = rest.windows(2).position(|w| w == b"\r\n")?;
    *at += cr + 2;
    Some(&rest[..cr])
}

fn integer(digits: &[u8]) -> Result<i64, NotResp> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(NotResp)
}

/// One value at `*at`: `Ok(None)` when incomplete (and `*at` is then meaningless).
fn value(buf: &[u8], at: &mut usize, depth: usize) -> Result<Option<Value>, NotResp> {
    if depth > MAX_DEPTH {
        return Err(NotResp);
    }
    let Some(&kind) = buf.get(*at) else {
        return Ok(None);
    };
    if !matches!(kind, b'+' | b'-' | b':' | b'$' | b'*') {
        return Err(NotResp);
    }
    let begin = *at;
    *at += 1;
    let Some(head) = line(buf, at) else {
        return Ok(None);
    };
    match kind {
        b'+' if head == b"OK" => Ok(Some(Value::Okay)),
        b'+' => Ok(Some(Value::SimpleString(
            String::from_utf8_lossy(head).into_owned(),
        ))),
        // The redis crate's own reading of an error line (its type keeps the parts private).
        b'-' => match redis::parse_redis_value(&buf[begin..*at]) {
            Ok(v @ Value::ServerError(_)) => Ok(Some(v)),
            _ => Err(NotResp),
        },
        b':' => integer(head).map(|n| Some(Value::Int(n))),
        b'$' => {
            let len = integer(head)?;
            if len == -1 {
                return Ok(Some(Value::Nil));
            }
            if !(0..=MAX_LEN).contains(&len) {
                return Err(NotResp);
            }
            let len = len as usize;
            if buf.len() < *at + len + 2 {
                return Ok(None);
            }
            if &buf[*at + len..*at + len + 2] != b"\r\n" {
                return Err(NotResp);
            }
            let bytes = buf[*at..*at + len].to_vec();
            *at += len + 2;
            Ok(Some(Value::BulkString(bytes)))
        }
        _ => {
            let len = integer(head)?;
            if len == -1 {
                return Ok(Some(Value::Nil));
            }
            if !(0..=MAX_LEN).contains(&len) {
                return Err(NotResp);
            }
            let mut items = Vec::with_capacity((len as usize).min(64));
            for _ in 0..len {
                match value(buf, at, depth + 1)? {
                    Some(v) => items.push(v),
                    None => return Ok(None),
                }
            }
            Ok(Some(Value::Array(items)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(buffer: &mut ReplyBuffer, bytes: &[u8]) {
        let room = buffer.room();
        room[..bytes.len()].copy_from_slice(bytes);
        buffer.filled(bytes.len());
    }

    /// Every reply shape reads as the redis crate's parser reads it, whole or in pieces.
    #[test]
    fn replies_read_as_the_redis_crate_reads_them() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b"-ERR unknown command\r\n",
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            b":-42\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\na\r\nbc\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n:1700000000000000\r\n*2\r\n$3\r\ntok\r\n$-1\r\n",
            b"*2\r\n-WRONGTYPE Operation against a key\r\n:0\r\n",
        ];
        let mut all = Vec::new();
        for reply in replies {
            all.extend_from_slice(reply);
        }
        for split in [1, 2, 3, 7, all.len()] {
            let mut buffer = ReplyBuffer::new();
            let mut got = Vec::new();
            for chunk in all.chunks(split) {
                feed(&mut buffer, chunk);
                while let Some(v) = buffer.next_reply().unwrap() {
                    got.push(v);
                }
            }
            assert!(!buffer.has_unread());
            let expected: Vec<Value> = replies
                .iter()
                .map(|r| redis::parse_redis_value(r).unwrap())
                .collect();
            assert_eq!(got, expected, "in chunks of {split}");
        }
    }

    #[test]
    fn bytes_that_are_not_resp_are_refused() {
        for bad in [
            &b"HTTP/1.1 400 Bad Request\r\n"[..],
            b"$3\r\nabcd\r\n",
            b":12x\r\n",
            b"$-7\r\n",
            b"*99999999999\r\n",
        ] {
            let mut buffer = ReplyBuffer::new();
            feed(&mut buffer, bad);
            assert!(buffer.next_reply().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_reply_larger_than_the_buffer_grows_it() {
        let mut buffer = ReplyBuffer::new();
        let body = vec![b'x'; 100_000];
        let mut reply = format!("${}\r\n", body.len()).into_bytes();
        reply.extend_from_slice(&body);
        reply.extend_from_slice(b"\r\n");
        let mut sent = 0;
        let value = loop {
            if let Some(v) = buffer.next_reply().unwrap() {
                break v;
            }
            let room = buffer.room();
            let n = room.len().min(reply.len() - sent);
            room[..n].copy_from_slice(&reply[sent..sent + n]);
            buffer.filled(n);
            sent += n;
        };
        assert_eq!(value, Value::BulkString(body));
    }
}
