//! The vector index's lifecycle: which index an agent's
//! `items.embedding` should have for the rows it holds. Pure: the
//! `memory-index` thread reads the index's shape
//! ([`crate::store::Store::memory_index_shape`]), asks [`step`], and builds
//! what it says ([`crate::store::Store::memory_index_build`]).
//!
//! Why: pgvector's HNSW inserts cost a graph search each (about 110 items/s
//! at a million items), IVFFlat's a nearest-centre lookup (12,000 items/s;
//! `make index-trial`), with as good a recall on clustered data at 10 probes.
//! But IVFFlat's lists are the k-means centres of the rows present when it
//! is built, so it is built once a table holds [`Policy::build_at`] rows,
//! with lists sized to the rows (pgvector's advice: rows / 1000 up to a
//! million, √rows beyond), and built again when the lists the rows call for
//! have grown or shrunk by [`Policy::growth`] from the lists built (the rows
//! doubling or halving up to a million, quadrupling or quartering beyond;
//! and once more when the lists reach the bound a build's memory sets).
//! Below `build_at` the index the schema was made with (HNSW, cheap while
//! the graph is small) stays; a table that shrinks below it keeps IVFFlat.
//!
//! **Invariant:** a table is rebuilt only after its lists and the lists its
//! rows call for differ by `growth` (2) either way, so the rows indexed by
//! all the builds an agent can cause add up to at most twice the rows it
//! has, plus what it deleted — a flood of upserts cannot make builds run
//! back to back (and the indexer runs one build at a time, for all agents).

pub use crate::store::memory_index::{Kind, Shape};

/// pgvector's most lists.
pub const MAX_LISTS: u32 = 32_768;

/// The most `maintenance_work_mem` a build may ask for, MiB. pgvector's
/// k-means keeps a float per sample per list (50 samples a list), so its
/// memory grows with the square of the lists; past this bound the lists
/// stop growing (about 2,000 lists at 384 dimensions, reached at about 4
/// million rows; beyond, each list and so each query keeps growing).
pub const MAX_BUILD_MIB: u64 = 1024;

/// When to build and rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Rows below which the schema's own index stays (no IVFFlat yet).
    pub build_at: u64,
    /// Rows per list up to `sqrt_from` rows.
    pub rows_per_list: u64,
    /// Rows from which lists are √rows (pgvector's advice).
    pub sqrt_from: u64,
    /// How far the lists wanted may drift from the lists built (as a
    /// factor, either way) before a rebuild.
    pub growth: u64,
}

impl Policy {
    /// As shipped: build at 10,000 rows (10 lists, so 10 probes still read
    /// every row), 1,000 rows a list up to a million, rebuild at 2×.
    pub const DEFAULT: Policy = Policy { build_at: 10_000, rows_per_list: 1_000, sqrt_from: 1_000_000, growth: 2 };

    /// The lists an index over `rows` rows of `dims`-dimensional vectors
    /// should have: within pgvector's bound and within what a build may
    /// ask of memory ([`MAX_BUILD_MIB`]).
    pub fn lists_for(&self, rows: u64, dims: u32) -> u32 {
        let lists = if rows <= self.sqrt_from { rows / self.rows_per_list.max(1) } else { (rows as f64).sqrt() as u64 };
        u32::try_from(lists).unwrap_or(MAX_LISTS).clamp(1, max_lists(dims))
    }
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Keep,
    /// Build an IVFFlat index of this many lists and put it in place of
    /// the present one.
    Build(u32),
}

/// What `policy` says for `shape`.
pub fn step(policy: &Policy, shape: &Shape) -> Step {
    if shape.rows < policy.build_at {
        return Step::Keep;
    }
    let want = policy.lists_for(shape.rows, shape.dims);
    match shape.kind {
        Kind::IvfFlat(lists) => {
            let capped = want == max_lists(shape.dims) && lists < want;
            let (want, lists, g) = (u64::from(want), u64::from(lists), policy.growth.max(2));
            if want >= lists * g || want * g <= lists || capped {
                Step::Build(want as u32)
            } else {
                Step::Keep
            }
        }
        Kind::None | Kind::Other(_) => Step::Build(want),
    }
}

/// The `maintenance_work_mem` (MiB) an IVFFlat build of `lists` lists over
/// `dims`-dimensional vectors needs: pgvector's own reckoning before its
/// k-means (`ivfkmeans.c`; it refuses to build when this does not fit),
/// for its sample of 50 rows a list (at least 10,000), with a tenth more
/// and never under PostgreSQL's default of 64.
pub fn build_memory_mib(lists: u32, dims: u32) -> u64 {
    let (l, d) = (u64::from(lists), u64::from(dims));
    let samples = (50 * l).max(10_000);
    let item = (8 + 4 * d).div_ceil(8) * 8;
    let bytes = samples * item           // the sample
        + 2 * l * item                   // centres, new centres
        + 4 * l * d                      // their sums
        + 4 * samples * l                // lower bounds: a float per sample per list
        + 4 * l * l                      // half the distances between centres
        + 8 * samples + 16 * l; // closest centres, upper bounds, counts, s, new distances
    (bytes * 11 / 10).div_ceil(1 << 20).max(64)
}

/// The most lists a build of `dims`-dimensional vectors may have within
/// [`MAX_BUILD_MIB`] (and pgvector's bound).
pub fn max_lists(dims: u32) -> u32 {
    let (mut lo, mut hi) = (1u32, MAX_LISTS);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if build_memory_mib(mid, dims) <= MAX_BUILD_MIB {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(kind: Kind, rows: u64) -> Shape {
        Shape { kind, rows, dims: 384 }
    }

    #[test]
    fn small_tables_keep_their_index_and_large_ones_get_lists_sized_to_their_rows() {
        let p = Policy::DEFAULT;
        let hnsw = || Kind::Other("hnsw".into());
        assert_eq!(step(&p, &shape(hnsw(), 9_999)), Step::Keep);
        assert_eq!(step(&p, &shape(Kind::None, 0)), Step::Keep);
        assert_eq!(step(&p, &shape(hnsw(), 10_000)), Step::Build(10));
        assert_eq!(step(&p, &shape(Kind::None, 1_000_000)), Step::Build(1_000));
        assert_eq!(p.lists_for(3_000_000, 384), 1_732, "√rows past a million");
        assert_eq!(p.lists_for(u64::MAX, 384), max_lists(384), "the build's memory bounds the lists");
        assert_eq!(p.lists_for(0, 384), 1);
        // Within a factor of two either way: kept.
        assert_eq!(step(&p, &shape(Kind::IvfFlat(1_000), 1_999_999)), Step::Keep);
        assert_eq!(step(&p, &shape(Kind::IvfFlat(1_000), 501_000)), Step::Keep);
        assert_eq!(step(&p, &shape(Kind::IvfFlat(1_000), 4_000_000)), Step::Build(max_lists(384)));
        assert_eq!(
            step(&p, &shape(Kind::IvfFlat(1_500), 4_000_000)),
            Step::Build(max_lists(384)),
            "once more, to the bound"
        );
        assert_eq!(step(&p, &shape(Kind::IvfFlat(max_lists(384)), u64::MAX)), Step::Keep, "and no more");
        assert_eq!(step(&p, &shape(Kind::IvfFlat(1_000), 500_000)), Step::Build(500));
        // Shrunk below build_at: kept (the exact cost is bounded by the rows).
        assert_eq!(step(&p, &shape(Kind::IvfFlat(1_000), 9_000)), Step::Keep);
    }

    /// The hostile case: an agent upserting as fast as it can, checked after
    /// every item, from nothing to 100 million rows. Builds happen only at
    /// doublings, and all of them together index at most twice the rows the
    /// table ends with.
    #[test]
    fn a_flood_of_upserts_cannot_make_builds_run_back_to_back() {
        let p = Policy::DEFAULT;
        let mut s = shape(Kind::Other("hnsw".into()), 0);
        let (mut builds, mut indexed) = (Vec::new(), 0u64);
        let mut rows = 0u64;
        while rows < 100_000_000 {
            rows += 1 + rows / 1_000; // checked at least every 0.1 % of growth
            s.rows = rows;
            if let Step::Build(lists) = step(&p, &s) {
                builds.push(rows);
                indexed += rows;
                s.kind = Kind::IvfFlat(lists);
                assert_eq!(step(&p, &s), Step::Keep, "a build is never followed by another at once");
            }
        }
        assert!(indexed <= 2 * rows + p.build_at, "{indexed} rows indexed for {rows}");
        for w in builds.windows(2) {
            assert!(w[1] >= w[0] * 2 - 2_000, "builds at {} and then {}", w[0], w[1]);
        }
        // 10k, then doublings to 1M (lists rows/1000), then quadruplings
        // (√rows) until the build's memory stops the lists growing.
        assert!(builds.len() <= 11, "{builds:?}");
        assert_eq!(s.kind, Kind::IvfFlat(max_lists(384)));

        // A model that shrinks its memory to a third (compaction) and
        // regrows it, over and over: one build each way per cycle, each
        // after the rows changed threefold, never more.
        let mut s = shape(Kind::IvfFlat(400), 400_000);
        let mut cycle_builds = Vec::new();
        for _ in 0..20 {
            for rows in [130_000, 400_000] {
                s.rows = rows;
                if let Step::Build(lists) = step(&p, &s) {
                    cycle_builds.push(lists);
                    s.kind = Kind::IvfFlat(lists);
                }
                assert_eq!(step(&p, &s), Step::Keep, "at {rows} rows");
            }
        }
        assert_eq!(cycle_builds, [130, 400].repeat(20));
    }

    #[test]
    fn a_build_asks_for_the_memory_pgvector_reckons_and_its_lists_stay_within_the_bound() {
        assert_eq!(build_memory_mib(1, 384), 64, "never under the default");
        // pgvector 0.8 said "memory required is 273 MB" for 1,000 lists of
        // 384 dimensions (bench-memory at a million items).
        let mib = build_memory_mib(1_000, 384);
        assert!((273..=305).contains(&mib), "{mib}");
        for dims in [3, 384, 1536, 3072, 16_000] {
            let most = max_lists(dims);
            assert!(build_memory_mib(most, dims) <= MAX_BUILD_MIB, "{dims}");
            assert!(most == MAX_LISTS || build_memory_mib(most + 1, dims) > MAX_BUILD_MIB, "{dims}");
            assert!(most >= 100, "{dims} dimensions: {most} lists");
        }
        assert!((1_900..=2_200).contains(&max_lists(384)), "{}", max_lists(384));
    }
}
