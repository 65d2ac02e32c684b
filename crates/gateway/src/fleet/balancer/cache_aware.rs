//! `cache_aware`: send a conversation where its prompt is cached, unless that
//! backend is much busier than the rest.
//!
//! Two ideas were weighed. SGLang's router (`cache_aware`) keeps a radix tree of
//! the prompts each gateway has sent where, and llm-d's prefix scorers keep an
//! index of prefix-block hashes per pod: both learn which engine holds which prefix
//! from the traffic one router instance has seen, so replicas of the gateway
//! disagree unless they share that state. We take instead rendezvous hashing
//! (highest random weight, Thaler and Ravishankar) of an affinity key derived from
//! the request: every replica that sees the same healthy backends ranks them the
//! same way for the same conversation, with no state at all, and when a backend
//! leaves only the conversations it ranked first move (each to its own second
//! choice). Load is bounded as in consistent hashing with bounded loads (Mirrokni,
//! Thorup and Zadimoghaddam): a backend is skipped while taking the request would
//! put it above `load_factor` times its share of the busy slots, and the next one
//! in the ranking is taken, so spilled turns also land in one predictable place.
//!
//! With few conversations hashing is lumpy (three of four may rank the same
//! backend first), and which of them spills depends on timing; a conversation
//! that moved would move back at its next turn and find its cache on neither
//! side. So the pool remembers where it last spilled a conversation (`sticky`),
//! and keeps it there while that backend has room. That memory is one replica's
//! own and only ever moves a conversation to where its newest turn is cached;
//! without it every replica still decides alike.

use super::{Decision, View};
use crate::fleet::hash::mix;

/// Picks a backend for a request whose affinity key is `key`: the first in the
/// key's rendezvous ranking with a free slot and a load within the bound, else the
/// first with a free slot. `sticky` is the id of the backend the conversation was
/// last spilled to, which goes to the front of the ranking while it is eligible.
/// `None` when no eligible backend has a free slot. `Affinity` means the front of
/// the ranking was taken.
pub fn pick(
    views: &[View],
    key: u64,
    sticky: Option<u64>,
    load_factor: f64,
) -> Option<(usize, Decision)> {
    let mut ranked = rank(views, key);
    if let Some(at) = ranked.iter().position(|&i| Some(views[i].id) == sticky) {
        let home = ranked.remove(at);
        ranked.insert(0, home);
    }
    let first = *ranked.first()?;
    let eligible = || ranked.iter().copied();
    let slots: u64 = eligible().map(|i| u64::from(views[i].slots)).sum();
    let busy: u64 = eligible().map(|i| u64::from(views[i].busy())).sum();
    let within = |i: usize| {
        if slots == 0 {
            return true;
        }
        // Its share of the busy slots after this request, times the factor.
        let share = u64::from(views[i].slots) as f64 / slots as f64;
        let bound = (load_factor * (busy + 1) as f64 * share).ceil();
        f64::from(views[i].busy() + 1) <= bound
    };
    let chosen = eligible()
        .find(|&i| views[i].free > 0 && within(i))
        .or_else(|| eligible().find(|&i| views[i].free > 0))?;
    let decision = if chosen == first { Decision::Affinity } else { Decision::Spilled };
    Some((chosen, decision))
}

/// The eligible backends in the order of their rendezvous score for `key`,
/// highest first. The score depends only on the key, the backend's stable id and
/// its weight, never on its position in the list.
pub fn rank(views: &[View], key: u64) -> Vec<usize> {
    let mut scored: Vec<(f64, u64, usize)> = (0..views.len())
        .filter(|&i| views[i].eligible())
        .map(|i| (score(key, views[i].id, views[i].weight), views[i].id, i))
        .collect();
    // Ties (equal ids) are broken by id, then position, so the order is total.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    scored.into_iter().map(|(_, _, i)| i).collect()
}

/// Weighted rendezvous score: `-weight / ln(u)` for a uniform `u` in (0, 1) drawn
/// from the key and the backend, so a backend of weight 2 ranks first for twice
/// as many keys as one of weight 1.
fn score(key: u64, id: u64, weight: u32) -> f64 {
    let h = mix(key ^ mix(id));
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(weight.max(1)) / u.ln()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::fleet::hash::{backend_id, Fnv};

    use super::*;

    fn view(id: u64, slots: u32, busy: u32) -> View {
        View {
            healthy: true,
            serves: true,
            free: slots.saturating_sub(busy),
            in_flight: busy,
            weight: 1,
            slots,
            id,
        }
    }

    fn fleet(n: u64) -> Vec<View> {
        (0..n).map(|i| view(backend_id(&format!("http://127.0.0.1:{}", 8081 + i)), 4, 0)).collect()
    }

    proptest! {
        #[test]
        fn every_replica_decides_alike_whatever_its_backend_order(
            key in any::<u64>(), busy in prop::collection::vec(0u32..5, 4), rotate in 0usize..4,
        ) {
            let mut views = fleet(4);
            for (v, b) in views.iter_mut().zip(&busy) {
                *v = view(v.id, 4, *b);
            }
            let a = pick(&views, key, None, 1.25).map(|(i, d)| (views[i].id, d));
            views.rotate_left(rotate);
            let b = pick(&views, key, None, 1.25).map(|(i, d)| (views[i].id, d));
            prop_assert_eq!(a, b);
        }

        #[test]
        fn the_bound_holds_while_any_backend_is_within_it(
            key in any::<u64>(), busy in prop::collection::vec(0u32..8, 3),
        ) {
            let views: Vec<View> = fleet(3).iter().zip(&busy).map(|(v, &b)| view(v.id, 8, b)).collect();
            let total: u32 = busy.iter().sum();
            let bound = |i: usize| (1.25 * f64::from(total + 1) / 3.0).ceil() >= f64::from(views[i].busy() + 1);
            if let Some((i, _)) = pick(&views, key, None, 1.25) {
                let someone_within = (0..3).any(|j| views[j].free > 0 && bound(j));
                prop_assert!(!someone_within || bound(i), "picked {i} above its bound: {views:?}");
                prop_assert!(views[i].free > 0);
            } else {
                prop_assert!(views.iter().all(|v| v.free == 0));
            }
        }

        #[test]
        fn a_leaving_backend_moves_only_its_own_keys(keys in prop::collection::vec(any::<u64>(), 1..64), gone in 0usize..4) {
            let views = fleet(4);
            let mut fewer = views.clone();
            fewer[gone].healthy = false;
            for key in keys {
                let before = rank(&views, key)[0];
                let after = rank(&fewer, key)[0];
                if before != gone {
                    prop_assert_eq!(before, after);
                } else {
                    prop_assert_eq!(after, rank(&views, key)[1], "to its second choice");
                }
            }
        }
    }

    #[test]
    fn an_idle_fleet_keeps_affinity_and_spreads_keys() {
        let views = fleet(3);
        let mut counts = [0u32; 3];
        for k in 0..3000u64 {
            let key = Fnv::default().write(format!("conversation {k}").as_bytes()).finish();
            let (i, decision) = pick(&views, key, None, 1.25).unwrap();
            assert_eq!(decision, Decision::Affinity);
            assert_eq!(pick(&views, key, None, 1.25).unwrap().0, i, "same key, same backend");
            counts[i] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }

    #[test]
    fn a_saturated_first_choice_spills_to_the_second() {
        let mut views = fleet(2);
        let key = 42;
        let first = rank(&views, key)[0];
        let second = rank(&views, key)[1];
        views[first] = view(views[first].id, 2, 2);
        assert_eq!(pick(&views, key, None, 1.25), Some((second, Decision::Spilled)));
        // Busier than its share but not full: still spilled by the load bound.
        views[first] = view(views[first].id, 8, 3);
        views[second] = view(views[second].id, 8, 0);
        assert_eq!(pick(&views, key, None, 1.25), Some((second, Decision::Spilled)));
        views[first] = view(views[first].id, 8, 1);
        assert_eq!(pick(&views, key, None, 1.25), Some((first, Decision::Affinity)));
        views[second] = view(views[second].id, 8, 8);
        views[first] = view(views[first].id, 8, 8);
        assert_eq!(pick(&views, key, None, 1.25), None);
    }

    #[test]
    fn a_spilled_conversation_stays_where_it_spilled_while_there_is_room() {
        let mut views = fleet(2);
        let key = 7;
        let (first, second) = (rank(&views, key)[0], rank(&views, key)[1]);
        let there = Some(views[second].id);
        assert_eq!(pick(&views, key, there, 1.25), Some((second, Decision::Affinity)));
        views[second] = view(views[second].id, 4, 4);
        assert_eq!(pick(&views, key, there, 1.25), Some((first, Decision::Spilled)));
        views[second].healthy = false;
        assert_eq!(pick(&views, key, there, 1.25), Some((first, Decision::Affinity)));
    }

    #[test]
    fn weights_skew_the_ranking() {
        let mut views = fleet(2);
        views[1].weight = 3;
        let firsts = (0..4000u64).filter(|&k| rank(&views, mix(k))[0] == 1).count();
        assert!((2700..3300).contains(&firsts), "{firsts}");
    }
}
