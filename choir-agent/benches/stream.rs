//! The model client's stream reader (`make bench`): a 2,000-chunk streamed
//! answer (text deltas, then a tool call whose arguments arrive in pieces,
//! a finishing chunk, usage and `[DONE]`) read into one chat completion,
//! against the floor of what any reader must do with the same bytes: split
//! them into lines and parse each chunk's JSON (`serde_json::Value`).
//! Prints the time per stream (best of five batches) and the ratio to that
//! floor.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Cursor;
use std::time::Instant;

/// Chunks in the stream.
const CHUNKS: usize = 2_000;
/// Reads timed (after a warm-up of a tenth as many).
const ROUNDS: usize = 200;

fn stream() -> Vec<u8> {
    let mut out = String::new();
    let head = r#""id":"chatcmpl-bench","object":"chat.completion.chunk","created":1764000000,"model":"bench-model""#;
    for i in 0..CHUNKS - 3 {
        if i < CHUNKS / 2 {
            out.push_str(&format!(
                "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"word{i} \"}},\"finish_reason\":null}}]}}\n\n"
            ));
        } else if i == CHUNKS / 2 {
            out.push_str(&format!(
                "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"id\":\"call_bench\",\"type\":\"function\",\"function\":{{\"name\":\"choir__fs__write\",\"arguments\":\"\"}}}}]}},\"finish_reason\":null}}]}}\n\n"
            ));
        } else {
            out.push_str(&format!(
                "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":\"x{i}\"}}}}]}},\"finish_reason\":null}}]}}\n\n"
            ));
        }
    }
    out.push_str(&format!(
        "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"tool_calls\"}}]}}\n\n"
    ));
    out.push_str(&format!(
        "data: {{{head},\"choices\":[],\"usage\":{{\"prompt_tokens\":900,\"completion_tokens\":2000,\"total_tokens\":2900}}}}\n\n"
    ));
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

/// The floor: lines split and each chunk's JSON parsed, nothing assembled.
fn floor(bytes: &[u8]) -> usize {
    let mut parsed = 0;
    for line in bytes.split(|b| *b == b'\n') {
        if let Some(data) = line.strip_prefix(b"data: ") {
            if data != b"[DONE]" {
                let v: serde_json::Value = serde_json::from_slice(data).unwrap();
                parsed += usize::from(v.is_object());
            }
        }
    }
    parsed
}

/// Seconds per call of `f`: the best of five batches (the machine's
/// speed wanders; the best batch is the least disturbed).
fn time(mut f: impl FnMut()) -> f64 {
    for _ in 0..ROUNDS / 10 {
        f();
    }
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..ROUNDS / 5 {
                f();
            }
            t.elapsed().as_secs_f64() / (ROUNDS / 5) as f64
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let bytes = stream();
    let answer = choir_agent::lanes::llm::read_stream(&mut Cursor::new(bytes.clone())).unwrap();
    let call = &answer.choices[0].message.tool_calls[0];
    assert_eq!(call.function.name, "choir__fs__write");
    assert!(answer.choices[0].message.content.as_deref().unwrap().starts_with("word0 word1 "));
    let read = time(|| {
        choir_agent::lanes::llm::read_stream(&mut Cursor::new(bytes.as_slice())).unwrap();
    });
    let bare = time(|| {
        assert_eq!(floor(&bytes), CHUNKS - 1);
    });
    println!("choir-agent stream reader ({CHUNKS} chunks, {} KiB)", bytes.len() / 1024);
    println!("  read into one answer   {:>8.0} µs  ({:.0} ns a chunk)", read * 1e6, read * 1e9 / CHUNKS as f64);
    println!("  floor: lines + JSON    {:>8.0} µs", bare * 1e6);
    println!("  ratio to the floor     {:>8.2}", read / bare);
}
