//! `bench-docker` (`make bench`): agent cold start through choird (create →
//! start → token on stdin → INIT_HELLO → set-up → RUNNING) against a bare
//! `true` container started through the same Engine API, median of 10 each;
//! crash-to-resumed time after `kill -9` of the container; image sizes.
//! Needs the engine, the base image and PostgreSQL, like `make test`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{docker_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn status(choird: &Choird) -> Value {
    serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap()
}

fn main() {
    assert!(choir_tests::docker::available(), "the Docker engine and the base image are needed");
    let pg = TestPg::start().expect("PostgreSQL is needed");
    let fake = FakeLlm::start_on("127.0.0.1:0", vec![], Some(Step::Text("ok".into()))).unwrap();
    let choird = Choird::start(&docker_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    let engine = choir_tests::docker::engine();
    let built = Instant::now();
    choird.ctl_ok(&["agent", "build", "demo"]);
    choir_tests::report!("agent image build (cold cache): {:.1} s", built.elapsed().as_secs_f64());

    let mut agent_starts = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        choird.ctl_ok(&["agent", "start", "demo"]);
        agent_starts.push(t.elapsed());
        choird.ctl_ok(&["agent", "stop", "demo"]);
    }

    let mut bare = Vec::new();
    for i in 0..10 {
        let name = format!("choir-bench-true-{}-{i}", std::process::id());
        let config = json!({
            "Image": "choir-base:bookworm",
            "Cmd": ["true"],
            "User": "10001:10001",
            "NetworkDisabled": true,
            "HostConfig": {"CapDrop": ["ALL"], "ReadonlyRootfs": true, "NetworkMode": "none", "Init": true}
        });
        let t = Instant::now();
        let id = engine.create(&name, &config).unwrap();
        engine.start(&id).unwrap();
        engine.wait(&id).unwrap();
        bare.push(t.elapsed());
        engine.remove(&id).unwrap();
    }

    let (mut resumes, mut noticed) = (Vec::new(), Vec::new());
    let mut image = String::new();
    for _ in 0..10 {
        // A fresh start each time, so every crash is a first crash.
        choird.ctl_ok(&["agent", "start", "demo"]);
        let before = status(&choird)["container"].as_str().unwrap().to_owned();
        let t = Instant::now();
        engine.kill(&before, "KILL").unwrap();
        let mut seen = None;
        loop {
            let s = status(&choird);
            // choird has noticed once the old container is no longer the running one.
            if seen.is_none() && !(s["state"] == "running" && s["container"] == before.as_str()) {
                seen = Some(t.elapsed());
            }
            if s["state"] == "running" && s["container"].as_str().is_some_and(|c| c != before) {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "no resume");
            std::thread::sleep(Duration::from_millis(5));
        }
        resumes.push(t.elapsed());
        noticed.push(seen.unwrap_or_default());
        image = status(&choird)["image"].as_str().unwrap().to_owned();
        choird.ctl_ok(&["agent", "stop", "demo"]);
    }
    let size = |name: &str| engine.image(name).unwrap().map(|i| i["Size"].as_f64().unwrap_or(0.0) / 1e6).unwrap_or(0.0);

    choir_tests::report!(
        "agent cold start (agent start → RUNNING): median {:.0} ms (min {:.0} ms, max {:.0} ms, n=10)",
        median(agent_starts.clone()).as_secs_f64() * 1e3,
        agent_starts.iter().min().unwrap().as_secs_f64() * 1e3,
        agent_starts.iter().max().unwrap().as_secs_f64() * 1e3
    );
    choir_tests::report!(
        "bare `true` container (create → start → exit): median {:.0} ms (n=10)",
        median(bare).as_secs_f64() * 1e3
    );
    let restart: Vec<Duration> = resumes.iter().zip(&noticed).map(|(r, n)| r.saturating_sub(*n)).collect();
    choir_tests::report!(
        "crash-to-resumed (kill -9 → new container RUNNING; the first restart is immediate): median {:.0} ms (min {:.0}, max {:.0}, n=10): the exit noticed after median {:.0} ms, then remove + create + start + INIT_HELLO + recovery to RUNNING median {:.0} ms",
        median(resumes.clone()).as_secs_f64() * 1e3,
        resumes.iter().min().unwrap().as_secs_f64() * 1e3,
        resumes.iter().max().unwrap().as_secs_f64() * 1e3,
        median(noticed).as_secs_f64() * 1e3,
        median(restart).as_secs_f64() * 1e3
    );
    choir_tests::report!(
        "image sizes: agent {image} {:.0} MB, base choir-base:bookworm {:.0} MB",
        size(&image),
        size("choir-base:bookworm")
    );
}
