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

/// How often each of choird's threads has given up its CPU, by name.
fn wakes_by_thread(choird: &Choird) -> std::collections::BTreeMap<String, u64> {
    let mut by = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{}/task", choird.pid())).unwrap().flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).map(str::to_owned);
        let wakes: u64 = field("voluntary_ctxt_switches:").and_then(|n| n.parse().ok()).unwrap_or(0);
        *by.entry(field("Name:").unwrap_or_default()).or_insert(0) += wakes;
    }
    by
}

/// choird at rest woke by the clock: its signal loop slept 200 ms between
/// looks at signals, reloads and resumes (five wake-ups a second), and the
/// thread that passes events to the Telegram gateway looked at its stop
/// flag every 500 ms (two more), for ever, on an idle machine. Now every
/// thread sleeps until something wakes it, but for the signal loop's
/// duties of the clock, once a second: all of choird's threads together
/// may wake at most twice a second here. The control: a reload asked
/// through the admin API and a SIGHUP are still acted on, and SIGTERM
/// still stops it.
#[test]
fn regression_choirds_threads_woke_seven_times_a_second_at_rest() {
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::with_responder(|_, _| Some(Step::Text("ok".into())));
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let mut choird = Choird::start(&config, &json!({"llm_key": "k"}));
    std::thread::sleep(Duration::from_secs(1));
    let before = wakes_by_thread(&choird);
    std::thread::sleep(Duration::from_secs(4));
    let after = wakes_by_thread(&choird);
    let woke: Vec<(String, u64)> = after
        .iter()
        .map(|(name, n)| (name.clone(), n.saturating_sub(before.get(name).copied().unwrap_or(0))))
        .filter(|(_, n)| *n > 0)
        .collect();
    let total: u64 = woke.iter().map(|(_, n)| n).sum();
    assert!(total <= 8, "choird's threads woke {total} times in 4 s at rest: {woke:?}");
    let reloads = |c: &Choird| c.stderr().matches("reloaded config.json").count();
    choird.ctl_ok(&["reload"]);
    choir_tests::observe::wait_for("the reload asked through the admin API", Duration::from_secs(10), || {
        reloads(&choird) == 1
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(choird.pid() as i32).unwrap(),
        rustix::process::Signal::HUP,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reloads(&choird) < 2 {
        assert!(std::time::Instant::now() < deadline, "SIGHUP not acted on:\n{}", choird.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(choird.stop().is_some_and(|s| s.success()), "SIGTERM stops choird cleanly");
}
