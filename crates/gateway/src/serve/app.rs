//! What every route of the gateway shares: the reload, the forwarder (which
//! holds the pool), the metrics handle, and the caller's address.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::proxy::Forwarder;
use crate::serve::reload::Reload;

/// What the routes share.
pub struct App {
    /// Reloads the configuration (`POST /admin/reload`).
    pub reload: Reload,
    /// Forwards the OpenAI requests, and holds the pool.
    pub forwarder: Arc<Forwarder>,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// Open connections per worker thread, for `/metrics`.
    pub spread: std::sync::Arc<crate::serve::spread::Spread>,
}

/// The routes' state.
pub type AppState = State<Arc<App>>;

/// The peer of the connection a request came on, for the admin routes.
pub type Peer = Option<axum::Extension<ConnectInfo<SocketAddr>>>;

/// The address in a [`Peer`].
pub fn peer(peer: Peer) -> Option<SocketAddr> {
    peer.map(|axum::Extension(ConnectInfo(addr))| addr)
}
