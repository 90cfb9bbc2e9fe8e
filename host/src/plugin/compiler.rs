//! Which compiler turns a handler's WebAssembly into machine code.
//!
//! - **Cranelift** (the default) optimises: the code a route runs in
//!   production. A Python or JavaScript handler (an interpreter of 10–20
//!   MiB) takes seconds to compile; an edit reuses the functions that did
//!   not change (the compiled-function pack, `plugin/functions.rs`).
//! - **Winch** translates each function in one pass, without optimising:
//!   about six times faster to compile a Python or JavaScript handler, and
//!   code that runs a little slower (BENCHMARKS.md, "Handlers by
//!   language"). `hopper dev` uses it, so that a saved edit serves within
//!   about a second; `--compiler winch` chooses it anywhere else.
//!
//! Compiled artifacts of the two never mix: the compiled-handler cache is
//! keyed by the engine's compatibility hash, which names the compiler.

use std::fmt;
use std::str::FromStr;

/// The compiler of a [`super::Runtime`]'s handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compiler {
    /// Optimising: for production.
    #[default]
    Cranelift,
    /// Fast to compile, slower code: for the development loop.
    Winch,
}

impl Compiler {
    pub const ALL: [Compiler; 2] = [Compiler::Cranelift, Compiler::Winch];

    pub fn as_str(self) -> &'static str {
        match self {
            Compiler::Cranelift => "cranelift",
            Compiler::Winch => "winch",
        }
    }
}

impl fmt::Display for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Compiler {
    type Err = String;

    fn from_str(s: &str) -> Result<Compiler, String> {
        Compiler::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown compiler `{s}`: use `cranelift` or `winch`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compiler_is_read_by_its_name_and_an_unknown_one_is_named() {
        for c in Compiler::ALL {
            assert_eq!(c.as_str().parse::<Compiler>(), Ok(c));
        }
        assert_eq!(
            "llvm".parse::<Compiler>().unwrap_err(),
            "unknown compiler `llvm`: use `cranelift` or `winch`"
        );
        assert_eq!(Compiler::default(), Compiler::Cranelift);
    }
}
