//! The allocator tunable both binaries set first thing in `main`, to keep each
//! process's resident memory small: glibc gives every thread that allocates while another holds an
//! arena's lock an arena of its own (up to eight per core), and each arena
//! keeps the memory freed into it. Choir's threads mostly wait on sockets
//! and channels; two arenas cost no measurable time and keep the heap from
//! spreading over one arena per thread (measured: DESIGN.md, "Measurements",
//! the soak rows).

/// Limits glibc's malloc to two arenas, unless the operator chose a number
/// (`overridden`: `MALLOC_ARENA_MAX` is set in the environment, which glibc
/// reads itself). Call it first in `main`, before any thread exists.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn limit_arenas(overridden: bool) {
    /// glibc's `M_ARENA_MAX` (malloc.h).
    const M_ARENA_MAX: std::ffi::c_int = -8;
    extern "C" {
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
    }
    if overridden {
        return;
    }
    // SAFETY: mallopt only sets a tunable of glibc's allocator; it is called
    // first thing in main, before any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        mallopt(M_ARENA_MAX, 2);
    }
}

/// Elsewhere, nothing to limit.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn limit_arenas(_overridden: bool) {}
