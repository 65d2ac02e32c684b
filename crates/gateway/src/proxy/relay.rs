//! A stream being relayed to the client, frame by frame, as an HTTP body of its
//! own (no stream adapters in between). It holds the slot's claim and the
//! request's metrics record, so both end when it is dropped: at the end of the
//! stream or when the client goes away. A stream read to its end gives its
//! connection back to the pool; one cut short drops it, and the closed connection
//! tells the engine to free its slot.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use http_body::{Body, Frame};
use hyper::body::Incoming;
use slotgate_protocol::{sse, ApiError, ErrorType};

use super::record::Record;
use crate::pool::Claim;
use crate::upstream::Lease;

/// The rest of an upstream stream whose first chunk has arrived.
pub struct Relay {
    first: Option<Bytes>,
    upstream: Incoming,
    /// Taken when the stream ends cleanly, to pool the connection again.
    lease: Option<Lease>,
    claim: Claim,
    _record: Record,
    ended: bool,
}

impl Relay {
    /// Relays `first`, then the rest of `upstream`.
    pub fn new(
        first: Bytes,
        upstream: Incoming,
        lease: Lease,
        claim: Claim,
        record: Record,
    ) -> Self {
        let lease = Some(lease);
        Self { first: Some(first), upstream, lease, claim, _record: record, ended: false }
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
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        loop {
            match Pin::new(&mut this.upstream).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    // Only the last chunk of a stream that asked for usage carries it.
                    super::count_reuse(&this.claim.backend, &data);
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(err))) => {
                    tracing::warn!(error = %err, backend = %this.claim.backend.url(), "backend failed mid-stream");
                    this.ended = true;
                    let err = ApiError::new(
                        ErrorType::ServerError,
                        "the backend failed while streaming; the answer is incomplete",
                    );
                    let event = Bytes::from(sse::encode(&err.into_envelope()));
                    return Poll::Ready(Some(Ok(Frame::data(event))));
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    if let Some(lease) = this.lease.take() {
                        lease.release();
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}
