//! A raw HTTP/2 (h2c, prior knowledge) client that writes any frame, valid
//! or not, and reads the server's frames one by one: what the abuse tests
//! need and no well-behaved client library sends.

use std::net::SocketAddr;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

use crate::{H2_PREFACE, within};

/// Frame types (RFC 9113 §6).
pub const DATA: u8 = 0;
/// HEADERS.
pub const HEADERS: u8 = 1;
/// RST_STREAM.
pub const RST_STREAM: u8 = 3;
/// SETTINGS.
pub const SETTINGS: u8 = 4;
/// PING.
pub const PING: u8 = 6;
/// GOAWAY.
pub const GOAWAY: u8 = 7;
/// WINDOW_UPDATE.
pub const WINDOW_UPDATE: u8 = 8;
/// CONTINUATION.
pub const CONTINUATION: u8 = 9;

/// END_STREAM (DATA, HEADERS); ACK (SETTINGS, PING).
pub const END_STREAM: u8 = 0x1;
/// ACK on SETTINGS and PING.
pub const ACK: u8 = 0x1;
/// END_HEADERS (HEADERS, CONTINUATION).
pub const END_HEADERS: u8 = 0x4;

/// Error codes (RFC 9113 §7).
pub const PROTOCOL_ERROR: u32 = 0x1;
/// FLOW_CONTROL_ERROR.
pub const FLOW_CONTROL_ERROR: u32 = 0x3;
/// REFUSED_STREAM.
pub const REFUSED_STREAM: u32 = 0x7;
/// CANCEL.
pub const CANCEL: u32 = 0x8;
/// ENHANCE_YOUR_CALM.
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// SETTINGS_INITIAL_WINDOW_SIZE.
pub const INITIAL_WINDOW_SIZE: u16 = 0x4;

/// One frame the server sent.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Its type.
    pub kind: u8,
    /// Its flags.
    pub flags: u8,
    /// Its stream.
    pub stream: u32,
    /// Its payload.
    pub payload: Bytes,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        let code = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes(code.try_into().ok()?))
    }

    /// Whether this is the response head of `stream` with status 200
    /// (HPACK's static entry 8, as hyper encodes it).
    pub fn is_200_on(&self, stream: u32) -> bool {
        self.kind == HEADERS && self.stream == stream && self.payload.first() == Some(&0x88)
    }
}

/// The bytes of one frame.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    assert!(len < 1 << 24, "a frame's length has 24 bits");
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The HPACK block of a request `method path` for host `a`, without
/// Huffman coding or indexing.
pub fn request_block(method: &str, path: &str) -> Vec<u8> {
    fn literal(block: &mut Vec<u8>, name_index: u8, value: &str) {
        assert!(value.len() < 127, "short values only");
        block.push(name_index);
        block.push(u8::try_from(value.len()).unwrap());
        block.extend_from_slice(value.as_bytes());
    }
    let mut block = Vec::new();
    match method {
        "GET" => block.push(0x82),
        "POST" => block.push(0x83),
        other => literal(&mut block, 0x02, other),
    }
    // :scheme http.
    block.push(0x86);
    match path {
        "/" => block.push(0x84),
        other => literal(&mut block, 0x04, other),
    }
    literal(&mut block, 0x01, "a");
    block
}

/// An HPACK literal header field (`name: value`, neither indexed), for
/// padding header blocks.
pub fn literal_field(name: &str, value_len: usize) -> Vec<u8> {
    assert!(name.len() < 127 && value_len < 127, "short fields only");
    let mut field = vec![0x00, u8::try_from(name.len()).unwrap()];
    field.extend_from_slice(name.as_bytes());
    field.push(u8::try_from(value_len).unwrap());
    field.resize(field.len() + value_len, b'a');
    field
}

/// A raw h2c connection.
pub struct RawH2 {
    write: OwnedWriteHalf,
    frames: mpsc::UnboundedReceiver<Frame>,
    reader: tokio::task::JoinHandle<()>,
}

impl RawH2 {
    /// Connects, sends the preface and `settings`, and acknowledges the
    /// server's SETTINGS, so that they are in force for what follows.
    pub async fn connect(addr: SocketAddr, settings: &[(u16, u32)]) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        let mut hello = H2_PREFACE.to_vec();
        let payload: Vec<u8> = settings
            .iter()
            .flat_map(|(id, value)| [id.to_be_bytes().to_vec(), value.to_be_bytes().to_vec()])
            .flatten()
            .collect();
        hello.extend(frame(SETTINGS, 0, 0, &payload));
        write.write_all(&hello).await.unwrap();
        let (tx, frames) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut header = [0u8; 9];
            while read.read_exact(&mut header).await.is_ok() {
                let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
                let mut payload = vec![0; len];
                if read.read_exact(&mut payload).await.is_err() {
                    break;
                }
                let stream = u32::from_be_bytes(header[5..9].try_into().unwrap()) & 0x7fff_ffff;
                let frame = Frame {
                    kind: header[3],
                    flags: header[4],
                    stream,
                    payload: payload.into(),
                };
                if tx.send(frame).is_err() {
                    break;
                }
            }
        });
        let mut conn = RawH2 {
            write,
            frames,
            reader,
        };
        conn.until("the server's SETTINGS", |f| {
            f.kind == SETTINGS && f.flags & ACK == 0
        })
        .await;
        conn.send(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
        conn
    }

    /// Stops reading what the server sends: its writes back up, as with a
    /// client that never reads.
    pub fn stop_reading(&mut self) {
        self.reader.abort();
    }

    /// Writes `bytes` as they are.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write.write_all(bytes).await
    }

    /// Opens `stream` with the request `method path`, ending it there or
    /// not.
    pub async fn request(&mut self, stream: u32, method: &str, path: &str, end: bool) {
        let flags = END_HEADERS | if end { END_STREAM } else { 0 };
        let block = request_block(method, path);
        self.send(&frame(HEADERS, flags, stream, &block))
            .await
            .unwrap();
    }

    /// The next frame the server sends; `None` once it has closed the
    /// connection.
    pub async fn next(&mut self) -> Option<Frame> {
        within("a frame from the server", self.frames.recv()).await
    }

    /// Reads frames until one satisfies `pred`, and returns it.
    pub async fn until(&mut self, what: &str, pred: impl Fn(&Frame) -> bool) -> Frame {
        within(what, async {
            loop {
                match self.frames.recv().await {
                    Some(f) if pred(&f) => return f,
                    Some(_) => {}
                    None => panic!("the server closed the connection before {what}"),
                }
            }
        })
        .await
    }

    /// Reads frames until the server closes the connection; returns them.
    pub async fn closed(&mut self, what: &str) -> Vec<Frame> {
        within(what, async {
            let mut frames = Vec::new();
            while let Some(f) = self.frames.recv().await {
                frames.push(f);
            }
            frames
        })
        .await
    }

    /// Whether the server has closed the connection, judging by what it
    /// has sent so far (nothing is waited for).
    pub fn saw_close(&mut self) -> bool {
        loop {
            match self.frames.try_recv() {
                Ok(f) if f.kind == GOAWAY => return true,
                Ok(_) => {}
                Err(mpsc::error::TryRecvError::Empty) => return false,
                Err(mpsc::error::TryRecvError::Disconnected) => return true,
            }
        }
    }
}
