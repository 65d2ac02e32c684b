//! The leftmost references of a grammar's rules: what llama.cpp's left-recursion
//! check walks, and how many calls that walk would make without a memo.

use super::{El, Refused, Rules, MAX_CHECK_CALLS, MAX_DEPTH};

/// The leftmost references of every rule: the rules llama.cpp's left-recursion
/// check recurses into, with multiplicity, and which rules it takes as possibly
/// empty (one with an empty alternative; llama.cpp does not look further).
pub(super) struct Leftmost {
    edges: Vec<Vec<usize>>,
}

impl Leftmost {
    pub(super) fn of(rules: &[Vec<El>]) -> Self {
        let empty: Vec<bool> = rules
            .iter()
            .map(|rule| {
                let mut start = true;
                for el in rule {
                    match el {
                        El::End | El::Alt if start => return true,
                        El::End | El::Alt => start = true,
                        _ => start = false,
                    }
                }
                false
            })
            .collect();
        let edges = rules
            .iter()
            .map(|rule| {
                let mut out = Vec::new();
                let mut recurse = true;
                for el in rule {
                    match *el {
                        El::Ref(r) if recurse => {
                            out.push(r as usize);
                            recurse = empty[r as usize];
                        }
                        El::End | El::Alt => recurse = true,
                        _ => recurse = false,
                    }
                }
                out
            })
            .collect();
        Self { edges }
    }

    /// Refuses left recursion, leftmost chains deeper than [`MAX_DEPTH`], and
    /// grammars on which llama.cpp's check would make over [`MAX_CHECK_CALLS`].
    pub(super) fn check(&self, rules: &Rules) -> Result<(), Refused> {
        let calls = self.calls(rules)?;
        if self.total(&calls) > MAX_CHECK_CALLS {
            return Err(Refused(format!(
                "the grammar's rules share their leftmost rules so often that llama.cpp's \
                 check of it would take over {MAX_CHECK_CALLS} steps"
            )));
        }
        Ok(())
    }

    /// How many calls llama.cpp's check makes for each rule (it keeps no
    /// memo); refuses left recursion and chains deeper than [`MAX_DEPTH`].
    fn calls(&self, rules: &Rules) -> Result<Vec<u64>, Refused> {
        let n = self.edges.len();
        // Post-order over the leftmost graph, iteratively; depth[r] is how deep.
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        let mut mark = vec![Mark::New; n];
        let mut calls = vec![0u64; n];
        let mut depth = vec![0usize; n];
        for start in 0..n {
            if mark[start] != Mark::New {
                continue;
            }
            let mut todo = vec![(start, 0usize)];
            mark[start] = Mark::Open;
            while let Some(&mut (r, ref mut next)) = todo.last_mut() {
                if let Some(&child) = self.edges[r].get(*next) {
                    *next += 1;
                    match mark[child] {
                        Mark::Open => {
                            return Err(Refused(format!(
                                "the grammar is left-recursive at the rule `{}`: llama.cpp \
                                 cannot match it",
                                rules.name(child)
                            )))
                        }
                        Mark::New => {
                            if todo.len() >= MAX_DEPTH {
                                return Err(Refused(format!(
                                    "the grammar's rules start with other rules over \
                                     {MAX_DEPTH} deep"
                                )));
                            }
                            mark[child] = Mark::Open;
                            todo.push((child, 0));
                        }
                        Mark::Done => {}
                    }
                    continue;
                }
                todo.pop();
                mark[r] = Mark::Done;
                calls[r] = self.edges[r]
                    .iter()
                    .fold(1u64, |sum, &c| sum.saturating_add(calls[c]))
                    .min(u64::MAX / 2);
                depth[r] = 1 + self.edges[r].iter().map(|&c| depth[c]).max().unwrap_or(0);
                if depth[r] > MAX_DEPTH {
                    return Err(Refused(format!(
                        "the grammar's rules start with other rules over {MAX_DEPTH} deep"
                    )));
                }
            }
        }
        Ok(calls)
    }

    /// The calls of llama.cpp's whole check: its outer loop starts a check at
    /// each rule no earlier check reached; each check reaches every rule below it.
    fn total(&self, calls: &[u64]) -> u64 {
        let n = self.edges.len();
        let mut reached = vec![false; n];
        let mut total: u64 = 0;
        for start in 0..n {
            if reached[start] {
                continue;
            }
            total = total.saturating_add(calls[start]);
            let mut todo = vec![start];
            reached[start] = true;
            while let Some(r) = todo.pop() {
                for &c in &self.edges[r] {
                    if !reached[c] {
                        reached[c] = true;
                        todo.push(c);
                    }
                }
            }
        }
        total
    }
}
