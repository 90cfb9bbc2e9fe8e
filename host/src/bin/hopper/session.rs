//! The admin server's session token outside the process: when no token is
//! configured, `hopper run` writes the one the server made to a file only
//! its user can read, and `hopper status` reads it back to call the API.
//! A handler reads no file, so it never learns the token.

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::PathBuf;

/// Where session tokens are kept: `$HOPPER_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/hopper`, else `~/.cache/hopper`.
pub fn dir() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("HOPPER_RUNTIME_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = set("XDG_RUNTIME_DIR") {
        return Some(PathBuf::from(dir).join("hopper"));
    }
    let home = set("HOME")?;
    Some(PathBuf::from(home).join(".cache/hopper"))
}

/// The file of the admin server listening on `addr`: one per address, so
/// two hoppers on one host keep their own.
pub fn path(addr: SocketAddr) -> Option<PathBuf> {
    let ip = addr.ip().to_string().replace(':', "_");
    Some(dir()?.join(format!("admin-{ip}-{}.token", addr.port())))
}

/// Writes `token` for `addr`, readable by this user only (0600, in a
/// directory made 0700). A stale file of an earlier run is replaced.
pub fn write(addr: SocketAddr, token: &str) -> std::io::Result<PathBuf> {
    let path = path(addr).ok_or_else(|| {
        std::io::Error::other(
            "no directory for it: set HOPPER_RUNTIME_DIR, XDG_RUNTIME_DIR or HOME",
        )
    })?;
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    writeln!(file, "{token}")?;
    Ok(path)
}

/// The token written for `addr`, if there is one.
pub fn read(addr: SocketAddr) -> Option<String> {
    let text = std::fs::read_to_string(path(addr)?).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// Removes the file written for `addr` when dropped: the token dies with
/// the process that made it.
pub struct Written(pub PathBuf);

impl Drop for Written {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
