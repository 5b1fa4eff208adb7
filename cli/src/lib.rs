//! `convergectl`'s library part, shared with `cargo xtask`: the control client with its
//! bearer token ([`client`]) and the live view ([`view::Board`]) that `convergectl top` and
//! `cargo xtask demo` both draw jobs with. The command line itself is `src/main.rs`.

pub mod client;
pub mod view;
