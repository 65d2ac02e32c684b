//! A slot's sequence to and from a file (llama-server's `--slot-save-path`):
//! its tokens and KV state written in llama.cpp's own format, so that a long
//! conversation can be parked on disk and taken up again, here or by
//! llama-server. On the scheduler thread, as every llama.cpp call; an idle
//! slot only.

use std::time::Instant;

use slotgate_protocol::{ApiError, ErrorType};

use super::ModelRuntime;
use crate::scheduler::{SlotFileDone, SlotOp};

impl ModelRuntime {
    /// Saves, restores or erases the sequence of slot `id`.
    pub fn slot_file(&mut self, id: u32, op: &SlotOp) -> Result<SlotFileDone, ApiError> {
        let started = Instant::now();
        let ctx_len = self.settings.ctx_len as usize;
        let Some(slot) = self.slots.iter_mut().find(|s| s.id == id) else {
            let n = self.slots.len();
            return Err(ApiError::invalid("id_slot", format!("no slot {id}: this model has {n}")));
        };
        if slot.running.is_some() {
            return Err(ApiError::new(
                ErrorType::UnavailableError,
                format!("slot {id} is busy; try again when it is idle"),
            )
            .with_code("slot_busy"));
        }
        let seq = slot.id as i32;
        let (tokens, bytes) = match op {
            SlotOp::Save(path) => {
                let cache = &slot.cache;
                let written =
                    self.loaded.with_dependent(|_, c| c.gen.state_seq_save_file(path, seq, cache));
                let bytes = written.map_err(|e| failed("save", &e.to_string()))?;
                (slot.cache.len(), bytes)
            }
            SlotOp::Restore(path) => {
                let read = self.loaded.with_dependent_mut(|_, c| {
                    let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
                    c.gen.state_seq_load_file(path, seq, ctx_len)
                });
                match read {
                    Ok((tokens, bytes)) => {
                        slot.cache = tokens;
                        // Whoever's it was, it is unsalted now: shared with
                        // requests that carry no salt.
                        slot.salt = None;
                        (slot.cache.len(), bytes)
                    }
                    Err(err) => {
                        slot.cache.clear();
                        return Err(failed("restore", &err.to_string()));
                    }
                }
            }
            SlotOp::Erase => {
                self.loaded.with_dependent_mut(|_, c| {
                    let _ = c.gen.clear_kv_cache_seq(Some(slot.id), None, None);
                });
                let erased = slot.cache.len();
                slot.cache.clear();
                (erased, 0)
            }
        };
        tracing::info!(model = %self.id, slot = id, ?op, tokens, bytes, "slot file");
        Ok(SlotFileDone { tokens, bytes, elapsed: started.elapsed() })
    }
}

/// The refusal of a save or restore that llama.cpp could not do (a file of
/// another model or context, or one that is not there).
fn failed(what: &str, why: &str) -> ApiError {
    ApiError::invalid("filename", format!("cannot {what} the slot: {why}"))
}
