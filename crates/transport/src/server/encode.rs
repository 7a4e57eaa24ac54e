//! A response head written as hyper writes it (its status line, then its
//! fields by a [`HeadWriter`], then its end), and the write queue that
//! holds it and the body's bytes behind it.

use std::io::{self, IoSlice, Write};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, Entry, TRAILER, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};
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
        ask_close(&mut parts.headers);
    }
    if parts.status.is_informational() && parts.status != StatusCode::SWITCHING_PROTOCOLS {
        // hyper answers no final response with a `1xx`: it writes `500`
        // and closes.
        dst.extend_from_slice(b"HTTP/1.1 500 Internal Server Error\r\n");
        if !head {
            dst.extend_from_slice(b"Content-Length: 0\r\n");
        }
        finish_head(dst, false);
        return Ok((Framing::Length(0), true));
    }
    status_line(dst, parts);
    let mut writer = HeadWriter::new(dst, parts, length, head, keep_alive);
    for (name, value) in parts.headers.iter() {
        writer.field(name, value)?;
    }
    Ok(writer.finish())
}

/// Adds `close` to the response's `Connection`, unless it says so
/// already: the connection closes after it.
fn ask_close(headers: &mut HeaderMap) {
    match headers.entry(CONNECTION) {
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

/// Writes a final response's status line: `HTTP/1.1 200 OK` as it is,
/// any other from its version, its code and its reason (the response's
/// own, or the standard one).
fn status_line(dst: &mut Vec<u8>, parts: &http::response::Parts) {
    let status = parts.status;
    let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>();
    let http10 = parts.version == Version::HTTP_10;
    if !http10 && status == StatusCode::OK && reason.is_none() {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        return;
    }
    dst.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    dst.extend_from_slice(status.as_str().as_bytes());
    dst.push(b' ');
    match reason {
        Some(reason) => dst.extend_from_slice(reason.as_bytes()),
        None => dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
    }
    dst.extend_from_slice(b"\r\n");
}

/// A final response's header fields being written, in the map's order,
/// as hyper's server writes them: what the fields said so far of the
/// body's framing, the `Date` and the connection's end, and the line that
/// later values of the same name join.
struct HeadWriter<'a> {
    dst: &'a mut Vec<u8>,
    /// The body's size as hyper takes it: `None` for no body, `Some(None)`
    /// for a size unknown.
    length: Option<Option<u64>>,
    /// The request is a `HEAD`.
    head: bool,
    /// The response is HTTP/1.0, which has no chunks.
    http10: bool,
    /// The status allows no body (`1xx`, `204`, `304`).
    no_content: bool,
    /// How the body is framed, as the fields say so far.
    framing: Framing,
    /// A `Content-Length` or `Transfer-Encoding` was written.
    wrote_len: bool,
    /// A `Content-Length`, `Transfer-Encoding`, `Connection` or `Trailer`
    /// line is open: further values of the same name join it.
    open: bool,
    /// The last `Transfer-Encoding` value does not end in `chunked`.
    must_chunk: bool,
    /// The first `Content-Length` of a body whose size is unknown.
    first_len: Option<u64>,
    /// The response has its own `Date`.
    wrote_date: bool,
    /// The connection closes after the response.
    last: bool,
    /// The name of the fields being written.
    current: Option<&'a HeaderName>,
}

impl<'a> HeadWriter<'a> {
    /// A writer of the fields of the final response `parts` (its status
    /// line written) into `dst`, its body `length` long, to a request that
    /// is a `HEAD` when `head`, the connection closing after it unless
    /// `keep_alive`.
    fn new(
        dst: &'a mut Vec<u8>,
        parts: &http::response::Parts,
        length: Option<Option<u64>>,
        head: bool,
        keep_alive: bool,
    ) -> Self {
        let status = parts.status;
        HeadWriter {
            dst,
            length,
            head,
            http10: parts.version == Version::HTTP_10,
            no_content: status.is_informational()
                || status == StatusCode::NO_CONTENT
                || status == StatusCode::NOT_MODIFIED,
            framing: Framing::Length(0),
            wrote_len: false,
            open: false,
            must_chunk: false,
            first_len: None,
            wrote_date: false,
            last: !keep_alive || status == StatusCode::SWITCHING_PROTOCOLS,
            current: None,
        }
    }

    /// Whether the body may be chunked: not in answer to a `HEAD`, nor
    /// for a status that allows no body.
    fn can_chunk(&self) -> bool {
        !self.head && !self.no_content
    }

    /// Writes a header field; `Err` for a `Content-Length` or
    /// `Transfer-Encoding` hyper cannot write.
    #[inline]
    fn field(&mut self, name: &'a HeaderName, value: &HeaderValue) -> Result<(), ()> {
        if !self.current.is_some_and(|c| std::ptr::eq(c, name)) {
            self.close_line();
            self.current = Some(name);
        }
        // Whether the field goes on a line of its own, as it is.
        let as_is = match *name {
            CONTENT_LENGTH => self.content_length(name, value)?,
            TRANSFER_ENCODING => {
                self.transfer_encoding(name, value)?;
                false
            }
            CONNECTION => {
                self.last = self.last || connection_has(value, "close");
                self.add_to_line(name, value);
                false
            }
            DATE => {
                self.wrote_date = true;
                true
            }
            TRAILER => {
                if !self.http10 && self.can_chunk() {
                    self.add_to_line(name, value);
                }
                false
            }
            _ => true,
        };
        if as_is {
            header_line(self.dst, name, value);
        }
        Ok(())
    }

    /// Writes a `Content-Length`: the body's own size when it is known
    /// (one line, whatever the field says), the field's when it is not
    /// (its repeats dropped, `Err` when they differ). `Ok(true)` when it
    /// goes as it is instead, on a line of its own: for a `HEAD` without a
    /// body.
    fn content_length(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<bool, ()> {
        if self.wrote_len && !self.open {
            return Err(());
        }
        match self.length {
            Some(Some(known)) => {
                if !self.open {
                    self.framing = Framing::Length(known);
                    open_line(self.dst, name, value);
                    self.wrote_len = true;
                    self.open = true;
                }
            }
            Some(None) => {
                let Some(len) = digits(value.as_bytes()) else {
                    return Err(());
                };
                if let Some(first) = self.first_len {
                    return if first == len { Ok(false) } else { Err(()) };
                }
                self.framing = Framing::Length(len);
                open_line(self.dst, name, value);
                self.wrote_len = true;
                self.open = true;
                self.first_len = Some(len);
            }
            None if !self.head => {}
            None => {
                self.wrote_len = true;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Writes a `Transfer-Encoding` (none in HTTP/1.0, nor where the body
    /// may not be chunked), its values on one line that ends in `chunked`.
    fn transfer_encoding(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<(), ()> {
        if self.wrote_len && !self.open {
            return Err(());
        }
        if self.http10 || !self.can_chunk() {
            return Ok(());
        }
        self.wrote_len = true;
        self.must_chunk = !ends_chunked(value);
        if !self.open {
            self.framing = Framing::Chunked(());
        }
        self.add_to_line(name, value);
        Ok(())
    }

    /// Adds a value to the open line, or opens one with it.
    fn add_to_line(&mut self, name: &HeaderName, value: &HeaderValue) {
        if self.open {
            self.dst.extend_from_slice(b", ");
            self.dst.extend_from_slice(value.as_bytes());
        } else {
            open_line(self.dst, name, value);
            self.open = true;
        }
    }

    /// Ends the open line, if one is; a `Transfer-Encoding` whose last
    /// coding is not `chunked` gets it (hyper adds it to whichever line it
    /// ends).
    fn close_line(&mut self) {
        if self.open {
            if self.must_chunk {
                self.dst.extend_from_slice(b", chunked\r\n");
            } else {
                self.dst.extend_from_slice(b"\r\n");
            }
            self.open = false;
        }
    }

    /// Ends the head: the framing the fields did not say, from the body's
    /// size, the `Date` and the blank line. Says how the body is framed
    /// and whether the connection closes after it.
    fn finish(mut self) -> (Framing, bool) {
        self.close_line();
        let mut framing = if self.wrote_len {
            self.framing
        } else {
            self.implied_framing()
        };
        if self.head || self.no_content {
            framing = Framing::Length(0);
        }
        finish_head(self.dst, self.wrote_date);
        (framing, self.last || framing == Framing::Close)
    }

    /// The framing of a body whose fields gave none, written as hyper
    /// writes it: chunks for a size unknown (or the connection's close,
    /// where chunks may not be), a `Content-Length` for a size known.
    fn implied_framing(&mut self) -> Framing {
        let can_length = !self.no_content;
        match self.length {
            Some(None) if self.http10 || !self.can_chunk() => Framing::Close,
            Some(None) => {
                self.dst
                    .extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                Framing::Chunked(())
            }
            None | Some(Some(0)) => {
                if can_length && !self.head {
                    self.dst.extend_from_slice(b"Content-Length: 0\r\n");
                }
                Framing::Length(0)
            }
            Some(Some(len)) if can_length => {
                self.dst.extend_from_slice(b"Content-Length: ");
                let _ = write!(self.dst, "{len}\r\n");
                Framing::Length(len)
            }
            Some(Some(_)) => Framing::Length(0),
        }
    }
}

/// Starts a header line that later values of its name may join.
fn open_line(dst: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    title_case(dst, name.as_str());
    dst.extend_from_slice(b": ");
    dst.extend_from_slice(value.as_bytes());
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
