//! How many parse stacks llama.cpp's matcher would hold at once, from any point
//! of a grammar, counted per rule with a memo.

use super::{El, Refused, MAX_DEPTH, MAX_STACKS};

/// How many parse stacks llama.cpp's matcher holds after expanding from a point of
/// the grammar: `done` stacks whose top is a terminal, and `exits` (0 or 1)
/// whether the end of the sequence can be reached (the rule below goes on).
#[derive(Debug, Clone, Copy, Default)]
struct Fan {
    done: u64,
    exits: u64,
}

impl Fan {
    /// The fan of a reference to a rule with fan `rule`, followed by `then`. Every
    /// way out of a rule leaves the same stack below it, which llama.cpp keeps
    /// once: the ways out count as one.
    fn then(rule: Fan, then: Fan) -> Fan {
        let out = u64::from(rule.exits > 0);
        Fan {
            done: rule.done.saturating_add(out * then.done).min(MAX_STACKS + 1),
            exits: out * then.exits,
        }
    }
}

/// Refuses grammars whose expansion from some point (the start included) holds
/// over [`MAX_STACKS`] stacks. Needs the left-recursion check passed first.
pub(super) fn stacks(rules: &[Vec<El>]) -> Result<(), Refused> {
    let fan = rule_fans(rules)?;
    // Every point of every rule: the fan from there to the end of its sequence.
    for rule in rules {
        let mut then = Fan { done: 0, exits: 1 };
        for el in rule.iter().rev() {
            then = match *el {
                El::End | El::Alt => Fan { done: 0, exits: 1 },
                El::Term => Fan { done: 1, exits: 0 },
                El::Ref(s) => Fan::then(fan[s as usize], then),
            };
            if then.done.saturating_add(then.exits) > MAX_STACKS {
                return Err(Refused(format!(
                    "the grammar has over {MAX_STACKS} ways to go on from one point \
                     (alternatives that start with the same rules multiply)"
                )));
            }
        }
    }
    Ok(())
}

/// Where the fan of one rule stands while the rules it starts with are worked out.
struct Frame {
    rule: usize,
    /// The element looked at next.
    at: usize,
    /// The fans of the current alternative's leading rules that can exit.
    lead: Vec<Fan>,
    total: Fan,
}

/// Every rule's fan: the sum over its alternatives of the fan of each alternative's
/// start. Depth-first and iterative over the rules each alternative starts with:
/// the first, and the next while those so far can exit.
fn rule_fans(rules: &[Vec<El>]) -> Result<Vec<Fan>, Refused> {
    let n = rules.len();
    let mut fan: Vec<Option<Fan>> = vec![None; n];
    let mut open = vec![false; n];
    let cap = |v: u64| v.min(MAX_STACKS + 1);
    for start in 0..n {
        if fan[start].is_some() {
            continue;
        }
        let mut todo = vec![Frame { rule: start, at: 0, lead: Vec::new(), total: Fan::default() }];
        open[start] = true;
        while let Some(frame) = todo.last_mut() {
            let rule = &rules[frame.rule];
            let mut needed = None;
            while frame.at < rule.len() {
                let then = match rule[frame.at] {
                    El::End | El::Alt => Fan { done: 0, exits: 1 },
                    El::Term => Fan { done: 1, exits: 0 },
                    El::Ref(s) => match fan[s as usize] {
                        None => {
                            needed = Some(s as usize);
                            break;
                        }
                        Some(f) if f.exits > 0 => {
                            frame.lead.push(f);
                            frame.at += 1;
                            continue;
                        }
                        Some(f) => f,
                    },
                };
                // The alternative's start is known: fold its leading rules in, and
                // skip to the next alternative.
                let alt = frame.lead.drain(..).rev().fold(then, |then, f| Fan::then(f, then));
                frame.total = Fan {
                    done: cap(frame.total.done.saturating_add(alt.done)),
                    exits: frame.total.exits.max(alt.exits),
                };
                while !matches!(rule[frame.at], El::End | El::Alt) {
                    frame.at += 1;
                }
                frame.at += 1;
            }
            let Some(s) = needed else {
                let done = frame.rule;
                fan[done] = Some(frame.total);
                open[done] = false;
                todo.pop();
                continue;
            };
            if open[s] {
                // Only rules that may be empty through other rules (which
                // llama.cpp's own check does not see) lead back here.
                return Err(Refused(
                    "the grammar is left-recursive through a rule that may be empty".into(),
                ));
            }
            if todo.len() >= MAX_DEPTH {
                return Err(Refused(format!(
                    "the grammar's rules start with other rules over {MAX_DEPTH} deep"
                )));
            }
            open[s] = true;
            todo.push(Frame { rule: s, at: 0, lead: Vec::new(), total: Fan::default() });
        }
    }
    Ok(fan.into_iter().map(Option::unwrap_or_default).collect())
}
