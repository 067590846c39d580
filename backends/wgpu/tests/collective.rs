//! Collectives (the host path through a `Communicator`) against the reference backend, and
//! the ordering of the in-place write against work recorded before and after it (not yet
//! submitted), through the shared op suite.
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use common::*;

#[test]
fn collective_ops_match_reference() {
    for p in paths(wgpu_both()) {
        dflash_tests::ops::collective::all_reduce(&p);
    }
}
