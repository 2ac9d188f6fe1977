//! The vector index's lifecycle (issue 19, item 5): which index an agent's
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
//! million, √rows beyond), and built again when the rows have grown or
//! shrunk by [`Policy::growth`]. Below `build_at` the index the schema was
//! made with (HNSW, cheap while the graph is small) stays.
//!
//! **Invariant:** a table is rebuilt only after its lists and the lists its
//! rows call for differ by `growth` (2) either way, so the rows indexed by
//! all the builds an agent can cause add up to at most twice the rows it
//! has, plus what it deleted — a flood of upserts cannot make builds run
//! back to back (and the indexer runs one build at a time, for all agents).

/// pgvector's most lists.
pub const MAX_LISTS: u32 = 32_768;

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

    /// The lists an index over `rows` rows should have.
    pub fn lists_for(&self, rows: u64) -> u32 {
        let lists = if rows <= self.sqrt_from { rows / self.rows_per_list.max(1) } else { (rows as f64).sqrt() as u64 };
        u32::try_from(lists).unwrap_or(MAX_LISTS).clamp(1, MAX_LISTS)
    }
}

/// The index an agent's `items.embedding` has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// No valid index (the exact scan answers queries).
    None,
    /// IVFFlat with this many lists.
    IvfFlat(u32),
    /// Another kind (HNSW, as the per-agent migration made it).
    Other(String),
}

/// What the indexer knows of one agent's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Its index.
    pub kind: Kind,
    /// Its rows (the planner's estimate, or a count when there is none).
    pub rows: u64,
    /// The embedding dimension (sizes the build's memory).
    pub dims: u32,
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
    let want = policy.lists_for(shape.rows);
    match shape.kind {
        Kind::IvfFlat(lists) => {
            let (want, lists, g) = (u64::from(want), u64::from(lists), policy.growth.max(2));
            if want >= lists * g || want * g <= lists {
                Step::Build(want as u32)
            } else {
                Step::Keep
            }
        }
        Kind::None | Kind::Other(_) => Step::Build(want),
    }
}

/// The `maintenance_work_mem` (MiB) an IVFFlat build of `lists` lists over
/// `dims`-dimensional vectors needs: pgvector samples 50 rows a list for
/// its k-means and refuses to build when they do not fit. A quarter more,
/// and never under PostgreSQL's default of 64.
pub fn build_memory_mib(lists: u32, dims: u32) -> u64 {
    let sample = 50 * u64::from(lists) * (4 * u64::from(dims) + 8);
    (sample * 5 / 4 / (1 << 20) + 16).max(64)
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
        assert_eq!(p.lists_for(4_000_000), 2_000, "√rows past a million");
        assert_eq!(p.lists_for(u64::MAX), MAX_LISTS, "pgvector's bound");
        assert_eq!(p.lists_for(0), 1);
        // Within a factor of two either way: kept.
        assert_eq!(step(&p, &shape(Kind::IvfFlat(1_000), 1_999_999)), Step::Keep);
        assert_eq!(step(&p, &shape(Kind::IvfFlat(1_000), 501_000)), Step::Keep);
        assert_eq!(step(&p, &shape(Kind::IvfFlat(1_000), 4_000_000)), Step::Build(2_000));
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
        // 10k, then doublings to 1M (lists rows/1000), then quadruplings (√rows).
        assert!(builds.len() <= 11, "{builds:?}");
    }

    #[test]
    fn a_build_asks_for_the_memory_its_sample_needs() {
        assert_eq!(build_memory_mib(10, 384), 64, "never under the default");
        let mib = build_memory_mib(1_000, 384);
        assert!((90..=120).contains(&mib), "50,000 samples of 1.5 KiB: {mib}");
        assert!(build_memory_mib(MAX_LISTS, 2_000) < 20_000);
    }
}
