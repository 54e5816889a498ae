//! The deadline for a connection's first bytes, whatever its protocol.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// The HTTP/2 connection preface. Until a client has sent all of it, or a
/// byte that differs from it (HTTP/1), its protocol is unknown.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A socket whose reads fail with [`io::ErrorKind::TimedOut`] once the
/// deadline passes before the client has told its protocol; after that, a
/// plain socket. Silent clients and clients that stop half-way through the
/// HTTP/2 preface are closed at the deadline; HTTP/1's header deadline and
/// HTTP/2's keep-alive pings and the idle timeout take over from there.
#[derive(Debug)]
pub(super) struct FirstBytes<I> {
    io: I,
    /// Until the protocol is known: the deadline, and how many bytes of
    /// the preface the client has sent.
    pending: Option<(Pin<Box<Sleep>>, usize)>,
}

impl<I> FirstBytes<I> {
    pub(super) fn new(io: I, timeout: Duration) -> Self {
        Self {
            io,
            pending: Some((Box::pin(tokio::time::sleep(timeout)), 0)),
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for FirstBytes<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some((deadline, matched)) = &mut this.pending else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                let expected = &PREFACE[*matched..];
                let compared = read.len().min(expected.len());
                if read[..compared] != expected[..compared] || compared == expected.len() {
                    this.pending = None;
                } else {
                    // Part of the preface, or end of file (hyper closes then).
                    *matched += compared;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client did not start a request by the first bytes deadline",
                ))),
                Poll::Pending => Poll::Pending,
            },
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for FirstBytes<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn read_after(sent: &[u8]) -> io::Result<usize> {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(sent).await?;
        let mut server = FirstBytes::new(server, Duration::from_millis(100));
        let mut buf = [0; 64];
        let mut total = 0;
        loop {
            match server.read(&mut buf).await? {
                0 => return Ok(total),
                n => total += n,
            }
        }
    }

    #[tokio::test]
    async fn silence_and_half_a_preface_time_out() {
        for sent in [&b""[..], &PREFACE[..10], &PREFACE[..23]] {
            let error = read_after(sent).await.expect_err("times out");
            assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{sent:?}");
        }
    }

    #[tokio::test]
    async fn a_whole_preface_or_http1_disarms_the_deadline() {
        for sent in [PREFACE, b"GET / HTTP/1.1\r\n", b"PUT"] {
            let (mut client, server) = tokio::io::duplex(64);
            client.write_all(sent).await.expect("write");
            let mut server = FirstBytes::new(server, Duration::from_millis(100));
            let mut buf = [0; 64];
            let n = server.read(&mut buf).await.expect("read");
            assert_eq!(&buf[..n], sent);
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(client);
            assert_eq!(
                server.read(&mut buf).await.expect("end of file"),
                0,
                "{sent:?}"
            );
        }
    }
}
