//! `metrics_listen`: a Prometheus scrape parses with an
//! independent text-format parser and counts what happened; nothing else is
//! served on that port, and a non-loopback address is refused.

use choir_tests::fake_llm::Step;
use choir_tests::harness::{test_config, TempHome};
use choir_tests::scenario::Scenario;
use serde_json::json;

fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape.samples.iter().find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))).map(
        |s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        },
    )
}

#[test]
fn a_scrape_parses_and_counts_agents_turns_tool_calls_and_tokens() {
    let port = choir_tests::ports::unused_port();
    let Some(Scenario { pg: _pg, llm: _fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.fs.write", json!({"path": "m.txt", "content": "m"})),
            Step::Text("measured".into()),
        ])
        .agents(&["demo", "idle"])
        .config(|c| c["metrics_listen"] = json!(format!("127.0.0.1:{port}")))
        .secrets(json!({"llm_key": "k"}))
        .build()
    else {
        return;
    };
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "measure"]).trim(), "measured");

    let url = format!("http://127.0.0.1:{port}/metrics");
    let mut resp = ureq::get(&url).call().unwrap();
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
    let text = resp.body_mut().read_to_string().unwrap();
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    assert_eq!(value(&scrape, "choir_up", &[]), Some(1.0));
    assert_eq!(value(&scrape, "choir_agents", &[("state", "running")]), Some(1.0), "{text}");
    assert_eq!(value(&scrape, "choir_agents", &[("state", "stopped")]), Some(1.0), "{text}");
    assert_eq!(value(&scrape, "choir_turns_total", &[("agent", "demo")]), Some(1.0), "{text}");
    assert_eq!(value(&scrape, "choir_tool_calls_total", &[("agent", "demo"), ("outcome", "ok")]), Some(1.0), "{text}");
    assert_eq!(value(&scrape, "choir_agent_replicated_seq", &[("agent", "demo")]), Some(1.0), "{text}");
    let prompt = value(&scrape, "choir_model_tokens_total", &[("agent", "demo"), ("kind", "prompt")]);
    assert!(prompt.is_some_and(|p| p > 0.0), "{text}");
    assert!(scrape.docs.contains_key("choir_tool_calls_total"), "HELP lines parsed");

    // Only the page: not the admin API, not the agent RPC, not a write.
    for (method, path) in [("GET", "/admin/v1/status"), ("POST", "/metrics"), ("GET", "/v1/HEARTBEAT")] {
        let url = format!("http://127.0.0.1:{port}{path}");
        let r = if method == "GET" { ureq::get(&url).call() } else { ureq::post(&url).send_empty() };
        assert!(matches!(r, Err(ureq::Error::StatusCode(404))), "{method} {path}: {r:?}");
    }
}

#[test]
fn metrics_on_a_public_address_are_refused_unless_asked_for() {
    let mut config = test_config("http://127.0.0.1:9/v1", None, &["demo"]);
    config["metrics_listen"] = json!("0.0.0.0:9464");
    let home = TempHome::new(&config, &json!({"llm_key": "k"}));
    let (status, stderr) = home.run_choird_to_exit(std::time::Duration::from_secs(30));
    assert!(!status.success());
    assert!(stderr.contains("metrics_listen") && stderr.contains("metrics_allow_non_loopback"), "{stderr}");
}
