//! One backend URL of the client: where to connect, what to send as `Host`,
//! the path its URL puts before each request's, and its pool of idle
//! connections.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderValue;

use super::{lock, Conn, SendError, LOOK_AFTER, MAX_IDLE};

/// One backend URL: where to connect, what to send as `Host`, and its idle
/// connections, the most recently used last.
#[derive(Debug)]
pub(super) struct Host {
    /// `host:port`, as `TcpStream::connect` takes it.
    pub(super) addr: String,
    pub(super) authority: HeaderValue,
    /// A path the base URL itself has (`http://h/prefix`), put before each path.
    pub(super) prefix: String,
    pub(super) idle: Mutex<Vec<(Conn, Instant)>>,
    idle_timeout: Duration,
}

impl Host {
    /// Reads `http://host[:port][/prefix]`. Backends speak plain HTTP, as before.
    pub(super) fn parse(base: &str, idle_timeout: Duration) -> Result<Self, SendError> {
        let invalid = |why: &str| SendError::Uri(format!("{base}: {why}"));
        let rest = base.strip_prefix("http://").ok_or_else(|| invalid("not an http:// URL"))?;
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let parsed: axum::http::uri::Authority =
            authority.parse().map_err(|_| invalid("no valid host"))?;
        if parsed.as_str().contains('@') {
            return Err(invalid("credentials in the URL are not supported"));
        }
        let prefix = prefix.trim_end_matches('/');
        // The prefix goes into the request line as it is: a path, nothing else.
        if !prefix.is_empty()
            && (prefix.parse::<axum::http::uri::PathAndQuery>().is_err()
                || prefix.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#'))
        {
            return Err(invalid("the path is not a plain URL path"));
        }
        let port = parsed.port_u16().unwrap_or(80);
        // `[::1]` keeps its brackets: TcpStream::connect reads `[::1]:port`.
        let addr = format!("{}:{port}", parsed.host());
        let authority = HeaderValue::from_str(authority).map_err(|_| invalid("no valid host"))?;
        Ok(Self {
            addr,
            authority,
            prefix: prefix.to_owned(),
            idle: Mutex::default(),
            idle_timeout,
        })
    }

    /// The most recently pooled connection that is still open and not too old.
    pub(super) fn take(&self) -> Option<Conn> {
        let mut idle = lock(&self.idle);
        while let Some((conn, since)) = idle.pop() {
            let idle = since.elapsed();
            if idle < self.idle_timeout && (idle < LOOK_AFTER || conn.is_open()) {
                return Some(conn);
            }
        }
        None
    }

    /// Pools `conn` again, and closes connections idle for too long.
    pub(super) fn put(&self, conn: Conn) {
        let mut idle = lock(&self.idle);
        let expired =
            idle.iter().take_while(|(_, since)| since.elapsed() >= self.idle_timeout).count();
        idle.drain(..expired);
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now()));
        }
    }
}
