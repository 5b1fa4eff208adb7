//! `convergectl`'s library part: the live view ([`view::Board`]) that `convergectl top` and
//! `cargo xtask demo` both draw jobs with. The command line itself is `src/main.rs`.

pub mod view;
