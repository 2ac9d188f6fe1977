//! Usage plots, drawn by choird as SVG: a horizontal bar per key (a day, an
//! agent, a model, a job) with its value written beside it. No script, no
//! external font or image; every label passes through [`esc`].

use std::fmt::Write as _;

use super::html::esc;

/// Bars drawn at most (the largest values; the rest are summed as "other").
pub const MAX_BARS: usize = 40;

/// An SVG bar chart of `(label, value)` titled `title`, values formatted by
/// `fmt`.
pub fn bars(title: &str, data: &[(String, f64)], fmt: impl Fn(f64) -> String) -> String {
    let mut data: Vec<(String, f64)> = data.iter().filter(|(_, v)| v.is_finite() && *v >= 0.0).cloned().collect();
    if data.len() > MAX_BARS {
        data.sort_by(|a, b| b.1.total_cmp(&a.1));
        let rest: f64 = data[MAX_BARS - 1..].iter().map(|(_, v)| v).sum();
        data.truncate(MAX_BARS - 1);
        data.push(("other".into(), rest));
    }
    let (row, label_w, bar_w) = (22.0, 180.0, 360.0);
    let height = 30.0 + row * data.len().max(1) as f64;
    let max = data.iter().map(|(_, v)| *v).fold(0.0, f64::max);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" role=\"img\" viewBox=\"0 0 {w} {height}\" \
         width=\"100%\" aria-label=\"{t}\"><text x=\"0\" y=\"16\" class=\"title\">{t}</text>",
        w = label_w + bar_w + 120.0,
        t = esc(title)
    );
    if data.is_empty() {
        svg.push_str("<text x=\"0\" y=\"44\">nothing recorded</text>");
    }
    for (i, (label, v)) in data.iter().enumerate() {
        let y = 26.0 + row * i as f64;
        let w = if max > 0.0 { (v / max * bar_w).max(1.0) } else { 1.0 };
        let _ = write!(
            svg,
            "<text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\">{label}</text>\
             <rect x=\"{bx}\" y=\"{y}\" width=\"{w:.1}\" height=\"16\" class=\"bar\"/>\
             <text x=\"{vx:.1}\" y=\"{ty}\">{value}</text>",
            lx = label_w - 6.0,
            ty = y + 13.0,
            label = esc(&choir_common::text::clipped(label, 28)),
            bx = label_w,
            vx = label_w + w + 6.0,
            value = esc(&fmt(*v)),
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_has_a_bar_per_key_scaled_to_the_largest_and_labels_escaped() {
        let data = vec![("2026-11-28".to_owned(), 10.0), ("<b>x</b>".to_owned(), 5.0)];
        let svg = bars("tokens per day", &data, |v| format!("{v}"));
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("width=\"360.0\"") && svg.contains("width=\"180.0\""), "{svg}");
        assert!(svg.contains("&lt;b&gt;x&lt;/b&gt;") && !svg.contains("<b>"), "{svg}");
        let many: Vec<(String, f64)> = (0..100).map(|i| (format!("k{i}"), i as f64)).collect();
        assert_eq!(bars("t", &many, |v| format!("{v}")).matches("<rect").count(), MAX_BARS);
        assert!(bars("t", &[], |v| format!("{v}")).contains("nothing recorded"));
    }
}
