//! What the benchmarks share: a client of an agent socket holding the
//! agent's token (choird's host tools called as the agent calls them) and
//! latency statistics.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::Choird;
use crate::observe::wait_for;

/// A client of one agent's socket with its lease token.
pub struct HostToolClient {
    /// The agent's lease token.
    pub token: String,
    /// A client of its socket.
    pub http: ureq::Agent,
}

impl HostToolClient {
    /// Waits for the hostile agent `id` to hand over its token (see `hostile-agent`).
    pub fn of(choird: &Choird, id: &str) -> HostToolClient {
        let token_file = choird.workspace(id).join("hostile.token");
        let mut token = String::new();
        wait_for("the agent's token", Duration::from_secs(30), || {
            token = std::fs::read_to_string(&token_file).unwrap_or_default();
            !token.is_empty()
        });
        let socket = choird.home.path().join("socks/agents").join(id).join("choird.sock");
        HostToolClient {
            token,
            http: choir_common::unix_http::agent_for_socket(&socket, Some(Duration::from_secs(120))),
        }
    }

    /// EXECUTE_HOST_TOOL: the result, or choird's status and answer.
    pub fn try_tool(&self, tool: &str, input: Value, call_id: &str) -> Result<Value, (u16, String)> {
        let body = json!({"tool": tool, "input": input, "lane": "edge", "call_id": call_id});
        let mut resp = self
            .http
            .post("http://localhost/rpc/v1/EXECUTE_HOST_TOOL")
            .header("Authorization", &format!("Bearer {}", self.token))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .map_err(|e| (0, e.to_string()))?;
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        match resp.status().as_u16() {
            200 => Ok(serde_json::from_str::<Value>(&text).map_err(|e| (200, e.to_string()))?["result"].clone()),
            status => Err((status, text)),
        }
    }

    /// EXECUTE_HOST_TOOL; the result (panics on anything but 200).
    pub fn tool(&self, tool: &str, input: Value, call_id: &str) -> Value {
        self.try_tool(tool, input, call_id).unwrap_or_else(|(status, text)| panic!("{tool}: {status} {text}"))
    }
}

/// A number field of `/proc/PID/status` (`"VmRSS:"`, `"Threads:"`, … in
/// the units the kernel gives: kB for sizes); 0 when the process or the
/// field is gone.
pub fn proc_status(pid: u32, key: &str) -> u64 {
    proc_field(pid, "status", key)
}

/// The number after `key` in `/proc/PID/<file>`; 0 when the process or the
/// field is gone.
fn proc_field(pid: u32, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The `q` quantile (sorts `v`).
pub fn pct(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * q) as usize]
}

/// Milliseconds, two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Runs `f` `n` times, timing each.
pub fn timed(n: usize, mut f: impl FnMut(usize)) -> Vec<Duration> {
    let mut last: Option<Instant> = None;
    (0..n)
        .map(|i| {
            // Paced (the wait is not measured): calls through choird are an
            // agent's, and an agent may make 200 a second (`sessions/auth.rs`);
            // faster, the bench would measure its own 429s.
            if let Some(wait) = last.map(|l| PACE.saturating_sub(l.elapsed())) {
                std::thread::sleep(wait);
            }
            let t = Instant::now();
            last = Some(t);
            f(i);
            t.elapsed()
        })
        .collect()
}

/// The least time between the starts of two timed calls (150 a second).
pub const PACE: Duration = Duration::from_micros(6_667);

/// Prints direct vs through-choird latencies and their ratio.
pub fn compare(what: &str, direct: Vec<Duration>, via: Vec<Duration>) {
    compare_through(what, "choird", direct, via);
}

/// Prints direct vs through-`layer` latencies and their ratio.
pub fn compare_through(what: &str, layer: &str, mut direct: Vec<Duration>, mut via: Vec<Duration>) {
    let (d50, v50) = (pct(&mut direct, 0.5), pct(&mut via, 0.5));
    crate::report!(
        "{what}, n={}: direct p50 {} p99 {}; through {layer} p50 {} p99 {}; ratio {:.2} ({layer} adds {})",
        via.len(),
        ms(d50),
        ms(pct(&mut direct, 0.99)),
        ms(v50),
        ms(pct(&mut via, 0.99)),
        v50.as_secs_f64() / d50.as_secs_f64(),
        ms(v50.saturating_sub(d50))
    );
}

/// The file `make bench` gathers every benchmark's results in (one row per
/// result line: the benchmark's name, a tab, the line), for its one table.
pub const TABLE_ENV: &str = "CHOIR_BENCH_TABLE";

/// Prints a benchmark's result line and, when [`TABLE_ENV`] names a file (as
/// `make bench` does), appends it there as a row of the combined table.
pub fn report(line: &str) {
    use std::io::Write;
    println!("{line}");
    let Ok(path) = std::env::var(TABLE_ENV) else { return };
    let text = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        return;
    }
    let bench = std::env::args()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{bench}\t{text}\n").as_bytes()));
    if let Err(e) = appended {
        eprintln!("cannot add to the benchmark table {path}: {e}");
    }
}

/// `println!` for a benchmark's results: printed, and a row of `make bench`'s table.
#[macro_export]
macro_rules! report {
    ($($arg:tt)*) => {
        $crate::bench::report(&format!($($arg)*))
    };
}

/// A number field of `/proc/PID/smaps_rollup` (`"Pss:"`, `"Rss:"`, in kB);
/// 0 when the process is gone.
pub fn smaps_rollup(pid: u32, key: &str) -> u64 {
    proc_field(pid, "smaps_rollup", key)
}

/// `root` and every process descended from it, now (none for pid 0, "no
/// process").
pub fn process_tree(root: u32) -> Vec<u32> {
    if root == 0 {
        return Vec::new();
    }
    std::iter::once(root)
        .chain(choir_common::proc_tree::descendants_of(root as i32, 100_000).into_iter().map(|p| p as u32))
        .collect()
}

/// The managed cluster's postmaster under a choird home (0 when it is not running).
pub fn postmaster_of(choird: &crate::harness::Choird) -> u32 {
    choird::db::cluster::ManagedCluster::postmaster_pid(&choird.home.path().join("pg")).unwrap_or(0)
}

/// CPU time used so far by choird (`choird_pid`), by everything below it
/// (its agents and what they run) and by the cluster under `postmaster`:
/// every process of the system but a benchmark's own.
pub fn system_cpu(choird_pid: u32, postmaster: u32) -> [Duration; 3] {
    let below = process_tree(choird_pid).iter().filter(|p| **p != choird_pid).map(|p| cpu_time(*p)).sum();
    let postgres = process_tree(postmaster).iter().map(|p| cpu_time(*p)).sum();
    [cpu_time(choird_pid), below, postgres]
}

/// Total CPU time (user + system) `pid` has used, from `/proc/PID/stat`;
/// zero when it is gone.
pub fn cpu_time(pid: u32) -> Duration {
    stat_cpu(&format!("/proc/{pid}/stat")).map_or(Duration::ZERO, |(_, d)| d)
}

/// A `stat` file's name field and its utime + stime.
fn stat_cpu(path: &str) -> Option<(String, Duration)> {
    let stat = std::fs::read_to_string(path).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_owned();
    let ticks: u64 = rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<u64>().ok()).sum();
    // USER_HZ is 100 on every Linux Choir runs on.
    Some((name, Duration::from_millis(ticks * 10)))
}

/// A thread's time on a CPU so far and how many times it was put on one
/// (woken, or resumed after being preempted), from its `schedstat`:
/// nanoseconds, where `stat` counts 10 ms ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ran {
    /// Time on a CPU.
    pub cpu: Duration,
    /// Times put on a CPU.
    pub runs: u64,
}

impl Ran {
    /// What ran since `before`.
    pub fn since(self, before: Ran) -> Ran {
        Ran { cpu: self.cpu.saturating_sub(before.cpu), runs: self.runs.saturating_sub(before.runs) }
    }
}

/// A `schedstat` file: time on a CPU (ns), time waiting for one, runs.
fn schedstat(path: &std::path::Path) -> Option<Ran> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut f = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    let cpu = f.next()??;
    let runs = f.nth(1)??;
    Some(Ran { cpu: Duration::from_nanos(cpu), runs })
}

/// What every thread of `pids` ran so far ([`Ran`]), by "process/thread"
/// name (threads of the same name summed; a PostgreSQL process named by its
/// role — `postgres/backend`, `postgres/walwriter` — from its title). A
/// thread that ended is not counted: compare the sum with [`cpu_time`]'s.
pub fn thread_cpu(pids: &[u32]) -> std::collections::BTreeMap<String, Ran> {
    let mut by = std::collections::BTreeMap::new();
    for pid in pids {
        let Some((process, _)) = stat_cpu(&format!("/proc/{pid}/stat")) else { continue };
        let process = if process == "postgres" {
            let title = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let role = title.trim_end_matches('\0').strip_prefix("postgres: ").unwrap_or("postmaster");
            // Backends' titles are "user database [local] STATE".
            if role.contains("[local]") {
                "postgres/backend".to_owned()
            } else {
                format!("postgres/{role}")
            }
        } else {
            process
        };
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for task in tasks.flatten() {
            let path = task.path().join("stat");
            let (Some((thread, _)), Some(ran)) =
                (stat_cpu(&path.to_string_lossy()), schedstat(&task.path().join("schedstat")))
            else {
                continue;
            };
            let key = if process.starts_with("postgres/") { process.clone() } else { format!("{process}/{thread}") };
            let sum: &mut Ran = by.entry(key).or_default();
            (sum.cpu, sum.runs) = (sum.cpu + ran.cpu, sum.runs + ran.runs);
        }
    }
    by
}
