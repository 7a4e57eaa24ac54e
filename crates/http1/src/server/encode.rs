//! A response head written as hyper writes it, and the write queue that
//! holds it and the body's bytes behind it.

use std::io::{self, IoSlice, Write};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, Entry, TRAILER, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, StatusCode, Version};
use tokio::io::AsyncWrite;

use crate::wire::chunked::{CHUNK_END, HexCase};
use crate::wire::date::http_date;
use crate::wire::framing::{Encoded, Encoder, Framing};
use crate::wire::length::digits;
use crate::wire::title_case::{header_line, title_case};
use crate::wire::token::{connection_has, ends_chunked};

/// Data frames up to this size are copied after the head; larger ones
/// are written from where they are.
pub(crate) const COPY_MAX: usize = 16 * 1024;

/// A response's write queue: its bytes on their way out, written in
/// order, `front`, then `data` (a large data frame, written from where it
/// is), then `back`.
#[derive(Debug, Default)]
pub(crate) struct WriteQueue {
    pub(crate) front: Vec<u8>,
    pub(crate) data: Bytes,
    pub(crate) back: Vec<u8>,
}

impl WriteQueue {
    /// The buffer with the most room, emptied, to keep for the next
    /// response.
    pub(crate) fn keep(self) -> Vec<u8> {
        let mut kept = if self.front.capacity() >= self.back.capacity() {
            self.front
        } else {
            self.back
        };
        kept.clear();
        kept
    }

    /// How many bytes are queued.
    pub(crate) fn queued(&self) -> usize {
        self.front.len() + self.data.len() + self.back.len()
    }

    /// Where small writes go: after `data`, once there is one.
    pub(crate) fn tail(&mut self) -> &mut Vec<u8> {
        if self.data.is_empty() {
            &mut self.front
        } else {
            &mut self.back
        }
    }

    /// Queues a data frame (not empty), framed by `encoder` as hyper's
    /// server frames it: a chunk's size in upper case, and more than a
    /// length still owes cut to what it owes.
    pub(crate) fn data(&mut self, encoder: &mut Encoder, data: Bytes) {
        match encoder.encode(data, HexCase::Upper) {
            Encoded::Data(data) => self.push(data),
            Encoded::Chunk { size, data } => {
                self.tail().extend_from_slice(size.rest());
                self.push(data);
                self.tail().extend_from_slice(CHUNK_END);
            }
        }
    }

    /// Queues `data`: copied, when it is small or follows a large frame
    /// still queued, or else held as it is.
    #[inline]
    fn push(&mut self, data: Bytes) {
        if data.len() <= COPY_MAX || !self.data.is_empty() {
            self.tail().extend_from_slice(&data);
        } else {
            self.data = data;
        }
    }

    /// Queues the body's end, as `encoder` frames it; false when the body
    /// ended short of its `Content-Length`, which leaves the connection to
    /// close at once.
    pub(crate) fn end(&mut self, encoder: &mut Encoder) -> bool {
        match encoder.end() {
            Ok(last) => {
                if !last.is_empty() {
                    self.tail().extend_from_slice(last);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Writes everything queued.
    pub(crate) fn poll_write<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.queued() > 0 {
            let n = if self.data.is_empty() && self.back.is_empty() {
                ready!(Pin::new(&mut *io).poll_write(cx, &self.front))?
            } else {
                let bufs = [
                    IoSlice::new(&self.front),
                    IoSlice::new(&self.data),
                    IoSlice::new(&self.back),
                ];
                ready!(Pin::new(&mut *io).poll_write_vectored(cx, &bufs))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `n` written bytes off the front.
    pub(crate) fn advance(&mut self, mut n: usize) {
        let front = n.min(self.front.len());
        self.front.drain(..front);
        n -= front;
        let data = n.min(self.data.len());
        self.data.advance(data);
        if self.data.is_empty() {
            // Written: its memory goes back now (an emptied `Bytes` still
            // holds it), so that the body it came from can read into it
            // again.
            self.data = Bytes::new();
        }
        n -= data;
        self.back.drain(..n.min(self.back.len()));
        if self.data.is_empty() && self.front.is_empty() {
            std::mem::swap(&mut self.front, &mut self.back);
        }
    }
}

/// Writes the head of a response to a request (`head`: a `HEAD`) as
/// hyper's server writes it, and says how its body is framed and whether
/// the connection closes after it. `length` is the body's size as hyper
/// takes it: `None` for no body, `Some(None)` for a size unknown.
/// `Err` when hyper would write nothing and close: a `Content-Length` or
/// `Transfer-Encoding` it cannot write.
pub(crate) fn encode_head(
    parts: &mut http::response::Parts,
    length: Option<Option<u64>>,
    head: bool,
    keep_alive: bool,
    dst: &mut Vec<u8>,
) -> Result<(Framing, bool), ()> {
    if !keep_alive {
        match parts.headers.entry(CONNECTION) {
            Entry::Occupied(mut entry) => {
                if !entry.iter().any(|v| connection_has(v, "close")) {
                    entry.append(HeaderValue::from_static("close"));
                }
            }
            Entry::Vacant(entry) => {
                entry.insert(HeaderValue::from_static("close"));
            }
        }
    }
    let status = parts.status;
    let mut last = !keep_alive;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        last = true;
    } else if status.is_informational() {
        // hyper answers no final response with a `1xx`: it writes `500`
        // and closes.
        dst.extend_from_slice(b"HTTP/1.1 500 Internal Server Error\r\n");
        if !head {
            dst.extend_from_slice(b"Content-Length: 0\r\n");
        }
        finish_head(dst, false);
        return Ok((Framing::Length(0), true));
    }
    let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>();
    let http10 = parts.version == Version::HTTP_10;
    if !http10 && status == StatusCode::OK && reason.is_none() {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        dst.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
        dst.extend_from_slice(status.as_str().as_bytes());
        dst.push(b' ');
        match reason {
            Some(reason) => dst.extend_from_slice(reason.as_bytes()),
            None => dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
        }
        dst.extend_from_slice(b"\r\n");
    }

    let no_content = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let can_chunk = !head && !no_content;
    let can_length = !no_content;

    let mut framing = Framing::Length(0);
    let mut wrote_len = false;
    // A `Content-Length`, `Transfer-Encoding`, `Connection` or `Trailer`
    // line is open: further values of the same name join it.
    let mut open = false;
    let mut must_chunk = false;
    let mut first_len = None;
    let mut wrote_date = false;
    let mut current: Option<&HeaderName> = None;
    for (name, value) in parts.headers.iter() {
        if !current.is_some_and(|c| std::ptr::eq(c, name)) {
            close_line(dst, &mut open, must_chunk);
            current = Some(name);
        }
        match *name {
            CONTENT_LENGTH => {
                if wrote_len && !open {
                    return Err(());
                }
                match length {
                    Some(Some(known)) => {
                        if !open {
                            framing = Framing::Length(known);
                            open_line(dst, name, value);
                            wrote_len = true;
                            open = true;
                        }
                        continue;
                    }
                    Some(None) => {
                        let Some(len) = digits(value.as_bytes()) else {
                            return Err(());
                        };
                        if let Some(first) = first_len {
                            if first != len {
                                return Err(());
                            }
                            continue;
                        }
                        framing = Framing::Length(len);
                        open_line(dst, name, value);
                        wrote_len = true;
                        open = true;
                        first_len = Some(len);
                        continue;
                    }
                    None if !head => continue,
                    None => wrote_len = true,
                }
            }
            TRANSFER_ENCODING => {
                if wrote_len && !open {
                    return Err(());
                }
                if http10 || !can_chunk {
                    continue;
                }
                wrote_len = true;
                must_chunk = !ends_chunked(value);
                if !open {
                    framing = Framing::Chunked(());
                }
                add_to_line(dst, &mut open, name, value);
                continue;
            }
            CONNECTION => {
                last = last || connection_has(value, "close");
                add_to_line(dst, &mut open, name, value);
                continue;
            }
            DATE => wrote_date = true,
            TRAILER => {
                if http10 || !can_chunk {
                    continue;
                }
                add_to_line(dst, &mut open, name, value);
                continue;
            }
            _ => {}
        }
        header_line(dst, name, value);
    }
    close_line(dst, &mut open, must_chunk);

    if !wrote_len {
        framing = match length {
            Some(None) if http10 || !can_chunk => Framing::Close,
            Some(None) => {
                dst.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                Framing::Chunked(())
            }
            None | Some(Some(0)) => {
                if can_length && !head {
                    dst.extend_from_slice(b"Content-Length: 0\r\n");
                }
                Framing::Length(0)
            }
            Some(Some(len)) if can_length => {
                dst.extend_from_slice(b"Content-Length: ");
                let _ = write!(dst, "{len}\r\n");
                Framing::Length(len)
            }
            Some(Some(_)) => Framing::Length(0),
        };
    }
    if head || no_content {
        framing = Framing::Length(0);
    }
    finish_head(dst, wrote_date);
    if framing == Framing::Close {
        last = true;
    }
    Ok((framing, last))
}

/// Starts a header line that later values of its name may join.
fn open_line(dst: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    title_case(dst, name.as_str());
    dst.extend_from_slice(b": ");
    dst.extend_from_slice(value.as_bytes());
}

/// Adds a value to the open line, or opens one with it.
fn add_to_line(dst: &mut Vec<u8>, open: &mut bool, name: &HeaderName, value: &HeaderValue) {
    if *open {
        dst.extend_from_slice(b", ");
        dst.extend_from_slice(value.as_bytes());
    } else {
        open_line(dst, name, value);
        *open = true;
    }
}

/// Ends the open line, if one is; a `Transfer-Encoding` whose last coding
/// is not `chunked` gets it (hyper adds it to whichever line it ends).
fn close_line(dst: &mut Vec<u8>, open: &mut bool, must_chunk: bool) {
    if *open {
        if must_chunk {
            dst.extend_from_slice(b", chunked\r\n");
        } else {
            dst.extend_from_slice(b"\r\n");
        }
        *open = false;
    }
}

/// Adds the `Date` (unless the response has one) and the head's end.
pub(crate) fn finish_head(dst: &mut Vec<u8>, wrote_date: bool) {
    if !wrote_date {
        dst.extend_from_slice(b"Date: ");
        http_date(dst);
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use bytes::BytesMut;

    use super::*;

    /// A data frame, once written, lets go of its memory, so that the
    /// body it came from reads into the same buffer again instead of a
    /// new one for every read.
    #[tokio::test]
    async fn a_written_frame_lets_go_of_the_body_buffer() {
        let size = 2 * COPY_MAX;
        let mut read = BytesMut::with_capacity(2 * size);
        read.resize(size, b'x');
        let frame = read.split_to(size).freeze();
        let mut encoder = Encoder::new(Framing::Length(size as u64));
        let mut out = WriteQueue::default();
        out.data(&mut encoder, frame);
        let mut written = Vec::new();
        poll_fn(|cx| out.poll_write(&mut written, cx))
            .await
            .unwrap();
        assert_eq!(written.len(), size);
        assert!(
            read.try_reclaim(2 * size),
            "the written frame still holds the body's buffer"
        );
    }
}
