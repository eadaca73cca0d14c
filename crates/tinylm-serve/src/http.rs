//! The connections: HTTP/1.1 (hyper) over TCP, each on a task of its own. A
//! connection is closed when it waits longer than the idle limit for a request's
//! head (an idle keep-alive connection, or a client sending its head slowly) or
//! when a write to it has waited that long (a client that stopped reading: its
//! stream is dropped, which frees its slots). At Ctrl-C or SIGTERM the server stops
//! accepting, lets every open request finish for up to the shutdown bound, then has
//! the engine end what is left, and returns.

use crate::limits::Limits;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// How long ended streams have to send their last events and close after the
/// shutdown bound has passed.
const ENDING_GRACE: Duration = Duration::from_secs(2);

/// The bytes a connection holds for its client outside the stream's own buffer:
/// the kernel's send buffer (asked for; Linux doubles it, and would otherwise grow
/// it to 4 MiB for a client that stops reading) and hyper's write buffer. So the
/// text of a client that stops reading waits in its stream's buffer, where it is
/// counted (`--stream-buffer`).
const SOCKET_BUFFER: usize = 64 << 10;

/// A TCP stream whose writes fail once one has waited `limit` for the client to
/// take what was sent before.
struct Guarded {
    io: TcpStream,
    peer: SocketAddr,
    limit: Duration,
    /// Started when a write first waits; cleared when one goes through.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Guarded {
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let timer = (self.stalled).get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                eprintln!(
                    "{}: the client has not read what it was sent for {:.1} s (--idle-timeout); its connection is closed",
                    self.peer,
                    limit.as_secs_f64()
                );
                let message = "the client has not read what it was sent (--idle-timeout)";
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves `router` on `listener` until `stop` resolves; then stops accepting,
/// waits up to `limits.shutdown_timeout` for the open requests to finish, calls
/// `end` (the engine ends every choice, whose streams then close) and waits
/// [`ENDING_GRACE`] more at most.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &Limits,
    stop: impl Future<Output = ()>,
    end: impl FnOnce(),
) {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(SOCKET_BUFFER);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(SOCKET_BUFFER);
                    let io = Guarded { io: tcp, peer, limit: limits.idle_timeout, stalled: None };
                    let service = TowerToHyperService::new(router.clone());
                    let connection = builder.serve_connection(TokioIo::new(io), service);
                    let connection = graceful.watch(connection);
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                }
                // Out of file descriptors, say: the next accept may succeed.
                Err(e) => {
                    eprintln!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut stop => break,
        }
    }
    drop(listener);
    let all_closed = graceful.shutdown();
    tokio::pin!(all_closed);
    if tokio::time::timeout(limits.shutdown_timeout, &mut all_closed)
        .await
        .is_err()
    {
        eprintln!(
            "stopping: requests still open after {:.1} s (--shutdown-timeout) are ended",
            limits.shutdown_timeout.as_secs_f64()
        );
        end();
        if tokio::time::timeout(ENDING_GRACE, all_closed)
            .await
            .is_err()
        {
            eprintln!("stopping: connections still open are closed");
        }
    }
}
