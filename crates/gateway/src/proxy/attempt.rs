//! One attempt at a backend: the request sent, a refusal read for what it
//! says, and the answer's first byte (of a stream: its first chunk) awaited
//! within the first-byte timeout; then the answer made the client's response.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;

use crate::config::error::RETRY_AFTER_SECS;
use crate::fleet::backend::Backend;
use crate::fleet::pool::{Claim, Wait};
use crate::proxy::record::Record;
use crate::proxy::relay::{Dialect, Relay};
use crate::proxy::resume::{Moving, Request, Resumed};
use crate::proxy::retry::{Failure, Refusal};
use crate::proxy::upstream::{Body as UpstreamBody, BodyError, SendError};
use crate::proxy::{strip, Forwarder, FULL_MARK, REQUEST_ID};

impl Forwarder {
    /// Marks `backend` full until it reports its slots, or for [`FULL_MARK`] at
    /// most; then the requests waiting for it are woken.
    fn mark_full(&self, backend: &Arc<Backend>) {
        let mark = backend.mark_full();
        let (pool, backend) = (self.pool.clone(), backend.clone());
        tokio::spawn(async move {
            tokio::time::sleep(FULL_MARK).await;
            if backend.unmark_full(mark) {
                pool.wake_backend(&backend);
            }
        });
    }

    /// One attempt on the claimed backend: its status and answer, or what failed.
    pub(super) async fn attempt(
        &self,
        claim: Claim,
        send: &Send<'_>,
        stream: bool,
    ) -> Result<(StatusCode, Answer), Failure> {
        let backend = &claim.backend;
        let mut extra: Vec<(HeaderName, HeaderValue)> =
            vec![(HeaderName::from_static(REQUEST_ID), send.request_id.clone())];
        let key = match &backend.api_key {
            Some(own) => Some(own),
            None => send.headers.get(header::AUTHORIZATION).filter(|_| send.pass_key),
        };
        if let Some(key) = key {
            extra.push((header::AUTHORIZATION, key.clone()));
        }
        if send.mark {
            let mark = HeaderName::from_static(slotgate_protocol::resume::MARK_HEADER);
            extra.push((mark, HeaderValue::from_static("1")));
        }
        if let Some(owner) = &send.owner {
            extra.push((HeaderName::from_static(slotgate_protocol::OWNER_HEADER), owner.clone()));
        }
        // A supervised engine between restarts has no address: as if refused.
        let url = backend.address().ok_or(Failure::Connect)?;
        let deadline = tokio::time::Instant::now() + self.timeouts.first_byte;
        let silent = || {
            tracing::warn!(backend = %backend.url(), "no answer within routing.first_byte_timeout_ms");
            Failure::Silent
        };
        let posted = self.upstream.post(&url, send.path, extra, send.body.clone());
        let posted = tokio::time::timeout_at(deadline, posted).await.map_err(|_| silent())?;
        let reply = posted.map_err(|e| {
            tracing::debug!(error = %e, backend = %backend.url(), "no answer");
            match e {
                // A URL that makes no URI is the backend's configuration at fault:
                // out of rotation, as for a refused connection.
                SendError::Connect(_) | SendError::Uri(_) => Failure::Connect,
                SendError::Broken(_) => Failure::BeforeFirstByte,
                SendError::Stale(_) => Failure::Stale,
            }
        })?;
        let (status, marked) = (reply.status, reply.marked);
        let mut upstream = reply.body;
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            let bytes = tokio::time::timeout_at(deadline, collect(upstream));
            let bytes = bytes.await.map_err(|_| silent())?.unwrap_or_default();
            match crate::proxy::retry::refusal(status.as_u16(), &bytes) {
                Some(Refusal::Full) => {
                    self.mark_full(backend);
                    return Err(Failure::SlotUnavailable);
                }
                Some(Refusal::Busy) => return Err(Failure::SlotUnavailable),
                None => {}
            }
            return Ok((status, Answer::Whole(bytes)));
        }
        if stream && status.is_success() {
            // A failure before the first chunk is still invisible to the client.
            let first = loop {
                let frame = tokio::time::timeout_at(deadline, upstream.frame());
                match frame.await.map_err(|_| silent())? {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) if !data.is_empty() => break data,
                        _ => continue,
                    },
                    _ => return Err(Failure::BeforeFirstByte),
                }
            };
            return Ok((status, Answer::Stream { first, upstream, claim, marked }));
        }
        let bytes =
            tokio::time::timeout_at(deadline, collect(upstream)).await.map_err(|_| silent())?;
        let bytes = bytes.map_err(|_| Failure::BrokenBody)?;
        Ok((status, Answer::Whole(bytes)))
    }
}

impl Forwarder {
    /// Sends a resumed stream's request to a backend of `model` outside
    /// `exclude` (or, when no other serves it, any), trying as many as a
    /// request may; the first that streams goes on with it.
    pub(super) async fn go_on(
        &self,
        request: Request,
        model: &str,
        wait: Wait,
        mut exclude: Vec<usize>,
    ) -> Result<Resumed, String> {
        let send = Send {
            path: request.path,
            headers: &request.headers,
            body: &request.body,
            request_id: &request.request_id,
            pass_key: request.pass_key,
            owner: request.owner.clone(),
            mark: true,
        };
        let mut last = String::from("no backend took it");
        for _ in 0..self.retry.max_attempts() {
            if !self.pool.has_other(model, &exclude) {
                exclude.clear();
            }
            let claim = self
                .pool
                .acquire(model, &exclude, None, wait)
                .await
                .map_err(|e| e.message.clone())?;
            let index = claim.backend.index;
            match self.attempt(claim, &send, true).await {
                Ok((_, Answer::Stream { first, upstream, claim, marked: true })) => {
                    return Ok(Resumed { claim, upstream, first })
                }
                Ok((_, Answer::Stream { .. })) => {
                    // Its tokens unmarked, the stream could not be followed.
                    return Err("the next backend does not mark its stream's tokens".into());
                }
                Ok((status, Answer::Whole(bytes))) => {
                    // The request itself was refused: no other backend takes it either.
                    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
                    return Err(format!("the next backend refused it ({status}): {text}"));
                }
                Err(failure) => {
                    last = format!("the next backend failed ({})", failure.label());
                    exclude.push(index);
                }
            }
        }
        Err(last)
    }
}

/// What every attempt of one request sends.
pub(super) struct Send<'a> {
    pub path: &'static str,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    pub request_id: &'a HeaderValue,
    /// Whether the client's own `Authorization` goes to the backend.
    pub pass_key: bool,
    /// Whose a Responses request is (`x-slotgate-owner`).
    pub owner: Option<HeaderValue>,
    /// Whether a stream is asked to mark its tokens, so that it can move
    /// ([`super::resume`]).
    pub mark: bool,
}

/// What a backend answered.
pub(super) enum Answer {
    /// A whole body, read before anything is sent.
    Whole(Bytes),
    /// A stream whose first chunk has arrived; it keeps the claim, and its body
    /// the connection.
    Stream {
        first: Bytes,
        upstream: UpstreamBody,
        claim: Claim,
        /// It marks its tokens: it may move to another backend.
        marked: bool,
    },
}

impl Answer {
    pub(super) fn into_response(
        self,
        backend: &Backend,
        status: StatusCode,
        mut record: Record,
        strip_usage: bool,
        (silence, dialect): (Duration, Dialect),
        moving: Option<Box<Moving>>,
    ) -> Response {
        record.answered(backend.url(), status.as_u16());
        match self {
            Self::Whole(bytes) => {
                if status.is_success() {
                    record.count_usage(backend, &bytes);
                }
                let mut response = Response::new(Body::from(bytes));
                *response.status_mut() = status;
                let h = response.headers_mut();
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
                }
                response
            }
            Self::Stream { first, upstream, claim, marked } => {
                let strip = strip_usage.then(strip::UsageStrip::default);
                let moving = moving.filter(|_| marked);
                let relay =
                    Relay::new(first, upstream, claim, record, strip, (silence, dialect), moving);
                let mut response = Response::new(Body::new(relay));
                *response.status_mut() = status;
                slotgate_http::event_stream(&mut response);
                response
            }
        }
    }
}

/// Reads a whole answer; its connection is then pooled again.
async fn collect(body: UpstreamBody) -> Result<Bytes, BodyError> {
    Ok(body.collect().await?.to_bytes())
}
