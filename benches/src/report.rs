//! Writing a comparison's results: JSON for machines, a Markdown section for
//! BENCHMARKS.md (spliced in by `scripts/bench`, never edited by hand), and SVG
//! charts beside them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::chart::Chart;
use crate::stats::Report;

/// A Markdown table.
#[derive(Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Self { headers: headers.iter().map(|h| (*h).to_owned()).collect(), rows: Vec::new() }
    }

    /// Appends a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as GitHub Markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!("| {} |\n|", self.headers.join(" | "));
        out.push_str(&"---|".repeat(self.headers.len()));
        out.push('\n');
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }
}

/// A number with `digits` decimals, or `-` when it is not a number.
pub fn fixed(value: f64, digits: usize) -> String {
    if value.is_finite() {
        format!("{value:.digits$}")
    } else {
        "-".to_owned()
    }
}

/// `a / b` as `1.23x`, or `-`.
pub fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b != 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".to_owned()
    }
}

/// The usual table of runs: one row per report.
pub fn runs_table(reports: &[Report]) -> Table {
    let mut table = Table::new(&[
        "target",
        "load",
        "stream",
        "ok",
        "errors",
        "req/s",
        "tok/s",
        "tok/req",
        "TTFT p50 / p90 / p99 ms",
        "ITL p50 / p99 ms",
        "e2e p50 / p99 ms",
    ]);
    for r in reports {
        table.row(vec![
            r.target.clone(),
            r.arrival.label(),
            if r.stream { "yes" } else { "no" }.to_owned(),
            r.ok.to_string(),
            r.errors_label(),
            fixed(r.requests_per_second, 1),
            fixed(r.tokens_per_second, 1),
            fixed(r.generated_tokens as f64 / r.ok as f64, 1),
            format!(
                "{} / {} / {}",
                fixed(r.ttft_ms.p50, 1),
                fixed(r.ttft_ms.p90, 1),
                fixed(r.ttft_ms.p99, 1)
            ),
            format!("{} / {}", fixed(r.itl_ms.p50, 1), fixed(r.itl_ms.p99, 1)),
            format!("{} / {}", fixed(r.e2e_ms.p50, 1), fixed(r.e2e_ms.p99, 1)),
        ]);
    }
    table
}

/// One chart series per target: `(arrival.x, value)` of its reports.
pub fn by_target(
    reports: &[Report],
    value: impl Fn(&Report) -> f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    group(reports.iter().map(|r| (r.target.clone(), (r.arrival.x(), value(r)))))
}

/// Points gathered by key, keys in the order they first come.
pub fn group<K: PartialEq>(
    points: impl IntoIterator<Item = (K, (f64, f64))>,
) -> Vec<(K, Vec<(f64, f64)>)> {
    let mut out: Vec<(K, Vec<(f64, f64)>)> = Vec::new();
    for (key, point) in points {
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push(point),
            None => out.push((key, vec![point])),
        }
    }
    out
}

/// Where one comparison writes: `DIR/NAME.json`, `DIR/NAME.md`, `DIR/NAME-*.svg`.
pub struct Output {
    dir: PathBuf,
    name: String,
    markdown: String,
}

impl Output {
    /// An output named `name` under `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
        Self { dir: dir.to_owned(), name: name.to_owned(), markdown: String::new() }
    }

    /// Appends Markdown to the section, and prints it.
    pub fn text(&mut self, markdown: &str) {
        println!("{markdown}");
        self.markdown.push_str(markdown);
        self.markdown.push('\n');
    }

    /// Writes `DIR/NAME-KEY.svg` and links it from the section, as it will sit in
    /// `docs/benchmarks/` once published.
    pub fn chart(&mut self, key: &str, chart: &Chart) -> anyhow::Result<()> {
        let file = format!("{}-{key}.svg", self.name);
        std::fs::create_dir_all(&self.dir)?;
        std::fs::write(self.dir.join(&file), chart.svg())?;
        self.text(&format!("![{}](docs/benchmarks/{file})\n", chart.title));
        Ok(())
    }

    /// Writes the JSON results and the Markdown section.
    pub fn finish(self, results: &Value) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let json = self.dir.join(format!("{}.json", self.name));
        std::fs::write(&json, serde_json::to_string_pretty(results)?)?;
        let md = self.dir.join(format!("{}.md", self.name));
        std::fs::write(&md, self.markdown)?;
        println!("wrote {} and {}", json.display(), md.display());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_markdown() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into(), fixed(2.345, 1)]);
        assert_eq!(t.markdown(), "| a | b |\n|---|---|\n| 1 | 2.3 |\n");
        assert_eq!(ratio(3.0, 2.0), "1.50x");
        assert_eq!(ratio(1.0, 0.0), "-");
        assert_eq!(fixed(f64::NAN, 2), "-");
    }
}
