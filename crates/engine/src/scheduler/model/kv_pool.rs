//! Admission to a unified KV cache (`kv_unified`): one pool of cells that
//! every slot's sequence draws from, each up to the whole pool.
//!
//! llama-server admits into such a pool freely and, when the pool runs out
//! mid-answer, fails every request in it ("context size has been exceeded").
//! Here a task is admitted only when its prompt and its `max_tokens` (the rest
//! of the pool when it sets none) fit beside what the running tasks reserved
//! and what idle slots still cache; idle caches give way, least recently used
//! first (to the host cache, which keeps them). A task that does not fit waits
//! at the head of the queue, so a sequence never finds the pool full and no
//! request is lost to another's length.

/// One slot, as the pool sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    /// Cells reserved by the task it runs, if it runs one.
    pub reserved: Option<usize>,
    /// Cells its cache holds.
    pub cached: usize,
    /// When it was last admitted into, for least-recently-used order.
    pub last_used: u64,
}

/// The cells a task reserves: its prompt and what it may generate, at most
/// the pool.
pub(super) fn reservation(prompt: usize, max_tokens: Option<u32>, pool: usize) -> usize {
    let generated = max_tokens.map_or(pool, |m| m as usize);
    prompt.saturating_add(generated).min(pool)
}

/// The idle slots whose caches must be dropped, least recently used first, for
/// a task reserving `need` cells to enter slot `chosen` (whose own cache
/// counts within `need`: it holds part of the prompt, or is cut); `None` when
/// the running tasks' reservations leave no room, and the task must wait.
pub(super) fn make_room(
    pool: usize,
    need: usize,
    slots: &[Held],
    chosen: usize,
) -> Option<Vec<usize>> {
    let others = || slots.iter().enumerate().filter(move |(i, _)| *i != chosen);
    let held = |s: &Held| s.reserved.unwrap_or(s.cached);
    let mut used: usize = others().map(|(_, s)| held(s)).sum();
    let mut idle: Vec<(usize, &Held)> =
        others().filter(|(_, s)| s.reserved.is_none() && s.cached > 0).collect();
    idle.sort_by_key(|(i, s)| (s.last_used, *i));
    let mut dropped = Vec::new();
    let mut idle = idle.into_iter();
    while need.saturating_add(used) > pool {
        let (i, slot) = idle.next()?;
        used -= slot.cached;
        dropped.push(i);
    }
    Some(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(reserved: usize) -> Held {
        Held { reserved: Some(reserved), cached: reserved / 2, last_used: 0 }
    }

    fn idle(cached: usize, last_used: u64) -> Held {
        Held { reserved: None, cached, last_used }
    }

    #[test]
    fn a_reservation_is_the_prompt_and_max_tokens_or_the_pool() {
        assert_eq!(reservation(2, Some(80), 256), 82);
        assert_eq!(reservation(2, None, 256), 256, "no max_tokens: the whole pool");
        assert_eq!(reservation(200, Some(100), 256), 256);
    }

    #[test]
    fn fits_beside_the_running_tasks_or_waits() {
        let slots = [running(82), running(42), running(82), idle(0, 0)];
        assert_eq!(make_room(256, 82, &slots, 3), None, "288 cells of 256: waits");
        assert_eq!(make_room(256, 50, &slots, 3), Some(vec![]), "256 of 256: fits");
    }

    #[test]
    fn idle_caches_give_way_oldest_first_but_never_the_chosen_ones() {
        let slots = [idle(100, 5), idle(100, 1), idle(100, 3), running(50)];
        // 50 reserved + 200 cached by the other idle slots + 100 asked = 350 > 256.
        assert_eq!(make_room(256, 100, &slots, 0), Some(vec![1]));
        assert_eq!(make_room(256, 200, &slots, 0), Some(vec![1, 2]));
        assert_eq!(make_room(256, 207, &slots, 0), None, "50 reserved + 207 > 256 even emptied");
    }
}
