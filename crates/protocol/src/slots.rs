//! The slot-status document of `GET /slots`, with the fields of llama.cpp's own server
//! (`id`, `id_task`, `n_ctx`, `is_processing`) so that a gateway can front both.

use serde::{Deserialize, Serialize};

/// The state of one slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotStatus {
    /// The slot's number within its model (llama.cpp numbers from 0).
    pub id: u32,
    /// The task running in the slot, -1 when idle.
    #[serde(default = "no_task")]
    pub id_task: i64,
    /// Context size of the slot, in tokens.
    #[serde(default)]
    pub n_ctx: u32,
    /// Whether a request is running in the slot.
    pub is_processing: bool,
    /// The model the slot belongs to; llama.cpp's server leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Tokens held in the slot's cache (prompt and generated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_cached: Option<u32>,
    /// What the slot is doing; llama.cpp's server leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SlotPhase>,
}

/// What a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotPhase {
    /// No request.
    Idle,
    /// Reading its request's prompt: no token sampled yet.
    Prompt,
    /// Sampling its request's answer.
    Generating,
}

fn no_task() -> i64 {
    -1
}

/// Counts of a set of slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotCounts {
    /// All slots.
    pub total: u32,
    /// Slots running a request.
    pub busy: u32,
}

impl SlotCounts {
    /// Counts the slots of `model`, or all slots when `model` is `None`. Slots that
    /// name no model (llama.cpp's server) count for every model.
    pub fn of(slots: &[SlotStatus], model: Option<&str>) -> Self {
        let mut counts = Self::default();
        for slot in slots {
            let matches = match (model, slot.model.as_deref()) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            };
            if matches {
                counts.total += 1;
                counts.busy += u32::from(slot.is_processing);
            }
        }
        counts
    }
}

/// The header of `GET /slots` that carries the sequence number of the state it
/// shows, the same as the `seq` of `GET /slots/events`.
pub const SLOTS_SEQ_HEADER: &str = "x-slotgate-slots-seq";

/// The header with which a gateway names itself to an engine, so that the engine
/// can say which requests are whose ([`ModelSlots::replicas`]).
pub const REPLICA_HEADER: &str = "x-slotgate-replica";

/// The whole slot state of an engine, as one event of `GET /slots/events`: sent
/// first on connecting, then again each time it changes. Each event is whole, so
/// a reader that misses one loses nothing once the next arrives.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotState {
    /// Grows by one with each change of any model's slots or queue.
    pub seq: u64,
    /// Every loaded model.
    pub models: Vec<ModelSlots>,
    /// The gateway replicas following these events (by `x-slotgate-replica`),
    /// so that each knows the others, and they can take turns at freed slots.
    #[serde(default)]
    pub followers: Vec<String>,
    /// How long one decode step takes, in microseconds (a moving average): a
    /// request sent now shows in an event within about that long.
    #[serde(default)]
    pub step_us: u64,
}

/// One model's slots and queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSlots {
    /// The model's id.
    pub id: String,
    /// Slots it has.
    pub slots: u32,
    /// Slots running a request.
    pub busy: u32,
    /// Requests waiting for a slot.
    pub queued: u32,
    /// Of the running and waiting requests, how many each gateway replica sent
    /// (by the name in its `x-slotgate-replica` header).
    #[serde(default)]
    pub replicas: std::collections::BTreeMap<String, u32>,
}
