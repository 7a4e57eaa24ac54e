//! How a message body is framed on the wire (RFC 9112 §6): one codec for
//! both roles, as in hyper's `proto/h1`. An [`Encoder`] frames the bodies
//! qproxy writes (the server its responses', the client the request bodies
//! it streams to the app), a [`Decoder`] reads the ones it is sent (the
//! client the app's responses'); both work from one [`Framing`], and the
//! chunked coding's own rules are [`chunked`]'s.
//!
//! Where the roles write a body each their own way, the caller says which:
//! a data frame that goes past what a `Content-Length` still owes is cut
//! to it ([`Encoder::encode`], as hyper's server writes it) or refused
//! ([`Encoder::encode_exact`], as a request is never sent longer than its
//! head said); a chunk's size is written in the role's [`HexCase`];
//! trailers are written only by the client, in the last chunk
//! ([`Encoder::encode_trailers`]). What a body that ends short of its
//! length leads to is each role's own: the encoder says so ([`TooShort`]),
//! and the server closes the connection while the client fails the
//! request.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName};

use super::chunked::{self, CHUNK_END, ChunkSize, ChunkState, HexCase, LAST_CHUNK, Step};
use super::title_case::header_line;

/// How a message body is framed: what tells where it ends.
///
/// `C` is what a chunked body carries along: nothing while it is written,
/// and where its reading is ([`ChunkState`]) while it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing<C = ()> {
    /// `Content-Length`: this many bytes are still owed.
    Length(u64),
    /// Chunked: it ends at its last chunk (and trailers).
    Chunked(C),
    /// It ends with the connection's close.
    Close,
}

/// A body's framing as it is written: what frames its next data frame and
/// its end.
#[derive(Debug)]
pub(crate) struct Encoder(Framing);

/// A data frame framed for the wire.
#[derive(Debug)]
pub(crate) enum Encoded {
    /// The data, as it is: the body's length or the connection's close
    /// frames it.
    Data(Bytes),
    /// A chunk, written as its size line, its data, then [`CHUNK_END`].
    Chunk {
        /// The chunk's size line.
        size: ChunkSize,
        /// The chunk's data.
        data: Bytes,
    },
}

/// A data frame that goes past what the body's `Content-Length` still
/// owes, refused by [`Encoder::encode_exact`].
#[derive(Debug)]
pub(crate) struct TooLong;

/// A body that ended with bytes of its `Content-Length` still owed.
#[derive(Debug)]
pub(crate) struct TooShort;

impl Encoder {
    /// An encoder for a body framed as `framing` says.
    pub(crate) fn new(framing: Framing) -> Self {
        Encoder(framing)
    }

    /// Frames `data`, a data frame of the body (not empty: an empty chunk
    /// would be the last one), a chunk's size in `case`. A frame that goes
    /// past what a length still owes is cut to what is owed, as hyper's
    /// server writes a body that gives more than its `Content-Length`.
    #[inline]
    pub(crate) fn encode(&mut self, mut data: Bytes, case: HexCase) -> Encoded {
        match &mut self.0 {
            Framing::Length(owed) => {
                if let Ok(owed) = usize::try_from(*owed)
                    && data.len() > owed
                {
                    data.truncate(owed);
                }
                *owed -= data.len() as u64;
                Encoded::Data(data)
            }
            Framing::Chunked(()) => Encoded::Chunk {
                size: ChunkSize::new(data.len(), case),
                data,
            },
            Framing::Close => Encoded::Data(data),
        }
    }

    /// Frames `data` as [`encode`](Self::encode) does, but refuses a frame
    /// that goes past what a length still owes, cutting nothing: a request
    /// body is never sent longer than its head said.
    #[inline]
    pub(crate) fn encode_exact(&mut self, data: Bytes, case: HexCase) -> Result<Encoded, TooLong> {
        if let Framing::Length(owed) = self.0
            && data.len() as u64 > owed
        {
            return Err(TooLong);
        }
        Ok(self.encode(data, case))
    }

    /// The bytes that end the body: the last chunk, without trailers, for
    /// a chunked one (after which nothing more is owed); nothing for one
    /// whose length is met or that the connection's close ends. `Err` when
    /// bytes of its length are still owed.
    #[inline]
    pub(crate) fn end(&mut self) -> Result<&'static [u8], TooShort> {
        match self.0 {
            Framing::Length(0) | Framing::Close => Ok(b""),
            Framing::Length(_) => Err(TooShort),
            Framing::Chunked(()) => {
                self.0 = Framing::Length(0);
                Ok(LAST_CHUNK)
            }
        }
    }

    /// The last chunk of a chunked body with the fields of `trailers` that
    /// `announced` names (those its head announced in `Trailer`, which
    /// hyper's client sends, and no others), to write in place of
    /// [`end`](Self::end)'s; `None` when the body is not chunked or none of
    /// those fields is there. Asked before `end`, which leaves a chunked
    /// body with nothing owed. Only the client writes trailers: the
    /// server's would go to a client that asked for them (`TE: trailers`),
    /// and such requests are hyper's.
    pub(crate) fn encode_trailers(
        &self,
        trailers: &HeaderMap,
        announced: &[HeaderName],
    ) -> Option<Bytes> {
        if self.0 != Framing::Chunked(()) {
            return None;
        }
        let mut chunk = Vec::new();
        for (name, value) in trailers {
            if announced.contains(name) {
                if chunk.is_empty() {
                    // The last chunk's size line; the fields follow.
                    chunk.extend_from_slice(b"0\r\n");
                }
                header_line(&mut chunk, name, value);
            }
        }
        if chunk.is_empty() {
            return None;
        }
        chunk.extend_from_slice(CHUNK_END);
        Some(Bytes::from(chunk))
    }
}

/// A body's framing as it is read, with where a chunked body's reading is.
#[derive(Debug)]
pub(crate) struct Decoder(Framing<ChunkState>);

/// What [`Decoder::decode`] made of the bytes read so far.
#[derive(Debug, PartialEq)]
pub(crate) enum Decoded {
    /// Data of the body.
    Data(Bytes),
    /// The body ended, with these trailers, if any.
    End(Option<HeaderMap>),
    /// More bytes are needed (at most [`Decoder::wants`] of them).
    Short,
}

impl Decoder {
    /// A decoder for a body framed as `framing` says, a chunked one from
    /// its first size line.
    pub(crate) fn new(framing: Framing) -> Self {
        Decoder(match framing {
            Framing::Length(n) => Framing::Length(n),
            Framing::Chunked(()) => Framing::Chunked(ChunkState::Size),
            Framing::Close => Framing::Close,
        })
    }

    /// Whether the body has ended: nothing more of it is owed.
    #[inline]
    pub(crate) fn is_end(&self) -> bool {
        self.0 == Framing::Length(0)
    }

    /// The bytes still owed, when a length frames the body.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self.0 {
            Framing::Length(n) => Some(n),
            Framing::Chunked(_) | Framing::Close => None,
        }
    }

    /// The most bytes the body's next read should ask for: what a length
    /// still owes, or whatever has come, for a chunked body (however
    /// little its next step needs: an event stream's chunk arrives whole)
    /// and one that the close ends.
    #[inline]
    pub(crate) fn wants(&self) -> u64 {
        match self.0 {
            Framing::Length(n) => n,
            Framing::Chunked(_) | Framing::Close => u64::MAX,
        }
    }

    /// How many of the body's next bytes on the wire are its data, as
    /// they are, when that is known: what a length still owes, or what is
    /// left of a chunk's data. They may be taken without decoding
    /// ([`took`](Self::took)), once the bytes read so far are decoded.
    pub(crate) fn data_ahead(&self) -> Option<u64> {
        match self.0 {
            Framing::Length(n) | Framing::Chunked(ChunkState::Data(n)) if n > 0 => Some(n),
            _ => None,
        }
    }

    /// `n` bytes of [`data_ahead`](Self::data_ahead) were taken as they
    /// are (at most as many as it said).
    pub(crate) fn took(&mut self, n: usize) {
        match &mut self.0 {
            Framing::Length(owed) => *owed = owed.saturating_sub(n as u64),
            Framing::Chunked(state @ ChunkState::Data(_)) => {
                if let ChunkState::Data(left) = *state {
                    let left = left.saturating_sub(n as u64);
                    *state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    };
                }
            }
            Framing::Chunked(_) | Framing::Close => {}
        }
    }

    /// Whether the connection's close ends the body whole; it cuts any
    /// other short.
    pub(crate) fn ends_at_close(&self) -> bool {
        self.0 == Framing::Close
    }

    /// Decodes what it can of the body from the start of `buf`, consuming
    /// it: data up to what a length still owes, or all that has come of a
    /// body the close ends, or a chunked body's next data or end. `Err`
    /// with hyper's words for a chunked body that is not chunked as HTTP
    /// says.
    #[inline]
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, &'static str> {
        match &mut self.0 {
            Framing::Length(0) => Ok(Decoded::End(None)),
            Framing::Length(_) | Framing::Close if buf.is_empty() => Ok(Decoded::Short),
            Framing::Length(owed) => {
                let n = usize::try_from(*owed).unwrap_or(usize::MAX).min(buf.len());
                *owed -= n as u64;
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            Framing::Close => Ok(Decoded::Data(buf.split_to(buf.len()).freeze())),
            Framing::Chunked(state) => loop {
                match chunked::decode(*state, buf)? {
                    Step::Next(next) => *state = next,
                    Step::Data(data, next) => {
                        *state = next;
                        return Ok(Decoded::Data(data));
                    }
                    Step::End(trailers) => {
                        self.0 = Framing::Length(0);
                        return Ok(Decoded::End(trailers));
                    }
                    Step::Short => return Ok(Decoded::Short),
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    /// What `encode` writes of `frames` and the end, each frame's pieces
    /// in order.
    fn written(encoder: &mut Encoder, frames: &[&'static [u8]], case: HexCase) -> Vec<u8> {
        let mut out = Vec::new();
        for frame in frames {
            match encoder.encode(Bytes::from_static(frame), case) {
                Encoded::Data(data) => out.extend_from_slice(&data),
                Encoded::Chunk { size, data } => {
                    out.extend_from_slice(size.rest());
                    out.extend_from_slice(&data);
                    out.extend_from_slice(CHUNK_END);
                }
            }
        }
        if let Ok(end) = encoder.end() {
            out.extend_from_slice(end);
        }
        out
    }

    #[test]
    fn each_framing_writes_its_body_and_end() {
        let frames: &[&'static [u8]] = &[b"hello", &[b'x'; 300]];
        let mut chunked = Encoder::new(Framing::Chunked(()));
        let sent = written(&mut chunked, frames, HexCase::Upper);
        assert!(sent.starts_with(b"5\r\nhello\r\n12C\r\nxxx"));
        assert!(sent.ends_with(b"x\r\n0\r\n\r\n"));
        assert_eq!(chunked.end().ok(), Some(&b""[..]), "ended once");
        let mut chunked = Encoder::new(Framing::Chunked(()));
        let sent = written(&mut chunked, frames, HexCase::Lower);
        assert!(sent.starts_with(b"5\r\nhello\r\n12c\r\nxxx"));

        let mut close = Encoder::new(Framing::Close);
        assert_eq!(written(&mut close, frames, HexCase::Upper).len(), 305);
        let mut length = Encoder::new(Framing::Length(305));
        assert_eq!(written(&mut length, frames, HexCase::Upper).len(), 305);
        assert!(length.end().is_ok());
    }

    /// Past its length, a body is cut to it by `encode` (hyper's server)
    /// and refused by `encode_exact` (the client's upload); short of it,
    /// its end is refused.
    #[test]
    fn a_length_is_kept_to_either_way() {
        let mut cut = Encoder::new(Framing::Length(3));
        assert!(matches!(
            cut.encode(Bytes::from_static(b"hello"), HexCase::Upper),
            Encoded::Data(data) if data == "hel"
        ));
        assert!(cut.end().is_ok());

        let mut exact = Encoder::new(Framing::Length(3));
        let over = exact.encode_exact(Bytes::from_static(b"hello"), HexCase::Lower);
        assert!(matches!(over, Err(TooLong)));
        assert!(matches!(exact.end(), Err(TooShort)), "nothing was taken");
        assert!(matches!(
            exact.encode_exact(Bytes::from_static(b"hel"), HexCase::Lower),
            Ok(Encoded::Data(data)) if data == "hel"
        ));
        assert!(exact.end().is_ok());
    }

    #[test]
    fn only_announced_trailers_go_in_a_chunked_body_s_last_chunk() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", HeaderValue::from_static("abc"));
        trailers.insert("x-other", HeaderValue::from_static("1"));
        let announced = [HeaderName::from_static("x-checksum")];
        let chunked = Encoder::new(Framing::Chunked(()));
        assert_eq!(
            chunked.encode_trailers(&trailers, &announced).as_deref(),
            Some(&b"0\r\nX-Checksum: abc\r\n\r\n"[..])
        );
        let none = [HeaderName::from_static("x-missing")];
        assert_eq!(chunked.encode_trailers(&trailers, &none), None);
        let length = Encoder::new(Framing::Length(0));
        assert_eq!(length.encode_trailers(&trailers, &announced), None);
    }

    /// Decodes `sent`, all that came before the connection closed, as
    /// `framing` frames it: the data and the trailers' count, or why it is
    /// not whole.
    fn decoded(framing: Framing, sent: &[u8]) -> Result<(Vec<u8>, usize), &'static str> {
        let mut decoder = Decoder::new(framing);
        let mut buf = BytesMut::from(sent);
        let mut data = Vec::new();
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(bytes) => data.extend_from_slice(&bytes),
                Decoded::End(trailers) => return Ok((data, trailers.map_or(0, |t| t.len()))),
                Decoded::Short if decoder.ends_at_close() => return Ok((data, 0)),
                Decoded::Short => return Err("short"),
            }
        }
    }

    #[test]
    fn each_framing_reads_its_body_to_its_end() {
        assert_eq!(
            decoded(Framing::Length(5), b"helloGET"),
            Ok((b"hello".to_vec(), 0))
        );
        assert_eq!(decoded(Framing::Length(5), b"hel"), Err("short"));
        assert_eq!(
            decoded(Framing::Close, b"all of it"),
            Ok((b"all of it".to_vec(), 0))
        );
        assert_eq!(
            decoded(Framing::Chunked(()), b"5\r\nhello\r\n0\r\nX-A: 1\r\n\r\n"),
            Ok((b"hello".to_vec(), 1))
        );
        assert_eq!(
            decoded(Framing::Chunked(()), b"5\r\nhello\r\n"),
            Err("short")
        );
        assert_eq!(
            decoded(Framing::Chunked(()), b"g\r\n"),
            Err("invalid chunk size")
        );
        let mut chunked = Decoder::new(Framing::Chunked(()));
        let mut buf = BytesMut::from(&b"0\r\n\r\n"[..]);
        assert_eq!(chunked.decode(&mut buf), Ok(Decoded::End(None)));
        assert!(chunked.is_end());
    }

    #[test]
    fn a_read_asks_for_what_a_length_still_owes() {
        let mut decoder = Decoder::new(Framing::Length(10));
        let mut buf = BytesMut::from(&b"abc"[..]);
        assert_eq!(decoder.decode(&mut buf), Ok(Decoded::Data("abc".into())));
        assert_eq!(decoder.wants(), 7);
        assert_eq!(decoder.remaining(), Some(7));
        assert_eq!(Decoder::new(Framing::Chunked(())).wants(), u64::MAX);
        assert_eq!(Decoder::new(Framing::Close).remaining(), None);
    }

    /// Data taken from the wire as it is (spliced) counts as decoded: a
    /// length owes less, a chunk has less left, and the chunk's end comes
    /// next once its data is all taken.
    #[test]
    fn data_taken_as_it_is_moves_the_decoder_on() {
        let mut length = Decoder::new(Framing::Length(10));
        assert_eq!(length.data_ahead(), Some(10));
        length.took(4);
        assert_eq!(length.data_ahead(), Some(6));
        length.took(6);
        assert!(length.is_end());
        assert_eq!(length.data_ahead(), None);

        let mut chunked = Decoder::new(Framing::Chunked(()));
        assert_eq!(chunked.data_ahead(), None, "a size line is next");
        let mut buf = BytesMut::from(&b"8\r\nab"[..]);
        assert_eq!(chunked.decode(&mut buf), Ok(Decoded::Data("ab".into())));
        assert_eq!(chunked.data_ahead(), Some(6));
        chunked.took(6);
        assert_eq!(chunked.data_ahead(), None, "the chunk's CRLF is next");
        let mut buf = BytesMut::from(&b"\r\n0\r\n\r\n"[..]);
        assert_eq!(chunked.decode(&mut buf), Ok(Decoded::End(None)));

        assert_eq!(Decoder::new(Framing::Close).data_ahead(), None);
    }
}
