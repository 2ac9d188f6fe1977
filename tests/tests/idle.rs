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

/// The times choird's main thread (the signal loop) has given up its CPU.
fn main_thread_wakes(choird: &Choird) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{0}/task/{0}/status", choird.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("voluntary_ctxt_switches in the main thread's status")
}

/// choird's signal loop slept 200 ms between looks at signals, reloads and
/// resumes: five wake-ups a second, for ever, on an idle machine. Now it
/// sleeps until a signal, a reload or a resume wakes it, or its duties of
/// the clock come (once a second). The control: a reload asked through the
/// admin API and a SIGHUP are still acted on, and SIGTERM still stops it.
#[test]
fn regression_choirds_main_thread_woke_five_times_a_second_at_rest() {
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::with_responder(|_, _| Some(Step::Text("ok".into())));
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let mut choird = Choird::start(&config, &json!({"llm_key": "k"}));
    std::thread::sleep(Duration::from_secs(1));
    let before = main_thread_wakes(&choird);
    std::thread::sleep(Duration::from_secs(4));
    let woke = main_thread_wakes(&choird) - before;
    assert!(woke <= 8, "choird's main thread woke {woke} times in 4 s at rest (its clock is once a second)");
    let reloads = |c: &Choird| c.stderr().matches("reloaded config.json").count();
    choird.ctl_ok(&["reload"]);
    assert_eq!(reloads(&choird), 1, "a reload through the admin API is done:\n{}", choird.stderr());
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
