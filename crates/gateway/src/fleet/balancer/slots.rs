//! `slots`: only backends with a free slot, two of them drawn by weight (power of
//! two choices), the one with more free slots taken.

use super::View;

/// The chosen backend's position, or `None` when no eligible backend has a free slot.
pub fn pick(views: &[View], rand: &mut impl FnMut(u64) -> u64) -> Option<usize> {
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
