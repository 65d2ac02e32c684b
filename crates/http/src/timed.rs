//! A request body that must arrive by a deadline: a client that sends its
//! body slowly holds its connection no longer than the body timeout.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

/// A request body that must end by a deadline; past it, reading it fails.
pub struct Timed<B> {
    inner: B,
    deadline: Pin<Box<Sleep>>,
}

impl<B> Timed<B> {
    /// `inner`, which must end within `limit` from now.
    pub fn new(inner: B, limit: Duration) -> Self {
        Self { inner, deadline: Box::pin(tokio::time::sleep(limit)) }
    }
}

/// The body did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the server's body timeout")]
pub struct BodyTimedOut;

impl<B> Body for Timed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
