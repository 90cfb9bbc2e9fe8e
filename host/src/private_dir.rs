//! Directories whose contents hopper trusts, so that no other user may
//! change them: the compiled-handler cache (hopper runs the machine code it
//! finds there) and the runtime directory (where `hopper run` writes the
//! admin server's session token, and `hopper status` reads it back).
//!
//! One check serves both ([`secure`]): the directory is created private
//! when missing; an existing one must be a directory itself (not a
//! symbolic link, which whoever may write the link's own directory could
//! point elsewhere), owned by this user, and writable by nobody else.

use std::path::{Path, PathBuf};

/// What a directory is for, as its refusals name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purpose {
    /// The directory's name, such as `the compiled-handler cache`.
    pub what: &'static str,
    /// Why others must not write to it.
    pub why: &'static str,
    /// How an operator chooses another, such as `--cache-dir`.
    pub choose: &'static str,
}

/// Why a directory cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    #[error("cannot create {} {dir}: {source}", purpose.what)]
    Create {
        purpose: Purpose,
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} {dir} is a symbolic link; {}, so give the directory itself (whoever may change the link chooses where it points), or choose another {}",
        purpose.what, purpose.why, purpose.choose
    )]
    Symlink { purpose: Purpose, dir: PathBuf },
    #[error(
        "{} {dir} is not a directory; choose another {}",
        purpose.what, purpose.choose
    )]
    NotADirectory { purpose: Purpose, dir: PathBuf },
    #[error(
        "{} {dir} is writable by others (mode {mode:o}); {}, so only its owner may write to it: `chmod go-w {dir}`, or choose another {}",
        purpose.what, purpose.why, purpose.choose
    )]
    WritableByOthers {
        purpose: Purpose,
        dir: PathBuf,
        mode: u32,
    },
    #[error(
        "{} {dir} belongs to user {owner}, not to hopper's user {uid}; {}, so choose a {} of your own",
        purpose.what, purpose.why, purpose.choose
    )]
    NotOwned {
        purpose: Purpose,
        dir: PathBuf,
        owner: u32,
        uid: u32,
    },
}

/// Creates `dir` (and its missing parents) readable and writable by its
/// owner only, and checks that `dir`, new or not, is a directory (not a
/// symbolic link) owned by this user and writable by nobody else.
pub fn secure(dir: &Path, purpose: Purpose) -> Result<(), PrivateDirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let create = |source| PrivateDirError::Create {
        purpose,
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(create)?;
    // The entry itself: a link is refused, not followed.
    let meta = std::fs::symlink_metadata(dir).map_err(create)?;
    if meta.file_type().is_symlink() {
        return Err(PrivateDirError::Symlink {
            purpose,
            dir: dir.to_path_buf(),
        });
    }
    if !meta.is_dir() {
        return Err(PrivateDirError::NotADirectory {
            purpose,
            dir: dir.to_path_buf(),
        });
    }
    let uid = rustix::process::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(PrivateDirError::NotOwned {
            purpose,
            dir: dir.to_path_buf(),
            owner: meta.uid(),
            uid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(PrivateDirError::WritableByOthers {
            purpose,
            dir: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    const PURPOSE: Purpose = Purpose {
        what: "the test directory",
        why: "a test trusts it",
        choose: "TEST_DIR",
    };

    #[test]
    fn a_new_directory_is_private_and_a_shared_or_linked_one_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let fresh = root.path().join("a/b");
        secure(&fresh, PURPOSE).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);

        let shared = root.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        for mode in [0o777, 0o770, 0o1777] {
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = secure(&shared, PURPOSE).unwrap_err().to_string();
            assert!(
                err.starts_with("the test directory ")
                    && err.contains(&format!(
                        "is writable by others (mode {mode:o}); a test trusts it"
                    )),
                "{err}"
            );
        }
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
        secure(&shared, PURPOSE).unwrap();

        // A link to a private directory is refused all the same: the link's
        // own directory decides where it points.
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        let err = secure(&link, PURPOSE).unwrap_err().to_string();
        assert!(err.contains("is a symbolic link"), "{err}");

        // Another user's directory, private to them: root gives one away,
        // anyone else finds `/`.
        let theirs = if rustix::process::geteuid().is_root() {
            let theirs = root.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            theirs
        } else {
            PathBuf::from("/")
        };
        let err = secure(&theirs, PURPOSE).unwrap_err().to_string();
        assert!(err.contains("belongs to user "), "{err}");

        let file = root.path().join("file");
        std::fs::write(&file, "").unwrap();
        let err = secure(&file, PURPOSE).unwrap_err().to_string();
        assert!(
            err.contains("cannot create") || err.contains("not a directory"),
            "{err}"
        );
    }
}
