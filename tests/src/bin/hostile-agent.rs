//! A hostile agent for the `hostile` tests (threat T2: a client on an agent
//! socket with the session's own valid token). choird starts it as its
//! `agent_binary` under the process runtime. For an agent whose id starts
//! with `evil` it speaks just enough RPC to count as running (INIT_HELLO,
//! REPORT_STATUS, long-polling HEARTBEATs), records the messages it is handed
//! in `<workspace>/hostile.messages`, and leaves its lease token in
//! `<workspace>/hostile.token` for the test, which then drives every attack
//! itself. For any other agent id it runs the real `choir-agent` in its place
//! (same arguments, same stdin), so well-behaved agents share the choird.

#![allow(clippy::disallowed_methods, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let agent = arg(&args, "--agent").expect("--agent");
    if !agent.starts_with("evil") {
        let real = std::env::current_exe().expect("exe").with_file_name("choir-agent");
        let err = std::process::Command::new(&real).args(&args[1..]).exec();
        eprintln!("hostile-agent: cannot run {}: {err}", real.display());
        std::process::exit(1);
    }
    let socket = PathBuf::from(arg(&args, "--connect").expect("--connect").trim_start_matches("unix:"));
    let workspace = PathBuf::from(arg(&args, "--workspace").expect("--workspace"));
    let mut token = String::new();
    std::io::stdin().lock().read_line(&mut token).expect("token");
    let token = token.trim().to_owned();
    let client = choir_common::unix_http::agent_for_socket(&socket, Some(Duration::from_secs(60)));
    let call = |verb: &str, body: &Value| -> Result<Value, u16> {
        let mut resp = client
            .post(&format!("http://localhost/rpc/v1/{verb}"))
            .header("Authorization", &format!("Bearer {token}"))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .map_err(|_| 0u16)?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if status == 200 {
            Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
        } else {
            Err(status)
        }
    };
    let hello = json!({"agent_id": agent, "protocol_version": choir_common::PROTOCOL_VERSION, "agent_version": "hostile",
                       "local_head": {"seq": 0, "hash": choir_common::commit::GENESIS_HASH}});
    let hello = call("INIT_HELLO", &hello).expect("INIT_HELLO");
    let head = hello["recovery"]["replicated_head"].clone();
    call("REPORT_STATUS", &json!({"session_state": "RUNNING", "lanes": []})).expect("REPORT_STATUS");
    std::fs::write(workspace.join("hostile.head"), head.to_string()).expect("head file");
    std::fs::write(workspace.join("hostile.bindings"), hello["bindings"].to_string()).expect("bindings file");
    std::fs::write(workspace.join("hostile.token"), &token).expect("token file");
    eprintln!("hostile-agent {agent}: running, token handed to the test");
    let mut messages = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(workspace.join("hostile.messages"))
        .expect("messages file");
    loop {
        let poll = json!({"events": [], "replies": [], "processed_upto": 0, "config_version": 0, "wait_ms": 5000});
        match call("HEARTBEAT", &poll) {
            Ok(reply) => {
                for m in reply["messages"].as_array().into_iter().flatten() {
                    writeln!(messages, "{m}").expect("record a message");
                }
                if reply["stop"] == true {
                    let _ = call("TERMINATE_SELF", &json!({"reason": "stopped"}));
                    return;
                }
            }
            Err(401) => return,
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}
