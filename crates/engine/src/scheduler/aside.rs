//! Draws beside the loop: a choice whose draw needs the whole vocabulary in
//! hand (a grammar to check every candidate against, or log probabilities to
//! rank) is drawn on a helper thread from a copy of its logits, while the
//! scheduler thread goes on decoding the other slots. Checking 262k candidates
//! against a grammar of many alternatives costs up to seconds; on the scheduler
//! thread it would hold up every stream of the process.
//!
//! The helper touches no context and no device state: only the copied logits,
//! the choice's samplers and the model's vocabulary (which the grammar reads,
//! in host memory). It holds the model for as long as it draws, and hands it
//! back with the result, so that the model is still only ever freed on the
//! scheduler thread (see `worker.rs`).

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use llama_cpp_2::model::LlamaModel;

use super::sampler::{ChoiceSampler, Drawn};

/// A draw made beside the loop, sent back to the scheduler thread.
pub(crate) struct Drew {
    /// The model the choice runs on.
    pub model: String,
    /// The choice's task; a task that ended meanwhile drops the result.
    pub task: u64,
    /// The choice's samplers, back for its next draw.
    pub sampler: ChoiceSampler,
    /// The token drawn.
    pub drawn: Drawn,
    /// Held while drawing: dropped by the receiver, on the scheduler thread.
    pub keep: Arc<LlamaModel>,
}

/// What one draw beside the loop needs.
pub(crate) struct Draw {
    pub model: String,
    pub task: u64,
    pub sampler: ChoiceSampler,
    pub logits: Vec<f32>,
    pub keep: Arc<LlamaModel>,
}

impl Draw {
    /// Makes the draw.
    fn run(self) -> Drew {
        let Draw { model, task, mut sampler, logits, keep } = self;
        let drawn = sampler.draw_from(&logits);
        Drew { model, task, sampler, drawn, keep }
    }
}

/// Draws `draw` on a thread of its own and sends the result to `back`. At most
/// one draw per slot is ever in flight, so there are at most as many of these
/// threads as slots. When no thread can be started, the draw is made here
/// rather than lost: a choice left waiting for it would never end.
pub(crate) fn draw_aside(draw: Draw, back: &Sender<Drew>) {
    let held = Arc::new(Mutex::new(Some(draw)));
    let (theirs, their_back) = (held.clone(), back.clone());
    let take = |held: &Mutex<Option<Draw>>| held.lock().unwrap_or_else(|e| e.into_inner()).take();
    let spawned = std::thread::Builder::new().name("slotgate-draw".into()).spawn(move || {
        if let Some(draw) = take(&theirs) {
            let _ = their_back.send(draw.run());
        }
    });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "cannot start a draw thread: drawn on the scheduler thread");
        if let Some(draw) = take(&held) {
            let _ = back.send(draw.run());
        }
    }
}
