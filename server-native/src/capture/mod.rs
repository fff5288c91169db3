//! Commit-ordered capture (issue 5, in progress): the pgoutput decoder, source values to
//! wire values, and the worker that applies transactions to the synced projections.
//! Membership evaluation and per-scope effects are the next steps.

mod block;
pub mod pgoutput;
mod registry;
mod row;
mod statements;
pub mod values;
pub mod worker;

pub use block::BlockReason;
