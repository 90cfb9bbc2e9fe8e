//! Compiled handler artifacts on disk, keyed by the sha256 of the `.wasm`.
//!
//! Compiling a large component takes seconds (a Python guest: 8.5 s), while
//! loading its compiled artifact takes milliseconds, so both startup and hot
//! reload look here first. The cache is only ever a shortcut: an entry that
//! is missing, unreadable, corrupt or made by an incompatible wasmtime is a
//! miss, and the fresh compile overwrites it. A write that fails is logged
//! and otherwise ignored.
//!
//! The cache is bounded (`[limits] cache_max_mib`): after each write, the
//! entries used least recently (by modification time, which a hit renews)
//! are removed until the rest fit, the one just written excepted. Entries
//! of other wasmtime builds in the same directory count too, and, never
//! read by this one, go first.
//!
//! An entry is `MAGIC`, the sha256 of the artifact, then the artifact as
//! `Component::serialize` wrote it. The digest is checked before wasmtime
//! sees the bytes, so a truncated or bit-flipped file is never loaded as
//! machine code. The cache directory must be writable by hopper's user only:
//! whoever can write an entry with a matching digest chooses the code hopper
//! runs.

use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::Component;

const MAGIC: &[u8; 8] = b"hopperc1";
const HEADER: usize = MAGIC.len() + 32;

/// A directory of compiled artifacts for one engine configuration.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    /// Names the engine's compatibility (wasmtime version and every setting
    /// that changes compiled code), so hopper builds that share a directory
    /// do not keep overwriting each other's entries.
    engine_tag: String,
    /// The most the directory's entries may take together, in bytes.
    max_bytes: u64,
}

/// Why a cache directory cannot be used. Hopper runs the machine code it
/// finds there, so a directory anyone else may write to, or a link, is
/// refused ([`crate::private_dir::secure`]).
pub type CacheError = crate::private_dir::PrivateDirError;

/// The cache, as its refusals name it.
const CACHE: crate::private_dir::Purpose = crate::private_dir::Purpose {
    what: "the compiled-handler cache",
    why: "hopper runs the code it finds there",
    choose: "--cache-dir",
};

impl ArtifactCache {
    /// Opens (creating it if needed, mode 0700) the cache in `dir` for
    /// `engine`'s compiled code. Refuses a directory that another user owns,
    /// that others may write to, or that is a symbolic link.
    pub fn open(dir: PathBuf, engine: &Engine) -> Result<ArtifactCache, CacheError> {
        crate::private_dir::secure(&dir, CACHE)?;
        Ok(ArtifactCache::new(dir, engine))
    }

    fn new(dir: PathBuf, engine: &Engine) -> ArtifactCache {
        // DefaultHasher::new() has fixed keys: the same engine gives the same
        // tag in every process built by the same toolchain. A toolchain
        // change only costs one miss.
        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ArtifactCache {
            dir,
            engine_tag: format!("{:016x}", hasher.finish()),
            max_bytes: crate::config::DEFAULT_CACHE_MAX_MIB << 20,
        }
    }

    /// The same cache, holding at most `max_bytes` of entries.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> ArtifactCache {
        self.max_bytes = max_bytes;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Names the engine's compatibility, in every entry's file name.
    pub fn engine_tag(&self) -> &str {
        &self.engine_tag
    }

    /// Where the artifact of the `.wasm` whose sha256 is `version` lives.
    pub fn entry_path(&self, version: &str) -> PathBuf {
        self.dir
            .join(format!("{version}-{}.cwasm", self.engine_tag))
    }

    /// The compiled component of `version`, if a sound entry exists.
    pub fn get(&self, engine: &Engine, version: &str) -> Option<Component> {
        let path = self.entry_path(version);
        let bytes = std::fs::read(&path).ok()?;
        let path = path.display();
        let Some(artifact) = verified(&bytes) else {
            tracing::warn!(entry = %path, "Cached artifact is corrupt; compiling again.");
            return None;
        };
        // SAFETY: wasmtime trusts a serialized artifact to hold code it
        // produced. This one was written by `put` below (its digest matches),
        // in a directory that `open` checked is owned by hopper's user and
        // writable by nobody else, and wasmtime itself rejects artifacts from
        // an incompatible engine.
        match unsafe { Component::deserialize(engine, artifact) } {
            Ok(component) => {
                // Used now: the last to be pruned.
                let touched = std::fs::File::options()
                    .append(true)
                    .open(self.entry_path(version))
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                if let Err(e) = touched {
                    tracing::debug!(entry = %path, error = %e, "Cannot mark the cached artifact as used.");
                }
                Some(component)
            }
            Err(e) => {
                tracing::info!(entry = %path, error = %e, "Cached artifact does not fit this engine; compiling again.");
                None
            }
        }
    }

    /// Stores the artifact of `component`, replacing any entry, atomically:
    /// a reader sees the old entry or the new one, never half of one.
    pub fn put(&self, version: &str, component: &Component) {
        let path = self.entry_path(version);
        if let Err(e) = self.write(&path, component) {
            tracing::warn!(entry = %path.display(), error = %e, "Cannot write the compiled artifact to the cache.");
            return;
        }
        self.prune(&path);
    }

    /// Removes the entries used least recently until the rest fit in
    /// `max_bytes`; never `keep`, the entry just written.
    fn prune(&self, keep: &Path) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                if !meta.is_file() {
                    return None;
                }
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|(_, size, _)| size).sum();
        if total <= self.max_bytes {
            return;
        }
        entries.sort();
        let (mut removed, mut freed) = (0usize, 0u64);
        for (_, size, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if path == keep {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total -= size;
                    removed += 1;
                    freed += size;
                }
                Err(e) => {
                    tracing::warn!(entry = %path.display(), error = %e, "Cannot remove a compiled artifact from the cache.")
                }
            }
        }
        if removed > 0 {
            tracing::info!(
                removed,
                freed_mib = freed >> 20,
                max_mib = self.max_bytes >> 20,
                "Compiled-handler cache pruned, least recently used first."
            );
        }
    }

    fn write(&self, path: &Path, component: &Component) -> std::io::Result<()> {
        let artifact = component
            .serialize()
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        let mut bytes = Vec::with_capacity(HEADER + artifact.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&Sha256::digest(&artifact));
        bytes.extend_from_slice(&artifact);
        let tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        std::fs::write(tmp.path(), &bytes)?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// The artifact inside an entry, if its magic and digest are right.
fn verified(entry: &[u8]) -> Option<&[u8]> {
    if entry.len() < HEADER || &entry[..MAGIC.len()] != MAGIC {
        return None;
    }
    let (digest, artifact) = entry[MAGIC.len()..].split_at(32);
    (Sha256::digest(artifact).as_slice() == digest).then_some(artifact)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest component: the preamble of an empty one.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    fn engine(epochs: bool) -> Engine {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(epochs);
        Engine::new(&config).unwrap()
    }

    #[test]
    fn an_entry_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(true);
        let cache = ArtifactCache::open(dir.path().join("c"), &engine).unwrap();
        assert!(cache.get(&engine, "v1").is_none(), "empty cache");
        let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
        cache.put("v1", &component);
        assert!(cache.get(&engine, "v1").is_some());
        assert!(cache.get(&engine, "v2").is_none());
    }

    #[test]
    fn a_corrupt_entry_is_a_miss_and_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(true);
        let cache = ArtifactCache::open(dir.path().to_path_buf(), &engine).unwrap();
        let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
        cache.put("v1", &component);
        let path = cache.entry_path("v1");
        let good = std::fs::read(&path).unwrap();

        // One flipped bit in the code, then a truncated file, then garbage.
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        for bad in [
            flipped,
            good[..good.len() / 2].to_vec(),
            b"garbage".to_vec(),
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert!(cache.get(&engine, "v1").is_none());
        }
        cache.put("v1", &component);
        assert_eq!(std::fs::read(&path).unwrap(), good);
        assert!(cache.get(&engine, "v1").is_some());
    }

    /// Past its bound, the cache keeps the entries used last and the one
    /// just written, and removes the rest, oldest use first.
    #[test]
    fn the_cache_is_pruned_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(true);
        let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
        let unbounded = ArtifactCache::open(dir.path().to_path_buf(), &engine).unwrap();
        unbounded.put("v0", &component);
        let size = std::fs::metadata(unbounded.entry_path("v0")).unwrap().len();
        // Room for three entries.
        let cache = unbounded.with_max_bytes(size * 3);
        let at =
            |secs: u64| std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let age = |version: &str, secs: u64| {
            std::fs::File::options()
                .append(true)
                .open(cache.entry_path(version))
                .unwrap()
                .set_modified(at(secs))
                .unwrap();
        };
        for (i, version) in ["v1", "v2"].iter().enumerate() {
            cache.put(version, &component);
            age(version, 1_000 + i as u64);
        }
        age("v0", 500);
        // A hit makes v0 the most recently used.
        assert!(cache.get(&engine, "v0").is_some());
        cache.put("v3", &component);
        let left: Vec<bool> = ["v0", "v1", "v2", "v3"]
            .iter()
            .map(|v| cache.entry_path(v).exists())
            .collect();
        assert_eq!(
            left,
            [true, false, true, true],
            "v1 was used least recently"
        );
        // A bound smaller than one entry still keeps the one just written.
        let tiny = cache.clone().with_max_bytes(1);
        tiny.put("v4", &component);
        assert!(tiny.entry_path("v4").exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn an_entry_from_an_incompatible_engine_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (engine(true), engine(false));
        let cache = ArtifactCache::open(dir.path().to_path_buf(), &ours).unwrap();
        let other = ArtifactCache::open(dir.path().to_path_buf(), &theirs).unwrap();
        assert_ne!(cache.entry_path("v1"), other.entry_path("v1"));

        // Another build's sound entry, under our name (as after an upgrade
        // that kept the tag): wasmtime refuses it, and it is a miss.
        other.put("v1", &Component::new(&theirs, EMPTY_COMPONENT).unwrap());
        std::fs::rename(other.entry_path("v1"), cache.entry_path("v1")).unwrap();
        assert!(cache.get(&ours, "v1").is_none());
    }

    #[test]
    fn a_directory_others_may_write_is_refused_and_a_new_one_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(true);
        let fresh = dir.path().join("new/cache");
        ArtifactCache::open(fresh.clone(), &engine).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "a new cache directory is private");

        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ArtifactCache::open(shared.clone(), &engine).unwrap_err();
        assert!(
            err.to_string().contains("is writable by others (mode 777)"),
            "{err}"
        );
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
        ArtifactCache::open(shared, &engine).unwrap();
    }
}
