//! The gateway's HTTP/1.1 client to its backends: hyper's connection API with a
//! pool of kept-alive connections per backend, owned by one worker thread.
//!
//! hyper-util's pooled client cost measurable time per request here (see
//! BENCHMARKS.md, gateway overhead): a `Uri` parsed and turned into origin-form,
//! a checkout through its shared pool, and a task spawned per request only to
//! wait until the connection may be pooled again. Here the target is parsed once
//! per backend URL, the path is a static `Uri`, and a connection goes back to
//! the pool when its answer has been read to the end, by the caller's [`Lease`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderValue, Method, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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

/// Idle connections kept per backend, at most; as the client before had it.
const MAX_IDLE: usize = 1024;

type Sender = SendRequest<Full<Bytes>>;

/// Pooled connections to every backend.
#[derive(Debug)]
pub struct Upstream {
    /// By base URL: a restarted engine's new port is a new entry.
    hosts: Mutex<HashMap<String, Arc<Host>>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// This gateway's name, sent with every request (`x-slotgate-replica`).
    replica: HeaderValue,
}

/// One backend URL: where to connect, what to send as `Host`, and its idle
/// connections, the most recently used last.
#[derive(Debug)]
struct Host {
    /// `host:port`, as `TcpStream::connect` takes it.
    addr: String,
    authority: HeaderValue,
    /// A path the base URL itself has (`http://h/prefix`), put before each path.
    prefix: String,
    idle: Mutex<Vec<(Sender, Instant)>>,
    idle_timeout: Duration,
}

/// A connection lent to one request. [`Lease::release`] puts it back once the
/// answer has been read to its end; dropped instead (an answer cut short, a
/// client gone), it is closed, as a half-read HTTP/1.1 connection must be.
pub struct Lease {
    host: Arc<Host>,
    sender: Sender,
}

impl Lease {
    /// The answer was read whole: the connection may carry another request.
    pub fn release(self) {
        self.host.put(self.sender);
    }
}

impl Upstream {
    /// A client with the pool and connect timeouts of `routing`, naming itself
    /// `replica` to the backends.
    pub fn new(routing: &Routing, replica: HeaderValue) -> Self {
        Self {
            hosts: Mutex::default(),
            connect_timeout: Duration::from_millis(routing.connect_timeout_ms),
            idle_timeout: Duration::from_millis(routing.pool_idle_timeout_ms),
            replica,
        }
    }

    /// POSTs a JSON `body` to `base` + `path` with `headers` added, and returns the
    /// answer's head with its body still to read, and the connection it came on.
    pub async fn post(
        &self,
        base: &str,
        path: &'static str,
        headers: impl IntoIterator<Item = (header::HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Result<(Response<Incoming>, Lease), SendError> {
        let host = self.host(base)?;
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = if host.prefix.is_empty() {
            Uri::from_static(path)
        } else {
            let uri = format!("{}{path}", host.prefix);
            uri.parse().map_err(|e| SendError::Uri(format!("{uri}: {e}")))?
        };
        let h = request.headers_mut();
        h.insert(header::HOST, host.authority.clone());
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(slotgate_protocol::REPLICA_HEADER, self.replica.clone());
        h.extend(headers);

        // A pooled connection the backend has closed meanwhile gives the request
        // back unsent: try the next one, and at last a new connection.
        while let Some(mut sender) = host.take() {
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, Lease { host, sender })),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(SendError::Broken(e.into_error().to_string())),
                },
            }
        }
        let mut sender = self.connect(&host).await?;
        match sender.send_request(request).await {
            Ok(response) => Ok((response, Lease { host, sender })),
            Err(e) => Err(SendError::Broken(e.to_string())),
        }
    }

    /// The pool entry of `base`, made on its first use.
    fn host(&self, base: &str) -> Result<Arc<Host>, SendError> {
        let mut hosts = lock(&self.hosts);
        if let Some(host) = hosts.get(base) {
            return Ok(host.clone());
        }
        let host = Arc::new(Host::parse(base, self.idle_timeout)?);
        hosts.insert(base.to_owned(), host.clone());
        Ok(host)
    }

    /// A new connection to `host`, served by a task of the calling thread.
    async fn connect(&self, host: &Host) -> Result<Sender, SendError> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&host.addr))
            .await
            .map_err(|_| SendError::Connect(format!("{}: connect timed out", host.addr)))?
            .map_err(|e| SendError::Connect(format!("{}: {e}", host.addr)))?;
        // A stream's small events go out at once, not after Nagle's delay.
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SendError::Broken(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "backend connection ended");
            }
        });
        Ok(sender)
    }
}

impl Host {
    /// Reads `http://host[:port][/prefix]`. Backends speak plain HTTP, as before.
    fn parse(base: &str, idle_timeout: Duration) -> Result<Self, SendError> {
        let invalid = |why: &str| SendError::Uri(format!("{base}: {why}"));
        let rest = base.strip_prefix("http://").ok_or_else(|| invalid("not an http:// URL"))?;
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let parsed: axum::http::uri::Authority =
            authority.parse().map_err(|_| invalid("no valid host"))?;
        if parsed.as_str().contains('@') {
            return Err(invalid("credentials in the URL are not supported"));
        }
        let port = parsed.port_u16().unwrap_or(80);
        // `[::1]` keeps its brackets: TcpStream::connect reads `[::1]:port`.
        let addr = format!("{}:{port}", parsed.host());
        let authority = HeaderValue::from_str(authority).map_err(|_| invalid("no valid host"))?;
        Ok(Self {
            addr,
            authority,
            prefix: prefix.trim_end_matches('/').to_owned(),
            idle: Mutex::default(),
            idle_timeout,
        })
    }

    /// The most recently pooled connection that is still open and not too old.
    fn take(&self) -> Option<Sender> {
        let mut idle = lock(&self.idle);
        while let Some((sender, since)) = idle.pop() {
            if !sender.is_closed() && since.elapsed() < self.idle_timeout {
                return Some(sender);
            }
        }
        None
    }

    /// Pools `sender` again, and closes connections idle for too long.
    fn put(&self, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = lock(&self.idle);
        let expired =
            idle.iter().take_while(|(_, since)| since.elapsed() >= self.idle_timeout).count();
        idle.drain(..expired);
        if idle.len() < MAX_IDLE {
            idle.push((sender, Instant::now()));
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing is left half-done under these locks: a panic elsewhere cannot
    // make their contents wrong.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const ANSWER: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

    /// A backend that answers every request on a connection with `{}`, closing
    /// the connection after `per_connection` answers; counts connections.
    async fn backend(per_connection: usize) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    for _ in 0..per_connection {
                        // Each test request's head and body arrive in one read.
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => assert!(buf[..n].starts_with(b"POST /v1/")),
                        }
                        if socket.write_all(ANSWER).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (base, accepted)
    }

    async fn post(upstream: &Upstream, base: &str) -> Result<Lease, SendError> {
        let (response, lease) =
            upstream.post(base, "/v1/completions", [], Bytes::from_static(b"{}")).await?;
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{}");
        Ok(lease)
    }

    /// A connection whose answer was read whole carries the next request.
    #[tokio::test]
    async fn a_released_connection_is_used_again() {
        let (base, accepted) = backend(usize::MAX).await;
        let upstream = Upstream::new(&Routing::default(), HeaderValue::from_static("test"));
        for _ in 0..5 {
            post(&upstream, &base).await.unwrap().release();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // Not released (an answer cut short): the next request opens another.
        drop(post(&upstream, &base).await.unwrap());
        post(&upstream, &base).await.unwrap().release();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// A pooled connection that the backend closed is replaced without an error.
    #[tokio::test]
    async fn a_connection_the_backend_closed_is_replaced() {
        let (base, accepted) = backend(1).await;
        let upstream = Upstream::new(&Routing::default(), HeaderValue::from_static("test"));
        for _ in 0..3 {
            post(&upstream, &base).await.unwrap().release();
            // Let the connection's task read the backend's close.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    /// Nobody listening is a connect failure, which the retry policy ejects for.
    #[tokio::test]
    async fn a_refused_connection_is_a_connect_failure() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let upstream = Upstream::new(&Routing::default(), HeaderValue::from_static("test"));
        assert!(matches!(post(&upstream, &base).await, Err(SendError::Connect(_))));
    }

    #[test]
    fn base_urls_are_read_once() {
        let t = Duration::from_secs(1);
        let host = Host::parse("http://127.0.0.1:8081", t).unwrap();
        assert_eq!((host.addr.as_str(), host.prefix.as_str()), ("127.0.0.1:8081", ""));
        let host = Host::parse("http://[::1]:9/api/", t).unwrap();
        assert_eq!((host.addr.as_str(), host.prefix.as_str()), ("[::1]:9", "/api"));
        assert_eq!(host.authority, "[::1]:9");
        assert_eq!(Host::parse("http://engine", t).unwrap().addr, "engine:80");
        for bad in ["https://x:1", "x:1", "http://", "http://u:p@x:1"] {
            assert!(Host::parse(bad, t).is_err(), "{bad}");
        }
    }
}
