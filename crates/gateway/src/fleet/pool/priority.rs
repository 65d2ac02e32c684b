//! Which requests go first in a model's queue: a key's class of service, set in
//! its settings and read by the queues.

use serde::{Deserialize, Serialize};

/// Which requests go first in a model's queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Someone is waiting for the answer: served before any batch work.
    #[default]
    Interactive,
    /// Work that can wait.
    Batch,
}

impl Priority {
    /// The label in metrics and in `/admin/keys`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }
}
