//! The threads that serve clients: each runs a single-threaded runtime, accepts
//! on the one listening socket, and serves its connections from the client's
//! socket to the backend's and back, with no hand-off between threads per
//! request. A new connection goes to the worker with the fewest open
//! ([`crate::serve::spread`]), handed over once when that is not the one that took it.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use slotgate_http::conn::Limits;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::live::LiveCell;
use crate::fleet::pool::Pool;
use crate::proxy::retry::RetryPolicy;
use crate::proxy::upstream::BackendClient;
use crate::proxy::Forwarder;
use crate::serve::app::App;
use crate::serve::reload::Reload;
use crate::serve::routes::Routes;
use crate::serve::spread::{Open, Spread};
use crate::tenancy::limits::UsageBook;

/// What every worker thread serves with.
pub(crate) struct Common {
    pub pool: Arc<Pool>,
    pub routing: crate::config::Routing,
    pub retry: Arc<RetryPolicy>,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub max_body_bytes: usize,
    /// Bounds on client connections.
    pub limits: slotgate_http::conn::Limits,
    pub live: LiveCell,
    pub book: Arc<UsageBook>,
    pub reload: Reload,
    pub replica: axum::http::HeaderValue,
    pub draining: CancellationToken,
    pub cut_off: CancellationToken,
}

/// `workers`, or one per core.
pub(crate) fn worker_count(workers: usize) -> usize {
    if workers > 0 {
        return workers;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A connection handed to another worker, with its place in the count.
type Handed = (std::net::TcpStream, Open);

/// Starts `count` worker threads (see the module's text). A request stays on the
/// thread that serves its connection: on a multi-threaded runtime the hand-offs
/// between threads per request cost a fifth of the proxy's time in wake-ups (see
/// BENCHMARKS.md). The pool, the retry budget and the metrics are shared. The
/// receiver resolves when every thread has stopped.
pub(crate) fn spawn_workers(
    listener: std::net::TcpListener,
    shared: Arc<Common>,
    count: usize,
) -> std::io::Result<tokio::sync::oneshot::Receiver<std::io::Result<()>>> {
    listener.set_nonblocking(true)?;
    let spread = Spread::new(count);
    let (inboxes, mut receivers): (Vec<_>, Vec<_>) =
        (0..count).map(|_| mpsc::unbounded_channel::<Handed>()).unzip();
    let inboxes = Arc::new(inboxes);
    let mut threads = Vec::with_capacity(count);
    for (i, inbox) in receivers.drain(..).enumerate() {
        let worker = Worker {
            index: i,
            listener: listener.try_clone()?,
            inbox,
            inboxes: inboxes.clone(),
            spread: spread.clone(),
        };
        let shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gateway-{i}"))
            .spawn(move || worker.serve(&shared))?;
        threads.push(thread);
    }
    let (done, workers) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut result = Ok(());
        for thread in threads {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(std::io::Error::other("a worker thread panicked")),
            }
        }
        let _ = done.send(result);
    });
    Ok(workers)
}

/// One worker thread's part.
struct Worker {
    index: usize,
    listener: std::net::TcpListener,
    /// Connections other workers accepted for this one.
    inbox: mpsc::UnboundedReceiver<Handed>,
    /// Every worker's inbox, by index.
    inboxes: Arc<Vec<mpsc::UnboundedSender<Handed>>>,
    spread: Arc<Spread>,
}

impl Worker {
    /// Serves until the drain ends or is cut off.
    fn serve(self, shared: &Common) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let Self { index, listener, mut inbox, inboxes, spread } = self;
            let listener = TcpListener::from_std(listener)?;
            let forwarder = Arc::new(Forwarder::new(
                shared.pool.clone(),
                BackendClient::new(&shared.routing, shared.replica.clone()),
                shared.retry.clone(),
                shared.live.clone(),
                shared.book.clone(),
                crate::proxy::Timeouts::of(&shared.routing),
            ));
            let app = Arc::new(App {
                reload: shared.reload.clone(),
                forwarder,
                metrics: shared.metrics.clone(),
                spread: spread.clone(),
            });
            let limits = shared.limits;
            let routes = Routes::new(app, shared.max_body_bytes, limits.body_timeout);
            let connections = GracefulShutdown::new();
            let take =
                |stream: TcpStream, open: Open| serve(stream, open, &routes, &connections, limits);
            loop {
                tokio::select! {
                    stream = accept(&listener) => {
                        if spread.total() >= limits.max_connections {
                            tracing::warn!(max = limits.max_connections, "connection refused: connections.max_connections open");
                            drop(stream);
                            continue;
                        }
                        let open = spread.pick(index);
                        if open.worker() == index {
                            take(stream, open);
                        } else if let Err(mpsc::error::SendError((stream, open))) =
                            hand_over(stream, open, &inboxes)
                        {
                            // The other worker has stopped: serve it here.
                            if let Ok(stream) = TcpStream::from_std(stream) {
                                take(stream, open);
                            }
                        }
                    }
                    Some((stream, open)) = inbox.recv() => {
                        if let Ok(stream) = TcpStream::from_std(stream) {
                            take(stream, open);
                        }
                    }
                    () = shared.draining.cancelled() => break,
                    // Dropping the runtime below drops the connections still open.
                    () = shared.cut_off.cancelled() => return Ok(()),
                }
            }
            // Stop accepting; finish the requests in flight, close idle connections.
            drop(listener);
            drop(inbox);
            tokio::select! {
                () = connections.shutdown() => {}
                () = shared.cut_off.cancelled() => {}
            }
            Ok(())
        })
    }
}

/// Sends a connection to the worker `open` names; it leaves this thread's
/// reactor first. A connection that fails to leave is dropped (closed).
fn hand_over(
    stream: TcpStream,
    open: Open,
    inboxes: &[mpsc::UnboundedSender<Handed>],
) -> Result<(), mpsc::error::SendError<Handed>> {
    match stream.into_std() {
        Ok(stream) => inboxes[open.worker()].send((stream, open)),
        Err(e) => {
            tracing::debug!(error = %e, "a connection could not be handed over");
            Ok(())
        }
    }
}

/// Serves one connection in a task of this thread, within `limits`
/// ([`slotgate_http::conn::connection`]); it counts as open on this worker until
/// it ends.
fn serve(
    stream: TcpStream,
    open: Open,
    routes: &Routes,
    connections: &GracefulShutdown,
    limits: Limits,
) {
    let routes = routes.from(stream.peer_addr().ok());
    let answer = move |request| hyper::service::Service::call(&routes, request);
    slotgate_http::conn::connection(stream, answer, limits, connections, open);
}

/// The next client connection.
async fn accept(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            // One client's connection went away before it was taken: take the next.
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of descriptors or the like: wait rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// An accept error that concerns one connection, not the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset)
}
