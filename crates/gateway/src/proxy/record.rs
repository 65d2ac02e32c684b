//! The one place a request's metrics are recorded: once, when it ends, whichever
//! way it ends (an answer, an error, a stream that finished or a client that left).

use std::sync::Arc;
use std::time::Instant;

use crate::auth::limits::Permit;
use crate::metrics as m;

/// What the metrics say of one request; recorded when dropped.
pub struct Record {
    model: String,
    /// The backend that answered, if one did.
    backend: Option<Arc<String>>,
    status: u16,
    started: Instant,
    /// When the answer's first byte went out.
    first_byte: Option<Instant>,
    /// The key's admission, given back (with the tokens) at the end.
    permit: Option<Permit>,
}

impl Record {
    /// A request for `model` that arrived at `started`.
    pub fn new(model: &str, started: Instant) -> Self {
        Self {
            model: model.to_owned(),
            backend: None,
            status: 0,
            started,
            first_byte: None,
            permit: None,
        }
    }

    /// The request was admitted under a key's limits.
    pub fn permit(&mut self, permit: Permit) {
        self.permit = Some(permit);
    }

    /// The answer reported these tokens: charged to the key, if any.
    pub fn tokens(&mut self, prompt: u64, completion: u64) {
        if let Some(permit) = &mut self.permit {
            permit.tokens(prompt, completion);
        }
    }

    /// The gateway answered itself, with an error of this status.
    pub fn refused(&mut self, status: u16) {
        self.backend = None;
        self.status = status;
    }

    /// `backend` answered with `status`; its first byte is going out now.
    pub fn answered(&mut self, backend: Arc<String>, status: u16) {
        self.backend = Some(backend);
        self.status = status;
        self.first_byte = Some(Instant::now());
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let backend = self.backend.as_ref().map_or("none", |b| b.as_str());
        let times = self.first_byte.map(|first| {
            let ttft = first.duration_since(self.started).as_secs_f64();
            (ttft, self.started.elapsed().as_secs_f64())
        });
        m::request_done(&self.model, backend, self.status, times);
    }
}
