//! Backends found by DNS, so that a Kubernetes headless Service (or any DNS)
//! lists the engines: `dns+http://NAME:PORT` stands for an engine at every A and
//! AAAA record of NAME, `dnssrv+http://NAME` for one at every SRV record (each
//! target's addresses, at the record's port). Each name is resolved again every
//! `discovery.interval_ms`: an address that appears joins the pool and takes
//! traffic once its health checks pass, as any added backend; one that vanishes
//! is drained and leaves the pool when its requests have ended.
//!
//! A name that does not resolve (no such name, no records) means no engines; a
//! lookup that fails (timeout, refused) keeps the engines of the last answer,
//! so that a DNS outage does not empty the fleet.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::{ResolveError, TokioResolver};
use tokio_util::sync::CancellationToken;

use crate::config::error::GatewayError;
use crate::config::{BackendConfig, DiscoveryConfig};
use crate::fleet::backend::Backend;
use crate::fleet::pool::Pool;
use crate::fleet::target::Target;

/// The base URL of an engine at `ip:port`.
fn base_url(scheme: &str, ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{scheme}://{v4}:{port}"),
        IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{port}"),
    }
}

/// Watches every DNS-named backend of the configuration.
pub struct Discovery {
    pool: Arc<Pool>,
    resolver: TokioResolver,
    interval: Duration,
    drain: Duration,
    /// Each watched backend configuration, by URL, and the token that stops it.
    watched: Mutex<HashMap<String, CancellationToken>>,
    stop: CancellationToken,
}

impl Discovery {
    /// A discovery over `pool` that asks the configured name servers (or the
    /// system's). Nothing is watched until [`Discovery::sync`].
    pub fn new(
        config: &DiscoveryConfig,
        drain: Duration,
        pool: Arc<Pool>,
        stop: CancellationToken,
    ) -> Result<Arc<Self>, GatewayError> {
        let mut builder = if config.nameservers.is_empty() {
            TokioResolver::builder_tokio()
                .map_err(|e| GatewayError::Config(format!("discovery: system DNS settings: {e}")))?
        } else {
            let mut servers = ResolverConfig::new();
            for ns in &config.nameservers {
                let addr = ns.parse().map_err(|_| {
                    GatewayError::Config(format!("discovery.nameservers: `{ns}` is not an address"))
                })?;
                servers.add_name_server(NameServerConfig::new(addr, Protocol::Udp));
                servers.add_name_server(NameServerConfig::new(addr, Protocol::Tcp));
            }
            TokioResolver::builder_with_config(servers, TokioConnectionProvider::default())
        };
        let options: &mut ResolverOpts = builder.options_mut();
        // Every interval asks the name server: an engine that left must not
        // linger in a cache for a record's TTL.
        options.cache_size = 0;
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        options.use_hosts_file = ResolveHosts::Never;
        Ok(Arc::new(Self {
            pool,
            resolver: builder.build(),
            interval: Duration::from_millis(config.interval_ms),
            drain,
            watched: Mutex::new(HashMap::new()),
            stop,
        }))
    }

    /// Watches the DNS-named backends in `backends` and stops watching those no
    /// longer there (their engines are drained). Other backends are left alone.
    pub fn sync(self: &Arc<Self>, backends: &[BackendConfig]) {
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let wanted: BTreeMap<&str, (&BackendConfig, Target)> = backends
            .iter()
            .filter_map(|b| match Target::parse(&b.url) {
                Ok(Target::Fixed) | Err(_) => None,
                Ok(target) => Some((b.url.as_str(), (b, target))),
            })
            .collect();
        watched.retain(|url, stop| {
            let keep = wanted.contains_key(url.as_str());
            if !keep {
                stop.cancel();
            }
            keep
        });
        for (url, (template, target)) in wanted {
            if watched.contains_key(url) {
                continue;
            }
            let stop = self.stop.child_token();
            watched.insert(url.to_owned(), stop.clone());
            tokio::spawn(self.clone().watch(template.clone(), target, stop));
        }
    }

    /// Resolves `target` every interval and makes the pool follow its answers.
    async fn watch(
        self: Arc<Self>,
        template: BackendConfig,
        target: Target,
        stop: CancellationToken,
    ) {
        let mut found: BTreeMap<String, Arc<Backend>> = BTreeMap::new();
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let urls = match self.resolve(&target).await {
                Ok(urls) => urls,
                Err(e) => {
                    tracing::warn!(name = %template.url, error = %e, "DNS lookup failed; keeping the engines it gave last");
                    continue;
                }
            };
            for url in &urls {
                if found.contains_key(url) {
                    continue;
                }
                let config = BackendConfig { url: url.clone(), ..template.clone() };
                tracing::info!(name = %template.url, backend = %url, "discovered");
                found.insert(url.clone(), self.pool.add(&config));
            }
            let gone: Vec<String> = found.keys().filter(|u| !urls.contains(*u)).cloned().collect();
            for url in gone {
                if let Some(backend) = found.remove(&url) {
                    tracing::info!(name = %template.url, backend = %url, "gone from DNS: draining");
                    self.pool.retire(backend, self.drain);
                }
            }
        }
        for backend in found.into_values() {
            self.pool.retire(backend, self.drain);
        }
    }

    /// The base URLs `target` stands for now. A name without records is an
    /// empty set, not an error.
    async fn resolve(&self, target: &Target) -> Result<BTreeSet<String>, ResolveError> {
        let empty_if_none = |r: Result<BTreeSet<String>, ResolveError>| match r {
            Err(e) if e.is_no_records_found() => Ok(BTreeSet::new()),
            other => other,
        };
        match target {
            Target::Fixed => Ok(BTreeSet::new()),
            Target::Hosts { scheme, host, port } => empty_if_none(
                self.resolver
                    .lookup_ip(host.as_str())
                    .await
                    .map(|ips| ips.iter().map(|ip| base_url(scheme, ip, *port)).collect()),
            ),
            Target::Srv { scheme, name } => {
                let records = match self.resolver.srv_lookup(name.as_str()).await {
                    Ok(records) => records,
                    Err(e) if e.is_no_records_found() => return Ok(BTreeSet::new()),
                    Err(e) => return Err(e),
                };
                let mut urls = BTreeSet::new();
                for srv in records.iter() {
                    let ips =
                        empty_if_none(self.resolver.lookup_ip(srv.target().clone()).await.map(
                            |ips| ips.iter().map(|ip| base_url(scheme, ip, srv.port())).collect(),
                        ))?;
                    urls.extend(ips);
                }
                Ok(urls)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_on_ipv6_get_bracketed_urls() {
        let v6 = "::1".parse().unwrap();
        assert_eq!(base_url("http", v6, 8081), "http://[::1]:8081");
    }
}
