//! `choirctl console`: opens the operator's console. choird starts its
//! console socket (mode 0600, its user); this command forwards a random
//! loopback port to it for as long as it runs and prints a login address
//! that works once. For a remote machine, forward the console socket over
//! SSH instead (`ssh -L 8080:/var/lib/choir/socks/console.sock host`) and
//! run `choirctl console --port 8080 --no-forward` there.

use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use choir_common::splice::{splice, Limits};
use serde_json::{json, Value};

use crate::ctx::Ctx;

/// `console [--port P] [--no-forward] [--revoke]`.
pub fn run(ctx: &Ctx, port: Option<u16>, forward: bool, revoke: bool) -> anyhow::Result<()> {
    if revoke {
        let r: Value = ctx.client.post("console/revoke", &json!({}))?;
        say!("{} console session(s) ended", r["ended"]);
        return Ok(());
    }
    let listener = if forward {
        Some(TcpListener::bind((Ipv4Addr::LOCALHOST, port.unwrap_or(0))).context("cannot listen on loopback")?)
    } else {
        None
    };
    let port = match &listener {
        Some(l) => l.local_addr()?.port(),
        None => port.context("--no-forward needs --port, the loopback port your tunnel listens on")?,
    };
    let opened: Value = ctx.client.post("console/open", &json!({"port": port}))?;
    let code = opened["code"].as_str().context("choird sent no code")?;
    // With console_listen configured, choird listens on loopback itself.
    let (url, listener) = match opened["listen"].as_str() {
        Some(addr) => (format!("http://{addr}/login?code={code}"), None),
        None => (format!("http://127.0.0.1:{port}/login?code={code}"), listener),
    };
    if ctx.json {
        println!("{}", json!({"url": url, "socket": opened["socket"], "listen": opened["listen"]}));
    } else {
        // One write: a reader that takes the first line and closes the pipe
        // must not end the forward by making a later write fail.
        crate::term::out(&format!(
            "Console: {}\n(the address logs you in once; it leaves the address bar at once. Ctrl-C closes the forward.)\n",
            crate::term::clean(&url)
        ));
    }
    let Some(listener) = listener else { return Ok(()) };
    let socket = PathBuf::from(opened["socket"].as_str().context("choird sent no socket")?);
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let socket = socket.clone();
        std::thread::spawn(move || {
            let Ok(upstream) = UnixStream::connect(&socket) else { return };
            let limits = Limits { idle: Duration::from_secs(120), max_bytes: 256 * 1024 * 1024 };
            let _ = splice(Box::new(conn), Box::new(upstream), limits);
        });
    }
    Ok(())
}
