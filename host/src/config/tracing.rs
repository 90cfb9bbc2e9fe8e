//! `[tracing]`: span export over OTLP and the trace link of the console
//! (docs/tracing.md). Without the table, or without `endpoint`, no span is
//! built; `traceparent` headers are written either way.

use serde::Deserialize;
use std::collections::BTreeMap;

/// The placeholder of `tracing.ui`.
pub const TRACE_ID_PLACEHOLDER: &str = "{trace_id}";

/// `[tracing]` as written, and (validated) as hopper runs it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// Where spans go: the OTLP/HTTP traces URL of a collector, such as
    /// `http://127.0.0.1:4318/v1/traces`. Without it nothing is exported.
    pub endpoint: Option<String>,
    /// `service.name` of the spans. Default `hopper`.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// The share of traces whose spans are exported, 0.0 to 1.0. Default 1.
    #[serde(default = "default_sampling")]
    pub sampling: f64,
    /// More resource attributes, such as `"deployment.environment" = "prod"`.
    #[serde(default)]
    pub resource: BTreeMap<String, String>,
    /// Finished spans waiting for export, at most; past it they are
    /// dropped and counted. Default 8192.
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// A trace viewer's URL with `{trace_id}`, for links from the console
    /// and `hopper dlq show`.
    pub ui: Option<String>,
}

fn default_service_name() -> String {
    "hopper".into()
}
fn default_sampling() -> f64 {
    1.0
}
fn default_queue() -> usize {
    8192
}

impl TracingConfig {
    pub(super) fn resolve(&self, problems: &mut Vec<String>) -> Option<TracingConfig> {
        let before = problems.len();
        if let Some(endpoint) = &self.endpoint {
            match endpoint.parse::<http::Uri>() {
                Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
                Ok(uri) if uri.scheme_str() == Some("https") => problems.push(format!(
                    "tracing.endpoint `{endpoint}`: https is not supported; send to a collector on http://, such as a local OpenTelemetry Collector"
                )),
                _ => problems.push(format!(
                    "tracing.endpoint `{endpoint}` is not an http:// URL such as http://127.0.0.1:4318/v1/traces"
                )),
            }
        }
        if self.service_name.trim().is_empty() {
            problems.push("tracing.service_name is empty".into());
        }
        if !(0.0..=1.0).contains(&self.sampling) {
            problems.push(format!(
                "tracing.sampling {} is not a share between 0.0 and 1.0",
                self.sampling
            ));
        }
        for key in self.resource.keys().filter(|k| k.trim().is_empty()) {
            problems.push(format!("tracing.resource has an empty key `{key}`"));
        }
        if self.queue == 0 {
            problems.push("tracing.queue is 0; it must hold at least one span".into());
        }
        if let Some(ui) = &self.ui {
            check_ui(ui, problems);
        }
        (problems.len() == before).then(|| self.clone())
    }

    /// The trace viewer's link for `trace_id`, when `ui` is set.
    pub fn link(&self, trace_id: &str) -> Option<String> {
        self.ui
            .as_ref()
            .map(|ui| ui.replace(TRACE_ID_PLACEHOLDER, trace_id))
    }
}

/// `tracing.ui`: an http(s) URL with `{trace_id}` and no other placeholder.
fn check_ui(ui: &str, problems: &mut Vec<String>) {
    let filled = ui.replace(TRACE_ID_PLACEHOLDER, "0af7651916cd43dd8448eb211c80319c");
    if !ui.contains(TRACE_ID_PLACEHOLDER) {
        problems.push(format!(
            "tracing.ui `{ui}` has no {TRACE_ID_PLACEHOLDER}, such as https://jaeger.example/trace/{TRACE_ID_PLACEHOLDER}"
        ));
    } else if filled.contains(['{', '}']) {
        problems.push(format!(
            "tracing.ui `{ui}` has a placeholder other than {TRACE_ID_PLACEHOLDER}"
        ));
    } else {
        match filled.parse::<http::Uri>() {
            Ok(uri)
                if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => {}
            _ => problems.push(format!(
                "tracing.ui `{ui}` is not an http:// or https:// URL"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(toml: &str) -> Vec<String> {
        let config: TracingConfig = toml::from_str(toml).unwrap();
        let mut problems = Vec::new();
        config.resolve(&mut problems);
        problems
    }

    #[test]
    fn a_valid_table_resolves() {
        assert!(problems(
            "endpoint = \"http://127.0.0.1:4318/v1/traces\"\nsampling = 0.1\nresource = { \"deployment.environment\" = \"prod\" }\nui = \"https://jaeger.example/trace/{trace_id}\""
        )
        .is_empty());
        assert!(problems("ui = \"http://127.0.0.1:16686/trace/{trace_id}?x=1\"").is_empty());
    }

    #[test]
    fn each_problem_names_its_key() {
        let all = problems(
            "endpoint = \"collector:4318\"\nservice_name = \" \"\nsampling = 1.5\nqueue = 0\nresource = { \"\" = \"x\" }\nui = \"https://jaeger.example/trace/\"",
        );
        for key in [
            "tracing.endpoint",
            "tracing.service_name",
            "tracing.sampling",
            "tracing.queue",
            "tracing.resource",
            "tracing.ui",
        ] {
            assert!(all.iter().any(|p| p.starts_with(key)), "{key}: {all:?}");
        }
        assert_eq!(all.len(), 6, "{all:?}");
        assert!(problems("endpoint = \"https://c.example/v1/traces\"")[0].contains("https"));
        assert!(problems("ui = \"https://j.example/{trace_id}/{span_id}\"")[0].contains("other"));
        assert!(problems("ui = \"jaeger/{trace_id}\"")[0].contains("not an http"));
        let unknown = toml::from_str::<TracingConfig>("sample = 1.0").unwrap_err();
        assert!(unknown.to_string().contains("sample"), "{unknown}");
    }

    #[test]
    fn the_link_fills_in_the_trace_id() {
        let config: TracingConfig =
            toml::from_str("ui = \"https://jaeger.example/trace/{trace_id}\"").unwrap();
        assert_eq!(
            config.link("abc").as_deref(),
            Some("https://jaeger.example/trace/abc")
        );
    }
}
