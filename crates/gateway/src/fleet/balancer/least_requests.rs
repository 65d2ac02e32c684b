//! `least_requests`: the healthy backend with the fewest requests in flight from
//! this gateway, free slots or not; there for comparison.

use super::View;

/// The eligible backend with the fewest requests in flight; the heavier on a tie.
pub fn pick(views: &[View]) -> Option<usize> {
    (0..views.len())
        .filter(|&i| views[i].eligible())
        .min_by_key(|&i| (views[i].in_flight, std::cmp::Reverse(views[i].weight)))
}
