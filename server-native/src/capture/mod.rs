//! Commit-ordered capture (issue 5, in progress): the pgoutput decoder first; the worker
//! that applies decoded transactions to projections, membership and scope effects follows.

pub mod pgoutput;
pub mod values;
