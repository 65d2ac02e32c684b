//! Taking out of a stream the usage chunk that the gateway asked for and the
//! client did not: `{"choices":[],"usage":{...}}`, the last event before
//! `[DONE]`. Events are cut at their blank line, so a chunk that arrives in two
//! pieces is held until it is whole; nothing else is changed or held back.

use axum::body::Bytes;

/// The part of the stream after its last complete event.
#[derive(Debug, Default)]
pub struct UsageStrip {
    carry: Vec<u8>,
}

impl UsageStrip {
    /// `data` without usage-only events, from the last event boundary before
    /// it to the last one in it; the rest waits for the next piece.
    pub fn filter(&mut self, data: Bytes) -> Bytes {
        if self.carry.is_empty() && !contains(&data, b"\"usage\"") && data.ends_with(b"\n\n") {
            // The common case: whole events, none of them usage.
            return data;
        }
        self.carry.extend_from_slice(&data);
        let Some(end) = self.carry.windows(2).rposition(|w| w == b"\n\n") else {
            return Bytes::new();
        };
        let rest = self.carry.split_off(end + 2);
        let whole = std::mem::replace(&mut self.carry, rest);
        let mut out = Vec::with_capacity(whole.len());
        for event in whole
            .split_inclusive(|b| *b == b'\n')
            .collect::<Vec<_>>()
            .split_inclusive(|l| *l == b"\n")
        {
            let event: Vec<u8> = event.concat();
            if !is_usage_only(&event) {
                out.extend_from_slice(&event);
            }
        }
        Bytes::from(out)
    }

    /// What is left when the stream ends: an unfinished last event, as it came.
    pub fn finish(&mut self) -> Option<Bytes> {
        (!self.carry.is_empty()).then(|| Bytes::from(std::mem::take(&mut self.carry)))
    }
}

/// A `data:` event whose chunk has no choices and carries usage.
fn is_usage_only(event: &[u8]) -> bool {
    event.starts_with(b"data:")
        && contains(event, b"\"usage\"")
        && contains(event, b"\"choices\":[]")
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

    /// Whatever the pieces, the client gets the stream without the usage event.
    #[test]
    fn the_usage_event_goes_whatever_the_cuts() {
        let needle = b"data: {\"choices\":[]";
        let usage_at = STREAM.windows(needle.len()).position(|w| w == needle).unwrap();
        let usage_end =
            usage_at + STREAM[usage_at..].windows(2).position(|w| w == b"\n\n").unwrap() + 2;
        let expected = [&STREAM[..usage_at], &STREAM[usage_end..]].concat();
        for size in 1..=STREAM.len() {
            let mut strip = UsageStrip::default();
            let mut out = Vec::new();
            for piece in STREAM.chunks(size) {
                out.extend_from_slice(&strip.filter(Bytes::copy_from_slice(piece)));
            }
            assert!(strip.finish().is_none(), "cut at {size}");
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&expected),
                "cut at {size}"
            );
        }
    }
}
