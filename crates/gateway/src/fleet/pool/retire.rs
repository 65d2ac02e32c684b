//! Retiring a backend: no new requests, then out of the pool once the requests
//! still on it have ended (or a time limit has passed). The admin API, a reload
//! and DNS discovery all take backends away this one way.

use std::sync::Arc;
use std::time::Duration;

use super::Pool;
use crate::fleet::backend::Backend;

impl Pool {
    /// Drains `backend` and removes it once its requests have ended, or after
    /// `limit`, whichever comes first (requests still on it keep it alive).
    pub fn retire(self: &Arc<Self>, backend: Arc<Backend>, limit: Duration) {
        backend.drain();
        let pool = self.clone();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + limit;
            while backend.in_flight() > 0 && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            pool.remove(backend.index);
            tracing::info!(backend = %backend.url(), "removed");
        });
    }
}
