//! Line charts as standalone SVG, for the sweeps in BENCHMARKS.md: one series per
//! system, the swept quantity (clients, arrival rate, turn) along x, a measured one
//! along y, linear or logarithmic. No fonts or native libraries are needed to draw
//! them; a browser or GitHub renders the text.

use std::fmt::Write as _;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 52.0;
const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

/// One line: a name for the legend and its points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x, y)` points; those with a non-finite or (on a log axis) non-positive y
    /// are left out.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title, above the plot.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// A logarithmic y axis, for values spanning decades.
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
}

impl Chart {
    /// A chart with no series yet.
    pub fn new(title: &str, x_label: &str, y_label: &str, log_y: bool) -> Self {
        Self {
            title: title.to_owned(),
            x_label: x_label.to_owned(),
            y_label: y_label.to_owned(),
            log_y,
            series: Vec::new(),
        }
    }

    /// Adds one series per `(name, points)`.
    pub fn lines(self, series: Vec<(String, Vec<(f64, f64)>)>) -> Self {
        series.into_iter().fold(self, |chart, (name, points)| chart.line(&name, points))
    }

    /// Adds a series.
    pub fn line(mut self, name: &str, points: Vec<(f64, f64)>) -> Self {
        self.series.push(Series { name: name.to_owned(), points });
        self
    }

    fn drawable(&self, y: f64) -> bool {
        y.is_finite() && (!self.log_y || y > 0.0)
    }

    /// The chart as an SVG document. The x values are placed evenly, in order,
    /// as categories (1, 2, 4, 8 clients sit at equal steps).
    pub fn svg(&self) -> String {
        let mut xs: Vec<f64> =
            self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let ys: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(|y| self.drawable(*y))
            .collect();
        let axis = YAxis::fit(&ys, self.log_y);
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
        let x_at = |x: f64| {
            let i = xs.iter().position(|v| *v == x).unwrap_or(0) as f64;
            let steps = (xs.len().max(2) - 1) as f64;
            LEFT + plot_w * if xs.len() < 2 { 0.5 } else { i / steps }
        };
        let y_at = |y: f64| TOP + plot_h * (1.0 - axis.fraction(y));

        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(svg, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
        let _ = write!(
            svg,
            r#"<text x="{}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
            LEFT + plot_w / 2.0,
            escape(&self.title)
        );
        for tick in &axis.ticks {
            let y = y_at(*tick);
            let _ = write!(
                svg,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                y + 4.0,
                number(*tick)
            );
        }
        for x in &xs {
            let px = x_at(*x);
            let _ = write!(
                svg,
                r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + plot_h,
                TOP + plot_h + 18.0,
                number(*x)
            );
        }
        let _ = write!(
            svg,
            r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>"##
        );
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            HEIGHT - 12.0,
            escape(&self.x_label)
        );
        let _ = write!(
            svg,
            r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}{}</text>"#,
            TOP + plot_h / 2.0,
            escape(&self.y_label),
            if self.log_y { " (log scale)" } else { "" }
        );
        for (i, series) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<(f64, f64)> = series
                .points
                .iter()
                .filter(|p| self.drawable(p.1))
                .map(|p| (x_at(p.0), y_at(p.1)))
                .collect();
            let path: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = write!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                path.join(" ")
            );
            for (x, y) in &points {
                let _ = write!(svg, r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}"/>"#);
            }
            let ly = TOP + 10.0 + 20.0 * i as f64;
            let lx = WIDTH - RIGHT + 14.0;
            let _ = write!(
                svg,
                r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
                lx + 20.0,
                lx + 26.0,
                ly + 4.0,
                escape(&series.name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// The y range and its grid lines.
struct YAxis {
    low: f64,
    high: f64,
    log: bool,
    ticks: Vec<f64>,
}

impl YAxis {
    fn fit(ys: &[f64], log: bool) -> Self {
        let max = ys.iter().copied().fold(f64::NAN, f64::max);
        let min = ys.iter().copied().fold(f64::NAN, f64::min);
        if log {
            let (lo, hi) = if max.is_nan() {
                (0, 1)
            } else {
                (
                    min.log10().floor() as i32,
                    (max.log10().ceil() as i32).max(min.log10().floor() as i32 + 1),
                )
            };
            let ticks = (lo..=hi).map(|e| 10f64.powi(e)).collect();
            return Self { low: 10f64.powi(lo), high: 10f64.powi(hi), log, ticks };
        }
        let max = if max.is_nan() || max <= 0.0 { 1.0 } else { max };
        let step = nice_step(max / 5.0);
        let top = (max / step).ceil() * step;
        let ticks = (0..=(top / step).round() as usize).map(|i| i as f64 * step).collect();
        Self { low: 0.0, high: top, log, ticks }
    }

    fn fraction(&self, y: f64) -> f64 {
        if self.log {
            (y.log10() - self.low.log10()) / (self.high.log10() - self.low.log10())
        } else {
            (y - self.low) / (self.high - self.low)
        }
    }
}

/// The smallest of 1, 2 or 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(magnitude * 10.0)
}

/// A number as a label: no trailing zeros, at most three decimals.
fn number(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_labels_are_round() {
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(0.13), 0.2);
        assert_eq!(nice_step(100.0), 100.0);
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(8.0), "8");
        assert_eq!(number(0.1234), "0.123");
    }

    #[test]
    fn every_drawable_point_is_plotted_inside_the_frame() {
        let chart = Chart::new("t <&>", "clients", "tok/s", true)
            .line("a", vec![(1.0, 10.0), (2.0, 200.0), (4.0, f64::NAN)])
            .line("b", vec![(1.0, 0.0), (4.0, 3.0)]);
        let svg = chart.svg();
        assert!(svg.contains("t &lt;&amp;&gt;"));
        // 2 from a, 1 from b (0 cannot sit on a log axis), NaN skipped.
        assert_eq!(svg.matches("<circle").count(), 3);
        for circle in svg.split("<circle").skip(1) {
            let cy: f64 =
                circle.split("cy=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
            assert!((TOP..=HEIGHT - BOTTOM).contains(&cy), "{cy}");
        }
        // Decades 1, 10, 100, 1000 cover 3 to 200.
        assert!(svg.contains(">1000</text>") && svg.contains(">1</text>"));
    }
}
