//! The reload of the configuration (`POST /admin/reload`, `SIGHUP`): the same
//! sources as the start read again (file, environment, flags), and what can
//! change while requests run applied without dropping one: each request keeps
//! the settings it arrived under, and a backend that leaves the list drains
//! first. An invalid configuration is refused with the reason and the old one
//! stays.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::config::error::GatewayError;
use crate::config::live::{Live, LiveCell};
use crate::config::{BackendConfig, Cli, GatewayConfig};
use crate::fleet::discovery::Discovery;
use crate::fleet::pool::Pool;
use crate::tenancy::limits::UsageBook;

/// Re-reads the configuration and applies it.
#[derive(Clone)]
pub struct Reload {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where the configuration came from; `None`: built in code, nothing to re-read.
    source: Option<Cli>,
    /// The configuration in force.
    config: Mutex<GatewayConfig>,
    live: LiveCell,
    book: Arc<UsageBook>,
    pool: Arc<Pool>,
    discovery: Arc<Discovery>,
}

impl Reload {
    /// Reloads of `config`, which was read from `source`.
    pub fn new(
        source: Option<Cli>,
        config: GatewayConfig,
        live: LiveCell,
        book: Arc<UsageBook>,
        pool: Arc<Pool>,
        discovery: Arc<Discovery>,
    ) -> Self {
        let config = Mutex::new(config);
        Self { inner: Arc::new(Inner { source, config, live, book, pool, discovery }) }
    }

    /// Whether a `[[backends]]` entry of the configuration in force takes its key
    /// from the variable `var`.
    pub fn declares_backend_key(&self, var: &str) -> bool {
        let config = self.inner.config.lock().unwrap_or_else(|e| e.into_inner());
        config.backends.iter().any(|b| b.api_key_env.as_deref() == Some(var))
    }

    /// Reads the configuration again and applies it; the error says why it was refused.
    pub fn apply(&self) -> Result<Value, GatewayError> {
        let inner = &self.inner;
        let Some(source) = &inner.source else {
            return Err(GatewayError::Config(
                "this gateway was not started from a configuration".into(),
            ));
        };
        let new = GatewayConfig::load(source)?;
        let live = Live::build(&new, &inner.book)?;
        let mut old = inner.config.lock().unwrap_or_else(|e| e.into_inner());
        let fixed = [
            ("listen", old.listen != new.listen),
            ("workers", old.workers != new.workers),
            ("engines", old.engines != new.engines),
            ("drain_timeout_ms", old.drain_timeout_ms != new.drain_timeout_ms),
            ("max_body_bytes", old.max_body_bytes != new.max_body_bytes),
            ("auth.redis_url", old.auth.redis_url != new.auth.redis_url),
            ("discovery", old.discovery != new.discovery),
        ];
        let kept: Vec<&str> =
            fixed.iter().filter(|(_, changed)| *changed).map(|(k, _)| *k).collect();
        if !kept.is_empty() {
            tracing::warn!(settings = ?kept, "reload: these settings apply only at start; restart to change them");
        }
        inner.live.store(Arc::new(live));
        inner.pool.set_routing(&new.routing);
        inner.discovery.sync(&new.backends);
        let fixed = |b: &&BackendConfig| !crate::fleet::target::is_discovered(&b.url);
        let mut added = 0;
        for b in new.backends.iter().filter(fixed).filter(|b| !old.backends.contains(b)) {
            inner.pool.add(b);
            added += 1;
        }
        let mut removed = 0;
        for gone in old.backends.iter().filter(fixed).filter(|b| !new.backends.contains(b)) {
            let url = gone.url.trim_end_matches('/');
            let backends = inner.pool.backends();
            let found =
                backends.iter().find(|b| b.fixed_url.as_deref() == Some(url) && !b.is_draining());
            if let Some(backend) = found {
                inner.pool.retire(backend.clone(), Duration::from_millis(new.drain_timeout_ms));
                removed += 1;
            }
        }
        tracing::info!(added, removed, keys = new.keys.len(), "configuration reloaded");
        *old = new;
        Ok(
            json!({"reloaded": true, "backends_added": added, "backends_removed": removed, "keys": old.keys.len()}),
        )
    }
}
