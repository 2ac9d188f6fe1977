//! The cost ledger (issue 17, item 7): every relayed model call is recorded
//! with its estimated cost from the operator's price table, and
//! `choirctl usage` sums it by day, model, lane or agent.

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

#[test]
fn each_model_call_is_in_the_ledger_with_its_cost_and_usage_sums_it() {
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::start(vec![
        Step::call("choir.fs.write", json!({"path": "u.txt", "content": "u"})),
        Step::Text("counted".into()),
    ]);
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    config["llm"]["prices"] = json!({"fake-edge": {"prompt_per_mtok": 2.0, "completion_per_mtok": 10.0}});
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "count"]).trim(), "counted");

    // Two edge calls of 10 prompt and 5 completion tokens (the fake's usage).
    let by_model: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "usage", "demo", "--by", "model"])).unwrap();
    let rows = by_model["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{by_model}");
    assert_eq!((&rows[0]["key"], &rows[0]["calls"]), (&json!("fake-edge"), &json!(2)));
    assert_eq!((&rows[0]["prompt_tokens"], &rows[0]["completion_tokens"]), (&json!(20), &json!(10)));
    let cost = rows[0]["cost_usd"].as_f64().unwrap();
    assert!((cost - 2.0 * (10.0 * 2.0 + 5.0 * 10.0) / 1e6).abs() < 1e-12, "{cost}");
    let by_lane: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "usage", "--by", "lane"])).unwrap();
    assert_eq!(by_lane["rows"][0]["key"], "edge");
    let table = choird.ctl_ok(&["usage", "--since", "1h"]);
    assert!(table.contains("DAY") && table.contains("total") && table.contains("$0.0001"), "{table}");
    let later: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "usage", "--since", "2999-01-01"])).unwrap();
    assert_eq!(later["rows"], json!([]));
    // The same calls are in the ledger table with their cost.
    let mut db = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let costed: i64 =
        db.query_one("SELECT count(*) FROM llm_calls WHERE agent_id = 'demo' AND cost_usd > 0", &[]).unwrap().get(0);
    assert_eq!(costed, 2);

    // Bad input is refused with the fix.
    assert!(choird.ctl_err(&["usage", "--by", "week"]).contains("use day, model, lane or agent"));
    assert!(choird.ctl_err(&["usage", "--since", "soon"]).contains("give a time"));
    assert!(choird.ctl_err(&["usage", "ghost"]).contains("no agent \"ghost\""));
}
