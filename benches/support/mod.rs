//! What the load benchmarks share: a closed-loop load generator ([`load`]), and a tracing
//! layer that times our own work per request ([`own_work`]).

pub(crate) mod load;
pub(crate) mod own_work;
