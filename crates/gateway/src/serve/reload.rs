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

/// What a reload applies while requests run, by dotted key or whole section:
/// the keys and limits, the admin key, CORS and aliases ([`Live`]), the fixed
/// and discovered backends, and the pool's own routing settings
/// (`Pool::set_routing`). Any other setting a reload changes is named as
/// needing a restart; that list is derived from the settings themselves, so a
/// new setting is never silently ignored.
const APPLIED_LIVE: &[&str] = &[
    "keys",
    "auth.admin_key_env",
    "auth.admin_loopback",
    "cors",
    "aliases",
    "backends",
    "routing.policy",
    "routing.cache_load_factor",
    "routing.queue_size",
    "routing.queue_timeout_ms",
];

/// The settings that differ between `old` and `new` and that a reload does
/// not apply, as dotted keys (`routing.max_attempts`); a list is one setting.
fn needs_restart(old: &GatewayConfig, new: &GatewayConfig) -> Vec<String> {
    let value = |c: &GatewayConfig| serde_json::to_value(c).unwrap_or(Value::Null);
    let mut changed = Vec::new();
    differences(&value(old), &value(new), "", &mut changed);
    let live = |key: &str| {
        APPLIED_LIVE
            .iter()
            .any(|l| key == *l || key.strip_prefix(l).is_some_and(|r| r.starts_with('.')))
    };
    changed.retain(|key| !live(key));
    changed
}

/// Pushes onto `out` the dotted keys under `at` whose values differ.
fn differences(old: &Value, new: &Value, at: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let path = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
                let (a, b) =
                    (a.get(key).unwrap_or(&Value::Null), b.get(key).unwrap_or(&Value::Null));
                differences(a, b, &path, out);
            }
        }
        (a, b) if a != b => out.push(at.to_owned()),
        _ => {}
    }
}

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
        let kept = needs_restart(&old, &new);
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
                backends.iter().find(|b| b.configured_url() == Some(url) && !b.is_draining());
            if let Some(backend) = found {
                inner.pool.retire(backend.clone(), Duration::from_millis(new.drain_timeout_ms));
                removed += 1;
            }
        }
        tracing::info!(added, removed, keys = new.keys.len(), "configuration reloaded");
        *old = new;
        Ok(json!({"reloaded": true, "backends_added": added, "backends_removed": removed,
                   "keys": old.keys.len(), "needs_restart": kept}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting a reload changes is applied live or named: a change in
    /// each section is sorted into one or the other.
    #[test]
    fn a_reload_names_every_change_it_does_not_apply() {
        let old = GatewayConfig::default();
        let mut new = old.clone();
        new.routing.queue_size += 1;
        new.routing.policy = crate::fleet::balancer::Policy::RoundRobin;
        new.aliases.insert("alias".into(), "model".into());
        new.cors.max_age_secs += 1;
        new.auth.admin_loopback = !new.auth.admin_loopback;
        assert_eq!(needs_restart(&old, &new), Vec::<String>::new(), "all applied live");
        new.routing.max_attempts += 1;
        new.routing.health_interval_ms += 1;
        new.workers += 1;
        new.max_body_bytes += 1;
        new.auth.redis_url = Some("redis://127.0.0.1:1".into());
        let mut named = needs_restart(&old, &new);
        named.sort();
        assert_eq!(
            named,
            [
                "auth.redis_url",
                "max_body_bytes",
                "routing.health_interval_ms",
                "routing.max_attempts",
                "workers"
            ]
        );
    }
}
