//! A connection's writes must make progress: [`StallGuard`] fails a connection whose
//! writes have been blocked for the write timeout (`--write-timeout`), a client that
//! stopped reading. hyper then ends the connection, the response's generation is dropped
//! and aborted like any disconnect, and the connection's slot is free again; without it, a
//! client that never reads would hold its slot, and a drain would wait on it.
//!
//! Only a stall counts: every write that moves bytes restarts the clock, so a slow reader
//! is served at its pace (what waits for it is bounded by the request's output).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::{Read, ReadBufCursor, Write};
use tokio::time::{sleep, Sleep};

/// `inner`, whose writes fail once blocked for `timeout`.
#[derive(Debug)]
pub struct StallGuard<T> {
    inner: T,
    timeout: Duration,
    /// Armed when a write is blocked; cleared when one moves bytes.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> StallGuard<T> {
    pub fn new(inner: T, timeout: Duration) -> StallGuard<T> {
        StallGuard {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// `poll`'s result, unless it is blocked and has been for the timeout.
    fn guard<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let timeout = self.timeout;
        let stall = self.stalled.get_or_insert_with(|| Box::pin(sleep(timeout)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {timeout:?} (--write-timeout)"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Read + Unpin> Read for StallGuard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for StallGuard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.guard(cx, poll)
    }
}
