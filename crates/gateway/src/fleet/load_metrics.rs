//! Load of a backend that has no `/slots` (vLLM), read from its Prometheus text:
//! requests running plus requests waiting there are slots taken, so that a mixed
//! fleet is scheduled by the one rule "a free slot, or wait in the gateway".

/// What a backend's `/metrics` says of its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Requests it is running (`vllm:num_requests_running`).
    pub running: u32,
    /// Requests waiting in its own queue (`vllm:num_requests_waiting`).
    pub waiting: u32,
}

impl Load {
    /// Reads the vLLM gauges from Prometheus exposition text, summed over their
    /// label sets (one per model and engine core). `None` when neither is there.
    pub fn parse(text: &str) -> Option<Self> {
        let (mut running, mut waiting) = (None::<f64>, None::<f64>);
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = sample(line) else { continue };
            let total = match name {
                "vllm:num_requests_running" => &mut running,
                "vllm:num_requests_waiting" => &mut waiting,
                _ => continue,
            };
            *total.get_or_insert(0.0) += value;
        }
        if running.is_none() && waiting.is_none() {
            return None;
        }
        // Gauges are floats in the text ("3.0"); counts are what they mean.
        let count =
            |v: Option<f64>| v.unwrap_or(0.0).clamp(0.0, f64::from(u32::MAX)).round() as u32;
        Some(Self { running: count(running), waiting: count(waiting) })
    }

    /// Slots taken: what runs, and what waits there ahead of anything sent now.
    pub fn busy(&self) -> u32 {
        self.running.saturating_add(self.waiting)
    }
}

/// A sample line's metric name and value (labels and timestamp skipped).
fn sample(line: &str) -> Option<(&str, f64)> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let rest = &line[name_end..];
    // Label values may hold spaces and braces inside quotes: skip to the closing
    // brace that is outside any quotes.
    let rest = if rest.starts_with('{') {
        let mut quoted = false;
        let mut escaped = false;
        let mut end = None;
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '}' if !quoted => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        &rest[end? + 1..]
    } else {
        rest
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_gauges_summed_over_label_sets() {
        let text = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a {odd} \"name\""} 3.0
vllm:num_requests_running{engine="1",model_name="b"} 1.0
vllm:num_requests_waiting{engine="0",model_name="a"} 2.0 1700000000000
vllm:num_requests_swapped 9
vllm:gpu_cache_usage_perc 0.5
"#;
        assert_eq!(Load::parse(text), Some(Load { running: 4, waiting: 2 }));
        assert_eq!(Load::parse(text).map(|l| l.busy()), Some(6));
    }

    #[test]
    fn other_servers_metrics_are_not_a_load() {
        assert_eq!(Load::parse("llamacpp:requests_processing 1\n"), None);
        assert_eq!(Load::parse(""), None);
        assert_eq!(
            Load::parse("vllm:num_requests_waiting 1\n"),
            Some(Load { running: 0, waiting: 1 })
        );
    }
}
