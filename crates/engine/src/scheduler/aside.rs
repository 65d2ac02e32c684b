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
use std::sync::Arc;

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

/// Draws `draw` on a thread of its own and sends the result to `back`. At most
/// one draw per slot is ever in flight, so there are at most as many of these
/// threads as slots.
pub(crate) fn draw_aside(draw: Draw, back: &Sender<Drew>) {
    let back = back.clone();
    let spawned = std::thread::Builder::new().name("slotgate-draw".into()).spawn(move || {
        let Draw { model, task, mut sampler, logits, keep } = draw;
        let drawn = sampler.draw_from(&logits);
        let _ = back.send(Drew { model, task, sampler, drawn, keep });
    });
    if let Err(err) = spawned {
        // The draw (and its choice) is lost; the slot is reaped as its task ends.
        tracing::error!(error = %err, "cannot start a draw thread");
    }
}
