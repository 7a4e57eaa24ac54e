//! A request body streamed to the app as the client sends it: framed by
//! its `Content-Length`, or in chunks (with the trailers the request
//! announced in `Trailer`, as hyper's client sends them), each chunk's
//! size in lower-case hex as Go's transport writes it (hyper's client
//! writes it in upper case).
//!
//! The request's head waits for the body's first frame and goes out with
//! it, as Go's transport sends a head with the first bytes of its body: an
//! app that closes a kept-alive connection as a request arrives then has
//! the whole of a small request, and the client's body has been read, so
//! that the client's connection can serve its next request.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http::header::HeaderName;
use http_body::Body;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use crate::BoxError;
use crate::wire::chunked::{CHUNK_END, ChunkSize, HexCase};
use crate::wire::framing::{Encoded, Encoder, Framing, TooLong, TooShort};

/// Why a streamed request body could not be written whole.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The client's body failed (the client went away, or broke its
    /// framing).
    #[error("the client's request body failed: {0}")]
    Body(BoxError),
    /// The client's body did not match its `Content-Length`.
    #[error("the client's request body does not match its Content-Length")]
    Length,
    /// The client's body failed before, and is polled again.
    #[error("the client's request body failed earlier")]
    Failed,
    /// The connection to the app failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A request body on its way to the app: what is to be written next (the
/// head, before the first frame), and the rest of the client's body.
#[derive(Debug)]
pub struct Upload<B> {
    body: B,
    /// Its `Content-Length`, or chunks.
    encoder: Encoder,
    /// The trailer fields the request announced in `Trailer`, which go in
    /// the last chunk of a chunked body (`None`: it announced none, or its
    /// body has a length, and none are sent).
    trailers: Option<Vec<HeaderName>>,
    /// Written in order: the request's head (until the first frame goes
    /// with it), a chunk's size line, its data, the line's end.
    out: Out,
    /// The head waits for the first frame.
    head_held: bool,
    /// The body's end has been framed into `out`.
    ended: bool,
    /// The client's body failed: its end is never framed, and every later
    /// poll fails again, so that nothing sends this request as if it had
    /// ended (a body that failed may answer `None` when polled again, as
    /// hyper's does once its error has been taken).
    failed: bool,
}

/// The bytes to write next, as up to four slices.
#[derive(Debug, Default)]
struct Out {
    head: Bytes,
    size: ChunkSize,
    data: Bytes,
    tail: &'static [u8],
}

impl Out {
    fn is_empty(&self) -> bool {
        self.head.is_empty()
            && self.size.rest().is_empty()
            && self.data.is_empty()
            && self.tail.is_empty()
    }

    /// Takes `n` written bytes off the front.
    fn advance(&mut self, mut n: usize) {
        let from_head = n.min(self.head.len());
        self.head.advance(from_head);
        n -= from_head;
        let from_size = n.min(self.size.rest().len());
        self.size.advance(from_size);
        n -= from_size;
        let from_data = n.min(self.data.len());
        self.data.advance(from_data);
        n -= from_data;
        self.tail = &self.tail[n.min(self.tail.len())..];
    }
}

impl<B> Upload<B> {
    /// Whether the client's body has failed: the request can never be
    /// written whole, on this connection or another.
    pub(crate) fn has_failed(&self) -> bool {
        self.failed
    }
}

impl<B> Upload<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// `body`, framed as `framing` says (a chunked one's last chunk with
    /// the `trailers` the request announced), after `head`.
    pub(crate) fn new(
        head: Bytes,
        body: B,
        framing: Framing,
        trailers: Option<Vec<HeaderName>>,
    ) -> Self {
        Upload {
            body,
            encoder: Encoder::new(framing),
            trailers,
            out: Out {
                head,
                ..Out::default()
            },
            head_held: true,
            ended: false,
            failed: false,
        }
    }

    /// The request's head, while it is held.
    #[cfg(test)]
    pub(crate) fn head(&self) -> &Bytes {
        &self.out.head
    }

    /// Writes what there is to write, reading the client's body as the
    /// socket takes it; `Ready(Ok)` once the body's end is written.
    /// `written` is set once any byte has gone out.
    pub(crate) fn poll_write(
        &mut self,
        tcp: &mut TcpStream,
        written: &mut bool,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UploadError>> {
        if self.failed {
            return Poll::Ready(Err(UploadError::Failed));
        }
        loop {
            if !self.head_held && !self.out.is_empty() {
                let slices = [
                    IoSlice::new(&self.out.head),
                    IoSlice::new(self.out.size.rest()),
                    IoSlice::new(&self.out.data),
                    IoSlice::new(self.out.tail),
                ];
                let n = ready!(Pin::new(&mut *tcp).poll_write_vectored(cx, &slices))?;
                if n == 0 {
                    return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                }
                *written = true;
                self.out.advance(n);
                continue;
            }
            if self.ended {
                return Poll::Ready(Ok(()));
            }
            let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
            self.head_held = false;
            let framed = match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.data(data),
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => self.end(Some(&trailers)),
                        Err(_) => Ok(()),
                    },
                },
                None => self.end(None),
                Some(Err(e)) => Err(UploadError::Body(e.into())),
            };
            if let Err(e) = framed {
                self.fail();
                return Poll::Ready(Err(e));
            }
        }
    }

    /// The client's body failed (or broke its length): nothing more of it
    /// is written, not even what is framed already, so that the app never
    /// sees its end.
    fn fail(&mut self) {
        self.failed = true;
        self.ended = false;
        self.out = Out::default();
    }

    /// Frames a data frame of the client's body: a chunk's size in lower
    /// case, as Go's transport writes it, and a body longer than its
    /// `Content-Length` refused, never cut.
    fn data(&mut self, data: Bytes) -> Result<(), UploadError> {
        if data.is_empty() {
            return Ok(());
        }
        let framed = self.encoder.encode_exact(data, HexCase::Lower);
        match framed.map_err(|TooLong| UploadError::Length)? {
            Encoded::Data(data) => self.out.data = data,
            Encoded::Chunk { size, data } => {
                self.out.size = size;
                self.out.data = data;
                self.out.tail = CHUNK_END;
            }
        }
        Ok(())
    }

    /// Frames the body's end: the last chunk, with the announced trailers.
    fn end(&mut self, trailers: Option<&HeaderMap>) -> Result<(), UploadError> {
        self.ended = true;
        // The trailers' chunk is asked for first: the end leaves a chunked
        // body with nothing owed.
        let with_trailers = match (trailers, &self.trailers) {
            (Some(trailers), Some(announced)) => self.encoder.encode_trailers(trailers, announced),
            _ => None,
        };
        let last = self.encoder.end().map_err(|TooShort| UploadError::Length)?;
        match with_trailers {
            Some(chunk) => self.out.data = chunk,
            None => self.out.tail = last,
        }
        Ok(())
    }
}

/// The rest of a request body, still being written when the app's
/// response came: the response's body writes it on while it is read.
pub trait Uploading: Send + std::fmt::Debug {
    /// Writes what the app can take of the rest of the body; ready once
    /// all of it, and its end, are written.
    fn poll_upload(
        &mut self,
        tcp: &mut TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UploadError>>;
}

impl<B> Uploading for Upload<B>
where
    B: Body<Data = Bytes> + Unpin + Send + std::fmt::Debug,
    B::Error: Into<BoxError>,
{
    fn poll_upload(
        &mut self,
        tcp: &mut TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UploadError>> {
        let mut written = false;
        self.poll_write(tcp, &mut written, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's body that fails, then (polled again) says it has ended,
    /// as hyper's does once its error has been taken.
    #[derive(Debug)]
    struct FailsThenEnds(u8);

    impl Body for FailsThenEnds {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
            self.0 += 1;
            Poll::Ready(match self.0 {
                1 => Some(Ok(http_body::Frame::data(Bytes::from_static(b"hello")))),
                2 => Some(Err("invalid chunk size".into())),
                _ => None,
            })
        }
    }

    /// A connection on loopback: the client's end, and the app's.
    async fn connected() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (app, _) = listener.accept().await.unwrap();
        (tcp, app)
    }

    #[tokio::test]
    async fn a_body_that_failed_is_never_framed_as_ended() {
        let (mut tcp, mut app) = connected().await;
        let head = Bytes::from_static(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        let mut upload = Upload::new(head, FailsThenEnds(0), Framing::Chunked(()), None);
        let mut written = false;
        let first = std::future::poll_fn(|cx| upload.poll_write(&mut tcp, &mut written, cx)).await;
        assert!(matches!(first, Err(UploadError::Body(_))), "{first:?}");
        assert!(upload.has_failed());
        for _ in 0..2 {
            let again =
                std::future::poll_fn(|cx| upload.poll_write(&mut tcp, &mut written, cx)).await;
            assert!(matches!(again, Err(UploadError::Failed)), "{again:?}");
        }
        drop(tcp);
        let mut seen = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut app, &mut seen)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8(seen).unwrap(),
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            "the chunk before the failure, and no last chunk"
        );
    }

    /// A body longer than its `Content-Length` is refused, never cut to
    /// it: nothing of the request goes out, its head included.
    #[tokio::test]
    async fn a_body_longer_than_its_length_is_refused() {
        let (mut tcp, mut app) = connected().await;
        let head = Bytes::from_static(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n");
        let body = http_body_util::Full::new(Bytes::from_static(b"hello"));
        let mut upload = Upload::new(head, body, Framing::Length(3), None);
        let mut written = false;
        let sent = std::future::poll_fn(|cx| upload.poll_write(&mut tcp, &mut written, cx)).await;
        assert!(matches!(sent, Err(UploadError::Length)), "{sent:?}");
        assert!(upload.has_failed() && !written);
        drop(tcp);
        let mut seen = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut app, &mut seen)
            .await
            .unwrap();
        assert!(seen.is_empty(), "{seen:?}");
    }

    #[test]
    fn written_bytes_come_off_the_front_across_parts() {
        let mut out = Out {
            head: Bytes::from_static(b"HEAD"),
            size: ChunkSize::new(3, HexCase::Lower),
            data: Bytes::from_static(b"abc"),
            tail: b"\r\n",
        };
        out.advance(5);
        assert_eq!(out.size.rest(), b"\r\n");
        out.advance(3);
        assert_eq!(&out.data[..], b"bc");
        out.advance(3);
        assert_eq!(out.tail, b"\n");
        assert!(!out.is_empty());
        out.advance(1);
        assert!(out.is_empty());
    }
}
