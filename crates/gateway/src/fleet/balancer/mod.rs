//! Choosing a backend for a request, one file per policy. The choice is a pure
//! function of what each candidate looks like now, so it can be property-tested;
//! claiming the slot is the caller's, atomic on the backend.

pub mod cache_aware;
mod least_requests;
mod round_robin;
mod slots;

use serde::{Deserialize, Serialize};

/// How a backend is chosen among those with a free slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Where the request's conversation is likely cached (rendezvous hashing of
    /// its affinity key), unless that backend is full or above its load bound;
    /// otherwise as `slots`.
    #[default]
    CacheAware,
    /// Only backends with a free slot; ties by power of two choices, weighted.
    Slots,
    /// Every healthy backend in turn, slots or not (for comparison).
    RoundRobin,
    /// The healthy backend with the fewest requests in flight (for comparison).
    LeastRequests,
}

impl Policy {
    /// Whether it only picks backends with a free slot, claiming it atomically.
    pub fn claims_slots(self) -> bool {
        matches!(self, Self::CacheAware | Self::Slots)
    }
}

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
    let plain = match (policy, affinity) {
        (Policy::CacheAware, Some(a)) => {
            return cache_aware::pick(views, a.key, a.sticky, a.load_factor)
        }
        // Without a key, `cache_aware` is `slots`.
        (Policy::CacheAware | Policy::Slots, _) => slots::pick(views, rand),
        (Policy::RoundRobin, _) => round_robin::pick(views, turn),
        (Policy::LeastRequests, _) => least_requests::pick(views),
    };
    plain.map(|i| (i, Decision::NoAffinity))
}

/// How a backend was chosen, as the `reason` label of the routing counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The first choice for the request's affinity key.
    Affinity,
    /// Another than the first choice: that one was full or above its load bound.
    Spilled,
    /// No affinity: another policy, or a request with nothing to derive a key from.
    NoAffinity,
}

impl Decision {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Affinity => "affinity",
            Self::Spilled => "spilled",
            Self::NoAffinity => "no_affinity",
        }
    }
}

/// What the picker sees of one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Takes traffic.
    pub healthy: bool,
    /// Serves the requested model.
    pub serves: bool,
    /// Slots free for this gateway.
    pub free: u32,
    /// Requests in flight from this gateway.
    pub in_flight: u32,
    /// Relative share among equals.
    pub weight: u32,
    /// Slots it has.
    pub slots: u32,
    /// Stable identity, the same on every gateway replica (see `cache_aware`).
    pub id: u64,
}

impl View {
    /// Whether it may be sent this model's request at all.
    pub fn eligible(&self) -> bool {
        self.healthy && self.serves
    }

    /// Slots not free for this request: this gateway's and everyone else's.
    pub fn busy(&self) -> u32 {
        self.slots.saturating_sub(self.free)
    }
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
