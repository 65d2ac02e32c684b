//! llama.cpp's grammar parser (`llama_grammar_parser`), rule for rule, building
//! only the shape of the rules and counting them against the limits as it goes.

use super::{El, Refused, Rules, MAX_ELEMENTS, MAX_NESTING, MAX_REPETITION};

/// llama.cpp's grammar parser, rule for rule, building only the shape.
#[derive(Default)]
pub(super) struct Parser {
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

/// A character set at `pos` (`[...]`, `[^...]`), one element of `rule`: it
/// matches one character. Where it ends.
fn set(src: &[u8], pos: usize, rule: &mut Vec<El>) -> Result<usize, Refused> {
    let mut pos = pos + 1;
    if at(src, pos) == b'^' {
        pos += 1;
    }
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
    Ok(pos + 1)
}

/// A token at `pos` (`<...>`, `!<...>`), one element of `rule`. Where it ends.
fn token(src: &[u8], pos: usize, rule: &mut Vec<El>) -> Result<usize, Refused> {
    let mut pos = pos;
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
    rule.push(El::Term);
    Ok(pos + 1)
}

/// A counted repetition at `pos` (`{m}`, `{m,}`, `{m,n}`): its least and most
/// (none above [`MAX_REPETITION`]), and where the text after it starts.
fn braces(src: &[u8], pos: usize, nested: bool) -> Result<(u64, Option<u64>, usize), Refused> {
    let pos = space(src, pos + 1, nested);
    let (min, end) = int(src, pos)?;
    let mut pos = space(src, end, nested);
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
        return Err(Refused(format!("a repetition of over {MAX_REPETITION} in the grammar")));
    }
    Ok((min, max.filter(|&m| m <= MAX_REPETITION), pos))
}

impl Parser {
    pub(super) fn parse(mut self, src: &[u8]) -> Result<Rules, Refused> {
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
            let (min, max) = match at(src, pos) {
                c @ (b'*' | b'+' | b'?') => {
                    pos = space(src, pos + 1, nested);
                    match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    }
                }
                b'{' => {
                    let (min, max, end) = braces(src, pos, nested)?;
                    pos = end;
                    (min, max)
                }
                _ => {
                    let start = rule.len();
                    let Some((end, rules)) = self.item(src, pos, rule, nested)? else {
                        return Ok(pos);
                    };
                    (pos, last_start, prev_rules) = (end, start, rules);
                    continue;
                }
            };
            self.repeat(rule, last_start, &mut prev_rules, min, max, pos)?;
        }
    }

    /// The item at `pos` (a literal, a set, a token, a rule's name, a group or
    /// `.`), pushed onto `rule`: where it ends, and how many rules it made (a
    /// repetition writes them out again); `None` when no item starts there.
    fn item(
        &mut self,
        src: &[u8],
        pos: usize,
        rule: &mut Vec<El>,
        nested: bool,
    ) -> Result<Option<(usize, u64)>, Refused> {
        let end = match at(src, pos) {
            b'"' => {
                let mut pos = pos + 1;
                while at(src, pos) != b'"' {
                    pos = char_end(src, pos)?;
                    rule.push(El::Term);
                }
                pos + 1
            }
            b'[' => set(src, pos, rule)?,
            b'<' | b'!' => token(src, pos, rule)?,
            c if is_word(c) => {
                let end = name(src, pos)?;
                rule.push(El::Ref(self.out.symbol(&src[pos..end])));
                end
            }
            b'(' => return self.group(src, pos, rule, nested).map(Some),
            b'.' => {
                rule.push(El::Term);
                pos + 1
            }
            _ => return Ok(None),
        };
        Ok(Some((space(src, end, nested), 1)))
    }

    /// A parenthesized group at `pos`: a rule of its own, referred to from
    /// `rule`. Where it ends, and how many rules it made.
    fn group(
        &mut self,
        src: &[u8],
        pos: usize,
        rule: &mut Vec<El>,
        nested: bool,
    ) -> Result<(usize, u64), Refused> {
        if self.nesting >= MAX_NESTING {
            return Err(Refused(format!("the grammar nests groups over {MAX_NESTING} deep")));
        }
        let pos = space(src, pos + 1, true);
        let before = self.out.ids.len();
        let sub = self.out.synthesized();
        self.nesting += 1;
        let pos = self.alternates(src, pos, sub, true)?;
        self.nesting -= 1;
        let made = (self.out.ids.len() - before).max(1) as u64;
        rule.push(El::Ref(sub));
        if at(src, pos) != b')' {
            return Err(syntax("expecting ')'", pos));
        }
        Ok((space(src, pos + 1, nested), made))
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
