//! The gateway's HTTP/1.1 client to its backends: hyper's pooled client with
//! kept-alive connections and no per-request URL parsing beyond `http::Uri`.
//! reqwest, which wraps the same client, cost measurable time per request here
//! (a WHATWG URL parse with IDNA, a header map rebuilt, redirect and timeout
//! layers); see BENCHMARKS.md, gateway overhead.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderValue, Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::config::Routing;

/// Why a request got no answer at all.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The connection was refused or timed out: the backend is down.
    #[error("connect: {0}")]
    Connect(String),
    /// The connection broke before the answer's head arrived.
    #[error("{0}")]
    Broken(String),
    /// The backend's URL and the path make no valid URI.
    #[error("invalid backend URI: {0}")]
    Uri(String),
}

/// Pooled connections to every backend.
#[derive(Clone, Debug)]
pub struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Upstream {
    /// A client with the pool and connect timeouts of `routing`.
    pub fn new(routing: &Routing) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(routing.connect_timeout_ms)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_millis(routing.pool_idle_timeout_ms))
            .pool_max_idle_per_host(1024)
            .build(connector);
        Self { client }
    }

    /// POSTs a JSON `body` to `base` + `path` with `headers` added, and returns the
    /// answer's head with its body still to read.
    pub async fn post(
        &self,
        base: &str,
        path: &str,
        headers: impl IntoIterator<Item = (header::HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Result<Response<Incoming>, SendError> {
        let mut uri = String::with_capacity(base.len() + path.len());
        uri.push_str(base);
        uri.push_str(path);
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri.parse().map_err(|e| SendError::Uri(format!("{uri}: {e}")))?;
        let h = request.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.extend(headers);
        self.client.request(request).await.map_err(|e| {
            if e.is_connect() {
                SendError::Connect(e.to_string())
            } else {
                SendError::Broken(e.to_string())
            }
        })
    }
}
