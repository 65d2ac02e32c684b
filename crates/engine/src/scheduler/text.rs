//! Turns the raw bytes of sampled tokens into text that is safe to send: never a
//! broken UTF-8 character, never a stop string or the start of one.

/// The text of one sequence as it is generated.
#[derive(Debug, Default)]
pub struct TextStream {
    stops: Vec<String>,
    /// Bytes of a UTF-8 character whose remaining bytes have not arrived.
    partial: Vec<u8>,
    /// Decoded text held back because it could be the start of a stop string.
    held: String,
    /// The stop string that ended the stream, once one has.
    matched: Option<String>,
}

/// What one push produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Text that may be sent now.
    pub text: String,
    /// A stop string was found; nothing after it is sent.
    pub stopped: bool,
}

impl TextStream {
    /// A stream that ends at any of `stops`.
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), ..Self::default() }
    }

    /// Adds the bytes of one token.
    pub fn push(&mut self, bytes: &[u8]) -> Pushed {
        if self.matched.is_some() {
            return Pushed { text: String::new(), stopped: true };
        }
        self.partial.extend_from_slice(bytes);
        self.decode_partial();
        if let Some((at, stop)) = self.find_stop() {
            self.held.truncate(at);
            self.matched = Some(self.stops[stop].clone());
            return Pushed { text: std::mem::take(&mut self.held), stopped: true };
        }
        let keep = self.stop_prefix_len();
        let text = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        Pushed { text, stopped: false }
    }

    /// Ends the stream: what was held back is sent, a dangling partial character as
    /// U+FFFD. Nothing is sent after a stop string.
    pub fn finish(&mut self) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        let mut rest = std::mem::take(&mut self.held);
        if !self.partial.is_empty() {
            rest.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.partial)));
        }
        rest
    }

    /// Moves every complete character from `partial` to `held`. Bytes that can never
    /// start a valid character become U+FFFD; an incomplete tail waits.
    fn decode_partial(&mut self) {
        loop {
            match std::str::from_utf8(&self.partial) {
                Ok(s) => {
                    self.held.push_str(s);
                    self.partial.clear();
                    return;
                }
                Err(err) => {
                    let valid = err.valid_up_to();
                    // Checked by from_utf8 just above.
                    self.held.push_str(std::str::from_utf8(&self.partial[..valid]).unwrap_or(""));
                    match err.error_len() {
                        None => {
                            self.partial.drain(..valid);
                            return;
                        }
                        Some(bad) => {
                            self.held.push(char::REPLACEMENT_CHARACTER);
                            self.partial.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// The stop string that ended the stream, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Where the earliest stop string in `held` starts, and which one it is (the
    /// first listed, of several found at one place).
    fn find_stop(&self) -> Option<(usize, usize)> {
        let found = self.stops.iter().enumerate();
        found.filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, i))).min()
    }

    /// The length of the longest tail of `held` that is a proper prefix of a stop string.
    fn stop_prefix_len(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(self.held.len());
            for len in (best + 1..=max).rev() {
                let start = self.held.len() - len;
                if self.held.is_char_boundary(start) && stop.starts_with(&self.held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&[u8]]) -> (Vec<String>, bool, String) {
        let mut stream = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        let mut stopped = false;
        for piece in pieces {
            let pushed = stream.push(piece);
            out.push(pushed.text);
            stopped |= pushed.stopped;
        }
        (out, stopped, stream.finish())
    }

    #[test]
    fn utf8_split_across_tokens_is_held_until_complete() {
        let snow = "☃".as_bytes();
        let (out, stopped, rest) = run(&[], &[b"a", &snow[..1], &snow[1..2], &snow[2..], b"b"]);
        assert_eq!(out, ["a", "", "", "☃", "b"]);
        assert!(!stopped);
        assert_eq!(rest, "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let (out, _, rest) = run(&[], &[b"a\xffb", b"\xe2\x98"]);
        assert_eq!(out, ["a\u{fffd}b", ""]);
        assert_eq!(rest, "\u{fffd}");
    }

    #[test]
    fn partial_stop_string_is_held_then_released() {
        let (out, stopped, rest) = run(&["END"], &[b"hello E", b"N", b"d more"]);
        assert_eq!(out, ["hello ", "", "ENd more"]);
        assert!(!stopped);
        assert_eq!(rest, "");
    }

    #[test]
    fn stop_string_across_tokens_ends_the_text_before_it() {
        let (out, stopped, rest) = run(&["END"], &[b"one E", b"N", b"D two", b"three"]);
        assert_eq!(out, ["one ", "", "", ""]);
        assert!(stopped);
        assert_eq!(rest, "");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (out, stopped, _) = run(&["bb", "a"], &[b"xxbba"]);
        assert_eq!(out, ["xx"]);
        assert!(stopped);
    }

    #[test]
    fn the_stop_string_that_ended_the_text_is_known() {
        let mut stream = TextStream::new(vec!["a".into(), "END".into(), "bb".into()]);
        assert_eq!(stream.push(b"xx E").text, "xx ");
        assert_eq!(stream.matched(), None);
        assert!(stream.push(b"ND bb a").stopped);
        assert_eq!(stream.matched(), Some("END"));
        // At one place, the first listed of the stops found there.
        let mut stream = TextStream::new(vec!["ab".into(), "a".into()]);
        assert!(stream.push(b"xab").stopped);
        assert_eq!(stream.matched(), Some("ab"));
    }

    #[test]
    fn held_tail_is_sent_at_finish() {
        let (out, stopped, rest) = run(&["\n\n"], &[b"line\n"]);
        assert_eq!(out, ["line"]);
        assert!(!stopped);
        assert_eq!(rest, "\n");
    }

    #[test]
    fn multibyte_stop_strings_are_matched_on_char_boundaries() {
        let (out, stopped, _) = run(&["é!"], &["café".as_bytes(), b"!"]);
        assert_eq!(out, ["caf", ""]);
        assert!(stopped);
    }
}
