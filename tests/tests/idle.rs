//! What an idle choird does with the database: nothing. The scheduler reads
//! the schedule when a change wakes it or a due time comes, an idle agent's
//! long-polls wait without asking PostgreSQL, so the pool's connection is
//! unused and closes (its backend is most of an idle system's memory).

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::json;
use std::time::Duration;

/// Lines choird logged for each use of a pooled connection.
fn uses(choird: &Choird) -> usize {
    choird.stderr().lines().filter(|l| l.contains("choird::db::uses")).count()
}

/// Idle past the old scheduler's 5 s look, its 30 s clock cap and the
/// agent's 25 s long-poll, with an agent running and a job scheduled for
/// tomorrow: not one use. The control: a change (a job added) is read at
/// once, so the count does move when the database is used.
#[test]
fn an_idle_choird_with_a_running_agent_and_a_job_leaves_the_database_alone() {
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::with_responder(|_, _| Some(Step::Text("ok".into())));
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start_logging(&config, &json!({"llm_key": "k"}), "info,choird::db::uses=trace");
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.wait_running("demo");
    choird.ctl_ok(&["schedule", "add", "demo", "daily", "--cron", "0 9 * * *", "--prompt", "Morning."]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hi"]), "ok\n");
    // The agent's next long-poll looks once, then waits.
    std::thread::sleep(Duration::from_secs(2));
    let before = uses(&choird);
    std::thread::sleep(Duration::from_secs(35));
    let idle = uses(&choird) - before;
    assert_eq!(idle, 0, "choird used the database {idle} time(s) while idle:\n{}", choird.stderr());
    choird.ctl_ok(&["schedule", "add", "demo", "evening", "--cron", "0 18 * * *", "--prompt", "Evening."]);
    assert!(uses(&choird) > before, "a change is read, so the count can move");
}
