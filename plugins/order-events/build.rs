//! Rebuilds the component when the WIT it is generated from changes: the
//! bindings macro reads `wit/` at compile time, which cargo does not track.
fn main() {
    println!("cargo:rerun-if-changed=../../wit");
}
