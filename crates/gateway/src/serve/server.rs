//! Starting and stopping the gateway: the backends and supervised engines, the
//! health checks, the HTTP server, and the drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use arc_swap::ArcSwap;

use crate::config::error::GatewayError;
use crate::config::live::{Live, LiveCell};
use crate::config::{Cli, EngineSpec, GatewayConfig};
use crate::fleet::backend::Backend;
use crate::fleet::discovery::Discovery;
use crate::fleet::pool::Pool;
use crate::proxy::retry::RetryPolicy;
use crate::proxy::upstream::BackendClient;
use crate::serve::reload::Reload;
use crate::serve::workers::{spawn_workers, worker_count, Common};
use crate::tenancy::limits::UsageBook;
use crate::tenancy::shared::RedisLimits;

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
        let (backends, engines) = backends_of(&config);
        let routing = config.routing.clone();
        let pool = Pool::new(backends, &routing);
        let shared_limits =
            config.auth.redis_url.as_ref().map(|url| RedisLimits::start(url, stop.clone()));
        let shared_limits = shared_limits.transpose().map_err(GatewayError::Config)?;
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
        zero_counters(&live.load());
        let reload = Reload::new(
            source,
            config.clone(),
            live.clone(),
            book.clone(),
            pool.clone(),
            discovery,
        );
        tasks.spawn(reload_on_hangup(reload.clone(), stop.clone()));
        for (spec, key, backend) in engines {
            tasks.spawn(crate::fleet::supervisor::supervise(spec, key, backend, stop.clone()));
        }
        let (replica, replica_header) = replica_of(&config)?;
        // The health checks' own client, on this runtime: each worker thread
        // has one for its requests.
        let client = Arc::new(BackendClient::new(&routing, replica_header.clone()));
        tasks.spawn(crate::fleet::health::run(
            pool.clone(),
            client,
            routing.clone(),
            replica.clone(),
            stop.clone(),
        ));
        let drain = Duration::from_millis(config.drain_timeout_ms);
        let draining = CancellationToken::new();
        tokio::spawn(cancel_on(shutdown, draining.clone()));
        let cut_off = CancellationToken::new();
        let workers = spawn_workers(
            listener.into_std()?,
            Arc::new(Common {
                pool,
                routing,
                retry: Arc::new(RetryPolicy::new(&config.routing)),
                metrics,
                max_body_bytes: config.max_body_bytes,
                limits: config.connections.limits(),
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

/// Cancels `token` when `signal` comes.
async fn cancel_on(signal: impl Future<Output = ()>, token: CancellationToken) {
    signal.await;
    token.cancel();
}

/// A supervised engine: what it runs, its admin key, and its place in the pool.
type Supervised = (EngineSpec, String, Arc<Backend>);

/// The configured backends (those named by DNS join as they are discovered),
/// then one for each supervised engine, with what its supervisor needs.
fn backends_of(config: &GatewayConfig) -> (Vec<Arc<Backend>>, Vec<Supervised>) {
    let fixed = config.backends.iter().filter(|b| !crate::fleet::target::is_discovered(&b.url));
    let mut backends: Vec<Arc<Backend>> =
        fixed.enumerate().map(|(i, b)| Arc::new(Backend::new(i, b))).collect();
    let mut engines = Vec::new();
    for spec in &config.engines {
        let id = spec.model_id.clone().unwrap_or_else(|| {
            let name = spec.model.file_name().and_then(|n| n.to_str()).unwrap_or("model");
            name.strip_suffix(".gguf").unwrap_or(name).to_owned()
        });
        let admin_key = crate::fleet::supervisor::new_admin_key();
        let backend =
            Backend::supervised(backends.len(), engines.len(), spec.n_parallel, &admin_key);
        let backend = Arc::new(backend);
        backend.set_models(vec![id]);
        backends.push(backend.clone());
        engines.push((spec.clone(), admin_key, backend));
    }
    (backends, engines)
}

/// Counters start at zero, so that rates and dashboards see them before the
/// first retry or refusal.
fn zero_counters(live: &Live) {
    for failure in crate::proxy::retry::Failure::ALL {
        metrics::counter!(crate::metrics::RETRIES, "reason" => failure.label()).increment(0);
    }
    for tenant in live.auth.tenants() {
        for reason in crate::tenancy::limits::REFUSAL_REASONS {
            let key = tenant.name.to_string();
            metrics::counter!(crate::metrics::KEY_REFUSALS, "key" => key, "reason" => reason)
                .increment(0);
        }
    }
}

/// This gateway's name among replicas (`replica_id`, or a random one), and
/// the header value that says it to the backends.
fn replica_of(config: &GatewayConfig) -> Result<(Arc<str>, axum::http::HeaderValue), GatewayError> {
    let replica: Arc<str> = match &config.replica_id {
        Some(id) => id.as_str().into(),
        None => format!("gw-{}", &crate::fleet::supervisor::new_admin_key()[..8]).into(),
    };
    let header = axum::http::HeaderValue::from_str(&replica)
        .map_err(|_| GatewayError::Config("replica_id: not a valid header value".into()))?;
    Ok((replica, header))
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

    /// Connections opened one after another, whichever worker accepts each, are
    /// served spread evenly over the workers, as `/metrics` shows.
    #[tokio::test]
    async fn connections_are_spread_over_the_workers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = GatewayConfig { workers: 2, ..GatewayConfig::default() };
        let gateway = Gateway::serve(listener, config, std::future::pending()).await.unwrap();
        let url = format!("http://{}", gateway.addr);
        // Each client keeps its own connection open after its request.
        let clients: Vec<reqwest::Client> = (0..12).map(|_| reqwest::Client::new()).collect();
        let mut metrics = String::new();
        let open = |metrics: &str, worker: &str| {
            let name = format!("slotgate_worker_connections{{worker=\"{worker}\"}} ");
            metrics.lines().find_map(|l| l.strip_prefix(name.as_str())?.parse::<f64>().ok())
        };
        for (n, client) in clients.iter().enumerate() {
            client.get(format!("{url}/health")).send().await.unwrap();
            // Read over the first client's connection, open since the start.
            let answer = clients[0].get(format!("{url}/metrics")).send().await.unwrap();
            metrics = answer.text().await.unwrap();
            let (Some(a), Some(b)) = (open(&metrics, "0"), open(&metrics, "1")) else {
                panic!("no worker gauges: {metrics}");
            };
            // Balanced after every connection, not only at the end.
            assert_eq!(a + b, (n + 1) as f64, "{metrics}");
            assert!((a - b).abs() <= 1.0, "after {} connections: {a} and {b}", n + 1);
        }
        assert_eq!((open(&metrics, "0"), open(&metrics, "1")), (Some(6.0), Some(6.0)), "{metrics}");
    }
}
