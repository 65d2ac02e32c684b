//! `round_robin`: every healthy backend in turn, free slots or not; there for
//! comparison with the slot-aware policies.

use super::View;

/// The eligible backend whose turn `turn` is.
pub fn pick(views: &[View], turn: u64) -> Option<usize> {
    let eligible: Vec<usize> = (0..views.len()).filter(|&i| views[i].eligible()).collect();
    (!eligible.is_empty()).then(|| eligible[(turn % eligible.len() as u64) as usize])
}
