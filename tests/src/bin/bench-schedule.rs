//! `bench-schedule` (`make bench`): the scheduler's overhead with 10,000 jobs
//! across 10 agents — choird's CPU while none is due, and the
//! firing latency (the due time → choird accepting the agent's start of the
//! core job, `started_at` in the firing's row) p50/p99 over 200 firings at
//! distinct seconds. The real system clock, a release build, the process
//! runtime and a fake model that answers at once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const AGENTS: usize = 10;
const JOBS: usize = 10_000;
const MEASURED: usize = 200;
/// Seconds of idle CPU measured.
const IDLE_S: u64 = 30;

/// choird's CPU time (user + system) so far, from /proc.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command (which may hold spaces) start after ") ".
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // /proc counts in USER_HZ, which Linux fixes at 100 for this interface.
    Duration::from_secs_f64(ticks as f64 / 100.0)
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q) as usize]
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL is needed");
    let fake = FakeLlm::with_responder(|_, _| Some(Step::Text("done".into())));
    fake.forget_bodies();
    let names: Vec<String> = (0..AGENTS).map(|i| format!("a{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &refs);
    for n in &names {
        config["agents"][n] = json!({"max_core_jobs": 8});
    }
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    for n in &names {
        choird.ctl_ok(&["agent", "start", n]);
    }
    let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
    let add = |agent: &str, spec: Value| {
        let mut r = admin.post(format!("http://localhost/admin/v1/agents/{agent}/schedule")).send_json(spec).unwrap();
        assert_eq!(r.status(), 200, "{}", r.body_mut().read_to_string().unwrap());
    };
    // The idle load: jobs that fire a year from now.
    let t0 = Instant::now();
    for i in 0..JOBS - MEASURED {
        add(&names[i % AGENTS], json!({"name": format!("idle{i}"), "every_s": 366 * 86400, "prompt": "x"}));
    }
    let added = t0.elapsed();
    // The measured jobs: daily at a distinct second each, starting 40 s on.
    let start = jiff::Timestamp::now().as_second() + 40;
    for i in 0..MEASURED {
        let at = jiff::Timestamp::from_second(start + (i / 2) as i64).unwrap().to_zoned(jiff::tz::TimeZone::UTC);
        let cron = format!("{} {} {} * * *", at.second(), at.minute(), at.hour());
        add(&names[i % AGENTS], json!({"name": format!("m{i}"), "cron": cron, "prompt": "measure"}));
    }
    choir_tests::report!(
        "{JOBS} jobs across {AGENTS} agents added through the admin API in {:.1} s ({:.2} ms each, each checked against its agent)",
        added.as_secs_f64(),
        added.as_secs_f64() * 1e3 / (JOBS - MEASURED) as f64
    );

    // Idle: nothing due for the next 40 s.
    std::thread::sleep(Duration::from_secs(2));
    let pid = choird.pid();
    let (c0, w0) = (cpu(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(IDLE_S.min(35)));
    let idle = (cpu(pid) - c0).as_secs_f64() / w0.elapsed().as_secs_f64();
    choir_tests::report!(
        "choird idle with {JOBS} jobs and {AGENTS} connected agents: {:.2} % of one core",
        idle * 100.0
    );

    // Firing latency.
    let mut db = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let deadline = Instant::now() + Duration::from_secs(200);
    loop {
        let n: i64 =
            db.query_one("SELECT count(*) FROM schedule_firings WHERE started_at IS NOT NULL", &[]).unwrap().get(0);
        if n as usize >= MEASURED {
            break;
        }
        assert!(Instant::now() < deadline, "only {n} of {MEASURED} firings started");
        std::thread::sleep(Duration::from_millis(500));
    }
    let rows = db
        .query(
            "SELECT extract(epoch FROM started_at - scheduled_for)::float8 * 1000, state FROM schedule_firings
             WHERE started_at IS NOT NULL",
            &[],
        )
        .unwrap();
    let mut lat: Vec<f64> = rows.iter().map(|r| r.get::<_, f64>(0)).collect();
    let missed: i64 = db.query_one("SELECT count(*) FROM schedule_firings WHERE state = 'missed'", &[]).unwrap().get(0);
    choir_tests::report!(
        "firing latency (due → the agent's start accepted), {} firings at 2 a second: p50 {:.2} ms p99 {:.2} ms max {:.2} ms; missed {missed}",
        lat.len(),
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0)
    );
    for n in &names {
        choird.ctl_ok(&["agent", "stop", n]);
    }
}
