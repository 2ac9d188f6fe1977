//! The rollouts of approved tools and skills that choird remembers, with
//! their progress (see `daemon/rollout.rs` for what a rollout does).
//!
//! **Invariant:** bounded — at most [`MAX_REMEMBERED`] rollouts, each with
//! at most [`MAX_LINES`] progress lines; the oldest finished one is
//! forgotten first (its outcome stays in the approval's record).

use std::collections::BTreeMap;

use choir_common::admin::Rollout;

/// Progress lines kept per rollout.
pub const MAX_LINES: usize = 200;
/// Finished rollouts remembered (the oldest are forgotten first; their
/// outcome stays in the approval's record).
pub const MAX_REMEMBERED: usize = 64;

/// The rollouts choird remembers, by approval id.
#[derive(Default)]
pub struct Rollouts {
    by_id: parking_lot::Mutex<BTreeMap<i64, Rollout>>,
}

impl Rollouts {
    /// The rollout of approval `id`, if remembered.
    pub fn get(&self, id: i64) -> Option<Rollout> {
        self.by_id.lock().get(&id).cloned()
    }

    pub(crate) fn begin(&self, id: i64) {
        let mut map = self.by_id.lock();
        while map.len() >= MAX_REMEMBERED {
            let oldest_done = map.iter().find(|(_, r)| r.finished()).map(|(k, _)| *k);
            match oldest_done {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(id, Rollout { state: "waiting".into(), lines: Vec::new(), outcome: None });
    }

    pub(crate) fn update(&self, id: i64, f: impl FnOnce(&mut Rollout)) {
        if let Some(r) = self.by_id.lock().get_mut(&id) {
            f(r);
            if r.lines.len() > MAX_LINES {
                let cut = r.lines.len() - MAX_LINES;
                r.lines.drain(..cut);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_and_memory_are_bounded() {
        let r = Rollouts::default();
        r.begin(1);
        for i in 0..1000 {
            r.update(1, |ro| ro.lines.push(format!("line {i}")));
        }
        let one = r.get(1).unwrap();
        assert_eq!(one.lines.len(), MAX_LINES);
        assert_eq!(one.lines.last().unwrap(), "line 999", "the newest lines are kept");
        r.update(1, |ro| ro.state = "done".into());
        for id in 2..(MAX_REMEMBERED as i64 + 10) {
            r.begin(id);
            r.update(id, |ro| ro.state = "failed".into());
        }
        assert!(r.by_id.lock().len() <= MAX_REMEMBERED);
        assert!(r.get(1).is_none(), "the oldest finished one went first");
        assert_eq!(r.get(MAX_REMEMBERED as i64 + 9).unwrap().state, "failed");
    }
}
