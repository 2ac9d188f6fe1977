//! `scripts/code_order.py` (`make code-order`): callgrind
//! profiles of one binary become lld's symbol ordering file — what ran after
//! start-up first (costliest first), then what only start-up ran; other
//! objects' functions, unnamed code and processes that never finished
//! start-up left out. The profiles are written in callgrind's own format as
//! valgrind 3.19 writes it with `--dump-after`: the part the trigger ended
//! is start-up, and names are compressed across a process's parts.

use std::path::Path;
use std::process::Command;

const BIN: &str = "/w/choird.real";

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("scripts/code_order.py")
}

fn part(pid: u32, part: u32, trigger: &str, body: &str) -> String {
    format!(
        "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npid: {pid}\ncmd:  {BIN}\npart: {part}\n\n\n\
         desc: I1 cache: \ndesc: D1 cache: \ndesc: LL cache: \n\ndesc: Timerange: Basic block 0 - 10\n\
         desc: Trigger: {trigger}\n\npositions: line\nevents: Ir\nsummary: 100\n\n\n{body}\ntotals: 100\n"
    )
}

fn run(files: &[(&str, String)]) -> (std::process::Output, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--binary".to_owned(), BIN.to_owned(), "--out".to_owned()];
    let out = dir.path().join("choird.order");
    args.push(out.display().to_string());
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        args.push(path.display().to_string());
    }
    let output = Command::new("python3").arg(script()).args(&args).output().expect("python3");
    let lines = std::fs::read_to_string(&out)
        .map(|s| s.lines().filter(|l| !l.starts_with('#')).map(str::to_owned).collect())
        .unwrap_or_default();
    (output, lines)
}

#[test]
fn steady_functions_come_first_by_their_own_cost_then_those_only_start_up_ran() {
    // Start-up: main, config parsing (start-up only) and a libc function.
    let startup = part(
        7,
        1,
        "--dump-after=_ZN12choir_common10code_pages16give_back_logged17h0E",
        "ob=(1) /usr/lib/x86_64-linux-gnu/libc.so.6\nfl=(1) ???\nfn=(1) memcpy\n0 50\n\n\
         ob=(2) /w/choird.real\nfl=(2) ???\nfn=(2) main\n0 3\ncfn=(3) _ZN6choird6config5parse17h1E\ncalls=1 0\n0 900\n\n\
         fn=(3)\n0 900\n\nfn=(4) _ZN6choird4turn17h2E\n0 1\n\nfn=(5) 0x0000000000001050\n0 5\n",
    );
    // Steady turns, in the final part: ids defined in the first part reused
    // without their names; a call's inclusive cost is not the caller's own.
    let steady = part(
        7,
        2,
        "Program termination",
        "ob=(2)\nfl=(2)\nfn=(2)\n0 1\ncfn=(4)\ncalls=5 0\n0 10000\n\nfn=(4)\n0 400\n+1 200\n\n\
         fn=(6) _ZN6choird5relay17h3E'2\n0 30\n\n\
         cob=(1)\ncfn=(1)\ncalls=1 0\n0 7\nfn=(7) _ZN6choird5relay17h3E\n0 50\n\n\
         fn=(8) (below main)\n0 9\n\nob=(1)\nfn=(1)\n0 99999\n",
    );
    // A second process (a restart), whose start-up ran the turn code too,
    // and after it a function the first never ran; then a periodic dump
    // before its start-up ended.
    let second = [
        part(8, 1, "--dump-every-bb=50000000", "ob=(1) /w/choird.real\nfl=(1) ???\nfn=(1) _ZN6choird4turn17h2E\n0 5\n"),
        part(8, 2, "--dump-after=_ZN12choir_common10code_pages16give_back_logged17h0E", "ob=(1)\nfn=(1)\n0 5\n"),
        part(8, 3, "Program termination", "ob=(1)\nfn=(2) _ZN6choird5flush17h4E\n0 70\n"),
    ];
    // Passed out of order: the parts are put back in order by their heads.
    let (output, lines) = run(&[
        ("choird.8", second[2].clone()),
        ("choird.7", steady),
        ("choird.8.2", second[1].clone()),
        ("choird.7.1", startup),
        ("choird.8.1", second[0].clone()),
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        lines,
        [
            "_ZN6choird4turn17h2E",  // 600 after start-up
            "_ZN6choird5relay17h3E", // 30 + 50, recursion levels merged
            "_ZN6choird5flush17h4E", // 70, in the second process only
            "main",                  // 1 after start-up (its call's 10,000 not its own)
            "_ZN6choird6config5parse17h1E",
        ]
    );
}

#[test]
fn a_process_that_never_finished_start_up_is_left_out_and_without_any_the_script_fails() {
    let unfinished = part(9, 1, "Program termination", "ob=(1) /w/choird.real\nfl=(1) ???\nfn=(1) _ZN1a17h0E\n0 5\n");
    let (output, lines) = run(&[("choird.9", unfinished)]);
    assert!(!output.status.success(), "no steady profile must fail");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("process 9 never finished start-up"), "{stderr}");
    assert!(stderr.contains("no steady-state profile"), "{stderr}");
    assert!(lines.is_empty(), "nothing written: {lines:?}");
}
