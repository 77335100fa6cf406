//! The alert rules (deploy/prometheus/alerts.yaml), their promtool tests
//! and the Grafana dashboard (deploy/grafana/credbroker.json) use only
//! metrics the broker has: every `credbroker_*` name in them is in the
//! metrics catalogue (`Metrics::catalogue`, which tests/it/reference/
//! holds equal to docs/OPERATIONS.md), a histogram's through its
//! `_bucket`, `_sum` or `_count` series; every label in a selector of one
//! is among its labels (or `instance`, `job`, added by the scrape, or `le`
//! on a bucket), and every label a `by`/`on` clause groups an expression
//! of those metrics by is a label of one of them or a scrape label. promtool
//! checks the syntax and the rules' behaviour (scripts/check-deploy); this
//! checks the names, which promtool cannot know.
// Test helpers panic loudly on failure, as tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use credbroker::internals::metrics::{MetricInfo, Metrics};

const FILES: &[(&str, &str)] = &[
    (
        "deploy/prometheus/alerts.yaml",
        include_str!("../../../deploy/prometheus/alerts.yaml"),
    ),
    (
        "deploy/prometheus/alerts.test.yaml",
        include_str!("../../../deploy/prometheus/alerts.test.yaml"),
    ),
    (
        "deploy/grafana/credbroker.json",
        include_str!("../../../deploy/grafana/credbroker.json"),
    ),
];

/// Labels every scraped series may carry besides its own.
const SCRAPE_LABELS: &[&str] = &["instance", "job"];

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The catalogue entry a series name belongs to, and whether it is a
/// histogram's bucket series.
fn metric_of<'a>(name: &str, catalogue: &'a [MetricInfo]) -> Option<(&'a MetricInfo, bool)> {
    if let Some(m) = catalogue.iter().find(|m| m.name == name) {
        return Some((m, false));
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        catalogue
            .iter()
            .find(|m| m.name == base && m.kind == "histogram")
            .map(|m| (m, *suffix == "_bucket"))
    })
}

/// The label names inside `{...}` at the start of `rest` (JSON's `\"`
/// unescaped first).
fn selector_labels(rest: &str) -> Vec<String> {
    let Some(body) = rest.strip_prefix('{') else {
        return Vec::new();
    };
    let body = &body[..body.find('}').unwrap_or(body.len())];
    body.split(',')
        .filter_map(|m| {
            let name: String = m.trim().chars().take_while(|c| is_name_char(*c)).collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// The label names of every `by (...)` and `on (...)` clause in `text`.
fn grouping_labels(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for kw in ["by", "on"] {
        let mut rest = text;
        while let Some(i) = rest.find(&format!("{kw} (")) {
            let before = rest[..i].chars().last();
            rest = &rest[i + kw.len() + 2..];
            if before.is_some_and(is_name_char) {
                continue;
            }
            let body = &rest[..rest.find(')').unwrap_or(rest.len())];
            out.extend(body.split(',').map(|l| l.trim().to_string()));
        }
    }
    out
}

/// What `file`'s text uses that the catalogue does not have.
fn problems(file: &str, text: &str, catalogue: &[MetricInfo]) -> (Vec<String>, usize) {
    let text = text.replace("\\\"", "\"");
    let mut out = Vec::new();
    let mut uses = 0;
    // One expression a line (YAML) or a JSON string: grouping clauses are
    // read per line, with the metrics of that line.
    for line in text.lines() {
        let mut line_labels: Vec<String> = SCRAPE_LABELS.iter().map(|s| s.to_string()).collect();
        let mut any = false;
        let mut rest = line;
        while let Some(i) = rest.find("credbroker_") {
            let before = rest[..i].chars().last();
            let tail = &rest[i..];
            let len = tail.find(|c: char| !is_name_char(c)).unwrap_or(tail.len());
            let name = &tail[..len];
            rest = &tail[len..];
            // A word that merely starts so (`credbroker_*` in a comment).
            if before.is_some_and(is_name_char) || len == "credbroker_".len() {
                continue;
            }
            uses += 1;
            any = true;
            let Some((m, bucket)) = metric_of(name, catalogue) else {
                out.push(format!("{file}: {name} is not a metric of the broker"));
                continue;
            };
            line_labels.extend(m.labels.iter().cloned());
            if bucket {
                line_labels.push("le".into());
            }
            for l in selector_labels(rest) {
                let ok = m.labels.contains(&l)
                    || SCRAPE_LABELS.contains(&l.as_str())
                    || (bucket && l == "le");
                if !ok {
                    out.push(format!(
                        "{file}: {name} has no label {l} (its labels: {:?})",
                        m.labels
                    ));
                }
            }
        }
        if any {
            for l in grouping_labels(line) {
                if !line_labels.contains(&l) {
                    out.push(format!(
                        "{file}: grouped by {l}, which none of the line's metrics has: {}",
                        line.trim()
                    ));
                }
            }
        }
    }
    (out, uses)
}

#[test]
fn alerts_and_dashboard_use_only_the_metrics_and_labels_of_the_catalogue() {
    let catalogue = Metrics::new().catalogue();
    assert!(catalogue.len() > 10, "{catalogue:?}");
    let mut all = Vec::new();
    for (file, text) in FILES {
        let (p, uses) = problems(file, text, &catalogue);
        assert!(
            uses >= 5,
            "{file}: only {uses} credbroker_ names found: is the scan reading it?"
        );
        all.extend(p);
    }
    assert!(all.is_empty(), "{}", all.join("\n"));

    // The same scan refuses a name, a label and a grouping the broker does
    // not have, in each file's syntax...
    for (bad, why) in [
        (
            "expr: credbroker_derive_total > 0",
            "credbroker_derive_total is not a metric",
        ),
        (
            "expr: credbroker_frozen{reason=\"cap\"} == 1",
            "credbroker_frozen has no label reason",
        ),
        (
            "\"expr\": \"sum by (tool) (credbroker_frozen)\"",
            "grouped by tool",
        ),
        (
            "expr: credbroker_frozen_bucket",
            "credbroker_frozen_bucket is not a metric",
        ),
    ] {
        let (p, _) = problems("control", bad, &catalogue);
        assert!(p.iter().any(|p| p.contains(why)), "{bad}: {p:?}");
    }
    // ... and passes their correct forms.
    for good in [
        "expr: credbroker_derives_total{outcome=\"denied\",instance=~\".*\"} > 0",
        "\"expr\": \"histogram_quantile(0.99, sum by (service, le) (rate(credbroker_proxy_duration_seconds_bucket{le=\\\"1\\\"}[5m])))\"",
        "expr: x and on (instance) (credbroker_frozen offset 10m)",
    ] {
        let (p, uses) = problems("control", good, &catalogue);
        assert!(p.is_empty() && uses == 1, "{good}: {p:?}");
    }
}
