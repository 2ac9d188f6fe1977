//! `choir-scripted-llm`: a scripted OpenAI-compatible chat-completions server
//! for the demo. It is NOT a language model: it replays the steps of a
//! scenario file in order, whatever it is asked, and says so on start.

#![allow(clippy::disallowed_methods)]

use choir_tests::fake_llm::{load_scenario, FakeLlm};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(scenario), Some(addr)) = (args.next(), args.next()) else {
        eprintln!("usage: choir-scripted-llm SCENARIO.json HOST:PORT [URL_FILE]");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(&scenario).unwrap_or_else(|e| {
        eprintln!("choir-scripted-llm: {scenario}: {e}");
        std::process::exit(1);
    });
    let (steps, fallback) = load_scenario(&text).unwrap_or_else(|e| {
        eprintln!("choir-scripted-llm: {scenario}: {e}");
        std::process::exit(1);
    });
    let server = FakeLlm::start_on(&addr, steps, fallback).unwrap_or_else(|e| {
        eprintln!("choir-scripted-llm: cannot listen on {addr}: {e}");
        std::process::exit(1);
    });
    if let Some(url_file) = args.next() {
        // Written once listening, so a script can wait for it and learn the port.
        if let Err(e) = std::fs::write(&url_file, server.base_url()) {
            eprintln!("choir-scripted-llm: {url_file}: {e}");
            std::process::exit(1);
        }
    }
    eprintln!(
        "choir-scripted-llm: SCRIPTED model server (not a real LLM) replaying {scenario} at {}",
        server.base_url()
    );
    loop {
        std::thread::park();
    }
}
