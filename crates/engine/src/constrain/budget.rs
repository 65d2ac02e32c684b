//! A grammar's cost, bounded before llama.cpp sees it.
//!
//! llama.cpp compiles a grammar on the scheduler thread, once per choice, and
//! parts of that are unbounded: its parser recurses once per nested group (a
//! 100 000-deep group overflows the stack and aborts the engine), its
//! left-recursion check re-explores shared rules without a memo (60 rules
//! `aN ::= aN+1 "x" | aN+1 "y"` take 2^60 calls), and the parse stacks it keeps
//! for every leftmost derivation can be as many (the same grammar again, and
//! `anyOf` of two `$ref`s to one definition through a schema). So every grammar
//! is read here first, on the request's own thread, by a parser that builds the
//! same rules as llama.cpp's (`llama-grammar.cpp`, `llama_grammar_parser`), and
//! what llama.cpp would do with them is counted, with memos, against the limits
//! below. A grammar over a limit is the request's 400; one within them costs
//! llama.cpp a bounded amount of work.

use std::collections::HashMap;

/// Groups nested in groups, at most (llama.cpp's parser recurses once per level).
pub const MAX_NESTING: usize = 64;
/// Elements of all rules together, after repetitions are written out.
pub const MAX_ELEMENTS: usize = 1 << 20;
/// Rules, named and synthesized (groups and repetitions make rules of their own).
pub const MAX_RULES: usize = 1 << 16;
/// Rules a leftmost derivation may pass through (llama.cpp's left-recursion check
/// recurses once per rule on it).
pub const MAX_DEPTH: usize = 512;
/// Calls llama.cpp's left-recursion check would make.
pub const MAX_CHECK_CALLS: u64 = 1_000_000;
/// Parse stacks one step of llama.cpp's matcher may hold: the leftmost derivations
/// from any point of the grammar. Each is matched against the vocabulary when a
/// drawn token breaks the grammar, and de-duplicated in quadratic time.
pub const MAX_STACKS: u64 = 1024;

/// llama.cpp's limit on written-out repetitions (`MAX_REPETITION_THRESHOLD`).
const MAX_REPETITION: u64 = 2000;

/// Why a grammar is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// One element of a rule, as llama.cpp stores it (a character set counts once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum El {
    /// End of the rule's last alternative.
    End,
    /// End of an alternative with another after it.
    Alt,
    /// A reference to rule number `.0`.
    Ref(u32),
    /// Anything matched against input: a character, a set, `.`, a token.
    Term,
}

/// Checks `text` (GBNF, root rule `root`) against every limit above.
pub fn check(text: &str) -> Result<(), Refused> {
    let rules = Parser::default().parse(text.as_bytes())?;
    let n = rules.rules.len();
    if n > MAX_RULES {
        return Err(Refused(format!("the grammar has {n} rules; at most {MAX_RULES} are allowed")));
    }
    if !rules.ids.contains_key("root") {
        return Err(Refused("the grammar has no `root` rule".into()));
    }
    for (name, &id) in &rules.ids {
        if rules.rules.get(id as usize).is_none_or(Vec::is_empty) {
            return Err(Refused(format!("the rule `{name}` is used but never defined")));
        }
    }
    let graph = Leftmost::of(&rules.rules);
    graph.check(&rules)?;
    stacks(&rules.rules)?;
    Ok(())
}

/// The rules as llama.cpp's parser makes them, and the names of the named ones.
#[derive(Default)]
struct Rules {
    rules: Vec<Vec<El>>,
    ids: HashMap<String, u32>,
    /// Elements in all rules so far.
    elements: usize,
}

impl Rules {
    /// The id of `name`, made on first use (`get_symbol_id`).
    fn symbol(&mut self, name: &[u8]) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(String::from_utf8_lossy(name).into_owned()).or_insert(next)
    }

    /// A fresh id for a synthesized rule (`generate_symbol_id`): synthesized names
    /// carry a `_`, which no named rule can, so they never clash.
    fn synthesized(&mut self) -> u32 {
        let next = self.ids.len() as u32;
        self.ids.insert(format!("_{next}"), next);
        next
    }

    fn add(&mut self, id: u32, rule: Vec<El>) -> Result<(), Refused> {
        self.grow(rule.len())?;
        let id = id as usize;
        if self.rules.len() <= id {
            if id >= MAX_RULES {
                return Err(Refused(format!("the grammar has over {MAX_RULES} rules")));
            }
            self.rules.resize(id + 1, Vec::new());
        }
        self.rules[id] = rule;
        Ok(())
    }

    fn grow(&mut self, by: usize) -> Result<(), Refused> {
        self.elements = self.elements.saturating_add(by);
        if self.elements > MAX_ELEMENTS {
            return Err(Refused(format!(
                "the grammar is too large once its repetitions are written out \
                 (over {MAX_ELEMENTS} elements)"
            )));
        }
        Ok(())
    }
}

/// llama.cpp's grammar parser, rule for rule, building only the shape.
#[derive(Default)]
struct Parser {
    out: Rules,
    nesting: usize,
}

fn syntax(what: &str, at: usize) -> Refused {
    Refused(format!("the grammar does not parse: {what} at byte {at}"))
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

/// The byte at `i`, or 0 past the end (the C string's terminator).
fn at(src: &[u8], i: usize) -> u8 {
    src.get(i).copied().unwrap_or(0)
}

fn space(src: &[u8], mut i: usize, newline_ok: bool) -> usize {
    loop {
        match at(src, i) {
            b' ' | b'\t' => i += 1,
            b'\r' | b'\n' if newline_ok => i += 1,
            b'#' => {
                while !matches!(at(src, i), 0 | b'\r' | b'\n') {
                    i += 1;
                }
            }
            _ => return i,
        }
    }
}

fn name(src: &[u8], i: usize) -> Result<usize, Refused> {
    let end = i + src[i.min(src.len())..].iter().take_while(|&&c| is_word(c)).count();
    if end == i {
        return Err(syntax("expecting a name", i));
    }
    Ok(end)
}

fn int(src: &[u8], i: usize) -> Result<(u64, usize), Refused> {
    let digits = src[i.min(src.len())..].iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return Err(syntax("expecting an integer", i));
    }
    // llama.cpp's `std::stoull` throws past u64: a refusal either way.
    let value = std::str::from_utf8(&src[i..i + digits])
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| syntax("integer out of range", i))?;
    Ok((value, i + digits))
}

/// One character of a literal or set: where it ends.
fn char_end(src: &[u8], i: usize) -> Result<usize, Refused> {
    match at(src, i) {
        0 => Err(syntax("unexpected end of input", i)),
        b'\\' => {
            let hex = match at(src, i + 1) {
                b'x' => 2,
                b'u' => 4,
                b'U' => 8,
                b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']' | b'-' => return Ok(i + 2),
                _ => return Err(syntax("unknown escape", i)),
            };
            let start = i + 2;
            let n = src[start.min(src.len())..]
                .iter()
                .take(hex)
                .take_while(|c| c.is_ascii_hexdigit())
                .count();
            if n < hex {
                return Err(syntax("expecting hex digits", start));
            }
            Ok(start + hex)
        }
        first => {
            // As llama.cpp's `decode_utf8`: the length from the first byte, stopping
            // at the terminator.
            let len = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4][usize::from(first >> 4)];
            let mut end = i + 1;
            while end < i + len && at(src, end) != 0 {
                end += 1;
            }
            Ok(end)
        }
    }
}

impl Parser {
    fn parse(mut self, src: &[u8]) -> Result<Rules, Refused> {
        let mut i = space(src, 0, true);
        while at(src, i) != 0 {
            i = self.rule(src, i)?;
        }
        if self.out.rules.is_empty() {
            return Err(Refused("the grammar has no rules".into()));
        }
        Ok(self.out)
    }

    fn rule(&mut self, src: &[u8], i: usize) -> Result<usize, Refused> {
        let name_end = name(src, i)?;
        let mut pos = space(src, name_end, false);
        let id = self.out.symbol(&src[i..name_end]);
        if !src[pos.min(src.len())..].starts_with(b"::=") {
            return Err(syntax("expecting ::=", pos));
        }
        pos = space(src, pos + 3, true);
        pos = self.alternates(src, pos, id, false)?;
        match at(src, pos) {
            b'\r' => pos += if at(src, pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => pos += 1,
            0 => {}
            _ => return Err(syntax("expecting newline or end", pos)),
        }
        Ok(space(src, pos, true))
    }

    fn alternates(
        &mut self,
        src: &[u8],
        i: usize,
        id: u32,
        nested: bool,
    ) -> Result<usize, Refused> {
        let mut rule = Vec::new();
        let mut pos = self.sequence(src, i, &mut rule, nested)?;
        while at(src, pos) == b'|' {
            rule.push(El::Alt);
            pos = space(src, pos + 1, true);
            pos = self.sequence(src, pos, &mut rule, nested)?;
        }
        rule.push(El::End);
        self.out.add(id, rule)?;
        Ok(pos)
    }

    fn sequence(
        &mut self,
        src: &[u8],
        i: usize,
        rule: &mut Vec<El>,
        nested: bool,
    ) -> Result<usize, Refused> {
        let mut last_start = rule.len();
        let mut pos = i;
        let mut prev_rules: u64 = 1;
        loop {
            if rule.len() > MAX_ELEMENTS {
                return Err(Refused(format!(
                    "a rule of the grammar is over {MAX_ELEMENTS} elements"
                )));
            }
            match at(src, pos) {
                b'"' => {
                    pos += 1;
                    last_start = rule.len();
                    prev_rules = 1;
                    while at(src, pos) != b'"' {
                        pos = char_end(src, pos)?;
                        rule.push(El::Term);
                    }
                    pos = space(src, pos + 1, nested);
                }
                b'[' => {
                    pos += 1;
                    if at(src, pos) == b'^' {
                        pos += 1;
                    }
                    last_start = rule.len();
                    prev_rules = 1;
                    // A set is one element here: it matches one character.
                    rule.push(El::Term);
                    while at(src, pos) != b']' {
                        pos = char_end(src, pos)?;
                        if at(src, pos) == b'-' && at(src, pos + 1) != b']' {
                            if at(src, pos + 1) == 0 {
                                return Err(syntax("unexpected end of input", pos));
                            }
                            pos = char_end(src, pos + 1)?;
                        }
                    }
                    pos = space(src, pos + 1, nested);
                }
                b'<' | b'!' => {
                    if at(src, pos) == b'!' {
                        pos += 1;
                    }
                    if at(src, pos) != b'<' {
                        return Err(syntax("expecting '<'", pos));
                    }
                    while !matches!(at(src, pos), 0 | b'>') {
                        pos += 1;
                    }
                    if at(src, pos) != b'>' {
                        return Err(syntax("expecting '>'", pos));
                    }
                    last_start = rule.len();
                    prev_rules = 1;
                    rule.push(El::Term);
                    pos = space(src, pos + 1, nested);
                }
                c if is_word(c) => {
                    let end = name(src, pos)?;
                    let id = self.out.symbol(&src[pos..end]);
                    pos = space(src, end, nested);
                    last_start = rule.len();
                    prev_rules = 1;
                    rule.push(El::Ref(id));
                }
                b'(' => {
                    if self.nesting >= MAX_NESTING {
                        return Err(Refused(format!(
                            "the grammar nests groups over {MAX_NESTING} deep"
                        )));
                    }
                    pos = space(src, pos + 1, true);
                    let before = self.out.ids.len();
                    let sub = self.out.synthesized();
                    self.nesting += 1;
                    pos = self.alternates(src, pos, sub, true)?;
                    self.nesting -= 1;
                    prev_rules = (self.out.ids.len() - before).max(1) as u64;
                    last_start = rule.len();
                    rule.push(El::Ref(sub));
                    if at(src, pos) != b')' {
                        return Err(syntax("expecting ')'", pos));
                    }
                    pos = space(src, pos + 1, nested);
                }
                b'.' => {
                    last_start = rule.len();
                    prev_rules = 1;
                    rule.push(El::Term);
                    pos = space(src, pos + 1, nested);
                }
                b'*' | b'+' | b'?' => {
                    let (min, max) = match at(src, pos) {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    pos = space(src, pos + 1, nested);
                    self.repeat(rule, last_start, &mut prev_rules, min, max, pos)?;
                }
                b'{' => {
                    pos = space(src, pos + 1, nested);
                    let (min, end) = int(src, pos)?;
                    pos = space(src, end, nested);
                    let mut max = None;
                    match at(src, pos) {
                        b'}' => {
                            max = Some(min);
                            pos = space(src, pos + 1, nested);
                        }
                        b',' => {
                            pos = space(src, pos + 1, nested);
                            if at(src, pos).is_ascii_digit() {
                                let (m, end) = int(src, pos)?;
                                max = Some(m);
                                pos = space(src, end, nested);
                            }
                            if at(src, pos) != b'}' {
                                return Err(syntax("expecting '}'", pos));
                            }
                            pos = space(src, pos + 1, nested);
                        }
                        _ => return Err(syntax("expecting ','", pos)),
                    }
                    if min > MAX_REPETITION {
                        return Err(Refused(format!(
                            "a repetition of over {MAX_REPETITION} in the grammar"
                        )));
                    }
                    let max = max.filter(|&m| m <= MAX_REPETITION);
                    self.repeat(rule, last_start, &mut prev_rules, min, max, pos)?;
                }
                _ => return Ok(pos),
            }
        }
    }

    /// `handle_repetitions`: the previous item repeated `min` times, then up to
    /// `max - min` optional copies as a chain of rules (or one recursive rule).
    fn repeat(
        &mut self,
        rule: &mut Vec<El>,
        last_start: usize,
        prev_rules: &mut u64,
        min: u64,
        max: Option<u64>,
        pos: usize,
    ) -> Result<(), Refused> {
        if last_start == rule.len() {
            return Err(syntax("expecting an item before */+/?/{", pos));
        }
        let prev: Vec<El> = rule[last_start..].to_vec();
        let total = match max {
            Some(m) if m > 0 => m,
            _ if min > 0 => min,
            _ => 1,
        };
        if prev_rules.saturating_mul(total) > MAX_REPETITION {
            return Err(Refused(format!(
                "a repetition in the grammar writes out over {MAX_REPETITION} rules"
            )));
        }
        if min == 0 {
            rule.truncate(last_start);
        } else {
            let copies = (min - 1) as usize;
            self.out.grow(prev.len().saturating_mul(copies))?;
            for _ in 1..min {
                rule.extend_from_slice(&prev);
            }
        }
        let optional = match max {
            None => 1,
            Some(max) => max.saturating_sub(min),
        };
        let mut last = 0;
        for k in 0..optional {
            let id = self.out.synthesized();
            let mut rec = prev.clone();
            if k > 0 || max.is_none() {
                rec.push(El::Ref(if max.is_none() { id } else { last }));
            }
            rec.push(El::Alt);
            rec.push(El::End);
            self.out.add(id, rec)?;
            last = id;
        }
        if optional > 0 {
            rule.push(El::Ref(last));
        }
        *prev_rules = prev_rules.saturating_mul(total);
        Ok(())
    }
}

/// The leftmost references of every rule: the rules llama.cpp's left-recursion
/// check recurses into, with multiplicity, and which rules it takes as possibly
/// empty (one with an empty alternative; llama.cpp does not look further).
struct Leftmost {
    edges: Vec<Vec<usize>>,
}

impl Leftmost {
    fn of(rules: &[Vec<El>]) -> Self {
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
    fn check(&self, rules: &Rules) -> Result<(), Refused> {
        let n = self.edges.len();
        // Post-order over the leftmost graph, iteratively: calls[r] is how many
        // calls llama.cpp's check makes for r (it keeps no memo), depth[r] how deep.
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
        // llama.cpp's outer loop starts a check at each rule no earlier check
        // reached; each check reaches every rule below it.
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
        if total > MAX_CHECK_CALLS {
            return Err(Refused(format!(
                "the grammar's rules share their leftmost rules so often that llama.cpp's \
                 check of it would take over {MAX_CHECK_CALLS} steps"
            )));
        }
        Ok(())
    }
}

impl Rules {
    /// A rule's name for messages: its own, or the rule whose group made it.
    fn name(&self, id: usize) -> String {
        self.ids
            .iter()
            .find(|(_, &v)| v as usize == id)
            .map_or_else(|| format!("#{id}"), |(k, _)| k.clone())
    }
}

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
fn stacks(rules: &[Vec<El>]) -> Result<(), Refused> {
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn refused(grammar: &str) -> String {
        match check(grammar) {
            Err(Refused(why)) => why,
            Ok(()) => panic!("accepted: {grammar:.200}"),
        }
    }

    /// `aN ::= aN+1 "x" | aN+1 "y"`, `n` rules deep: 2^n leftmost derivations.
    fn doubling(n: usize) -> String {
        let mut g = String::from("root ::= a0\n");
        for i in 0..n {
            g.push_str(&format!("a{i} ::= a{} \"x\" | a{} \"y\"\n", i + 1, i + 1));
        }
        g.push_str(&format!("a{n} ::= \"z\"\n"));
        g
    }

    #[test]
    fn the_grammars_the_engine_makes_pass() {
        check(&super::super::gbnf::any_object()).unwrap();
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 40},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
                "when": {"type": "string", "format": "date-time"},
                "a": {"type": "integer"}, "b": {"type": "number"}, "c": {"type": "boolean"},
                "d": {"anyOf": [{"type": "string"}, {"type": "null"}]}
            },
            "required": ["name"]
        });
        check(&super::super::schema::to_gbnf(&schema).unwrap()).unwrap();
        check("root ::= [a-z]+ (\" \" [a-z]+){0,30} | \"x\"{2000}\n").unwrap();
        // Right recursion is ordinary, however long the chain.
        let mut chain = String::from("root ::= r0\n");
        for i in 0..2000 {
            chain.push_str(&format!("r{i} ::= \"x\" r{}\n", i + 1));
        }
        chain.push_str("r2000 ::= \"y\"\n");
        check(&chain).unwrap();
        check(&doubling(8)).unwrap();
    }

    #[test]
    fn exponential_leftmost_derivations_are_refused_at_once() {
        let started = Instant::now();
        let why = refused(&doubling(60));
        assert!(why.contains("steps"), "{why}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// The matcher's stacks are bounded on their own, whatever the check made of
    /// the grammar first.
    #[test]
    fn the_stacks_of_one_point_are_bounded() {
        let parsed = |g: &str| Parser::default().parse(g.as_bytes()).unwrap();
        stacks(&parsed(&doubling(9)).rules).unwrap();
        let Refused(why) = stacks(&parsed(&doubling(11)).rules).unwrap_err();
        assert!(why.contains("ways to go on"), "{why}");
        // Empty alternatives that lead to the same place count once.
        let optional = format!(
            "root ::= {}\"z\"\na ::= b | c\nb ::= \"\" | \"x\"\nc ::= \"\" | \"y\"",
            "a ".repeat(40)
        );
        check(&optional).unwrap();
    }

    #[test]
    fn deep_nesting_long_leftmost_chains_and_left_recursion_are_refused() {
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(refused(&deep).contains("nests"));
        let mut chain = String::from("root ::= r0\n");
        for i in 0..30_000 {
            chain.push_str(&format!("r{i} ::= r{} \"x\"\n", i + 1));
        }
        chain.push_str("r30000 ::= \"y\"\n");
        assert!(refused(&chain).contains("deep"));
        assert!(refused("root ::= root \"x\" | \"y\"").contains("left-recursive"));
        assert!(refused("root ::= a \"x\"\na ::= b\nb ::= root | \"y\"").contains("left-recursive"));
        // Hidden by an empty rule that llama.cpp's check does not follow.
        let hidden = "root ::= e root \"x\" | \"y\"\ne ::= f\nf ::= \"\" | \"z\"";
        assert!(refused(hidden).contains("left-recursive"), "{}", refused(hidden));
    }

    #[test]
    fn big_repetitions_and_bad_syntax_are_refused() {
        assert!(refused("root ::= \"a\"{2001}").contains("repetition"));
        assert!(refused("root ::= (\"a\"{0,100}){0,100}").contains("repetition"));
        check("root ::= (\"a\"{100}){100}").unwrap();
        assert!(refused("root ::= x").contains("never defined"));
        assert!(refused("rot ::= \"x\"").contains("root"));
        assert!(refused("root ::= \"x").contains("parse"));
        assert!(refused("root ::= [a-").contains("parse"));
        assert!(refused("root ::= \"\\q\"").contains("escape"));
        assert!(refused("").contains("no rules"));
    }

    #[test]
    fn a_ref_chain_through_a_schema_is_refused_before_its_grammar_is_built() {
        // anyOf of two $refs to the same definition: 60 deep is too deep for the
        // converter, 25 deep converts into a grammar of 2^25 derivations.
        let doubling = |n: usize| {
            let mut defs = serde_json::Map::new();
            for i in 0..n {
                let next = format!("#/$defs/d{}", i + 1);
                defs.insert(format!("d{i}"), json!({"anyOf": [{"$ref": next}, {"$ref": next}]}));
            }
            defs.insert(format!("d{n}"), json!({"type": "string"}));
            super::super::schema::to_gbnf(&json!({"$ref": "#/$defs/d0", "$defs": defs}))
        };
        assert!(doubling(60).unwrap_err().message.contains("deep"));
        let why = refused(&doubling(25).unwrap());
        assert!(why.contains("ways") || why.contains("steps"), "{why}");
        check(&doubling(4).unwrap()).unwrap();
        // A $ref chain 30 000 long.
        let mut defs = serde_json::Map::new();
        for i in 0..30_000 {
            defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
        }
        defs.insert("d30000".into(), json!({"type": "string"}));
        let err = super::super::schema::to_gbnf(&json!({"$ref": "#/$defs/d0", "$defs": defs}))
            .unwrap_err();
        assert!(err.message.contains("deep"), "{err}");
    }

    /// GBNF pieces, shuffled: every input is read without a panic and within a
    /// time bound, whatever it is.
    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "root",
            " ::= ",
            "a",
            "b",
            " ::= ",
            "\n",
            "(",
            ")",
            "|",
            "\"x\"",
            "\"",
            "[a-z]",
            "[^",
            "]",
            "*",
            "+",
            "?",
            "{2}",
            "{1,3}",
            "{3,}",
            "{",
            "}",
            ".",
            "<x>",
            "!<[1]>",
            "\\",
            "#c\n",
            " ",
            "a ::= a",
            "b ::= \"\" | a",
            "(((",
            ")))",
            "{2000}",
            "\u{e9}",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        #[test]
        fn any_text_is_judged_quickly_without_a_panic(pieces in prop::collection::vec(piece(), 0..80)) {
            let text: String = pieces.concat();
            let started = Instant::now();
            let _ = check(&text);
            prop_assert!(started.elapsed() < Duration::from_millis(500));
        }

        #[test]
        fn any_bytes_are_judged_without_a_panic(text in ".{0,200}") {
            let _ = check(&text);
        }
    }
}
