//! The policies: `cache_aware` (see `cache_aware.rs`; `slots` when a request has
//! no affinity key), `slots` (only backends with a free slot; power of two
//! choices, weighted), `round_robin` and `least_requests` (for comparison; they
//! ignore slots).

use crate::config::Policy;

use super::{cache_aware, Decision, View};

/// What `cache_aware` knows of a request: its affinity key, where the pool last
/// spilled that conversation, and the load bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Affinity {
    /// The request's affinity key.
    pub key: u64,
    /// The id of the backend its conversation was last spilled to.
    pub sticky: Option<u64>,
    /// `routing.cache_load_factor`.
    pub load_factor: f64,
}

/// Picks a backend and says how, or `None` when the policy finds none. `affinity`
/// is what `cache_aware` needs, for a request that has a key; `rand` gives uniform
/// numbers in `0..n`; `turn` is a counter for round robin.
pub fn pick(
    views: &[View],
    policy: Policy,
    affinity: Option<Affinity>,
    turn: u64,
    rand: &mut impl FnMut(u64) -> u64,
) -> Option<(usize, Decision)> {
    if let (Policy::CacheAware, Some(a)) = (policy, affinity) {
        return cache_aware::pick(views, a.key, a.sticky, a.load_factor);
    }
    pick_plain(views, policy, turn, rand).map(|i| (i, Decision::NoAffinity))
}

fn pick_plain(
    views: &[View],
    policy: Policy,
    turn: u64,
    rand: &mut impl FnMut(u64) -> u64,
) -> Option<usize> {
    match policy {
        Policy::Slots | Policy::CacheAware => {
            let free: Vec<usize> =
                (0..views.len()).filter(|&i| views[i].eligible() && views[i].free > 0).collect();
            match free.len() {
                0 => None,
                1 => Some(free[0]),
                _ => {
                    let a = weighted(views, &free, rand);
                    let rest: Vec<usize> = free.iter().copied().filter(|&i| i != a).collect();
                    let b = weighted(views, &rest, rand);
                    // More free slots wins; on a tie, fewer requests in flight.
                    let key = |i: usize| (views[i].free, std::cmp::Reverse(views[i].in_flight));
                    Some(if key(b) > key(a) { b } else { a })
                }
            }
        }
        Policy::RoundRobin => {
            let eligible: Vec<usize> = (0..views.len()).filter(|&i| views[i].eligible()).collect();
            (!eligible.is_empty()).then(|| eligible[(turn % eligible.len() as u64) as usize])
        }
        Policy::LeastRequests => (0..views.len())
            .filter(|&i| views[i].eligible())
            .min_by_key(|&i| (views[i].in_flight, std::cmp::Reverse(views[i].weight))),
    }
}

/// One of `among`, with probability proportional to its weight.
fn weighted(views: &[View], among: &[usize], rand: &mut impl FnMut(u64) -> u64) -> usize {
    let total: u64 = among.iter().map(|&i| u64::from(views[i].weight.max(1))).sum();
    let mut r = rand(total);
    for &i in among {
        let w = u64::from(views[i].weight.max(1));
        if r < w {
            return i;
        }
        r -= w;
    }
    among[among.len() - 1]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn view() -> impl Strategy<Value = View> {
        (any::<bool>(), any::<bool>(), 0u32..4, 0u32..8, 1u32..5, any::<u64>()).prop_map(
            |(healthy, serves, free, in_flight, weight, id)| View {
                healthy,
                serves,
                free,
                in_flight,
                weight,
                slots: free + in_flight,
                id,
            },
        )
    }

    fn rng(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut state = seed | 1;
        move |n| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n.max(1)
        }
    }

    proptest! {
        #[test]
        fn slots_policy_never_picks_an_unhealthy_or_full_backend(views in prop::collection::vec(view(), 0..8), seed in any::<u64>()) {
            let picked = pick(&views, Policy::Slots, None, 0, &mut rng(seed)).map(|p| p.0);
            match picked {
                Some(i) => prop_assert!(views[i].healthy && views[i].serves && views[i].free > 0),
                None => prop_assert!(!views.iter().any(|v| v.eligible() && v.free > 0)),
            }
        }

        #[test]
        fn cache_aware_never_picks_an_unhealthy_or_full_backend(views in prop::collection::vec(view(), 0..8), key in prop::option::of(any::<u64>()), seed in any::<u64>()) {
            let affinity = key.map(|key| Affinity { key, sticky: None, load_factor: 1.25 });
            match pick(&views, Policy::CacheAware, affinity, 0, &mut rng(seed)) {
                Some((i, decision)) => {
                    prop_assert!(views[i].healthy && views[i].serves && views[i].free > 0);
                    prop_assert_eq!(decision == Decision::NoAffinity, key.is_none());
                }
                None => prop_assert!(!views.iter().any(|v| v.eligible() && v.free > 0)),
            }
        }

        #[test]
        fn comparison_policies_only_pick_eligible_backends(views in prop::collection::vec(view(), 0..8), turn in any::<u64>(), seed in any::<u64>()) {
            for policy in [Policy::RoundRobin, Policy::LeastRequests] {
                match pick(&views, policy, None, turn, &mut rng(seed)).map(|p| p.0) {
                    Some(i) => prop_assert!(views[i].eligible()),
                    None => prop_assert!(!views.iter().any(View::eligible)),
                }
            }
        }
    }

    #[test]
    fn two_choices_prefer_more_free_slots() {
        let v = |free| View {
            healthy: true,
            serves: true,
            free,
            in_flight: 0,
            weight: 1,
            slots: free,
            id: 0,
        };
        let views = [v(1), v(3)];
        for seed in 0..50 {
            assert_eq!(pick(&views, Policy::Slots, None, 0, &mut rng(seed)).map(|p| p.0), Some(1));
        }
    }

    #[test]
    fn weights_share_traffic_among_equals() {
        let v = |weight| View {
            healthy: true,
            serves: true,
            free: 1,
            in_flight: 0,
            weight,
            slots: 1,
            id: 0,
        };
        let views = [v(1), v(1), v(6)];
        let mut counts = [0u32; 3];
        let mut r = rng(42);
        for _ in 0..3000 {
            // With equal free slots the first choice wins ties: its weighted draw decides.
            counts[pick(&views, Policy::Slots, None, 0, &mut r).unwrap().0] += 1;
        }
        assert!(counts[2] > counts[0] * 2 && counts[2] > counts[1] * 2, "{counts:?}");
    }

    #[test]
    fn round_robin_cycles_through_eligible_backends() {
        let v = |healthy| View {
            healthy,
            serves: true,
            free: 0,
            in_flight: 0,
            weight: 1,
            slots: 1,
            id: 0,
        };
        let views = [v(true), v(false), v(true)];
        let picks: Vec<_> = (0..4)
            .map(|t| pick(&views, Policy::RoundRobin, None, t, &mut rng(1)).unwrap().0)
            .collect();
        assert_eq!(picks, [0, 2, 0, 2]);
    }
}
