//! Starting and stopping the gateway: the backends and supervised engines, the
//! health checks, the HTTP server, and the drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::Backend;
use crate::config::{BackendConfig, GatewayConfig};
use crate::error::GatewayError;
use crate::pool::Pool;
use crate::proxy::Forwarder;
use crate::retry::RetryPolicy;
use crate::routes::{router, App};
use crate::upstream::Upstream;

/// A running gateway. Not `Clone`: it owns the shutdown of everything it started.
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Stops the engines and the health checks.
    stop: CancellationToken,
    /// Cancelled by the shutdown signal: stop accepting, drain.
    draining: CancellationToken,
    tasks: TaskTracker,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
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

    /// Starts the supervised engines and the health checks, and serves on
    /// `listener` until `shutdown` resolves.
    pub async fn serve(
        listener: TcpListener,
        config: GatewayConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, GatewayError> {
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let mut backends: Vec<Arc<Backend>> =
            config.backends.iter().enumerate().map(|(i, b)| Arc::new(Backend::new(i, b))).collect();
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
            };
            let backend = Arc::new(Backend::new(backends.len(), &seed));
            backend.set_models(vec![id]);
            backends.push(backend.clone());
            engines.push((spec.clone(), backend));
        }
        let routing = config.routing.clone();
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_millis(routing.pool_idle_timeout_ms))
            .connect_timeout(Duration::from_millis(routing.connect_timeout_ms))
            .build()
            .map_err(|e| GatewayError::Config(format!("http client: {e}")))?;
        let pool = Pool::new(backends, &routing);
        for (spec, backend) in engines {
            tasks.spawn(crate::supervisor::supervise(spec, backend, stop.clone()));
        }
        tasks.spawn(crate::health::run(
            pool.clone(),
            client.clone(),
            routing.clone(),
            stop.clone(),
        ));
        let drain = Duration::from_millis(config.drain_timeout_ms);
        let forwarder = Forwarder::new(pool, Upstream::new(&routing), RetryPolicy::new(&routing));
        let app = Arc::new(App { forwarder, metrics: crate::metrics::handle() });
        let app = router(app, config.max_body_bytes);
        let draining = CancellationToken::new();
        let signal = draining.clone();
        tokio::spawn(async move {
            shutdown.await;
            signal.cancel();
        });
        let stop_accepting = draining.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop_accepting.cancelled_owned())
                .await
        });
        Ok(Self { addr, stop, draining, tasks, server, drain })
    }

    /// Waits for the server to stop accepting (on the shutdown signal), lets
    /// in-flight requests finish up to the drain timeout, then stops the engines.
    pub async fn run(self) -> Result<(), GatewayError> {
        let Self { stop, draining, tasks, mut server, drain, .. } = self;
        let result = tokio::select! {
            r = &mut server => Some(r),
            () = draining.cancelled() => None,
        };
        let result = match result {
            Some(r) => r,
            None => match tokio::time::timeout(drain, &mut server).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!("drain timeout passed; closing remaining connections");
                    server.abort();
                    Ok(Ok(()))
                }
            },
        };
        stop.cancel();
        tasks.close();
        tasks.wait().await;
        result.map_err(|e| GatewayError::Io(std::io::Error::other(e)))??;
        Ok(())
    }
}
