//! Bounds on client connections, for the engine and the gateway alike: a request
//! head must arrive within `header_timeout`, its body within `body_timeout`, a
//! connection that has no request in hand (none read, none being answered) and
//! moves no byte for `idle_timeout` is closed, and no more than `max_connections` are open at once. Without
//! them a client that opens sockets and sends nothing (or one byte a minute)
//! holds a file descriptor and a task each, until the server runs out.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::ConnectInfo;
use axum::http::Request;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::timed::Timed;

/// The bounds, in the units the settings use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request's head must have arrived this long after its first byte.
    pub header_timeout: Duration,
    /// A request's body must have arrived this long after its head.
    pub body_timeout: Duration,
    /// A connection with no request in hand that reads and writes nothing for
    /// this long is closed.
    pub idle_timeout: Duration,
    /// Open connections at most; one more is closed as soon as it is accepted.
    pub max_connections: usize,
}

impl Limits {
    /// From milliseconds, as the settings give them.
    pub fn from_ms(header: u64, body: u64, idle: u64, max_connections: usize) -> Self {
        Self {
            header_timeout: Duration::from_millis(header),
            body_timeout: Duration::from_millis(body),
            idle_timeout: Duration::from_millis(idle),
            max_connections,
        }
    }

    /// An HTTP/1.1 server with the head timeout.
    pub fn http1(&self) -> hyper::server::conn::http1::Builder {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(self.header_timeout);
        // Header names as llama-server, nginx and most servers write them
        // (`Content-Type`): names are case-insensitive, but some clients, and
        // llama.cpp's own tests, look them up as written.
        builder.title_case_headers(true);
        builder
    }
}

/// What a connection is doing: when it last moved a byte, and how many requests
/// it has in hand.
#[derive(Debug)]
pub struct Activity {
    born: Instant,
    /// Milliseconds after `born` of the last byte read or written.
    last: AtomicU64,
    busy: AtomicU32,
}

impl Default for Activity {
    fn default() -> Self {
        Self { born: Instant::now(), last: AtomicU64::new(0), busy: AtomicU32::new(0) }
    }
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }

    /// A request is in hand until the guard drops.
    pub fn enter(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Resolves once the connection has had no request in hand and moved no byte
    /// for `idle`: the caller then closes it.
    pub async fn idle(&self, idle: Duration) {
        let every = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            tokio::time::sleep(every).await;
            if self.busy.load(Ordering::Acquire) == 0 && self.idle_for() >= idle {
                return;
            }
        }
    }
}

/// A request in hand on a connection.
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A socket that records its activity.
#[derive(Debug)]
pub struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    /// `inner`, recording into a new [`Activity`].
    pub fn new(inner: T) -> (Self, Arc<Activity>) {
        let activity = Arc::new(Activity::default());
        (Self { inner, activity: activity.clone() }, activity)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        poll
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body that keeps its request in hand until it is dropped.
pub struct Held {
    body: axum::body::Body,
    _busy: Busy,
}

impl Held {
    /// `body`, keeping `busy` until it is sent (or dropped).
    pub fn new(body: axum::body::Body, busy: Busy) -> Self {
        Self { body, _busy: busy }
    }
}

impl Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Open connections, against `max_connections`.
#[derive(Debug, Default)]
pub struct Count(AtomicUsize);

/// One open connection, counted until dropped.
#[derive(Debug)]
pub struct Counted(Arc<Count>);

impl Count {
    /// Counts a new connection, or refuses it at the limit.
    pub fn admit(self: &Arc<Self>, max: usize) -> Option<Counted> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Counted(self.clone()))
    }

    /// Connections open now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `router` on `listener` within `limits` until `stop` resolves, then
/// lets the requests in flight finish (the caller bounds how long). Each request
/// carries its peer as axum's `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let count = Arc::new(Count::default());
    let connections = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, or a connection reset while queued: wait a
                    // little rather than spin.
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Some(counted) = count.admit(limits.max_connections) else {
            tracing::warn!(
                max = limits.max_connections,
                "connection refused: max_connections open"
            );
            drop(stream);
            continue;
        };
        one(stream, peer, router.clone(), limits, counted, &connections);
    }
    drop(listener);
    connections.shutdown().await;
}

/// Serves one connection in a task of its own.
fn one(
    stream: TcpStream,
    peer: SocketAddr,
    router: axum::Router,
    limits: Limits,
    counted: Counted,
    connections: &hyper_util::server::graceful::GracefulShutdown,
) {
    let answer = move |request: Request<Incoming>| {
        let (mut head, body) = request.into_parts();
        head.extensions.insert(ConnectInfo(peer));
        let body = axum::body::Body::new(Timed::new(body, limits.body_timeout));
        tower_call(router.clone(), Request::from_parts(head, body))
    };
    connection(stream, answer, limits, connections, counted);
}

/// Serves `stream` with `answer`, within `limits` (the head's timeout, closed
/// once idle), as HTTP/1.1 with no Nagle delay (a stream's small events go out
/// at once), in a task of its own; `done` is dropped when the connection ends.
pub fn connection<A, F>(
    stream: TcpStream,
    answer: A,
    limits: Limits,
    connections: &hyper_util::server::graceful::GracefulShutdown,
    done: impl Send + 'static,
) where
    A: Fn(Request<Incoming>) -> F + Send + 'static,
    F: Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send + 'static,
{
    let _ = stream.set_nodelay(true);
    let (stream, activity) = Watched::new(stream);
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let busy = requests.enter();
        let answer = answer(request);
        async move {
            // In hand until its body is sent: a long stream is not idle.
            let response = answer.await?;
            Ok::<_, std::convert::Infallible>(response.map(|body| Held::new(body, busy)))
        }
    });
    let connection = limits.http1().serve_connection(TokioIo::new(stream), service);
    let connection = connections.watch(connection);
    tokio::spawn(async move {
        tokio::select! {
            result = connection => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended");
                }
            }
            () = activity.idle(limits.idle_timeout) => {
                tracing::debug!("idle connection closed");
            }
        }
        drop(done);
    });
}

/// Calls the router as a tower service.
fn tower_call(
    mut router: axum::Router,
    request: Request<axum::body::Body>,
) -> impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> {
    use tower_service::Service as _;
    router.call(request)
}
