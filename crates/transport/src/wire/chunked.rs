//! The chunked transfer coding (RFC 9112 §7.1), as hyper reads and writes
//! it: [`decode`] reads a chunked body a step at a time, and a chunk's size
//! line ([`ChunkSize`]), [`CHUNK_END`] and [`LAST_CHUNK`] write one. The
//! body's framing around them, for both roles, is
//! [`framing`](super::framing)'s.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Most bytes a chunk-size line or the trailers of a chunked body may
/// take before the body is refused.
pub(crate) const CHUNK_LINE_MAX: usize = 16 * 1024;
/// Trailer lines parsed on the stack (more is a refused body).
const TRAILER_LINES: usize = 64;
/// The last chunk, with no trailers.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Where a chunked body's reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkState {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of a chunk's data are left.
    Data(u64),
    /// The CRLF after a chunk's data is next.
    DataEnd,
    /// The trailers after the last chunk are next.
    Trailers,
}

/// What one step of [`decode`] made of the bytes read so far.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// The reading moved on, to this state.
    Next(ChunkState),
    /// Data, and the state after it.
    Data(Bytes, ChunkState),
    /// The body ended, with these trailers, if any.
    End(Option<HeaderMap>),
    /// More bytes are needed.
    Short,
}

/// Decodes what it can from the start of `buf` in state `state`,
/// consuming it; `Err` with hyper's words for a body that is not chunked
/// as HTTP says.
pub(crate) fn decode(state: ChunkState, buf: &mut BytesMut) -> Result<Step, &'static str> {
    match state {
        ChunkState::Size => match httparse::parse_chunk_size(buf) {
            Ok(httparse::Status::Complete((used, size))) => {
                buf.advance(used);
                Ok(Step::Next(if size == 0 {
                    ChunkState::Trailers
                } else {
                    ChunkState::Data(size)
                }))
            }
            Ok(httparse::Status::Partial) if buf.len() > CHUNK_LINE_MAX => {
                Err("chunk size line too long")
            }
            Ok(httparse::Status::Partial) => Ok(Step::Short),
            Err(_) => Err("invalid chunk size"),
        },
        ChunkState::Data(_) if buf.is_empty() => Ok(Step::Short),
        ChunkState::Data(left) => {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            let data = buf.split_to(n).freeze();
            let left = left - n as u64;
            let next = if left == 0 {
                ChunkState::DataEnd
            } else {
                ChunkState::Data(left)
            };
            Ok(Step::Data(data, next))
        }
        ChunkState::DataEnd if buf.len() < 2 => Ok(Step::Short),
        ChunkState::DataEnd if &buf[..2] != b"\r\n" => Err("no CRLF after chunk data"),
        ChunkState::DataEnd => {
            buf.advance(2);
            Ok(Step::Next(ChunkState::Size))
        }
        ChunkState::Trailers => match trailers(buf)? {
            Some(trailers) => Ok(Step::End(trailers)),
            None if buf.len() > CHUNK_LINE_MAX => Err("trailers too long"),
            None => Ok(Step::Short),
        },
    }
}

/// The trailers after the last chunk, once all of them are in `buf`:
/// `Some(None)` when there are none.
fn trailers(buf: &mut BytesMut) -> Result<Option<Option<HeaderMap>>, &'static str> {
    let mut lines = [httparse::EMPTY_HEADER; TRAILER_LINES];
    let (used, parsed) = match httparse::parse_headers(buf, &mut lines) {
        Ok(httparse::Status::Complete((used, parsed))) => (used, parsed),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err("invalid trailers"),
    };
    let mut trailers = HeaderMap::new();
    for line in parsed {
        let name = HeaderName::from_bytes(line.name.as_bytes());
        let value = HeaderValue::from_bytes(line.value);
        match (name, value) {
            (Ok(name), Ok(value)) => {
                trailers.append(name, value);
            }
            _ => return Err("invalid trailers"),
        }
    }
    buf.advance(used);
    Ok(Some((!trailers.is_empty()).then_some(trailers)))
}

/// What follows a chunk's data.
pub(crate) const CHUNK_END: &[u8] = b"\r\n";

/// The case of the hexadecimal digits of a chunk's size, which the roles
/// write each their own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HexCase {
    /// `12C`: hyper writes chunk sizes so, and the server role writes its
    /// responses' as hyper's server did.
    Upper,
    /// `12c`: Go's transport writes chunk sizes so, and the client role
    /// writes its streamed requests' so (hyper's client writes upper case).
    Lower,
}

/// The size line of a chunk (its size in hexadecimal, then CRLF), on the
/// stack; what of it is left to write, once some of it has been.
#[derive(Debug, Default)]
pub(crate) struct ChunkSize {
    bytes: [u8; SIZE_LINE_MAX],
    at: u8,
    len: u8,
}

/// The longest size line: a `usize` in hexadecimal, and CRLF.
const SIZE_LINE_MAX: usize = usize::BITS as usize / 4 + 2;

impl ChunkSize {
    /// The size line of a chunk of `n` bytes, its digits in `case`.
    #[inline]
    pub(crate) fn new(n: usize, case: HexCase) -> Self {
        let digits: &[u8; 16] = match case {
            HexCase::Upper => b"0123456789ABCDEF",
            HexCase::Lower => b"0123456789abcdef",
        };
        let mut len = 1;
        while len < SIZE_LINE_MAX - 2 && n >> (4 * len) != 0 {
            len += 1;
        }
        let mut size = ChunkSize::default();
        for i in 0..len {
            size.bytes[len - 1 - i] = digits[(n >> (4 * i)) & 0xf];
        }
        size.bytes[len..len + 2].copy_from_slice(CHUNK_END);
        size.len = (len + 2) as u8;
        size
    }

    /// What of the line is left to write.
    pub(crate) fn rest(&self) -> &[u8] {
        &self.bytes[usize::from(self.at)..usize::from(self.len)]
    }

    /// Takes `n` written bytes (at most what is left) off the front.
    pub(crate) fn advance(&mut self, n: usize) {
        self.at += n.min(self.rest().len()) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `sent` whole: the data, and the trailers' count, or the
    /// error.
    fn decoded(sent: &[u8]) -> Result<(Vec<u8>, usize), &'static str> {
        let mut buf = BytesMut::from(sent);
        let mut state = ChunkState::Size;
        let mut data = Vec::new();
        loop {
            match decode(state, &mut buf)? {
                Step::Next(next) => state = next,
                Step::Data(bytes, next) => {
                    data.extend_from_slice(&bytes);
                    state = next;
                }
                Step::End(trailers) => return Ok((data, trailers.map_or(0, |t| t.len()))),
                Step::Short => return Err("short"),
            }
        }
    }

    #[test]
    fn chunks_and_trailers_are_read_as_hyper_reads_them() {
        assert_eq!(
            decoded(b"5\r\nhello\r\n1;ext=1\r\n!\r\n0\r\n\r\n"),
            Ok((b"hello!".to_vec(), 0))
        );
        assert_eq!(
            decoded(b"a\r\n0123456789\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n"),
            Ok((b"0123456789".to_vec(), 2))
        );
        assert_eq!(decoded(b"5\r\nhel"), Err("short"));
        assert_eq!(
            decoded(b"5\r\nhelloXX0\r\n\r\n"),
            Err("no CRLF after chunk data")
        );
        assert_eq!(decoded(b"g\r\n"), Err("invalid chunk size"));
        assert_eq!(
            decoded(b"0\r\nbad trailer\r\n\r\n"),
            Err("invalid trailers")
        );
        let mut long = b"1;".to_vec();
        long.resize(CHUNK_LINE_MAX + 1, b'a');
        assert_eq!(decoded(&long), Err("chunk size line too long"));
    }

    #[test]
    fn chunk_sizes_are_hex_lines_in_either_case() {
        for (n, upper, lower) in [
            (1, "1\r\n", "1\r\n"),
            (15, "F\r\n", "f\r\n"),
            (16, "10\r\n", "10\r\n"),
            (0xabc, "ABC\r\n", "abc\r\n"),
            (usize::MAX, "FFFFFFFFFFFFFFFF\r\n", "ffffffffffffffff\r\n"),
        ] {
            assert_eq!(ChunkSize::new(n, HexCase::Upper).rest(), upper.as_bytes());
            assert_eq!(ChunkSize::new(n, HexCase::Lower).rest(), lower.as_bytes());
            assert_eq!(
                ChunkSize::new(n, HexCase::Upper).rest(),
                format!("{n:X}\r\n").as_bytes(),
                "as hyper's server wrote it"
            );
        }
        let mut size = ChunkSize::new(0x12c, HexCase::Upper);
        size.advance(2);
        assert_eq!(size.rest(), b"C\r\n");
        size.advance(9);
        assert!(size.rest().is_empty());
    }

    #[test]
    fn what_is_written_reads_back() {
        let mut sent = Vec::new();
        for piece in [&b"hello"[..], &[b'x'; 300][..]] {
            sent.extend_from_slice(ChunkSize::new(piece.len(), HexCase::Upper).rest());
            sent.extend_from_slice(piece);
            sent.extend_from_slice(CHUNK_END);
        }
        sent.extend_from_slice(LAST_CHUNK);
        assert!(sent.starts_with(b"5\r\nhello\r\n12C\r\n"));
        let (data, trailers) = decoded(&sent).unwrap();
        assert_eq!(data.len(), 305);
        assert_eq!(trailers, 0);
    }
}
