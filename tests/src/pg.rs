//! A disposable PostgreSQL cluster per test: a fresh `initdb` in a temporary
//! directory, started on a private socket with the same code choird uses for its
//! managed cluster, stopped and deleted on drop.

use std::os::unix::fs::PermissionsExt;

use choird::db::cluster::ManagedCluster;

/// A running throwaway cluster.
pub struct TestPg {
    cluster: Option<ManagedCluster>,
    dir: Option<tempfile::TempDir>,
}

impl TestPg {
    /// Starts a cluster, or returns `None` (after printing why) when PostgreSQL
    /// is not installed and services are not required.
    pub fn start() -> Option<TestPg> {
        let bin = match ManagedCluster::find_bin_dir(None) {
            Ok(b) => b,
            Err(e) if !crate::services_required() => {
                eprintln!("SKIPPED: no PostgreSQL server here ({e}); `make test` requires it");
                return None;
            }
            Err(e) => panic!("PostgreSQL is required for this test: {e}"),
        };
        let dir = tempfile::Builder::new().prefix("choir-pg-").tempdir().expect("temp dir");
        // The cluster may run as the `postgres` user (when tests run as root).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let cluster = ManagedCluster::start(&dir.path().join("pg"), &bin)
            .unwrap_or_else(|e| panic!("cannot start a test cluster: {e}"));
        Some(TestPg { cluster: Some(cluster), dir: Some(dir) })
    }

    /// Connection string of the `choir` database.
    pub fn url(&self) -> String {
        self.cluster.as_ref().map(|c| c.url()).unwrap_or_default()
    }

    /// Restarts the server crash-like (`pg_ctl restart -m immediate`).
    pub fn restart_immediate(&self) {
        if let Some(c) = &self.cluster {
            c.restart_immediate().expect("restart the test cluster");
        }
    }

    /// Stops the server crash-like and keeps it down until [`TestPg::start_again`].
    pub fn stop_immediate(&self) {
        if let Some(c) = &self.cluster {
            c.stop_immediate().expect("stop the test cluster");
        }
    }

    /// Starts the server again after [`TestPg::stop_immediate`].
    pub fn start_again(&mut self) {
        let (dir, bin) = (
            self.dir.as_ref().expect("a test dir").path().join("pg"),
            ManagedCluster::find_bin_dir(None).expect("bin"),
        );
        self.cluster = Some(ManagedCluster::start(&dir, &bin).expect("restart the test cluster"));
    }

    /// The postmaster's pid (0 when it is not running), from its pid file.
    pub fn postmaster_pid(&self) -> u32 {
        self.dir.as_ref().and_then(|d| ManagedCluster::postmaster_pid(&d.path().join("pg"))).unwrap_or(0)
    }

    /// choird's store on the `choir` database, migrated.
    pub fn store(&self) -> choird::store::Store {
        let db = choird::db::Db::connect(&self.url()).expect("connect to the test cluster");
        db.migrate().expect("migrate the test database");
        choird::store::Store::new(db)
    }

    /// A connected client.
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url(), postgres::NoTls).expect("connect to the test cluster")
    }
}

impl Drop for TestPg {
    fn drop(&mut self) {
        if let Some(c) = self.cluster.take() {
            if crate::keep() {
                eprintln!("CHOIR_TEST_KEEP: leaving the test cluster running at {}", c.url());
                if let Some(d) = self.dir.take() {
                    let _ = d.keep();
                }
                return;
            }
            if let Err(e) = c.stop_immediate() {
                eprintln!("warning: stopping the test cluster: {e}");
            }
        }
    }
}
