//! `choird cluster`: keeps the home's managed PostgreSQL running in a
//! process of its own (the `choir-db` systemd unit), so a restart of choird
//! — an upgrade, a crash, `systemctl restart choird` — neither stops nor
//! starts the database: choird adopts it in milliseconds instead of waiting
//! for PostgreSQL's own start, the largest part of a restart.
//!
//! It does what choird does for a cluster it keeps itself: initdb once, the
//! same settings (`db::cluster`), `pg-keeper`'s supervision (a killed or
//! crashed server is started again with backoff), and a fast shutdown on
//! SIGTERM or SIGINT. It tells systemd READY=1 once the server accepts
//! connections and the `choir` database exists.
//!
//! **Invariant:** it keeps the cluster only while it holds the home's
//! `pg-keeper.lock` (`db::keeping`), so it and a choird keeping the cluster
//! itself never both start or stop it; whichever comes second is told who
//! holds it.

use std::path::PathBuf;

use anyhow::Context;

use crate::config::Config;
use crate::db::cluster::ManagedCluster;
use crate::db::keeper::Health;
use crate::db::keeping;
use crate::home::Home;
use crate::notify::Notifier;

/// Runs `choird cluster` for `home` until SIGTERM or SIGINT.
pub fn run(home: PathBuf, notify_socket: Option<std::ffi::OsString>) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    // Handlers first: a SIGTERM while initdb runs is acted on once it is done.
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let home = Home::new(home);
    home.ensure_layout()?;
    let config = Config::load(&home.config())?;
    if config.database_url.is_some() {
        anyhow::bail!(
            "config.json sets database_url: choird uses that database, and there is no managed cluster to keep"
        );
    }
    let lock = home.pg_keeper_lock();
    let Some(_keeping) = keeping::claim(&lock).with_context(|| lock.display().to_string())? else {
        let by = crate::home::lock_holder(&lock).map(|p| format!(" by pid {p}")).unwrap_or_default();
        anyhow::bail!(
            "the managed PostgreSQL of {} is kept already{by} (choird keeps it itself when it starts without \
             `choird cluster` running): stop that first",
            home.root().display()
        );
    };
    let bin = ManagedCluster::find_bin_dir(config.postgres_bin_dir.as_deref())?;
    let cluster = ManagedCluster::start(&home.pg(), &bin)?;
    log::info!("the managed PostgreSQL in {} accepts connections; keeping it", home.pg().display());
    let notify = Notifier::new(notify_socket);
    notify.send("READY=1");
    let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Some(sig) = signals.forever().next() {
            log::info!("signal {sig}: stopping the managed PostgreSQL");
        }
        drop(stop);
    })?;
    crate::db::keeper::run(&cluster, &Health::default(), &stopped, &|text| log::error!("{text}"));
    notify.send("STOPPING=1");
    cluster.stop().context("stopping the managed PostgreSQL")?;
    log::info!("the managed PostgreSQL stopped");
    Ok(())
}
