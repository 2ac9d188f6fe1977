//! Docker test support: is the engine (and the base image) there, and helpers
//! for tests that inspect containers through the same Engine API choird uses.

use choird::docker::Engine;

/// The engine at the default socket.
pub fn engine() -> Engine {
    Engine::new(std::path::Path::new("/var/run/docker.sock"))
}

/// Whether docker tests can run: the engine answers and the base image exists.
/// Missing either fails under `make test` and skips (saying why) otherwise.
pub fn available() -> bool {
    let engine = engine();
    let problem = match engine.ping() {
        Err(e) => Some(e.to_string()),
        Ok(()) => match engine.image("choir-base:bookworm") {
            Ok(Some(_)) => None,
            Ok(None) => Some("the base image choir-base:bookworm is missing (make base-image)".to_owned()),
            Err(e) => Some(e.to_string()),
        },
    };
    match problem {
        None => true,
        Some(p) if crate::services_required() => panic!("the Docker engine is required for this test: {p}"),
        Some(p) => {
            eprintln!("SKIPPED: {p}; `make test` requires it");
            false
        }
    }
}

/// Image tags of agent images named with `prefix`.
pub fn images_with_prefix(engine: &Engine, prefix: &str) -> Vec<String> {
    engine.images_of(&format!("{prefix}-agent-*")).unwrap_or_default()
}

/// Held by docker tests that build images, for their whole run: builds share
/// the engine's layer cache, and one test removing its images (on drop) must
/// not delete a cached parent layer from under another test's build ("unknown
/// parent image ID").
pub fn exclusive() -> parking_lot::MutexGuard<'static, ()> {
    static LOCK: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    LOCK.lock()
}
