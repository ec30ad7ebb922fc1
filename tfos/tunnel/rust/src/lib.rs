//! tfos-tunnel: the per-node tunnel of a tfos cluster. It gives the node's TF/Gloo processes
//! sockets in a private network namespace (through an LD_PRELOAD shim talking to its control
//! socket) and carries their connections between nodes over authenticated, encrypted tfos v5
//! channels (see `README.md` beside `Cargo.toml`).

pub mod config;
pub mod log;
pub mod netns;
pub mod procnet;
pub mod relay;
pub mod sys;
pub mod tunnel;
pub mod wire;
