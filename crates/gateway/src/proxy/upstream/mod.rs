//! The gateway's HTTP/1.1 client to its backends: a pool of kept-alive
//! connections per backend, owned by one worker thread, each request written in
//! one piece and its answer read on the request's own task.
//!
//! hyper's client cost a quarter of the proxy's time per request here (see
//! BENCHMARKS.md, gateway overhead): a task per connection, a channel to it and
//! one back per request, and a `Uri` and header map built and encoded for a
//! request that is always the same POST. Here the head is written straight from
//! the parts that vary, the answer's head is parsed for what the gateway uses
//! (status and framing), and the body is decoded where it is polled
//! ([`answer`]). The connection goes back to the pool when its answer has been
//! read to the end.

mod answer;
mod host;

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderValue, StatusCode};
use bytes::BytesMut;
use http_body_util::BodyExt as _;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use answer::{read_head, HeadError};
pub use answer::{Body, BodyError};
use host::Host;

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
    /// A kept-alive connection answered nothing at all: the backend had closed
    /// it while it lay idle. The request never reached a handler.
    #[error("stale pooled connection: {0}")]
    Stale(String),
    /// The backend's URL and the path make no valid URI.
    #[error("invalid backend URI: {0}")]
    Uri(String),
}

/// Why a GET of the whole answer failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No answer came.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The answer's body broke off or was larger than allowed.
    #[error("reading the answer: {0}")]
    Body(String),
    /// The whole answer did not come in time.
    #[error("no whole answer in time")]
    Timeout,
}

/// The requests the gateway makes of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A read, or a client's request with a body.
    Get,
    /// A client's request with a JSON body.
    Post,
    /// A client's deletion of a stored response.
    Delete,
}

/// Idle connections kept per backend, at most.
const MAX_IDLE: usize = 1024;

/// Bodies up to this size are copied behind the head and sent in one write.
const ONE_WRITE: usize = 16 * 1024;

/// How much is read from a socket at once, at least.
const READ_SIZE: usize = 8 * 1024;

/// A connection idle for longer is checked for a close before it is used; one
/// idle for less is used at once (a look costs a system call per request), and
/// if the backend did close it, it answers nothing and the request goes again.
const LOOK_AFTER: Duration = Duration::from_millis(100);

/// Pooled connections to every backend.
#[derive(Debug)]
pub struct BackendClient {
    /// By base URL: a restarted engine's new port is a new entry.
    hosts: Mutex<HashMap<String, Arc<Host>>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// This gateway's name, sent with every request (`x-slotgate-replica`).
    replica: HeaderValue,
}

/// One connection to a backend, and what has been read from it and not used.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

/// A backend's answer: its status, and its body still to read.
pub struct Reply {
    /// The answer's status.
    pub status: StatusCode,
    /// The body; read to its end, it gives the connection back to the pool.
    pub body: Body,
    /// Whether the stream marks its tokens, as asked ([`crate::proxy::resume`]).
    pub marked: bool,
}

impl BackendClient {
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
    /// answer's status with its body still to read.
    pub async fn post(
        &self,
        base: &str,
        path: &str,
        headers: impl IntoIterator<Item = (header::HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Result<Reply, SendError> {
        self.send(Method::Post, base, path, headers, body).await
    }

    /// GETs `base` + `path` (a path and query) with `headers` added: the
    /// gateway's own reads of a backend (health, slots, properties, slot
    /// events), never a client's request.
    pub async fn get(
        &self,
        base: &str,
        path: &str,
        headers: impl IntoIterator<Item = (header::HeaderName, HeaderValue)>,
    ) -> Result<Reply, SendError> {
        self.send(Method::Get, base, path, headers, Bytes::new()).await
    }

    /// Sends a request on a pooled connection, or a new one.
    async fn send(
        &self,
        method: Method,
        base: &str,
        path: &str,
        headers: impl IntoIterator<Item = (header::HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Result<Reply, SendError> {
        let host = self.host(base)?;
        let head = self.encode(&host, method, path, headers, &body);
        // A pooled connection that the backend closed while it lay idle answers
        // nothing at all. Under a POST (a client's request) that is `Stale`,
        // which the retry policy sends again at once (as nginx does with its
        // cached upstream connections), as an attempt that the metrics and the
        // access log see. A GET or a DELETE changes nothing twice: it goes again
        // here, on a new connection. Idle connections seen closed are skipped
        // before anything is sent.
        if let Some(mut conn) = host.take() {
            match exchange(&mut conn, &head, &body).await {
                Ok(answer) => return Ok(Reply::new(answer, conn, host)),
                Err(HeadError::Nothing(e)) if method == Method::Post => {
                    return Err(SendError::Stale(e))
                }
                Err(HeadError::Nothing(_)) => {}
                Err(HeadError::Broken(e)) => return Err(SendError::Broken(e)),
            }
        }
        self.fresh(&host, &head, &body).await
    }

    /// GETs `base` + `path` and reads the whole answer, at most `limit` bytes,
    /// within `timeout` from the start.
    pub async fn fetch(
        &self,
        base: &str,
        path: &str,
        headers: impl IntoIterator<Item = (header::HeaderName, HeaderValue)>,
        timeout: Duration,
        limit: usize,
    ) -> Result<(StatusCode, Bytes), FetchError> {
        self.fetch_as(Method::Get, base, path, headers, timeout, limit).await
    }

    /// As [`Self::fetch`], by `method` (a GET or a DELETE).
    pub async fn fetch_as(
        &self,
        method: Method,
        base: &str,
        path: &str,
        headers: impl IntoIterator<Item = (header::HeaderName, HeaderValue)>,
        timeout: Duration,
        limit: usize,
    ) -> Result<(StatusCode, Bytes), FetchError> {
        let read = async {
            let reply = self.send(method, base, path, headers, Bytes::new()).await?;
            let body = http_body_util::Limited::new(reply.body, limit);
            let bytes = body.collect().await.map_err(|e| FetchError::Body(e.to_string()))?;
            Ok((reply.status, bytes.to_bytes()))
        };
        tokio::time::timeout(timeout, read).await.map_err(|_| FetchError::Timeout)?
    }

    /// Sends `head` and `body` on a new connection to `host`.
    async fn fresh(&self, host: &Arc<Host>, head: &[u8], body: &Bytes) -> Result<Reply, SendError> {
        let mut conn = self.connect(host).await?;
        match exchange(&mut conn, head, body).await {
            Ok(answer) => Ok(Reply::new(answer, conn, host.clone())),
            Err(HeadError::Nothing(e) | HeadError::Broken(e)) => Err(SendError::Broken(e)),
        }
    }

    /// The request's head, and its body too when that is small.
    fn encode(
        &self,
        host: &Host,
        method: Method,
        path: &str,
        headers: impl IntoIterator<Item = (header::HeaderName, HeaderValue)>,
        body: &Bytes,
    ) -> Vec<u8> {
        let small = body.len() <= ONE_WRITE;
        let mut head = Vec::with_capacity(256 + if small { body.len() } else { 0 });
        head.extend_from_slice(match method {
            Method::Post => b"POST ",
            Method::Get => b"GET ",
            Method::Delete => b"DELETE ",
        });
        head.extend_from_slice(host.prefix.as_bytes());
        head.extend_from_slice(path.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        head.extend_from_slice(host.authority.as_bytes());
        head.extend_from_slice(b"\r\n");
        // Header values cannot hold line breaks (`HeaderValue` refuses them):
        // nothing a client sends can add a line to this head.
        let mut line = |name: &[u8], value: &[u8]| {
            head.extend_from_slice(name);
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        };
        line(slotgate_protocol::REPLICA_HEADER.as_bytes(), self.replica.as_bytes());
        for (name, value) in headers {
            line(name.as_str().as_bytes(), value.as_bytes());
        }
        if method == Method::Post {
            line(b"content-type", b"application/json");
            // Writing into a Vec cannot fail.
            let _ = write!(head, "content-length: {}\r\n", body.len());
        }
        head.extend_from_slice(b"\r\n");
        if small {
            head.extend_from_slice(body);
        }
        head
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

    /// A new connection to `host`.
    async fn connect(&self, host: &Host) -> Result<Conn, SendError> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&host.addr))
            .await
            .map_err(|_| SendError::Connect(format!("{}: connect timed out", host.addr)))?
            .map_err(|e| SendError::Connect(format!("{}: {e}", host.addr)))?;
        // A request goes out at once, not after Nagle's delay.
        let _ = stream.set_nodelay(true);
        Ok(Conn { stream, buf: BytesMut::with_capacity(READ_SIZE) })
    }
}

/// Sends a request on `conn` and reads its answer's head.
async fn exchange(conn: &mut Conn, head: &[u8], body: &Bytes) -> Result<answer::Head, HeadError> {
    let sent = async {
        conn.stream.write_all(head).await?;
        if body.len() > ONE_WRITE {
            conn.stream.write_all(body).await?;
        }
        Ok::<_, std::io::Error>(())
    };
    // A connection that fails before any answer is a closed one, as with no byte read.
    sent.await.map_err(|e| HeadError::Nothing(e.to_string()))?;
    read_head(conn).await
}

impl Reply {
    fn new(head: answer::Head, conn: Conn, host: Arc<Host>) -> Self {
        Self { status: head.status, marked: head.marked, body: Body::new(&head, conn, host) }
    }
}

impl Conn {
    /// Reads what the socket has into the buffer; `Ok(0)` when it is closed.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        self.buf.reserve(READ_SIZE);
        loop {
            if let Err(e) = std::task::ready!(self.stream.poll_read_ready(cx)) {
                return Poll::Ready(Err(e));
            }
            match self.stream.try_read_buf(&mut self.buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                result => return Poll::Ready(result),
            }
        }
    }

    /// Whether the backend has not closed the connection, as far as this thread
    /// has seen: an idle connection has nothing to read.
    fn is_open(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
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
    use std::time::Instant;

    use http_body_util::BodyExt;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    const ANSWER: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

    /// What a backend got: each request's head (lowercased) and body.
    type Got = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

    /// A backend that reads each request whole (by its `content-length`, none
    /// for a GET) and answers it with `answer`, closing the connection after
    /// `per_connection` answers; counts connections, and keeps what it got for
    /// the test to check (nothing is asserted in its tasks, where a failure
    /// would only close a connection).
    async fn backend(
        per_connection: usize,
        answer: &'static [u8],
    ) -> (String, Arc<AtomicUsize>, Got) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests: Got = Arc::default();
        let (count, got) = (accepted.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let got = got.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = vec![0u8; 64 * 1024];
                    let mut answered = 0;
                    while answered < per_connection {
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n");
                        let request = end.map(|end| {
                            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                            let value =
                                head.lines().find_map(|l| l.strip_prefix("content-length:"));
                            let n = value.and_then(|v| v.trim().parse::<usize>().ok());
                            (head, end + 4, n.unwrap_or(0))
                        });
                        match request {
                            Some((head, start, n)) if buf.len() >= start + n => {
                                got.lock().unwrap().push((head, buf[start..start + n].to_vec()));
                                buf.drain(..start + n);
                                if socket.write_all(answer).await.is_err() {
                                    return;
                                }
                                answered += 1;
                            }
                            _ => match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            },
                        }
                    }
                });
            }
        });
        (base, accepted, requests)
    }

    fn upstream() -> BackendClient {
        BackendClient::new(&Routing::default(), HeaderValue::from_static("test"))
    }

    /// Posts `{}` and reads the answer whole.
    async fn post(upstream: &BackendClient, base: &str) -> Result<Bytes, SendError> {
        let reply = upstream.post(base, "/v1/completions", [], Bytes::from_static(b"{}")).await?;
        assert_eq!(reply.status, 200);
        Ok(reply.body.collect().await.unwrap().to_bytes())
    }

    /// A connection whose answer was read whole carries the next request.
    #[tokio::test]
    async fn a_connection_read_to_the_end_is_used_again() {
        let (base, accepted, _) = backend(usize::MAX, ANSWER).await;
        let upstream = upstream();
        for _ in 0..5 {
            assert_eq!(&post(&upstream, &base).await.unwrap()[..], b"{}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // Not read to the end (an answer cut short): the next request opens another.
        let reply = upstream.post(&base, "/v1/completions", [], Bytes::new()).await.unwrap();
        drop(reply);
        post(&upstream, &base).await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// Every request is a POST of JSON to the path asked for, naming this replica.
    #[tokio::test]
    async fn posts_name_their_path_body_and_replica() {
        let (base, _, got) = backend(usize::MAX, ANSWER).await;
        post(&upstream(), &format!("{base}/api")).await.unwrap();
        let (head, body) = got.lock().unwrap()[0].clone();
        assert!(head.starts_with("post /api/v1/completions http/1.1\r\n"), "{head}");
        for line in
            ["content-type: application/json", "content-length: 2", "x-slotgate-replica: test"]
        {
            assert!(head.lines().any(|l| l == line), "{line} in {head}");
        }
        assert_eq!(body, b"{}");
    }

    /// The gateway's own reads are GETs without a body; a stale pooled connection
    /// under one is replaced at once (a GET may go twice); the whole answer must
    /// come within its time and its size limit.
    #[tokio::test]
    async fn gets_are_read_whole_within_their_time_and_size() {
        let (base, accepted, got) = backend(1, ANSWER).await;
        let client = upstream();
        let second = Duration::from_secs(1);
        for _ in 0..3 {
            // At once: the pooled connection the backend closed may be taken.
            let (status, body) = client.fetch(&base, "/slots?x=1", [], second, 2).await.unwrap();
            assert_eq!((status, &body[..]), (StatusCode::OK, &b"{}"[..]));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        let (head, body) = got.lock().unwrap()[0].clone();
        assert!(head.starts_with("get /slots?x=1 http/1.1\r\n"), "{head}");
        assert!(!head.contains("content-length"), "{head}");
        assert!(body.is_empty());
        let small = client.fetch(&base, "/slots", [], second, 1).await;
        assert!(matches!(small, Err(FetchError::Body(_))), "{small:?}");
        // A backend that accepts and never answers.
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", silent.local_addr().unwrap());
        let started = Instant::now();
        let late = client.fetch(&base, "/health", [], Duration::from_millis(200), 2).await;
        assert!(matches!(late, Err(FetchError::Timeout)), "{late:?}");
        assert!(started.elapsed() < second, "{:?}", started.elapsed());
    }

    /// A pooled connection that the backend closed is replaced without an error
    /// when the close was seen before the request went out, and is a stale
    /// connection (for the retry policy to send again) when it was not.
    #[tokio::test]
    async fn a_connection_the_backend_closed_is_replaced() {
        let (base, accepted, _) = backend(1, ANSWER).await;
        let upstream = upstream();
        for _ in 0..3 {
            post(&upstream, &base).await.unwrap();
            // Long enough for the close to be seen, and looked for, before reuse.
            tokio::time::sleep(LOOK_AFTER + Duration::from_millis(50)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        // At once: the request may go out on the closed connection.
        for _ in 0..3 {
            match post(&upstream, &base).await {
                Ok(_) => {}
                Err(SendError::Stale(_)) => {
                    post(&upstream, &base).await.unwrap();
                }
                Err(other) => panic!("not a stale connection: {other}"),
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 6);
    }

    /// Chunked answers are decoded, and their connections kept; a body larger
    /// than one write arrives whole.
    #[tokio::test]
    async fn chunked_answers_and_large_bodies() {
        const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
            6\r\ndata: \r\n4\r\nhi\n\n\r\n0\r\n\r\n";
        let (base, accepted, bodies) = backend(usize::MAX, CHUNKED).await;
        let upstream = upstream();
        let large = Bytes::from(vec![b'x'; ONE_WRITE * 3 + 7]);
        for body in [Bytes::from_static(b"{}"), large.clone()] {
            let reply = upstream.post(&base, "/v1/completions", [], body).await.unwrap();
            let text = reply.body.collect().await.unwrap().to_bytes();
            assert_eq!(&text[..], b"data: hi\n\n");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(bodies.lock().unwrap()[1].1, large);
    }

    /// An answer that ends with the connection is read to the close, and the
    /// connection not pooled.
    #[tokio::test]
    async fn an_answer_without_length_ends_with_its_connection() {
        const UNSIZED: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nall of it";
        let (base, accepted, _) = backend(1, UNSIZED).await;
        let upstream = upstream();
        for _ in 0..2 {
            assert_eq!(&post(&upstream, &base).await.unwrap()[..], b"all of it");
            assert!(lock(&upstream.host(&base).unwrap().idle).is_empty(), "pooled");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// Nobody listening is a connect failure, which the retry policy ejects for.
    #[tokio::test]
    async fn a_refused_connection_is_a_connect_failure() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        assert!(matches!(post(&upstream(), &base).await, Err(SendError::Connect(_))));
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
        for bad in
            ["https://x:1", "x:1", "http://", "http://u:p@x:1", "http://x:1/a b", "http://x/p?q"]
        {
            assert!(Host::parse(bad, t).is_err(), "{bad}");
        }
    }
}
