//! Tandem's decisions (no threads): hotness, batch → task graph, placement
//! policies, super-batch planning, staleness rules and the rebalancing monitor.
//!
//! Not built yet: this crate is an empty member of the workspace until the
//! orchestration issue lands; nothing depends on its contents.
