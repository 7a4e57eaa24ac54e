//! The response body read from a [`Conn`], which hands the
//! connection back to the pool at its end.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, Method};
use http_body::{Frame, SizeHint};

use super::{Conn, ExchangeError, ResponseHead, ResponseParse, UploadError, parse};
use crate::pool::Idle;
use crate::splice::{self, SPLICE_MAX, SPLICE_MIN, Spliced};
use crate::wire::framing::{Decoded, Decoder, Framing};

/// The smallest and largest reads of a body: a read that fills the room
/// it was given doubles the next one.
const BODY_READ_MIN: usize = 8 * 1024;
const BODY_READ_MAX: usize = 256 * 1024;
/// The first read after a chunk's data was spliced to its end: room for
/// the chunk's end and the next size line (`\r\n`, eight digits,
/// `\r\n`), so that little of the next chunk's data is read with them
/// rather than spliced. Each further read before the next data (a line
/// that came in pieces, trailers) has twice the room.
const FRAMING_READ: usize = 16;

/// Why a response body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum ResponseBodyError {
    /// The connection failed.
    #[error("reading the app's response body: {0}")]
    Io(#[from] io::Error),
    /// The app closed the connection before the body's end.
    #[error("the app closed the connection before the response body ended")]
    Incomplete,
    /// The chunked body or its trailers are not HTTP.
    #[error("invalid chunked response body: {0}")]
    Chunked(&'static str),
    /// The rest of the request body, written while the response was read,
    /// failed (the client's body broke off, or the connection did): the
    /// app waits for a request that will not come whole, so the connection
    /// is closed and the response ends here, as Go's transport ends it.
    #[error("the rest of the request body could not be written: {0}")]
    Upload(#[source] UploadError),
}

/// What a poll of a [`ResponseBody`] gives.
type PolledFrame = Poll<Option<Result<Frame<Bytes>, ResponseBodyError>>>;

/// A response body read from a [`Conn`], which goes back to `idle`
/// once the body has been read to its end, if it may be reused.
///
/// When the app answered before it had the whole request body, the rest is
/// written on while the response is read; the connection is reused only if
/// the request body was written whole by the response's end (if not, it
/// is closed, and the client's body let go of).
#[derive(Debug)]
pub struct ResponseBody {
    /// The connection, until the body has ended (with the rest of the
    /// request body, if it is still being written).
    conn: Option<Conn>,
    /// Where the connection goes back, when it may be reused.
    idle: Option<Arc<Idle<Conn>>>,
    /// Bytes read and not yet passed on.
    buf: BytesMut,
    /// `buf`'s memory is small enough to go back with the connection: it
    /// holds no more than one read of the head's.
    small: bool,
    /// How the body is framed, and how much of it has been read.
    decoder: Decoder,
    /// The room the next read is given.
    read: usize,
    /// Its data may be spliced into a pipe lent by the server writing it
    /// (see [`splice`]), rather than read; false for good (for the
    /// connection's life) once the socket holds bytes `splice` does not
    /// see.
    splice: bool,
    /// The data on the wire is the rest of data spliced already: it is
    /// spliced however little of it is left.
    splicing: bool,
    /// A chunk's data was spliced to its end: the room of the next read
    /// of its framing (from [`FRAMING_READ`]); 0 otherwise.
    framing_room: usize,
    /// Bytes of the body spliced so far: none once [`SPLICE_MAX`] are.
    spliced: u64,
}

impl ResponseBody {
    /// The body of `head`, read over `conn` (what came after the head is
    /// in its buffer), while what is left of the request body, if any, is
    /// written on; an empty body gives the connection back at once.
    /// Without `idle`, the connection is closed at the body's end. With
    /// `splice`, its data may be spliced to a client (see [`splice`]).
    pub fn new(
        mut conn: Conn,
        head: &ResponseHead,
        idle: Option<Arc<Idle<Conn>>>,
        splice: bool,
    ) -> Self {
        let buf = std::mem::take(&mut conn.buf);
        let splice = splice && !conn.redirected;
        let mut body = ResponseBody {
            conn: Some(conn),
            idle: idle.filter(|_| head.keep_alive),
            buf,
            small: head.one_read,
            decoder: Decoder::new(head.framing),
            read: BODY_READ_MIN,
            splice,
            splicing: false,
            framing_room: 0,
            spliced: 0,
        };
        if body.decoder.is_end() {
            body.finish();
        }
        body
    }

    /// The body has ended: its connection goes back when it may be reused,
    /// the request was written whole and nothing came after the body.
    fn finish(&mut self) {
        let conn = self.conn.take();
        if let (Some(mut conn), Some(idle)) = (conn, self.idle.take())
            && self.buf.is_empty()
            && conn.upload.is_none()
        {
            if self.small {
                conn.buf = std::mem::take(&mut self.buf);
            }
            idle.put(conn);
        }
        self.buf = BytesMut::new();
        self.decoder = Decoder::new(Framing::Length(0));
    }

    /// Writes on what is left of the request body, as the socket takes it.
    #[cold]
    fn poll_upload(&mut self, cx: &mut Context<'_>) -> Result<(), UploadError> {
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        let link = &mut *conn.0;
        let Some(upload) = &mut link.upload else {
            return Ok(());
        };
        match upload.poll_upload(&mut link.tcp, cx) {
            Poll::Pending => Ok(()),
            Poll::Ready(Ok(())) => {
                link.upload = None;
                Ok(())
            }
            Poll::Ready(Err(e)) => {
                link.upload = None;
                Err(e)
            }
        }
    }

    /// Splices the body's next data into the pipe lent by the server
    /// polling it, when the bytes read so far are all passed on, the next
    /// ones on the wire are data (at least [`SPLICE_MIN`] of them, or the
    /// rest of data spliced already), fewer than [`SPLICE_MAX`] have been
    /// spliced and no request body is still being written. `None` when
    /// they are to be read instead.
    fn poll_splice(&mut self, cx: &mut Context<'_>) -> Option<PolledFrame> {
        let ahead = self.decoder.data_ahead()?;
        self.framing_room = 0;
        if self.spliced >= SPLICE_MAX {
            return None;
        }
        let least = if self.splicing { 1 } else { SPLICE_MIN };
        if ahead < least as u64 {
            return None;
        }
        let conn = self.conn.as_ref().filter(|c| c.upload.is_none())?;
        let most = usize::try_from(ahead.min(SPLICE_MAX - self.spliced)).unwrap_or(usize::MAX);
        let spliced = match splice::fill_lent(&conn.tcp, most, cx) {
            Poll::Pending => return Some(Poll::Pending),
            Poll::Ready(spliced) => spliced,
        };
        let failed = match spliced {
            Ok(Spliced::NotLent) => return None,
            Ok(Spliced::Unspliceable) => {
                self.splice = false;
                if let Some(conn) = &mut self.conn {
                    conn.redirected = true;
                }
                return None;
            }
            Ok(Spliced::Bytes(data)) => {
                self.decoder.took(data.len());
                self.spliced += data.len() as u64;
                self.splicing = self.decoder.data_ahead().is_some();
                if !self.splicing && !self.decoder.is_end() {
                    self.framing_room = FRAMING_READ;
                }
                if self.decoder.is_end() {
                    self.finish();
                }
                return Some(Poll::Ready(Some(Ok(Frame::data(data)))));
            }
            Ok(Spliced::End) => ResponseBodyError::Incomplete,
            Err(e) => ResponseBodyError::Io(e),
        };
        self.close();
        Some(Poll::Ready(Some(Err(failed))))
    }

    /// The body has ended, and its connection may not serve another.
    fn close(&mut self) {
        self.idle = None;
        self.finish();
    }

    /// Reads more of the body into `buf`, up to `want` bytes (or what room
    /// `buf` has past them); `Ok(false)` at the connection's end.
    fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        want: u64,
    ) -> Poll<Result<bool, ResponseBodyError>> {
        let Some(conn) = &self.conn else {
            return Poll::Ready(Ok(false));
        };
        let conn = &conn.tcp;
        let room = usize::try_from(want)
            .unwrap_or(usize::MAX)
            .clamp(1, self.read);
        if self.buf.capacity() - self.buf.len() < room {
            self.buf.reserve(room);
            self.small = false;
        }
        loop {
            ready!(conn.poll_read_ready(cx))?;
            let read = if self.framing_room > 0 {
                conn.try_read_buf(&mut BufMut::limit(&mut self.buf, self.framing_room))
            } else {
                conn.try_read_buf(&mut self.buf)
            };
            match read {
                Ok(0) => return Poll::Ready(Ok(false)),
                Ok(n) => {
                    self.framing_room = (self.framing_room * 2).min(BODY_READ_MAX);
                    if n >= self.read {
                        self.read = (self.read * 2).min(BODY_READ_MAX);
                    }
                    return Poll::Ready(Ok(true));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = ResponseBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ResponseBodyError>>> {
        let this = self.get_mut();
        if this.conn.as_ref().is_some_and(|c| c.upload.is_some())
            && let Err(e) = this.poll_upload(cx)
        {
            // The connection is in the middle of a request: closed.
            this.close();
            return Poll::Ready(Some(Err(ResponseBodyError::Upload(e))));
        }
        if this.decoder.is_end() {
            return Poll::Ready(None);
        }
        if this.splice
            && this.buf.is_empty()
            && let Some(polled) = this.poll_splice(cx)
        {
            return polled;
        }
        let polled = loop {
            match this.decoder.decode(&mut this.buf) {
                Ok(Decoded::Data(data)) => {
                    // Data read, not spliced: what follows is read at the
                    // usual size, and spliced only from `SPLICE_MIN` on.
                    this.framing_room = 0;
                    this.splicing = false;
                    if this.decoder.is_end() {
                        this.finish();
                    }
                    break Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::End(trailers)) => {
                    this.finish();
                    break Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
                }
                Ok(Decoded::Short) => match ready!(this.poll_fill(cx, this.decoder.wants())) {
                    Ok(true) => {}
                    Ok(false) if this.decoder.ends_at_close() => {
                        // The end of a body that lasts until the app closes.
                        this.close();
                        break Poll::Ready(None);
                    }
                    Ok(false) => break Poll::Ready(Some(Err(ResponseBodyError::Incomplete))),
                    Err(e) => break Poll::Ready(Some(Err(e))),
                },
                Err(e) => break Poll::Ready(Some(Err(ResponseBodyError::Chunked(e)))),
            }
        };
        if let Poll::Ready(Some(Err(_))) = &polled {
            // A body that failed ends here; its connection is closed.
            this.close();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_end()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// What [`read_answer`] made of an app's answer.
#[derive(Debug)]
pub struct AppAnswer {
    /// The final head's status.
    pub status: u16,
    /// Bytes of body data read.
    pub data: usize,
    /// Trailer fields read.
    pub trailers: usize,
    /// Whether the body was read to its end, without a failure.
    pub complete: bool,
}

/// Reads `bytes`, all an app wrote before closing, as the answer to a
/// request (`HEAD` when `head`), as the main port reads one: its head,
/// then its body to the end or the first failure. `Err` when the head is
/// refused, with the words the main port's `502` gives. Made for the fuzz
/// target `app_answer`: it runs the body's reading without a socket.
pub fn read_answer(bytes: &[u8], head: bool) -> Result<AppAnswer, ExchangeError> {
    use http_body::Body as _;

    let method = if head { Method::HEAD } else { Method::GET };
    let mut buf = BytesMut::from(bytes);
    let parsed = loop {
        match parse(&mut buf, &method, &mut HeaderMap::new())? {
            ResponseParse::Final(parsed) => break parsed,
            ResponseParse::Informational => {}
            ResponseParse::Partial => return Err(ExchangeError::Closed),
        }
    };
    let mut body = ResponseBody {
        conn: None,
        idle: None,
        buf,
        small: false,
        decoder: Decoder::new(parsed.framing),
        read: BODY_READ_MIN,
        splice: false,
        splicing: false,
        framing_room: 0,
        spliced: 0,
    };
    let mut answer = AppAnswer {
        status: parsed.status.as_u16(),
        data: 0,
        trailers: 0,
        complete: false,
    };
    let mut cx = Context::from_waker(std::task::Waker::noop());
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => answer.data += data.len(),
                Err(frame) => answer.trailers += frame.into_trailers().map_or(0, |t| t.len()),
            },
            Poll::Ready(None) => {
                answer.complete = true;
                return Ok(answer);
            }
            // Without a connection, a body that needs more fails: nothing
            // waits.
            Poll::Ready(Some(Err(_))) | Poll::Pending => return Ok(answer),
        }
    }
}
