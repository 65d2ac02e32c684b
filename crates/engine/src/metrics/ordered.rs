//! The exporter's text in a stable order: families by name, and within one
//! family the series by their labels. The exporter keeps them in hash maps,
//! so two scrapes of the same values would otherwise differ in order, and a
//! diff of two scrapes (or a cached copy compared with a fresh one) would show
//! changes where there are none.

/// `text` (Prometheus' text format, one family after another: its comment
/// lines, then its samples) with its families sorted by name and each
/// family's samples stably sorted by their labels less `le` and `quantile`,
/// so that a histogram's buckets, sum and count stay together and in order.
pub fn ordered(text: &str) -> String {
    let mut families: Vec<(&str, Vec<&str>, Vec<&str>)> = Vec::new();
    let mut in_samples = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let comment = line.starts_with('#');
        if families.is_empty() || (comment && in_samples) {
            families.push((family_name(line), Vec::new(), Vec::new()));
        }
        in_samples = !comment;
        let (_, comments, samples) = families.last_mut().expect("pushed above");
        if comment {
            comments.push(line)
        } else {
            samples.push(line)
        }
    }
    families.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::with_capacity(text.len() + families.len());
    for (_, comments, mut samples) in families {
        samples.sort_by_key(|line| series_key(line));
        for line in comments.into_iter().chain(samples) {
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

/// The metric a line names: `# HELP name ...`, `# TYPE name ...` or `name{...} v`.
fn family_name(line: &str) -> &str {
    let rest =
        line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")).unwrap_or(line);
    rest.split([' ', '{']).next().unwrap_or(rest)
}

/// A sample's labels less the bucket's or quantile's bound.
fn series_key(line: &str) -> String {
    let Some((_, rest)) = line.split_once('{') else { return String::new() };
    let labels = rest.rsplit_once('}').map_or(rest, |(labels, _)| labels);
    let kept: Vec<&str> = labels
        .split("\",")
        .filter(|l| !l.starts_with("le=") && !l.starts_with("quantile="))
        .collect();
    kept.join("\",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_series_come_sorted_with_buckets_kept_in_order() {
        let text = "# TYPE b counter\nb{m=\"y\"} 1\nb{m=\"x\"} 2\n\n\
                    # HELP a_seconds A.\n# TYPE a_seconds histogram\n\
                    a_seconds_bucket{m=\"y\",le=\"1\"} 0\na_seconds_bucket{m=\"y\",le=\"+Inf\"} 1\n\
                    a_seconds_sum{m=\"y\"} 3\na_seconds_count{m=\"y\"} 1\n\
                    a_seconds_bucket{m=\"x\",le=\"1\"} 1\na_seconds_bucket{m=\"x\",le=\"+Inf\"} 1\n\
                    a_seconds_sum{m=\"x\"} 0.5\na_seconds_count{m=\"x\"} 1\n";
        let want = "# HELP a_seconds A.\n# TYPE a_seconds histogram\n\
                    a_seconds_bucket{m=\"x\",le=\"1\"} 1\na_seconds_bucket{m=\"x\",le=\"+Inf\"} 1\n\
                    a_seconds_sum{m=\"x\"} 0.5\na_seconds_count{m=\"x\"} 1\n\
                    a_seconds_bucket{m=\"y\",le=\"1\"} 0\na_seconds_bucket{m=\"y\",le=\"+Inf\"} 1\n\
                    a_seconds_sum{m=\"y\"} 3\na_seconds_count{m=\"y\"} 1\n\n\
                    # TYPE b counter\nb{m=\"x\"} 2\nb{m=\"y\"} 1\n\n";
        assert_eq!(ordered(text), want);
        assert_eq!(ordered(want), want, "already ordered: unchanged");
    }
}
