//! `choir.notion.query` through the real pipeline against a fake of the
//! Notion API: search, a page rendered from its blocks (two pages of
//! children), a database query with a filter and bounded pagination, 429
//! waited out, a bad token and a bad filter as clear errors, ids that
//! cannot become paths, and `choirctl tools check`.

use choir_tests::fake_notion::{FakeNotion, DATABASE_ID, INJECTED, PAGE_BLOCKS, PAGE_ID};
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use choir_tests::tool_calls::{assert_wrapped, call, caller, failed, ok};
use serde_json::json;

const TOKEN: &str = "secret_notion_integration_token";

#[test]
fn notion_search_pages_and_databases_arrive_as_wrapped_text_and_errors_are_clear() {
    let Some(pg) = TestPg::start() else { return };
    let llm = caller();
    let notion = FakeNotion::start(TOKEN);
    let mut c = test_config(&llm.base_url(), Some(&pg.url()), &["demo", "wrong"]);
    c["agents"]["demo"]["notion"] = json!({"token_secret": "notion", "base_url": notion.base_url()});
    c["agents"]["wrong"]["notion"] = json!({"token_secret": "notion_old", "base_url": notion.base_url()});
    let choird = Choird::start(&c, &json!({"llm_key": "k", "notion": TOKEN, "notion_old": "secret_revoked"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let q = |args: serde_json::Value| call(&choird, "demo", "choir.notion.query", args);

    let r = q(json!({"mode": "search", "query": "plan"}));
    ok(&r);
    assert_eq!(r["output_trust"], "untrusted");
    let text = r["content"].as_str().unwrap();
    assert_wrapped(text, &format!("{}/v1/search", notion.base_url()));
    assert!(text.contains("[page] Project plan") && text.contains(PAGE_ID) && !text.contains("Tasks"), "{text}");
    let r = q(json!({"mode": "search", "query": "", "kind": "database"}));
    assert!(ok(&r)["content"].as_str().unwrap().contains("[database] Tasks"), "{r}");

    let before = notion.requests().len();
    let r = q(json!({"mode": "page", "page_id": PAGE_ID}));
    let text = ok(&r)["content"].as_str().unwrap().to_owned();
    assert!(text.starts_with("<untrusted source=\"https://www.notion.so/Project-plan-"), "{text}");
    assert!(
        text.contains("Title: Project plan") && text.contains("Status: Active") && text.contains("# Plan"),
        "{text}"
    );
    assert!(text.contains("[x] ship the web tools") && text.contains(INJECTED), "{text}");
    assert!(text.contains(&format!("Line {}", PAGE_BLOCKS - 1)), "both pages of blocks: {text}");
    let asked: Vec<String> = notion.requests()[before..].to_vec();
    assert_eq!(asked.len(), 3, "the page and two pages of children: {asked:?}");

    // Pagination is bounded by limit; the filter goes to Notion as given.
    let before = notion.requests().len();
    let r = q(json!({"mode": "database", "database_id": DATABASE_ID, "limit": 100}));
    let text = ok(&r)["content"].as_str().unwrap().to_owned();
    assert!(text.contains("1. Task 0") && text.contains("100. Task 99") && !text.contains("Task 100"), "{text}");
    assert!(r["note"].as_str().is_some_and(|n| n.contains("more")), "{r}");
    assert_eq!(notion.requests().len() - before, 1);
    let r = q(
        json!({"mode": "database", "database_id": DATABASE_ID, "filter": {"property": "Done", "checkbox": {"equals": true}}}),
    );
    let text = ok(&r)["content"].as_str().unwrap().to_owned();
    assert!(
        text.contains("Task 0")
            && !text.contains("Task 1\n")
            && text.contains("Done: yes")
            && !text.contains("Done: no"),
        "{text}"
    );

    // 429 with Retry-After is waited out.
    notion.rate_limit_next(1);
    ok(&q(json!({"mode": "search", "query": "plan"})));

    // Clear errors; nothing asked of Notion for an id that is not one.
    let before = notion.requests().len();
    for (args, expect) in [
        (json!({"mode": "page", "page_id": "../../v1/users/me"}), "must be a Notion id"),
        (json!({"mode": "database", "database_id": "x"}), "must be a Notion id"),
    ] {
        let e = failed(&q(args.clone()));
        assert!(e.contains(expect), "{args}: {e}");
    }
    assert_eq!(notion.requests().len(), before);
    let e = failed(&q(json!({"mode": "page", "page_id": "33333333-3333-4333-8333-333333333333"})));
    assert!(e.contains("shared with the integration"), "{e}");
    let e = failed(&q(json!({"mode": "database", "database_id": DATABASE_ID, "filter": {"nonsense": 1}})));
    assert!(e.contains("refused the request") && e.contains("validation"), "{e}");
    notion.rate_limit_next(10);
    let e = failed(&q(json!({"mode": "search", "query": "plan"})));
    assert!(e.contains("rate limit"), "{e}");
    notion.rate_limit_next(0);

    // tools check tries the token; a revoked one says what to fix.
    let said = choird.ctl_ok(&["tools", "check", "demo", "choir.notion.query"]);
    assert!(said.contains("Notion accepts the token"), "{said}");
    let err = choird.ctl_err(&["tools", "check", "wrong", "choir.notion.query"]);
    assert!(
        err.contains("refused the integration token") && err.contains("notion_old") && !err.contains("secret_revoked"),
        "{err}"
    );
    let err = choird.ctl_err(&["tools", "check", "demo", "choir.tts.speak"]);
    assert!(err.contains("not served") && err.contains("voice"), "{err}");
    // The token is nowhere the model could see it.
    let shown: String = llm.requests().iter().map(|r| r.body.to_string()).collect();
    assert!(!shown.contains(TOKEN));
}
