//! `cache_aware`'s memory of where it spilled each conversation: a conversation
//! that moved stays where its newest turn is cached while that backend has room,
//! rather than moving back and finding its cache on neither side.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::fleet::balancer::Decision;

/// How long a spill is remembered: longer than a pause between turns, shorter
/// than an engine keeps an idle conversation warm.
const SPILL_MEMORY: Duration = Duration::from_secs(600);

/// Most conversations remembered; past it, the expired ones go, and if that is not
/// enough, all (they then follow their rendezvous ranking again).
const SPILL_ENTRIES: usize = 65_536;

/// Affinity key to the id of the backend it was spilled to, and when.
#[derive(Default)]
pub struct Spills(Mutex<HashMap<u64, (u64, Instant)>>);

impl Spills {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u64, Instant)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where `key`'s conversation was last spilled to, if that is recent.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.lock().get(&key).filter(|(_, at)| at.elapsed() < SPILL_MEMORY).map(|(id, _)| *id)
    }

    /// Keeps a spilled conversation where it went; forgets it once it is back at
    /// its first choice.
    pub fn remember(&self, key: u64, decision: Decision, sticky: Option<u64>, chosen: u64) {
        if decision != Decision::Spilled && sticky.is_none() {
            // At its first choice and not remembered: nothing to write, no lock taken.
            return;
        }
        let mut spills = self.lock();
        match decision {
            Decision::Spilled => {
                if spills.len() >= SPILL_ENTRIES {
                    spills.retain(|_, (_, at)| at.elapsed() < SPILL_MEMORY);
                    if spills.len() >= SPILL_ENTRIES {
                        spills.clear();
                    }
                }
                spills.insert(key, (chosen, Instant::now()));
            }
            Decision::Affinity if sticky == Some(chosen) => {
                spills.insert(key, (chosen, Instant::now()));
            }
            _ => {
                spills.remove(&key);
            }
        }
    }
}
