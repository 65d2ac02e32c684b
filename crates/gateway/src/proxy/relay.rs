//! A stream being relayed to the client, frame by frame, as an HTTP body of its
//! own (no stream adapters in between). It holds the slot's claim and the
//! request's metrics record, so both end when it is dropped: at the end of the
//! stream or when the client goes away. The upstream body gives its connection
//! back to the pool when read to its end; one cut short closes it, which tells
//! the engine to free its slot.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use slotgate_protocol::{sse, ApiError, ErrorType};

use super::record::Record;
use super::resume::{Moving, Why};
use super::strip::UsageStrip;
use crate::fleet::pool::Claim;
use crate::proxy::upstream::Body as UpstreamBody;

/// The rest of an upstream stream whose first chunk has arrived.
pub struct Relay {
    first: Option<Bytes>,
    upstream: UpstreamBody,
    claim: Claim,
    record: Record,
    /// Takes out the usage event that the gateway asked for, not the client.
    strip: Option<UsageStrip>,
    ended: bool,
    /// Whether the backend declared the stream's length, which the client then gets.
    sized: bool,
    /// Longest silence of the backend between two chunks.
    silence: Duration,
    /// When the last chunk came.
    last: Instant,
    /// Armed while the backend is silent.
    timer: Option<Pin<Box<Sleep>>>,
    /// Events relayed so far: a stream cut short (the client left, the backend
    /// died) reports no usage, and is charged one token for each.
    events: u64,
    /// How the stream's clients read an error event.
    dialect: Dialect,
    /// Of a stream that may go on at another backend: what its client has,
    /// and how to move it.
    moving: Option<Box<Moving>>,
}

/// The API a stream speaks, which decides the shape of an error event that ends
/// it early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Chat and text completions: a `data:` event with OpenAI's error envelope.
    OpenAi,
    /// Anthropic's Messages: `event: error` with Anthropic's envelope.
    Anthropic,
    /// OpenAI's Responses: `event: error` with a `type: "error"` event numbered
    /// after the last one relayed.
    Responses,
}

impl Dialect {
    /// The dialect of a stream from the backend path `path`.
    pub fn of(path: &str) -> Self {
        match path {
            "/v1/messages" => Self::Anthropic,
            "/v1/responses" => Self::Responses,
            _ => Self::OpenAi,
        }
    }
}

impl Relay {
    /// Relays `first`, then the rest of `upstream`, which may be silent for
    /// `silence` at most between chunks; an error ends it in `dialect`'s shape.
    pub fn new(
        first: Bytes,
        upstream: UpstreamBody,
        claim: Claim,
        record: Record,
        strip: Option<UsageStrip>,
        (silence, dialect): (Duration, Dialect),
        moving: Option<Box<Moving>>,
    ) -> Self {
        // A stream with an event or a mark taken out cannot keep its declared length.
        let sized = upstream.size_hint().exact().is_some() && strip.is_none() && moving.is_none();
        let mut relay = Self {
            first: None,
            upstream,
            claim,
            record,
            strip,
            ended: false,
            sized,
            silence,
            last: Instant::now(),
            timer: None,
            events: 0,
            dialect,
            moving,
        };
        relay.first = Some(relay.pass(first));
        relay
    }

    /// A piece of the stream as the client gets it, its usage counted: of a
    /// stream that may move, only what its engine has marked.
    fn pass(&mut self, data: Bytes) -> Bytes {
        let data = match &mut self.moving {
            Some(moving) => moving.ledger.take(&data),
            None => data,
        };
        self.relayed(data)
    }

    /// The stream ended: what was held back, and what the usage strip kept.
    fn end(&mut self) -> Option<Result<Frame<Bytes>, Infallible>> {
        self.ended = true;
        let held = self.moving.as_mut().map(|m| m.ledger.finish()).unwrap_or_default();
        let mut out = self.relayed(held).to_vec();
        if let Some(tail) = self.strip.as_mut().and_then(UsageStrip::finish) {
            out.extend_from_slice(&tail);
        }
        (!out.is_empty()).then(|| Ok(Frame::data(Bytes::from(out))))
    }

    /// Bytes going to the client: their events and usage counted.
    fn relayed(&mut self, data: Bytes) -> Bytes {
        if data.is_empty() {
            return data;
        }
        self.events += memchr::memmem::find_iter(&data, b"data: ").count() as u64;
        // Only the last chunk of a stream that asked for usage carries it.
        self.record.count_usage(&self.claim.backend, &data);
        match &mut self.strip {
            Some(strip) => strip.filter(data),
            None => data,
        }
    }
}

impl Relay {
    /// The backend has nothing yet: pending, unless it has been silent too long.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let deadline = self.last + self.silence;
        let timer = match &mut self.timer {
            Some(timer) => {
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            None => self.timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        tracing::warn!(backend = %self.claim.backend.url(), silence = ?self.silence, "backend silent mid-stream");
        // A backend that stalls mid-answer is out of rotation until its
        // health checks pass again, not only left by this stream.
        if self.claim.backend.eject() {
            tracing::warn!(backend = %self.claim.backend.url(), "ejected: stalled mid-stream");
        }
        let message = format!(
            "the backend sent nothing for {} ms (routing.chunk_timeout_ms); the answer is incomplete",
            self.silence.as_millis()
        );
        self.broken(cx, Why::Stalled, &message)
    }

    /// The backend is lost mid-stream: the stream moves to another backend if
    /// it may, else it ends with an error event. A stream whose client has the
    /// whole answer just ends.
    fn broken(
        &mut self,
        cx: &mut Context<'_>,
        why: Why,
        message: &str,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(moving) = self.moving.as_deref_mut() else { return self.fail(message) };
        if moving.ledger.is_whole() {
            self.ended = true;
            return Poll::Ready(None);
        }
        if !moving.ledger.can_move() {
            return self.fail(message);
        }
        // The lost backend's connection is closed now: its engine, if it comes
        // back, stops the request and frees the slot.
        self.upstream.abandon();
        let since = if why == Why::Stalled { self.last } else { Instant::now() };
        match moving.resumer.start(&moving.ledger, &self.claim.backend, why) {
            Ok(pending) => {
                moving.pending = Some((pending, since, why));
                self.next(cx)
            }
            Err(reason) => {
                tracing::warn!(backend = %self.claim.backend.url(), %reason, "stream not moved");
                self.fail(&format!("{message}; it could not go on elsewhere: {reason}"))
            }
        }
    }

    /// Polls the move under way: pending, failed (the stream ends with an error
    /// event), or done, when the next backend's first chunk goes out.
    fn poll_move(&mut self, cx: &mut Context<'_>) -> Option<Poll<Option<Bytes>>> {
        let moving = self.moving.as_deref_mut()?;
        let (pending, since, _) = moving.pending.as_mut()?;
        let result = match pending.as_mut().poll(cx) {
            Poll::Pending => return Some(Poll::Pending),
            Poll::Ready(result) => result,
        };
        let since = *since;
        moving.pending = None;
        match result {
            Ok(resumed) => {
                metrics::histogram!(crate::metrics::RESUME_GAP)
                    .record(since.elapsed().as_secs_f64());
                tracing::info!(backend = %resumed.claim.backend.url(), gap = ?since.elapsed(), "stream went on");
                self.record.moved(resumed.claim.backend.url());
                // The lost backend's claim goes: its slot is free in the pool.
                self.claim = resumed.claim;
                self.upstream = resumed.upstream;
                self.last = Instant::now();
                Some(Poll::Ready(Some(self.pass(resumed.first))))
            }
            Err(reason) => {
                tracing::warn!(%reason, "stream could not go on elsewhere");
                let message =
                    format!("the backend was lost mid-stream and no other could go on: {reason}");
                Some(Poll::Ready(self.fail_bytes(&message)))
            }
        }
    }

    /// Ends the stream with an error event (or, in a declared length, cut short).
    fn fail(&mut self, message: &str) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.fail_bytes(message).map(|b| Ok(Frame::data(b))))
    }

    /// The error event that ends the stream, in its dialect; none in a
    /// declared length, where the short body, cut off, tells the client.
    fn fail_bytes(&mut self, message: &str) -> Option<Bytes> {
        self.ended = true;
        if self.sized {
            return None;
        }
        let err = ApiError::new(ErrorType::ServerError, message);
        let event = match self.dialect {
            Dialect::OpenAi => sse::encode(&err.into_envelope()),
            Dialect::Anthropic => {
                let (_, envelope) = slotgate_protocol::anthropic::error(&err);
                let data = serde_json::to_string(&envelope).unwrap_or_default();
                format!("event: error\ndata: {data}\n\n")
            }
            Dialect::Responses => {
                // Every event of a Responses stream has one `data:` line, numbered
                // from 0: the next number is the count relayed.
                let data = slotgate_protocol::responses::stream::error_event(&err, self.events);
                format!("event: error\ndata: {data}\n\n")
            }
        };
        Some(Bytes::from(event))
    }

    /// The next frame for the client: from the move under way, if there is
    /// one, else from the backend. Pieces that carry nothing the client may
    /// have yet (held back until marked) are not sent as empty frames.
    fn next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            if let Some(moved) = self.poll_move(cx) {
                match moved {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(data)) if !data.is_empty() => {
                        return Poll::Ready(Some(Ok(Frame::data(data))))
                    }
                    Poll::Ready(Some(_)) => continue,
                    Poll::Ready(None) => return Poll::Ready(None),
                }
            }
            match Pin::new(&mut self.upstream).poll_frame(cx) {
                Poll::Pending => return self.wait(cx),
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    self.last = Instant::now();
                    let data = self.pass(data);
                    if self.upstream.is_end_stream() {
                        // The declared length is read: hyper will not poll again.
                        self.ended = true;
                    }
                    if data.is_empty() && !self.ended {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(err))) => {
                    tracing::warn!(error = %err, backend = %self.claim.backend.url(), "backend failed mid-stream");
                    return self.broken(
                        cx,
                        Why::Died,
                        "the backend failed while streaming; the answer is incomplete",
                    );
                }
                Poll::Ready(None) => return Poll::Ready(self.end()),
            }
        }
    }
}

impl Drop for Relay {
    /// A stream that ended without its usage (the client went away, or the
    /// backend did) is still charged to its key: one token per event relayed, a
    /// lower bound of what was generated (each event carries one token's text or
    /// more). Without it, abandoning streams would escape `tokens_per_minute`.
    fn drop(&mut self) {
        self.record.unreported(self.events);
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(first) = this.first.take() {
            if this.upstream.is_end_stream() {
                this.ended = true;
            }
            if !first.is_empty() || this.ended {
                return Poll::Ready(Some(Ok(Frame::data(first))));
            }
        }
        this.next(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    /// Exact when the backend sent a `Content-Length`, so the client gets the same
    /// framing (as nginx passes it on) instead of chunks.
    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
        match self.upstream.size_hint().exact() {
            Some(rest) if self.sized && !self.ended => SizeHint::with_exact(first + rest),
            _ if self.ended => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use crate::config::{BackendConfig, GatewayConfig, Routing};
    use crate::serve::server::Gateway;

    const EVENTS: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}\n\ndata: [DONE]\n\n";

    /// A kept-alive backend that streams `EVENTS` with a declared length; it
    /// records which connections (by client port) carried a chat request.
    async fn sized_backend() -> (String, Arc<Mutex<HashSet<u16>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let chats = Arc::new(Mutex::new(HashSet::new()));
        let seen = chats.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, peer)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // One request: its head, then the body its length declares.
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if buf.len() < end + 4 + length {
                            match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                            continue;
                        }
                        buf.drain(..end + 4 + length);
                        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                        let (kind, body) = match path.as_str() {
                            "/health" => ("application/json", r#"{"status":"ok"}"#.to_owned()),
                            "/slots" => ("application/json",
                                r#"[{"id":0,"id_task":-1,"n_ctx":512,"is_processing":false}]"#.to_owned()),
                            "/v1/models" => ("application/json",
                                r#"{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"t"}]}"#.to_owned()),
                            _ => {
                                seen.lock().unwrap().insert(peer.port());
                                ("text/event-stream", EVENTS.to_owned())
                            }
                        };
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (base, chats)
    }

    /// A stream whose length the backend declared keeps that framing, and its
    /// connection serves the next request (hyper stops polling a body once its
    /// length is written, so the end must be seen without another poll).
    #[tokio::test]
    async fn a_sized_stream_keeps_its_length_and_its_connection() {
        let (backend, chats) = sized_backend().await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let routing =
            // No slot-event stream: its connection would be counted as the relay's.
            Routing {
                health_interval_ms: 50,
                healthy_threshold: 1,
                slot_events: false,
                ..Routing::default()
            };
        let backends = vec![BackendConfig {
            models: Some(vec!["m".into()]),
            slots: Some(1),
            ..BackendConfig::at(backend)
        }];
        let config = GatewayConfig { workers: 1, backends, routing, ..GatewayConfig::default() };
        let gateway = Gateway::serve(listener, config, std::future::pending()).await.unwrap();
        let url = format!("http://{}/v1/chat/completions", gateway.addr);
        let client = reqwest::Client::new();
        let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut answered = 0;
        while answered < 5 {
            assert!(std::time::Instant::now() < deadline, "the backend never became healthy");
            let response = client.post(&url).body(body).send().await.unwrap();
            if response.status() == 503 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            assert_eq!(response.status(), 200);
            assert_eq!(response.content_length(), Some(EVENTS.len() as u64));
            assert_eq!(response.text().await.unwrap(), EVENTS);
            answered += 1;
        }
        assert_eq!(chats.lock().unwrap().len(), 1, "one upstream connection for five streams");
    }
}
