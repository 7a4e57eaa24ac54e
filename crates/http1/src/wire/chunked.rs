//! The chunked transfer coding (RFC 9112 §7.1), as hyper reads and writes
//! it: the client role decodes the app's chunked bodies with [`decode`],
//! the server role frames its clients' with [`encode_data`] and
//! [`LAST_CHUNK`].

use std::io::Write;

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
pub(crate) enum Decoded {
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
pub(crate) fn decode(state: ChunkState, buf: &mut BytesMut) -> Result<Decoded, &'static str> {
    match state {
        ChunkState::Size => match httparse::parse_chunk_size(buf) {
            Ok(httparse::Status::Complete((used, size))) => {
                buf.advance(used);
                Ok(Decoded::Next(if size == 0 {
                    ChunkState::Trailers
                } else {
                    ChunkState::Data(size)
                }))
            }
            Ok(httparse::Status::Partial) if buf.len() > CHUNK_LINE_MAX => {
                Err("chunk size line too long")
            }
            Ok(httparse::Status::Partial) => Ok(Decoded::Short),
            Err(_) => Err("invalid chunk size"),
        },
        ChunkState::Data(_) if buf.is_empty() => Ok(Decoded::Short),
        ChunkState::Data(left) => {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            let data = buf.split_to(n).freeze();
            let left = left - n as u64;
            let next = if left == 0 {
                ChunkState::DataEnd
            } else {
                ChunkState::Data(left)
            };
            Ok(Decoded::Data(data, next))
        }
        ChunkState::DataEnd if buf.len() < 2 => Ok(Decoded::Short),
        ChunkState::DataEnd if &buf[..2] != b"\r\n" => Err("no CRLF after chunk data"),
        ChunkState::DataEnd => {
            buf.advance(2);
            Ok(Decoded::Next(ChunkState::Size))
        }
        ChunkState::Trailers => match trailers(buf)? {
            Some(trailers) => Ok(Decoded::End(trailers)),
            None if buf.len() > CHUNK_LINE_MAX => Err("trailers too long"),
            None => Ok(Decoded::Short),
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

/// Writes the size line of a chunk of `len` bytes, as hyper writes it
/// (upper-case hex); the chunk's data and [`CHUNK_END`] follow.
pub(crate) fn encode_data(dst: &mut Vec<u8>, len: usize) {
    let _ = write!(dst, "{len:X}\r\n");
}

/// What follows a chunk's data.
pub(crate) const CHUNK_END: &[u8] = b"\r\n";

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
                Decoded::Next(next) => state = next,
                Decoded::Data(bytes, next) => {
                    data.extend_from_slice(&bytes);
                    state = next;
                }
                Decoded::End(trailers) => return Ok((data, trailers.map_or(0, |t| t.len()))),
                Decoded::Short => return Err("short"),
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
    fn what_is_written_reads_back() {
        let mut sent = Vec::new();
        for piece in [&b"hello"[..], &[b'x'; 300][..]] {
            encode_data(&mut sent, piece.len());
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
