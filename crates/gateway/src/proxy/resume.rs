//! A stream whose backend died or fell silent goes on at another backend of
//! its model: the same request is sent again with the tokens the client
//! already has ([`super::ledger`]), and the next engine reads them after the
//! prompt and writes the rest under the same `id`. The client sees one stream.
//!
//! Bounded like a retry: `routing.max_resumes` moves per stream, each taken
//! from the retry budget, and a request under which two backends died is not
//! moved again (it may be what kills them; see [`super::poison`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue};
use tokio::time::Instant;

use super::ledger::Ledger;
use super::{poison, Forwarder};
use crate::fleet::backend::Backend;
use crate::fleet::pool::{Claim, Wait};
use crate::metrics as m;
use crate::proxy::upstream::Body as UpstreamBody;

/// Why a stream moved: the `reason` label of [`m::RESUMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Its backend's connection broke.
    Died,
    /// Its backend sent nothing for `routing.chunk_timeout_ms`.
    Stalled,
}

impl Why {
    fn label(self) -> &'static str {
        match self {
            Self::Died => "died",
            Self::Stalled => "stalled",
        }
    }
}

/// The next backend of a moved stream, its first chunk arrived.
pub struct Resumed {
    pub claim: Claim,
    pub upstream: UpstreamBody,
    pub first: Bytes,
}

/// A move under way.
pub type Pending = Pin<Box<dyn Future<Output = Result<Resumed, String>> + std::marker::Send>>;

/// What a stream needs to go on elsewhere: its request as first sent, and
/// what its moves so far have used.
pub struct Resumer {
    forwarder: Arc<Forwarder>,
    request: Request,
    model: String,
    wait: Wait,
    /// Backends it failed on, which its next move avoids.
    exclude: Vec<usize>,
    /// Backends lost under it, before the stream began and since.
    deaths: u32,
    /// Moves made.
    moves: u32,
}

/// A request, owned, to be sent again after the handler that read it returned.
#[derive(Clone)]
pub struct Request {
    pub path: &'static str,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body as the client sent it, which a poisonous one is remembered by.
    pub sent: Bytes,
    pub request_id: HeaderValue,
    pub pass_key: bool,
    pub owner: Option<HeaderValue>,
}

/// A stream that may move, and its move under way.
pub struct Moving {
    pub ledger: Ledger,
    pub resumer: Resumer,
    /// The move under way, when it began, and why.
    pub pending: Option<(Pending, Instant, Why)>,
}

impl Resumer {
    /// A resumer of `request` for `model`, whose attempts so far left out
    /// `exclude` and lost `deaths` backends.
    pub fn new(
        forwarder: Arc<Forwarder>,
        request: Request,
        (model, wait): (String, Wait),
        (exclude, deaths): (Vec<usize>, u32),
    ) -> Self {
        Self { forwarder, request, model, wait, exclude, deaths, moves: 0 }
    }

    /// Starts moving the stream off `failed`, or says why it may not.
    pub fn start(
        &mut self,
        ledger: &Ledger,
        failed: &Backend,
        why: Why,
    ) -> Result<Pending, String> {
        let max = self.forwarder.retry.max_resumes();
        if self.moves >= max {
            return Err(format!("it already moved {max} times (routing.max_resumes)"));
        }
        if why == Why::Died {
            self.deaths += 1;
        }
        if self.deaths >= poison::DEATHS {
            let _ = self.forwarder.poisons.remember(&self.request.sent);
            return Err(format!("{} backends died under this request", self.deaths));
        }
        if !self.forwarder.retry.withdraw() {
            return Err("the gateway's retry budget is spent".into());
        }
        let body = ledger.resume_body(&self.request.body).ok_or("its body is not a JSON object")?;
        self.moves += 1;
        if !self.exclude.contains(&failed.index) {
            self.exclude.push(failed.index);
        }
        metrics::counter!(m::RESUMES, "reason" => why.label()).increment(1);
        metrics::counter!(m::RESUMED_TOKENS).increment(ledger.tokens() as u64);
        tracing::info!(
            request_id = ?self.request.request_id, backend = %failed.url(), reason = why.label(),
            tokens = ledger.tokens(), "stream moving to another backend"
        );
        let forwarder = self.forwarder.clone();
        let request = Request { body, ..self.request.clone() };
        let (model, wait, exclude) = (self.model.clone(), self.wait, self.exclude.clone());
        Ok(Box::pin(async move { forwarder.go_on(request, &model, wait, exclude).await }))
    }
}
