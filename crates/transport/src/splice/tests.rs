//! Splicing between loopback connections.

use std::task::Poll;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// Two connected loopback sockets: the one dialled, the one accepted.
async fn connected() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dialled = TcpStream::connect(listener.local_addr().unwrap());
    let (dialled, accepted) = tokio::join!(dialled, listener.accept());
    (dialled.unwrap(), accepted.unwrap().0)
}

/// Sends `body` on `client`, then ends its side; the client, once done.
fn send_and_end(mut client: TcpStream, body: Vec<u8>) -> tokio::task::JoinHandle<TcpStream> {
    tokio::spawn(async move {
        client.write_all(&body).await.unwrap();
        client.shutdown().await.unwrap();
        client
    })
}

/// Bytes no two runs of which line up with a pipe's size.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4093) as u8).collect()
}

/// What a client sends reaches the far end whole and in order, every byte
/// spliced; the client's end of its side ends the copy, and the far side
/// stays open for the caller.
#[tokio::test]
async fn a_stream_is_spliced_whole_to_its_end() {
    let (client, from) = connected().await;
    let (to, mut far) = connected().await;
    let sent = pattern(5 * PIPE_SIZE + 123);
    let copy = tokio::spawn(async move {
        let copied = copy(&from, &to).await.unwrap();
        (copied, to)
    });
    let writer = send_and_end(client, sent.clone());
    let mut got = vec![0; sent.len()];
    far.read_exact(&mut got).await.unwrap();
    assert!(got == sent, "the bytes came whole and in order");
    let (copied, to) = copy.await.unwrap();
    assert_eq!(
        copied,
        Copied {
            spliced: sent.len() as u64,
            copied: 0
        }
    );
    // The far side is the caller's to end: it is open still.
    to.writable().await.unwrap();
    drop(to);
    assert_eq!(far.read(&mut [0; 1]).await.unwrap(), 0);
    drop(writer.await.unwrap());
}

/// A copy that ended gives its pipe back, empty, for the thread's next.
#[tokio::test]
async fn an_ended_copy_keeps_its_pipe_for_the_next() {
    PIPES.with(|p| p.borrow_mut().clear());
    let (client, from) = connected().await;
    let (to, _far) = connected().await;
    drop(client);
    copy(&from, &to).await.unwrap();
    assert_eq!(PIPES.with(|p| p.borrow().len()), 1);
    let (client, from) = connected().await;
    drop(client);
    copy(&from, &to).await.unwrap();
    assert_eq!(
        PIPES.with(|p| p.borrow().len()),
        1,
        "the kept pipe was taken again"
    );
}

/// A far end that is gone fails the copy, and its pipe, which may hold
/// bytes, is not kept.
#[tokio::test]
async fn a_far_end_gone_fails_the_copy() {
    PIPES.with(|p| p.borrow_mut().clear());
    let (mut client, from) = connected().await;
    let (to, far) = connected().await;
    drop(far);
    let sender = tokio::spawn(async move {
        // Written until the copy stops taking bytes.
        let chunk = pattern(PIPE_SIZE);
        while client.write_all(&chunk).await.is_ok() {}
    });
    assert!(copy(&from, &to).await.is_err());
    drop(from);
    sender.await.unwrap();
    assert_eq!(PIPES.with(|p| p.borrow().len()), 0);
}

/// The copy through a buffer, for a socket that cannot be spliced from,
/// moves every byte too.
#[tokio::test]
async fn the_buffered_copy_moves_every_byte() {
    let (client, from) = connected().await;
    let (to, mut far) = connected().await;
    let sent = pattern(3 * COPY_BUF + 5);
    let writer = send_and_end(client, sent.clone());
    let copy = tokio::spawn(async move {
        let mut copy = copy(&from, &to);
        copy.buffer = Some(Buffered::new());
        (copy.await.unwrap(), to)
    });
    let mut got = vec![0; sent.len()];
    far.read_exact(&mut got).await.unwrap();
    assert!(got == sent);
    let (copied, _to) = copy.await.unwrap();
    assert_eq!(copied.copied, sent.len() as u64);
    drop(writer.await.unwrap());
}

/// A copy between its bursts holds no pipe: the one its bytes went
/// through is back with the thread's while it waits for more, and the
/// next burst takes it again.
#[tokio::test]
async fn a_quiet_copy_holds_no_pipe() {
    PIPES.with(|p| p.borrow_mut().clear());
    let (mut client, from) = connected().await;
    let (to, mut far) = connected().await;
    // This runtime has one thread: the copy's task and this one share
    // its pipes.
    let copy = tokio::spawn(async move { copy(&from, &to).await.unwrap() });
    for burst in [&b"first"[..], b"second"] {
        client.write_all(burst).await.unwrap();
        let mut got = vec![0; burst.len()];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, burst);
        assert_eq!(
            PIPES.with(|p| p.borrow().len()),
            1,
            "the pipe is kept by the thread, not the waiting copy"
        );
    }
    client.shutdown().await.unwrap();
    assert_eq!(copy.await.unwrap().spliced, 11);
}

/// What was read of a side already goes first, counted as copied, then
/// its stream, spliced; a forward, polled by hand, is a few words.
#[tokio::test]
async fn a_forward_writes_what_was_read_ahead_first() {
    let (client, from) = connected().await;
    let (to, mut far) = connected().await;
    let ahead = Bytes::from_static(b"read ahead, ");
    let sent = pattern(2 * PIPE_SIZE + 9);
    let writer = send_and_end(client, sent.clone());
    let forward = tokio::spawn(async move {
        let forward = forward(&from, ahead, &to);
        assert!(std::mem::size_of_val(&forward) <= 160);
        (forward.await.unwrap(), to)
    });
    let mut got = vec![0; 12 + sent.len()];
    far.read_exact(&mut got).await.unwrap();
    assert_eq!(&got[..12], b"read ahead, ");
    assert!(got[12..] == sent[..], "the stream came whole, after");
    let (copied, _to) = forward.await.unwrap();
    assert_eq!(
        copied,
        Copied {
            spliced: sent.len() as u64,
            copied: 12
        }
    );
    drop(writer.await.unwrap());
}

/// A body polled with a pipe lent splices its bytes into it and hands on
/// a frame standing for them; the server drains them into the client's
/// socket, whole and in order, and the pipe goes back to the thread's.
#[tokio::test]
async fn a_lent_pipe_carries_a_body_s_bytes_to_the_client() {
    PIPES.with(|p| p.borrow_mut().clear());
    let (mut app, from) = connected().await;
    let (to, mut client) = connected().await;
    let sent = pattern(3 * PIPE_SIZE + 77);
    app.write_all(&sent).await.unwrap();
    drop(app);
    let mut moved = 0;
    while moved < sent.len() {
        let (polled, lent) = std::future::poll_fn(|cx| {
            let (polled, lent) = Lent::around(|| fill_lent(&from, sent.len() - moved, cx));
            match polled {
                Poll::Pending => {
                    assert!(lent.is_none(), "nothing lent back while it waits");
                    Poll::Pending
                }
                Poll::Ready(polled) => Poll::Ready((polled.unwrap(), lent)),
            }
        })
        .await;
        let Spliced::Bytes(frame) = polled else {
            panic!("not spliced: {polled:?}");
        };
        assert!(is_in_pipe(&frame));
        let (pipe, mut held) = lent.unwrap();
        assert_eq!(held, frame.len());
        std::future::poll_fn(|cx| poll_drain(&pipe, &mut held, &to, cx))
            .await
            .unwrap();
        pipe.give_back();
        moved += frame.len();
    }
    let mut got = vec![0; sent.len()];
    client.read_exact(&mut got).await.unwrap();
    assert!(got == sent, "the bytes came whole and in order");
    // The app's end is told as the end.
    let end = std::future::poll_fn(|cx| {
        let (polled, _) = Lent::around(|| fill_lent(&from, 1, cx));
        polled
    })
    .await
    .unwrap();
    assert!(matches!(end, Spliced::End), "{end:?}");
    assert_eq!(PIPES.with(|p| p.borrow().len()), 1);
}

/// Without a pipe lent (a body polled by hyper's servers, or its own
/// task), nothing is spliced and the body reads its bytes itself; a frame
/// of the same bytes read is not taken for one in a pipe.
#[tokio::test]
async fn nothing_is_spliced_unless_a_pipe_is_lent() {
    let (mut app, from) = connected().await;
    app.write_all(b"abc").await.unwrap();
    let polled = std::future::poll_fn(|cx| fill_lent(&from, 3, cx)).await;
    assert!(matches!(polled.unwrap(), Spliced::NotLent));
    assert!(!is_in_pipe(&Bytes::from(vec![0u8; 3])));
    assert!(!is_in_pipe(&Bytes::new()));
}

/// A poll that panics with a pipe lent gives it back all the same: a body
/// polled later on the thread, by a server that lends none, reads its
/// bytes rather than splicing them into a pipe nobody drains.
#[tokio::test]
async fn a_panicking_poll_leaves_no_pipe_lent() {
    let (mut app, from) = connected().await;
    app.write_all(b"abc").await.unwrap();
    let panicked = std::panic::catch_unwind(|| Lent::around(|| panic!("a layer failed")));
    assert!(panicked.is_err());
    let polled = std::future::poll_fn(|cx| fill_lent(&from, 3, cx)).await;
    assert!(matches!(polled.unwrap(), Spliced::NotLent));
}
