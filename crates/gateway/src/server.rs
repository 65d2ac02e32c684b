//! Starting and stopping the gateway: the backends and supervised engines, the
//! health checks, the HTTP server, and the drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use arc_swap::ArcSwap;

use crate::admin::Reload;
use crate::auth::limits::UsageBook;
use crate::auth::shared::Shared;
use crate::backend::Backend;
use crate::config::{BackendConfig, Cli, GatewayConfig};
use crate::discovery::Discovery;
use crate::error::GatewayError;
use crate::live::{Live, LiveCell};
use crate::pool::Pool;
use crate::proxy::Forwarder;
use crate::retry::RetryPolicy;
use crate::routes::{App, Routes};
use crate::upstream::Upstream;

/// A running gateway. Not `Clone`: it owns the shutdown of everything it started.
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Stops the engines and the health checks.
    stop: CancellationToken,
    /// Cancelled by the shutdown signal: stop accepting, drain.
    draining: CancellationToken,
    /// Cancelled when the drain timeout passes: the workers drop what still runs.
    cut_off: CancellationToken,
    /// Cancels `cut_off` when a gateway (or its `run`) is dropped before the end: the
    /// worker threads are not tasks of the caller's runtime, and would outlive it.
    cut_on_drop: tokio_util::sync::DropGuard,
    tasks: TaskTracker,
    /// Resolves when every worker thread has stopped serving.
    workers: tokio::sync::oneshot::Receiver<std::io::Result<()>>,
    drain: Duration,
}

impl Gateway {
    /// Binds `config.listen`, then as [`Gateway::serve`].
    pub async fn start(
        config: GatewayConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, GatewayError> {
        let listener = TcpListener::bind(&config.listen).await?;
        Self::serve(listener, config, shutdown).await
    }

    /// Binds `config.listen`, then as [`Gateway::serve`]; `source` is what the
    /// configuration was read from, read again on `SIGHUP` or `POST /admin/reload`.
    pub async fn start_from(
        source: Cli,
        config: GatewayConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, GatewayError> {
        let listener = TcpListener::bind(&config.listen).await?;
        Self::serve_inner(listener, config, Some(source), shutdown).await
    }

    /// Starts the supervised engines and the health checks, and serves on
    /// `listener` until `shutdown` resolves.
    pub async fn serve(
        listener: TcpListener,
        config: GatewayConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, GatewayError> {
        Self::serve_inner(listener, config, None, shutdown).await
    }

    async fn serve_inner(
        listener: TcpListener,
        config: GatewayConfig,
        source: Option<Cli>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, GatewayError> {
        let addr = listener.local_addr()?;
        // The recorder first: metrics set while starting (Redis reached) count.
        let metrics = crate::metrics::handle();
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        // Backends named by DNS join the pool as they are discovered.
        let fixed = config.backends.iter().filter(|b| !crate::target::is_discovered(&b.url));
        let mut backends: Vec<Arc<Backend>> =
            fixed.enumerate().map(|(i, b)| Arc::new(Backend::new(i, b))).collect();
        let mut engines = Vec::new();
        for spec in &config.engines {
            let id = spec.model_id.clone().unwrap_or_else(|| {
                let name = spec.model.file_name().and_then(|n| n.to_str()).unwrap_or("model");
                name.strip_suffix(".gguf").unwrap_or(name).to_owned()
            });
            let seed = BackendConfig {
                url: String::new(),
                models: None,
                slots: Some(spec.n_parallel),
                weight: 1,
                api_key_env: None,
            };
            let admin_key = crate::supervisor::new_admin_key();
            let mut backend = Backend::new(backends.len(), &seed);
            backend.api_key =
                axum::http::HeaderValue::from_str(&format!("Bearer {admin_key}")).ok();
            let backend = Arc::new(backend);
            backend.set_models(vec![id]);
            backends.push(backend.clone());
            engines.push((spec.clone(), admin_key, backend));
        }
        let routing = config.routing.clone();
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_millis(routing.pool_idle_timeout_ms))
            .connect_timeout(Duration::from_millis(routing.connect_timeout_ms))
            .build()
            .map_err(|e| GatewayError::Config(format!("http client: {e}")))?;
        let pool = Pool::new(backends, &routing);
        let shared_limits = match &config.auth.redis_url {
            Some(url) => Some(Shared::start(url, stop.clone()).map_err(GatewayError::Config)?),
            None => None,
        };
        let book = Arc::new(UsageBook::new(shared_limits));
        let live: LiveCell = Arc::new(ArcSwap::from_pointee(Live::build(&config, &book)?));
        if live.load().auth.is_open() {
            tracing::warn!("no [[keys]]: the gateway is open to anyone who reaches it");
        }
        let discovery = Discovery::new(
            &config.discovery,
            Duration::from_millis(config.drain_timeout_ms),
            pool.clone(),
            stop.clone(),
        )?;
        discovery.sync(&config.backends);
        // Counters start at zero, so that rates and dashboards see them before
        // the first retry or refusal.
        for failure in crate::retry::Failure::ALL {
            metrics::counter!(crate::metrics::RETRIES, "reason" => failure.label()).increment(0);
        }
        for tenant in live.load().auth.tenants() {
            for reason in crate::auth::limits::REFUSAL_REASONS {
                let key = tenant.name.to_string();
                metrics::counter!(crate::metrics::KEY_REFUSALS, "key" => key, "reason" => reason)
                    .increment(0);
            }
        }
        let reload = Reload::new(
            source,
            config.clone(),
            live.clone(),
            book.clone(),
            pool.clone(),
            discovery,
        );
        tasks.spawn(reload_on_hangup(reload.clone(), stop.clone()));
        for (spec, admin_key, backend) in engines {
            tasks.spawn(crate::supervisor::supervise(spec, admin_key, backend, stop.clone()));
        }
        let replica: Arc<str> = match &config.replica_id {
            Some(id) => id.as_str().into(),
            None => format!("gw-{}", &crate::supervisor::new_admin_key()[..8]).into(),
        };
        let replica_header = axum::http::HeaderValue::from_str(&replica)
            .map_err(|_| GatewayError::Config("replica_id: not a valid header value".into()))?;
        tasks.spawn(crate::health::run(
            pool.clone(),
            client.clone(),
            routing.clone(),
            replica.clone(),
            stop.clone(),
        ));
        let drain = Duration::from_millis(config.drain_timeout_ms);
        let draining = CancellationToken::new();
        let signal = draining.clone();
        tokio::spawn(async move {
            shutdown.await;
            signal.cancel();
        });
        let cut_off = CancellationToken::new();
        let workers = spawn_workers(
            listener.into_std()?,
            Arc::new(Common {
                pool,
                routing,
                retry: Arc::new(RetryPolicy::new(&config.routing)),
                metrics,
                max_body_bytes: config.max_body_bytes,
                live,
                book,
                reload,
                replica: replica_header,
                draining: draining.clone(),
                cut_off: cut_off.clone(),
            }),
            worker_count(config.workers),
        )?;
        let cut_on_drop = cut_off.clone().drop_guard();
        Ok(Self { addr, stop, draining, cut_off, cut_on_drop, tasks, workers, drain })
    }

    /// Waits for the server to stop accepting (on the shutdown signal), lets
    /// in-flight requests finish up to the drain timeout, then stops the engines.
    pub async fn run(self) -> Result<(), GatewayError> {
        let Self {
            stop,
            draining,
            cut_off,
            cut_on_drop: _cut_on_drop,
            tasks,
            mut workers,
            drain,
            ..
        } = self;
        let result = tokio::select! {
            r = &mut workers => Some(r),
            () = draining.cancelled() => None,
        };
        let result = match result {
            Some(r) => r,
            None => match tokio::time::timeout(drain, &mut workers).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!("drain timeout passed; closing remaining connections");
                    cut_off.cancel();
                    workers.await
                }
            },
        };
        stop.cancel();
        tasks.close();
        tasks.wait().await;
        result
            .map_err(|_| GatewayError::Io(std::io::Error::other("a worker thread panicked")))??;
        Ok(())
    }
}

/// Reloads the configuration on each `SIGHUP` until `stop`.
async fn reload_on_hangup(reload: Reload, stop: CancellationToken) {
    let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
    else {
        return;
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        match reload.apply() {
            Ok(summary) => tracing::info!(%summary, "SIGHUP: reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: reload refused; the old configuration stays")
            }
        }
    }
}

/// What every worker thread serves with.
struct Common {
    pool: Arc<Pool>,
    routing: crate::config::Routing,
    retry: Arc<RetryPolicy>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    max_body_bytes: usize,
    live: LiveCell,
    book: Arc<UsageBook>,
    reload: Reload,
    replica: axum::http::HeaderValue,
    draining: CancellationToken,
    cut_off: CancellationToken,
}

/// `workers`, or one per core.
fn worker_count(workers: usize) -> usize {
    if workers > 0 {
        return workers;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Starts `count` threads, each with a single-threaded runtime that accepts on
/// the one listening socket and serves its connections with its own client to the
/// backends. A request then stays on the thread that accepted it, from the
/// client's socket to the backend's and back: no hand-off between threads per
/// request, which on a multi-threaded runtime cost a fifth of the proxy's time in
/// wake-ups (see BENCHMARKS.md). The pool, the retry budget and the metrics are
/// shared. The receiver resolves when every thread has stopped.
fn spawn_workers(
    listener: std::net::TcpListener,
    shared: Arc<Common>,
    count: usize,
) -> std::io::Result<tokio::sync::oneshot::Receiver<std::io::Result<()>>> {
    listener.set_nonblocking(true)?;
    let mut threads = Vec::with_capacity(count);
    for i in 0..count {
        let listener = listener.try_clone()?;
        let shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gateway-{i}"))
            .spawn(move || serve_worker(listener, &shared))?;
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

/// One worker thread: serves until the drain ends or is cut off.
fn serve_worker(listener: std::net::TcpListener, shared: &Common) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let listener = TcpListener::from_std(listener)?;
        let forwarder = Forwarder::new(
            shared.pool.clone(),
            Upstream::new(&shared.routing, shared.replica.clone()),
            shared.retry.clone(),
            shared.live.clone(),
            shared.book.clone(),
        );
        let app = Arc::new(App {
            reload: shared.reload.clone(),
            forwarder,
            metrics: shared.metrics.clone(),
        });
        let routes = Routes::new(app, shared.max_body_bytes);
        let connections = GracefulShutdown::new();
        tokio::select! {
            () = accept(&listener, &routes, &connections) => {}
            () = shared.draining.cancelled() => {}
            // Dropping the runtime below drops the connections still open.
            () = shared.cut_off.cancelled() => return Ok(()),
        }
        // Stop accepting; finish the requests in flight, close idle connections.
        drop(listener);
        tokio::select! {
            () = connections.shutdown() => {}
            () = shared.cut_off.cancelled() => {}
        }
        Ok(())
    })
}

/// Accepts connections and serves each in a task of this thread, as HTTP/1.1
/// with no Nagle delay (a stream's small events go out at once).
async fn accept(listener: &TcpListener, routes: &Routes, connections: &GracefulShutdown) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // One client's connection went away before it was taken: take the next.
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of descriptors or the like: wait rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), routes.clone());
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}

/// An accept error that concerns one connection, not the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker threads are not tasks of the caller's runtime: a gateway dropped
    /// without `run` must still stop them, and close its socket.
    #[tokio::test]
    async fn a_dropped_gateway_stops_its_worker_threads() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = GatewayConfig { workers: 2, ..GatewayConfig::default() };
        let gateway = Gateway::serve(listener, config, std::future::pending()).await.unwrap();
        let addr = gateway.addr;
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok(), "it serves");
        drop(gateway);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            assert!(std::time::Instant::now() < deadline, "still accepting 5 s after the drop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
