//! The admin server's session token outside the process: `hopper run`
//! writes the one the server made to a file only its user can read, in a
//! runtime directory only its user controls, and `hopper status` reads it
//! back to call the API.
//! A handler reads no file, so it never learns the token. The token is a
//! read token: it never changes state, and it is the only one `hopper
//! status` sends, so a configured (write) token never goes to whatever
//! listens on `admin.listen`.

use anyhow::Context as _;
use hopper::private_dir::{self, Purpose};
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

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
    Some(dir()?.join(file_name(addr)))
}

fn file_name(addr: SocketAddr) -> String {
    let ip = addr.ip().to_string().replace(':', "_");
    format!("admin-{ip}-{}.token", addr.port())
}

/// The runtime directory, as its refusals name it.
const RUNTIME: Purpose = Purpose {
    what: "the runtime directory",
    why: "hopper keeps the admin server's session token there",
    choose: "HOPPER_RUNTIME_DIR",
};

/// Writes `token` for `addr`, readable by this user only (0600, in a
/// directory made 0700). A stale file of an earlier run is replaced.
/// Refuses a runtime directory that is a symbolic link, another user's, or
/// writable by others: whoever may change it could read or swap the token.
pub fn write(addr: SocketAddr, token: &str) -> anyhow::Result<PathBuf> {
    let dir = dir().ok_or_else(|| {
        anyhow::anyhow!("no directory for it: set HOPPER_RUNTIME_DIR, XDG_RUNTIME_DIR or HOME")
    })?;
    write_in(&dir, addr, token)
}

fn write_in(dir: &Path, addr: SocketAddr, token: &str) -> anyhow::Result<PathBuf> {
    private_dir::secure(dir, RUNTIME)?;
    let path = dir.join(file_name(addr));
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(anyhow::Error::new(e).context(format!("removing {}", path.display())));
        }
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(file, "{token}").with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The token written for `addr`: none when there is no file; an error when
/// the runtime directory is one [`write`] would refuse.
pub fn read(addr: SocketAddr) -> Result<Option<String>, String> {
    let Some(dir) = dir() else {
        return Ok(None);
    };
    if std::fs::symlink_metadata(&dir).is_err() {
        return Ok(None);
    }
    private_dir::secure(&dir, RUNTIME).map_err(|e| e.to_string())?;
    let Ok(text) = std::fs::read_to_string(dir.join(file_name(addr))) else {
        return Ok(None);
    };
    let token = text.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

/// Removes the file written for `addr` when dropped: the token dies with
/// the process that made it.
pub struct Written(pub PathBuf);

impl Drop for Written {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    const ADDR: &str = "127.0.0.1:9464";

    /// Regression: a runtime directory that already existed was used as it
    /// was, so another user who made it (or could write it, or pointed a
    /// link) read or replaced the session token.
    #[test]
    fn a_runtime_directory_others_control_is_refused_and_nothing_is_written() {
        let root = tempfile::tempdir().unwrap();
        let addr: SocketAddr = ADDR.parse().unwrap();

        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let group = root.path().join("group");
        std::fs::create_dir(&group).unwrap();
        std::fs::set_permissions(&group, std::fs::Permissions::from_mode(0o770)).unwrap();
        let private = root.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        let mut bad = vec![
            (open.clone(), "is writable by others (mode 777)"),
            (group.clone(), "is writable by others (mode 770)"),
            (link.clone(), "is a symbolic link"),
        ];
        if rustix::process::geteuid().is_root() {
            let theirs = root.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            bad.push((theirs, "belongs to user 65534"));
        }
        for (dir, why) in bad {
            let err = format!("{:#}", write_in(&dir, addr, "t0ken").unwrap_err());
            assert!(
                err.starts_with("the runtime directory ") && err.contains(why),
                "{}: {err}",
                dir.display()
            );
            assert!(err.contains("HOPPER_RUNTIME_DIR"), "{err}");
            assert!(
                !private.join(file_name(addr)).exists() && !dir.join(file_name(addr)).exists(),
                "a token was written through {}",
                dir.display()
            );
        }

        // A private one, made or found, takes it, 0600.
        let made = root.path().join("made/hopper");
        for dir in [&private, &made] {
            let path = write_in(dir, addr, "t0ken").unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "t0ken\n");
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}
